//! The NBD frontend against a raw socket: bad requests get the right errno and leave the
//! connection usable, option haggling recovers from unknown exports, framing errors close
//! only their own connection, replies come back for every request in flight, back-pressure
//! holds at the bound, and random bytes never panic the server or reach the block device.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::nbd_support::raw_client::{export_size, RawClient};
use crate::nbd_support::{within, MemDevice, TestServer, EXPORT};
use hawser_agent::nbd::transmission::MAX_IN_FLIGHT_REQUESTS;
use hawser_wire::nbd::{self, Command};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

const MIB: u64 = 1024 * 1024;
const SIZE: u64 = 16 * MIB;

/// A valid write then read of 4 KiB at `offset`: proves the connection is still in sync.
async fn assert_usable(c: &mut RawClient, handle: u64, offset: u64) {
    let data = vec![u8::try_from(handle % 251).unwrap_or(0); 4096];
    c.write(handle, offset, &data).await;
    let (r, _) = c.reply(0).await;
    assert_eq!(
        (r.handle, r.error),
        (handle, 0),
        "write after an error failed"
    );
    c.request(Command::Read, 0, handle + 1, offset, 4096).await;
    let (r, got) = c.reply(4096).await;
    assert_eq!(
        (r.handle, r.error),
        (handle + 1, 0),
        "read after an error failed"
    );
    assert!(got == data, "read back different data");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_errno_and_connection_stays_usable() {
    let server = TestServer::start(MemDevice::new(SIZE)).await;
    let (mut c, size) = within("GO", RawClient::connect_go(server.tcp, EXPORT)).await;
    assert_eq!(size, SIZE);
    let too_big = u32::try_from(33 * MIB).unwrap_or(u32::MAX);
    let cases: [(&str, Command, u16, u64, u32, u32); 12] = [
        (
            "misaligned offset",
            Command::Read,
            0,
            100,
            4096,
            nbd::EINVAL,
        ),
        ("misaligned length", Command::Read, 0, 0, 1000, nbd::EINVAL),
        ("zero-length read", Command::Read, 0, 0, 0, nbd::EINVAL),
        (
            "read past the end",
            Command::Read,
            0,
            SIZE - 512,
            1024,
            nbd::EINVAL,
        ),
        (
            "read at u64 overflow",
            Command::Read,
            0,
            u64::MAX - 511,
            4096,
            nbd::EINVAL,
        ),
        (
            "oversized read",
            Command::Read,
            0,
            0,
            too_big,
            nbd::EOVERFLOW,
        ),
        (
            "unknown command CACHE",
            Command::Unknown(5),
            0,
            0,
            4096,
            nbd::EINVAL,
        ),
        (
            "unknown command 0x7777",
            Command::Unknown(0x7777),
            0,
            0,
            0,
            nbd::EINVAL,
        ),
        ("BLOCK_STATUS", Command::Unknown(7), 0, 0, 4096, nbd::EINVAL),
        ("unknown flag", Command::Read, 1 << 9, 0, 4096, nbd::EINVAL),
        (
            "DF without structured replies",
            Command::Read,
            nbd::CMD_FLAG_DF,
            0,
            4096,
            nbd::EINVAL,
        ),
        (
            "trim past the end",
            Command::Trim,
            0,
            SIZE,
            4096,
            nbd::EINVAL,
        ),
    ];
    let mut handle = 1000;
    for (what, command, flags, offset, len, want) in cases {
        within(what, async {
            c.request(command, flags, handle, offset, len).await;
            let (r, _) = c.reply(0).await;
            assert_eq!((r.handle, r.error), (handle, want), "{what}");
            assert_usable(&mut c, handle + 1, 8192).await;
        })
        .await;
        handle += 10;
    }
    assert_eq!(
        server.device.writes.load(Ordering::SeqCst),
        12,
        "only the valid writes landed"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_writes_skip_their_payload() {
    let server = TestServer::start(MemDevice::new(SIZE)).await;
    let (mut c, _) = within("GO", RawClient::connect_go(server.tcp, EXPORT)).await;
    // Payloads shaped like request headers would be parsed as such if not skipped.
    let fake = nbd::Request {
        flags: 0,
        command: Command::Write,
        handle: 7,
        offset: 0,
        length: 0,
    };
    let poison: Vec<u8> = fake.encode().iter().copied().cycle().take(4096).collect();
    let cases = [
        ("misaligned write", 100, 4096, nbd::EINVAL),
        ("write past the end", SIZE - 512, 4096, nbd::ENOSPC),
        ("unaligned length", 0, 4000, nbd::EINVAL),
    ];
    for (i, (what, offset, len, want)) in cases.into_iter().enumerate() {
        let handle = 50 + i as u64 * 10;
        within(what, async {
            c.write(handle, offset, &poison[..len]).await;
            let (r, _) = c.reply(0).await;
            assert_eq!((r.handle, r.error), (handle, want), "{what}");
            assert_usable(&mut c, handle + 1, 0).await;
        })
        .await;
    }
    within("flags on a write", async {
        let req = nbd::Request {
            flags: nbd::CMD_FLAG_NO_HOLE,
            handle: 99,
            ..fake
        };
        let mut msg = nbd::Request { length: 512, ..req }.encode().to_vec();
        msg.extend_from_slice(&poison[..512]);
        c.send(&msg).await;
        let (r, _) = c.reply(0).await;
        assert_eq!((r.handle, r.error), (99, nbd::EINVAL));
        assert_usable(&mut c, 100, 0).await;
    })
    .await;
    assert_eq!(server.device.writes.load(Ordering::SeqCst), 4);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_write_closes_only_that_connection() {
    let server = TestServer::start(MemDevice::new(SIZE)).await;
    let (mut c, _) = within("GO", RawClient::connect_go(server.tcp, EXPORT)).await;
    let len = u32::try_from(32 * MIB + 512).unwrap_or(u32::MAX);
    c.request(Command::Write, 0, 1, 0, len).await;
    assert!(
        within("close", c.closed_by_server()).await,
        "server kept the connection"
    );
    let (mut fresh, _) = within("GO again", RawClient::connect_go(server.tcp, EXPORT)).await;
    within("fresh client", assert_usable(&mut fresh, 2, 0)).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn option_haggling_recovers_from_unknown_exports() {
    let server = TestServer::start(MemDevice::new(SIZE)).await;
    let flags = nbd::CLIENT_FIXED_NEWSTYLE | nbd::CLIENT_NO_ZEROES;
    let mut c = within("connect", RawClient::connect(server.tcp, flags)).await;
    within("haggle", async {
        for name in ["nope", ""] {
            let r = c.info(nbd::OPT_GO, name, &[]).await;
            assert_eq!(r.len(), 1, "{r:?}");
            assert_eq!(r[0].reply_type, nbd::REP_ERR_UNKNOWN, "GO {name:?}");
        }
        for option in [nbd::OPT_STRUCTURED_REPLY, nbd::OPT_STARTTLS, 0xdead] {
            c.send_option(option, &[]).await;
            let r = c.replies_until_done(option).await;
            assert_eq!(r[0].reply_type, nbd::REP_ERR_UNSUP, "option {option}");
        }
        c.send_option(nbd::OPT_LIST, &[]).await;
        let r = c.replies_until_done(nbd::OPT_LIST).await;
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(r[0].reply_type, nbd::REP_SERVER);
        assert_eq!(r[0].payload, nbd::encode_rep_server(EXPORT).expect("name"));
        c.send_option(nbd::OPT_LIST, b"junk").await;
        let r = c.replies_until_done(nbd::OPT_LIST).await;
        assert_eq!(r[0].reply_type, nbd::REP_ERR_INVALID);
        // A GO payload whose lengths lie.
        c.send_option(nbd::OPT_GO, &[0, 0, 0, 200, b'v']).await;
        let r = c.replies_until_done(nbd::OPT_GO).await;
        assert_eq!(r[0].reply_type, nbd::REP_ERR_INVALID);
        let r = c.info(nbd::OPT_INFO, EXPORT, &[nbd::INFO_NAME]).await;
        assert_eq!(export_size(&r), Some(SIZE));
        let name = nbd::encode_info_name(EXPORT).expect("name");
        assert!(
            r.iter().any(|x| x.payload == name),
            "INFO_NAME missing: {r:?}"
        );
        let block = nbd::encode_info_block_size(hawser_agent::nbd::handshake::BLOCK_SIZES);
        assert!(
            r.iter().any(|x| x.payload == block),
            "INFO_BLOCK_SIZE missing: {r:?}"
        );
        let r = c.info(nbd::OPT_GO, EXPORT, &[]).await;
        assert_eq!(r.last().map(|x| x.reply_type), Some(nbd::REP_ACK));
        assert_usable(&mut c, 1, 0).await;
    })
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_name_option_with_and_without_zeroes() {
    let server = TestServer::start(MemDevice::new(SIZE)).await;
    for (flags, reply_len) in [
        (nbd::CLIENT_FIXED_NEWSTYLE | nbd::CLIENT_NO_ZEROES, 10),
        (nbd::CLIENT_FIXED_NEWSTYLE, 10 + nbd::EXPORT_NAME_ZEROES),
    ] {
        within("EXPORT_NAME", async {
            let mut c = RawClient::connect(server.tcp, flags).await;
            c.send_option(nbd::OPT_EXPORT_NAME, EXPORT.as_bytes()).await;
            let mut reply = vec![0u8; reply_len];
            tokio::io::AsyncReadExt::read_exact(&mut c.stream, &mut reply)
                .await
                .expect("reply");
            assert_eq!(reply[0..8], SIZE.to_be_bytes());
            let tflags = u16::from_be_bytes([reply[8], reply[9]]);
            assert_eq!(tflags, hawser_agent::nbd::handshake::TRANSMISSION_FLAGS);
            assert_usable(&mut c, 1, 0).await;
        })
        .await;
    }
    within("unknown EXPORT_NAME", async {
        let mut c = RawClient::connect(server.tcp, nbd::CLIENT_FIXED_NEWSTYLE).await;
        c.send_option(nbd::OPT_EXPORT_NAME, b"nope").await;
        assert!(c.closed_by_server().await, "unknown EXPORT_NAME must close");
    })
    .await;
    within("client without FIXED_NEWSTYLE", async {
        let mut c = RawClient::connect(server.tcp, 0).await;
        assert!(c.closed_by_server().await);
    })
    .await;
    within("ABORT", async {
        let mut c = RawClient::connect(server.tcp, nbd::CLIENT_FIXED_NEWSTYLE).await;
        c.send_option(nbd::OPT_ABORT, &[]).await;
        let r = c.replies_until_done(nbd::OPT_ABORT).await;
        assert_eq!(r[0].reply_type, nbd::REP_ACK);
        assert!(c.closed_by_server().await);
    })
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disc_answers_every_request_in_flight_first() {
    let server = TestServer::start(MemDevice::new(SIZE)).await;
    let (mut c, _) = within("GO", RawClient::connect_go(server.tcp, EXPORT)).await;
    server.device.close_gate();
    let n = 40u64;
    for h in 0..n {
        c.request(Command::Read, 0, h, h * 4096, 4096).await;
    }
    c.request(Command::Disc, 0, 999, 0, 0).await;
    wait_until("all reads reach the device", || {
        server.device.in_flight() as u64 == n
    })
    .await;
    server.device.open_gate();
    let mut seen = HashSet::new();
    for _ in 0..n {
        let (r, data) = within("reply after DISC", c.reply(4096)).await;
        assert_eq!((r.error, data.len()), (0, 4096));
        assert!(seen.insert(r.handle), "handle {} answered twice", r.handle);
    }
    assert_eq!(seen, (0..n).collect());
    assert!(within("close after DISC", c.closed_by_server()).await);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_requests_are_bounded_and_all_answered() {
    let server = TestServer::start(MemDevice::new(SIZE)).await;
    let (mut c, _) = within("GO", RawClient::connect_go(server.tcp, EXPORT)).await;
    server.device.close_gate();
    let bound = MAX_IN_FLIGHT_REQUESTS;
    let n = bound as u64 + 72;
    // Writes (with payload) and reads both hold slots. Past the bound only reads are sent:
    // the server stops reading there, and the kernel buffers must absorb what is left.
    let is_write = |h: u64| h.is_multiple_of(2) && h < bound as u64;
    for h in 0..n {
        if is_write(h) {
            c.write(h, h * 4096, &[0x5a; 4096]).await;
        } else {
            c.request(Command::Read, nbd::CMD_FLAG_FUA, h, 0, 4096)
                .await;
        }
    }
    wait_until("the device holds a full window", || {
        server.device.in_flight() == bound
    })
    .await;
    server.device.open_gate();
    let mut seen = HashSet::new();
    for _ in 0..n {
        let data_len = |h: u64| if is_write(h) { 0 } else { 4096 };
        let (r, data) = within("reply", c.reply_by(data_len)).await;
        assert_eq!(
            (r.error, data.len()),
            (0, data_len(r.handle)),
            "handle {}",
            r.handle
        );
        assert!(seen.insert(r.handle));
    }
    assert_eq!(seen.len() as u64, n);
    assert_eq!(
        server.device.max_in_flight.load(Ordering::SeqCst),
        bound,
        "bound exceeded"
    );
    assert_eq!(server.device.misaligned_writes.load(Ordering::SeqCst), 0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_requests_then_closes() {
    let server = TestServer::start(MemDevice::new(SIZE)).await;
    let (mut c, _) = within("GO", RawClient::connect_go(server.tcp, EXPORT)).await;
    let mut idle = within("idle client", RawClient::connect(server.tcp, 1)).await;
    server.device.close_gate();
    c.write(1, 0, &[1; 4096]).await;
    wait_until("the write reaches the device", || {
        server.device.in_flight() == 1
    })
    .await;
    let device = std::sync::Arc::clone(&server.device);
    let stopping = tokio::spawn(server.shutdown());
    // A still-haggling client is dropped at once; the write in flight is still answered.
    assert!(within("haggling client closed", idle.closed_by_server()).await);
    device.open_gate();
    let (r, _) = within("reply during shutdown", c.reply(0)).await;
    assert_eq!((r.handle, r.error), (1, 0));
    assert!(within("closed after shutdown", c.closed_by_server()).await);
    within("shutdown", stopping).await.expect("shutdown task");
    assert_eq!(device.writes.load(Ordering::SeqCst), 1);
}

/// Poll `cond` until it holds; fail after `STEP_DEADLINE`. Polling, not sleeping, is the
/// synchronisation: the yield only spaces the checks out.
async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Garbage.

static SERVER_PANICS: AtomicU64 = AtomicU64::new(0);
/// Worker threads of the garbage test's own runtime: panics there are server panics.
const GARBAGE_RUNTIME_THREAD: &str = "nbd-garbage-rt";

fn count_server_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some(GARBAGE_RUNTIME_THREAD) {
                SERVER_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            default(info);
        }));
    });
}

fn garbage(rng: &mut StdRng) -> Vec<u8> {
    let len = if rng.random_bool(0.1) {
        rng.random_range(0..8192)
    } else {
        rng.random_range(0..256)
    };
    let mut bytes = vec![0u8; len];
    rng.fill_bytes(&mut bytes);
    bytes
}

/// Send `bytes`, half-close, and read until the server closes. Errors are expected: the
/// server may reset a connection whose unread garbage it dropped.
async fn spray(c: &mut RawClient, bytes: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = c.stream.write_all(bytes).await;
    let _ = c.stream.shutdown().await;
    let mut sink = Vec::new();
    let _ = c.stream.read_to_end(&mut sink).await;
}

#[test]
fn random_bytes_never_panic_or_reach_the_device() {
    count_server_panics();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(GARBAGE_RUNTIME_THREAD)
        .enable_all()
        .build()
        .expect("build runtime");
    runtime.block_on(garbage_trials());
}

async fn garbage_trials() {
    let seed = std::env::var("HAWSER_NBD_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            now.as_secs() ^ u64::from(now.subsec_nanos()) << 24
        });
    eprintln!("garbage seed {seed} (rerun with HAWSER_NBD_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let server = TestServer::start(MemDevice::new(SIZE)).await;
    const TRIALS: usize = 1000;
    for trial in 0..TRIALS {
        let what = format!("seed {seed} trial {trial}");
        let mut prefix = Vec::new();
        // A third each: raw bytes, valid flags then garbage options, valid option magic.
        match trial % 3 {
            0 => {}
            1 => prefix.extend_from_slice(&1u32.to_be_bytes()),
            _ => {
                prefix.extend_from_slice(&1u32.to_be_bytes());
                prefix.extend_from_slice(&nbd::IHAVEOPT.to_be_bytes());
            }
        }
        prefix.extend(garbage(&mut rng));
        within(&what, async {
            let mut c = RawClient::connect_silent(server.tcp).await;
            spray(&mut c, &prefix).await;
        })
        .await;
        // In transmission: raw bytes, or a valid magic with random fields after it.
        let mut bytes = garbage(&mut rng);
        if trial % 2 == 1 && bytes.len() >= 4 {
            bytes[0..4].copy_from_slice(&nbd::REQUEST_MAGIC.to_be_bytes());
        }
        within(&what, async {
            let (mut c, _) = RawClient::connect_go(server.tcp, EXPORT).await;
            spray(&mut c, &bytes).await;
        })
        .await;
    }
    assert_eq!(
        SERVER_PANICS.load(Ordering::SeqCst),
        0,
        "server panicked (seed {seed})"
    );
    assert_eq!(
        server.device.writes.load(Ordering::SeqCst),
        0,
        "garbage wrote (seed {seed})"
    );
    assert_eq!(
        server.device.calls.load(Ordering::SeqCst),
        0,
        "garbage did I/O (seed {seed})"
    );
    assert!(server.is_running(), "a listener stopped (seed {seed})");
    let (mut c, _) = within("fresh client", RawClient::connect_go(server.tcp, EXPORT)).await;
    within("fresh client I/O", assert_usable(&mut c, 1, 0)).await;
    server.shutdown().await;
}

/// A listener with TLS requires it: before STARTTLS no export is named or served (LIST, INFO
/// and GO get ERR_TLS_REQD, EXPORT_NAME closes the connection), STARTTLS with data is
/// invalid, and STARTTLS is acknowledged (the TLS handshake would follow).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_listener_names_and_serves_nothing_before_starttls() {
    use hawser_tls::{Ca, CertSlot, ClientAuth, Credentials, Peer};
    let ca = Ca::generate("t").expect("CA");
    let (issued, key_pem) = ca
        .issue_with_key(&Peer::Node("n1".into()), hawser_tls::NODE_CERT_LIFETIME)
        .expect("certificate");
    let slot = CertSlot::new(&Credentials {
        chain_pem: issued.chain_pem,
        key_pem,
    })
    .expect("slot");
    let config = hawser_tls::server_config(ca.cert_pem(), slot, ClientAuth::Required)
        .expect("server config");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let device = MemDevice::new(SIZE);
    let registry: std::sync::Arc<dyn hawser_agent::frontends::block::ExportRegistry> =
        std::sync::Arc::new(crate::nbd_support::OneExport(device));
    let (stop, rx) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(hawser_agent::nbd::server::serve_tcp(
        listener,
        registry,
        Some(hawser_agent::nbd::server::NbdTls::new(config, "n1")),
        hawser_agent::observe::refusals::RefusalMetrics::default(),
        rx,
    ));
    let flags = nbd::CLIENT_FIXED_NEWSTYLE | nbd::CLIENT_NO_ZEROES;
    let mut c = within("connect", RawClient::connect(addr, flags)).await;
    within("haggle", async {
        c.send_option(nbd::OPT_LIST, &[]).await;
        let r = c.replies_until_done(nbd::OPT_LIST).await;
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].reply_type, nbd::REP_ERR_TLS_REQD);
        for option in [nbd::OPT_GO, nbd::OPT_INFO] {
            let r = c.info(option, EXPORT, &[]).await;
            assert_eq!(r.len(), 1, "{r:?}");
            assert_eq!(r[0].reply_type, nbd::REP_ERR_TLS_REQD, "option {option}");
        }
        c.send_option(nbd::OPT_STARTTLS, b"x").await;
        let r = c.replies_until_done(nbd::OPT_STARTTLS).await;
        assert_eq!(r[0].reply_type, nbd::REP_ERR_INVALID);
        c.send_option(nbd::OPT_STARTTLS, &[]).await;
        let r = c.replies_until_done(nbd::OPT_STARTTLS).await;
        assert_eq!(r[0].reply_type, nbd::REP_ACK);
    })
    .await;
    let mut c = within("connect", RawClient::connect(addr, flags)).await;
    c.send_option(nbd::OPT_EXPORT_NAME, EXPORT.as_bytes()).await;
    assert!(within("close", c.closed_by_server()).await);
    stop.send_replace(true);
    within("server stop", server).await.expect("server task");
}
