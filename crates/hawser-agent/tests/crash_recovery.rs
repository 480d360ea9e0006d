//! Crash recovery of the engine, without the control plane: two nodes' storage in one process
//! (a local replica and one behind a real replica server). An engine writes and is abandoned
//! without stopping (its crash); the replicas are made to differ inside and outside its
//! activity log; the next engine must make them equal inside the log before serving I/O, and
//! compare nothing else. A cleanly stopped engine leaves an empty log.

// Test sizes and patterns: small values, truncation intended.
#![allow(clippy::cast_possible_truncation)]

mod node_support;

use bytes::Bytes;
use hawser_agent::block::BlockDevice;
use hawser_agent::rate_limit::ResyncRates;
use hawser_agent::replica_server;
use hawser_agent::volume_engine::VolumeEngine;
use hawser_api::agent::{EngineReplica, StartEngine};
use hawser_api::controller::ReplicaState;
use node_support::{node, TempDir};
use tokio::net::TcpListener;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 128 * MIB;
const EXTENT: u64 = 4 * MIB;

fn request(epoch: u64, raddr: &str) -> StartEngine {
    StartEngine {
        volume: "vol".into(),
        size_bytes: SIZE,
        epoch,
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
                replica_addr: raddr.into(),
                state: ReplicaState::InSync,
                blank: false,
            },
        ],
        controller_url: "http://127.0.0.1:1".into(),
        on_quorum_loss: Default::default(),
        export: true,
    }
}

fn pattern(seed: u8, len: usize) -> Bytes {
    Bytes::from((0..len).map(|i| seed ^ (i as u8)).collect::<Vec<u8>>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_engine_reconciles_exactly_the_activity_log() {
    let dir = TempDir::new("recovery");
    let a = node(&dir.0, "a", SIZE);
    let b = node(&dir.0, "b", SIZE);
    let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let rl = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let raddr = rl.local_addr().expect("addr").to_string();
    tokio::spawn(replica_server::serve(rl, b.clone(), stop_rx));

    // Engine 1 writes into extents 2 and 7, and is never stopped.
    let e1 = VolumeEngine::start(&request(1, &raddr), "a", &a, ResyncRates::default())
        .await
        .expect("start engine 1");
    e1.write(2 * EXTENT, pattern(1, 65536), false)
        .await
        .expect("write");
    e1.write(7 * EXTENT + 8192, pattern(2, 4096), false)
        .await
        .expect("write");
    assert_eq!(e1.status().active_extents, 2, "both extents are in the log");
    // Its crash mid-write: a write reached replica b only, inside the log (extent 7)...
    let rb = b.replica("vol-b").expect("b");
    rb.write(1, 7 * EXTENT + 65536, &pattern(3, 65536), false)
        .expect("direct write");
    // ... and, to prove recovery looks only at the log, a difference outside it (extent 20),
    // which no engine could have caused.
    rb.write(1, 20 * EXTENT, &pattern(4, 4096), false)
        .expect("direct write");
    std::mem::forget(e1);

    let e2 = VolumeEngine::start(&request(2, &raddr), "a", &a, ResyncRates::default())
        .await
        .expect("start engine 2");
    let report = e2.status().recovery.expect("recovery ran");
    assert_eq!(report.replicas, 2);
    assert_eq!(
        report.compared_bytes,
        2 * EXTENT,
        "only the two logged extents"
    );
    assert_eq!(report.copied_bytes, 65536, "one 64 KiB block differed");
    let ra = a.replica("vol-a").expect("a");
    for off in [2 * EXTENT, 7 * EXTENT] {
        let x = ra.read(2, off, EXTENT as u32).expect("read a");
        let y = rb.read(2, off, EXTENT as u32).expect("read b");
        assert!(x == y, "extent at {off} differs after recovery");
    }
    // The source was the local replica, which never got the stray write.
    let x = ra.read(2, 7 * EXTENT + 65536, 65536).expect("read a");
    assert!(x.iter().all(|&v| v == 0), "the source's value won");
    // Reads through the engine agree with what was acknowledged.
    let got = e2.read(2 * EXTENT, 65536).await.expect("read");
    assert_eq!(got, pattern(1, 65536));

    // A clean stop empties the log: the next engine compares nothing.
    e2.stop().await;
    let e3 = VolumeEngine::start(&request(3, &raddr), "a", &a, ResyncRates::default())
        .await
        .expect("start engine 3");
    let report = e3.status().recovery.expect("recovery ran");
    assert_eq!(
        report.compared_bytes, 0,
        "a clean stop leaves nothing to compare"
    );
    e3.stop().await;
}
