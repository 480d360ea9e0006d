//! A replicated volume without the control plane: two nodes' storage in one process, a replica
//! server for the remote one, an engine with one local and one remote replica, exported over
//! NBD; real fio writes and verifies through it, then the two replica files must be identical.
//! Several NBD connections to the one volume (multi-conn): what one connection wrote, every
//! other reads, and a flush on any of them covers it.
#![allow(clippy::cast_possible_truncation)]

use std::process::Command;
use std::sync::Arc;

use crate::nbd_support::raw_client::{export_info, RawClient};
use crate::node_support::TempDir;
use hawser_agent::engine::rate_limit::ResyncRates;
use hawser_agent::engine::registry::Engines;
use hawser_agent::nbd::server as nbd_server;
use hawser_agent::storage::pools::NodeStorage;
use hawser_api::agent::StartEngine;
use hawser_wire::nbd::{self, Command as NbdCommand};
use tokio::net::TcpListener;

const SIZE: u64 = 256 << 20;

fn have(bin: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {bin}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Two nodes' storage, a replica server for b's, and an engine on a with one replica on each,
/// exported over NBD on TCP.
struct Replicated {
    _dir: TempDir,
    a: Arc<NodeStorage>,
    b: Arc<NodeStorage>,
    req: StartEngine,
    engines: Arc<Engines>,
    port: u16,
    stop: tokio::sync::watch::Sender<bool>,
}

async fn replicated(label: &str) -> Replicated {
    let t = crate::node_support::two_nodes(label, SIZE).await;
    let nl = TcpListener::bind("127.0.0.1:0").await.expect("bind nbd");
    let port = nl.local_addr().expect("addr").port();
    tokio::spawn(nbd_server::serve_tcp(
        nl,
        t.engines.clone(),
        None,
        hawser_agent::observe::refusals::RefusalMetrics::default(),
        t.stop.subscribe(),
    ));
    Replicated {
        _dir: t.dir,
        a: t.a,
        b: t.b,
        req: t.req,
        engines: t.engines,
        port,
        stop: t.stop,
    }
}

impl Replicated {
    /// Stop the engine and the servers; the two replica files.
    async fn finish(self) -> (Vec<u8>, Vec<u8>) {
        assert!(self.engines.stop("vol").await);
        let _ = self.stop.send(true);
        let fa = std::fs::read(self.a.replica("vol-a").expect("a").data_path()).expect("read a");
        let fb = std::fs::read(self.b.replica("vol-b").expect("b").data_path()).expect("read b");
        (fa, fb)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fio_verify_on_two_replicas_and_files_identical() {
    if !have("fio") {
        eprintln!("SKIP: fio not installed (make test installs it)");
        return;
    }
    let r = replicated("engine-fio").await;
    let Replicated {
        a,
        req,
        engines,
        port,
        ..
    } = &r;
    let (a, req, engines, port) = (a.clone(), req.clone(), engines.clone(), *port);
    for iodepth in [1, 32] {
        // At queue depth 32 the engine is swapped for one of a newer epoch again and again
        // while fio runs (as a membership change does): fio must see no error.
        let swapping = Arc::new(std::sync::atomic::AtomicBool::new(iodepth == 32));
        let swapper = tokio::spawn({
            let (engines, a, swapping, mut req) =
                (engines.clone(), a.clone(), swapping.clone(), req.clone());
            async move {
                let mut swaps = 0u32;
                while swapping.load(std::sync::atomic::Ordering::Acquire) {
                    req.epoch += 1;
                    engines
                        .start(&req, "a", &a, ResyncRates::default(), &Default::default())
                        .await
                        .expect("swap engine");
                    swaps += 1;
                }
                swaps
            }
        });
        let out = tokio::process::Command::new("fio")
            .args([
                "--name=verify",
                "--ioengine=nbd",
                &format!("--uri=nbd://127.0.0.1:{port}/vol"),
                "--rw=randwrite",
                "--bsrange=4k-128k",
                "--size=128M",
                &format!("--iodepth={iodepth}"),
                "--verify=crc32c",
                "--verify_fatal=1",
                "--randrepeat=0",
                "--verify_state_save=0",
            ])
            .output()
            .await
            .expect("run fio");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "fio failed:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("err= 0"), "fio reported errors:\n{text}");
        swapping.store(false, std::sync::atomic::Ordering::Release);
        let swaps = swapper.await.expect("swapper");
        eprintln!("iodepth {iodepth}: {swaps} engine swaps under fio");
        assert!(iodepth == 1 || swaps > 0, "no swap happened while fio ran");
    }
    let (fa, fb) = r.finish().await;
    assert_eq!(fa.len(), fb.len());
    assert!(fa == fb, "replica files differ");
    assert!(fa.iter().any(|&x| x != 0), "nothing was written");
}

/// NBD_FLAG_CAN_MULTI_CONN promises that a client with several connections to an export sees
/// one device: a write answered on one connection is read by every other, and a flush on any
/// connection covers every write answered before it on all of them. Four connections each
/// write a queue of requests at once; then each reads back what all four wrote, one flushes,
/// and both replica files hold every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_conn_one_device_seen_from_every_connection() {
    const CONNS: u64 = 4;
    const WRITES: u64 = 32;
    const BS: u64 = 4096;
    let r = replicated("engine-multi-conn").await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", r.port).parse().expect("addr");
    let mut conns = Vec::new();
    for _ in 0..CONNS {
        let flags = nbd::CLIENT_FIXED_NEWSTYLE | nbd::CLIENT_NO_ZEROES;
        let mut c = RawClient::connect(addr, flags).await;
        let replies = c.info(nbd::OPT_GO, "vol", &[]).await;
        assert_eq!(
            replies.last().expect("GO answered").reply_type,
            nbd::REP_ACK
        );
        let (size, tflags) = export_info(&replies).expect("GO gives NBD_INFO_EXPORT");
        assert_eq!(size, SIZE);
        assert_ne!(
            tflags & nbd::TFLAG_CAN_MULTI_CONN,
            0,
            "multi-conn not offered"
        );
        conns.push(c);
    }
    // Block `w` of connection `c`: interleaved, so neighbours come from different connections.
    let offset = |c: u64, w: u64| (w * CONNS + c) * BS * 3;
    let data = |c: u64, w: u64| -> Vec<u8> {
        (0..BS)
            .map(|i| (i as u8) ^ (c as u8 * 61) ^ (w as u8))
            .collect()
    };
    // Every connection sends its whole queue before any waits for a reply.
    let writers = conns.into_iter().enumerate().map(|(c, mut conn)| {
        let c = c as u64;
        tokio::spawn(async move {
            for w in 0..WRITES {
                conn.write(w, offset(c, w), &data(c, w)).await;
            }
            for _ in 0..WRITES {
                let (reply, _) = conn.reply(0).await;
                assert_eq!(reply.error, 0, "write {} on connection {c}", reply.handle);
            }
            conn
        })
    });
    let mut conns = Vec::new();
    for w in writers {
        conns.push(w.await.expect("writer"));
    }
    // Every connection reads every block, its own and the other three's.
    for (reader, conn) in conns.iter_mut().enumerate() {
        for c in 0..CONNS {
            for w in 0..WRITES {
                conn.request(NbdCommand::Read, 0, w, offset(c, w), BS as u32)
                    .await;
                let (reply, got) = conn.reply(BS as usize).await;
                assert_eq!(reply.error, 0);
                assert!(
                    got == data(c, w),
                    "connection {reader} read block {w} of connection {c} wrong"
                );
            }
        }
    }
    // One flush, on a connection that wrote a quarter of it all.
    conns[3].request(NbdCommand::Flush, 0, 99, 0, 0).await;
    let (reply, _) = conns[3].reply(0).await;
    assert_eq!((reply.handle, reply.error), (99, 0));
    for mut conn in conns {
        conn.request(NbdCommand::Disc, 0, 0, 0, 0).await;
    }
    let (fa, fb) = r.finish().await;
    for c in 0..CONNS {
        for w in 0..WRITES {
            let at = offset(c, w) as usize..(offset(c, w) + BS) as usize;
            assert!(
                fa[at.clone()] == data(c, w)[..],
                "replica a lacks block {w} of {c}"
            );
            assert!(fb[at] == data(c, w)[..], "replica b lacks block {w} of {c}");
        }
    }
}

/// Polls `cond` every 20 ms until it holds; false if `within` passed first.
async fn eventually(within: std::time::Duration, cond: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    cond()
}

/// An engine with nothing to do stops its clock (issue 44: idle volumes cost their node
/// nothing), and the next request wakes it: the write is answered, the engine ticks until
/// the write is flushed in the background and its extent has left the activity log, then
/// rests again; what was written reads back, and both replicas have it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_engine_rests_and_the_next_request_wakes_it() {
    use hawser_agent::constants::{ACTIVITY_IDLE_TICKS, BACKGROUND_FLUSH_INTERVAL, ENGINE_TICK};
    use std::time::Duration;
    const AT: u64 = 1 << 20;
    let r = replicated("engine-rest").await;
    let engine = r.engines.get("vol").expect("the engine");
    // Nothing written yet: at rest within a few ticks.
    let rests = ENGINE_TICK * 4;
    assert!(
        eventually(rests, || engine.is_resting()).await,
        "a new engine with nothing to do keeps ticking"
    );
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", r.port).parse().expect("addr");
    let (mut conn, _) = RawClient::connect_go(addr, "vol").await;
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    conn.write(1, AT, &data).await;
    let (reply, _) = conn.reply(0).await;
    assert_eq!((reply.handle, reply.error), (1, 0), "the write is answered");
    // The write woke the clock: a background flush is due, then the extent ages out.
    assert!(
        eventually(Duration::from_secs(2), || !engine.is_resting()).await,
        "the write did not wake the engine's clock"
    );
    let settle = BACKGROUND_FLUSH_INTERVAL + ENGINE_TICK * (ACTIVITY_IDLE_TICKS as u32 + 8);
    assert!(
        eventually(settle, || engine.is_resting()).await,
        "the engine did not come to rest after its write was flushed"
    );
    assert_eq!(
        engine.status().active_extents,
        0,
        "an engine at rest has an empty activity log"
    );
    conn.request(NbdCommand::Read, 0, 2, AT, 4096).await;
    let (reply, got) = conn.reply(4096).await;
    assert_eq!(reply.error, 0);
    assert!(got == data, "the write reads back");
    conn.request(NbdCommand::Disc, 0, 0, 0, 0).await;
    drop(engine);
    let (fa, fb) = r.finish().await;
    let at = AT as usize..AT as usize + 4096;
    assert!(
        fa[at.clone()] == data[..] && fb[at] == data[..],
        "a replica lacks the write"
    );
}
