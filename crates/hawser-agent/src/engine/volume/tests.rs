//! Unit tests of the driver with a real local replica.

use super::*;
use hawser_api::agent::EngineReplica;
use hawser_storage::{NewReplica, Pool};

const SIZE: u64 = 1 << 20;

fn write(byte: u8) -> ClientOp {
    ClientOp::Write {
        offset: 0,
        data: Bytes::from(vec![byte; 4096]),
        fua: false,
    }
}

async fn local_idle(ve: &VolumeEngine) {
    while ve.local_inflight.load(Ordering::Acquire) > 0 {
        tokio::task::yield_now().await;
    }
}

/// Sim bug 7: a rate-limited resync send that waited while its replica's session was
/// closed must not land (the engine counted it lost; newer writes may follow).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_resync_send_for_a_closed_session_is_dropped() {
    let dir = std::env::temp_dir().join(format!("hawser-ve-gen-{}", std::process::id()));
    let cfg = crate::agent::parse_pool(&format!("default={}", dir.display())).expect("pool");
    let storage = NodeStorage::new("a".into(), vec![Pool::open(cfg).expect("open pool")]);
    let new = NewReplica {
        id: "vol-a".into(),
        volume: "vol".into(),
        size: SIZE,
        thin: true,
        cluster: None,
        key_check: None,
        checksums: false,
        wrapped_key: None,
        volume_uid: None,
    };
    let replica = storage.create("default", &new).expect("create replica");
    let req = StartEngine {
        volume: "vol".into(),
        size_bytes: SIZE,
        epoch: 1,
        replicas: vec![EngineReplica {
            replica_id: "vol-a".into(),
            node: "a".into(),
            replica_addr: String::new(),
            state: ReplicaState::InSync,
            blank: false,
        }],
        controller_url: "http://127.0.0.1:9".into(),
        on_quorum_loss: Default::default(),
        export: true,
        grant: None,
        qos: Default::default(),
        data_key: None,
        uid: None,
    };
    let ve = VolumeEngine::start(
        &req,
        "a",
        &storage,
        ResyncRates {
            max: 1 << 30,
            busy: 0,
        },
    )
    .await
    .expect("start engine");
    let r = ReplicaIdx(0);
    let gen = ve.current_gen(r);
    ve.send_if_current(r, gen, 1 << 40, write(1));
    local_idle(&ve).await;
    assert_eq!(replica.read(1, 0, 4096).expect("read")[0], 1);
    // The engine closes the session; a send queued for it arrives after.
    ve.disconnect(r);
    ve.send_if_current(r, gen, (1 << 40) + 1, write(2));
    local_idle(&ve).await;
    assert_eq!(
        replica.read(1, 0, 4096).expect("read")[0],
        1,
        "a resync write for a closed session landed"
    );
    ve.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
