//! A replicated volume without the control plane: two nodes' storage in one process, a replica
//! server for the remote one, an engine with one local and one remote replica, exported over
//! NBD; real fio writes and verifies through it, then the two replica files must be identical.

mod node_support;

use std::process::Command;
use std::sync::Arc;

use hawser_agent::engines::Engines;
use hawser_agent::rate_limit::ResyncRates;
use hawser_agent::{nbd_server, replica_server};
use hawser_api::agent::{EngineReplica, StartEngine};
use hawser_api::controller::ReplicaState;
use node_support::{node, TempDir};
use tokio::net::TcpListener;

const SIZE: u64 = 256 << 20;

fn have(bin: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {bin}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fio_verify_on_two_replicas_and_files_identical() {
    if !have("fio") {
        eprintln!("SKIP: fio not installed (make test installs it)");
        return;
    }
    let dir = TempDir::new("engine");
    let a = node(&dir.0, "a", SIZE);
    let b = node(&dir.0, "b", SIZE);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let rl = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind replica");
    let raddr = rl.local_addr().expect("addr").to_string();
    tokio::spawn(replica_server::serve(rl, b.clone(), None, stop_rx.clone()));

    let req = StartEngine {
        volume: "vol".into(),
        size_bytes: SIZE,
        epoch: 1,
        replicas: vec![
            EngineReplica {
                replica_id: "vol-a".into(),
                node: "a".into(),
                replica_addr: String::new(),
                state: ReplicaState::InSync,
                blank: false,
            },
            EngineReplica {
                replica_id: "vol-b".into(),
                node: "b".into(),
                replica_addr: raddr,
                state: ReplicaState::InSync,
                blank: false,
            },
        ],
        controller_url: "http://127.0.0.1:1".into(),
        on_quorum_loss: Default::default(),
        export: true,
        grant: None,
    };
    let engines = Arc::new(Engines::default());
    let engine = engines
        .start(&req, "a", &a, ResyncRates::default(), &Default::default())
        .await
        .expect("start engine");
    assert_eq!(engine.status().in_sync.len(), 2);
    let nl = TcpListener::bind("127.0.0.1:0").await.expect("bind nbd");
    let port = nl.local_addr().expect("addr").port();
    tokio::spawn(nbd_server::serve_tcp(
        nl,
        engines.clone(),
        None,
        stop_rx.clone(),
    ));

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
    assert!(engines.stop("vol").await);
    let _ = stop_tx.send(true);
    let fa = std::fs::read(a.replica("vol-a").expect("a").data_path()).expect("read a");
    let fb = std::fs::read(b.replica("vol-b").expect("b").data_path()).expect("read b");
    assert_eq!(fa.len(), fb.len());
    assert!(fa == fb, "replica files differ");
    assert!(fa.iter().any(|&x| x != 0), "nothing was written");
}
