//! The control plane on etcd: two controllers (real processes) share a real etcd and elect a
//! leader. kill -9 of the leader must not stop a volume's I/O, the other controller must take
//! over within 10 s with every record intact, and an engine that then loses a replica must
//! reach the new leader to outdate it (its controller list names both) and keep writing.
//! Fails if `etcd` is not installed.

use std::time::{Duration, Instant};

use hawser_api::controller::ReplicaState;
use hawser_e2e::{
    verify_nbd, wait_until, Cluster, ClusterOptions, NbdTarget, Writer, WriterOptions,
};

const ACKS: u64 = 300;
const ACK_TIMEOUT: Duration = Duration::from_secs(30);

#[test]
fn leader_killed_io_continues_and_the_other_controller_takes_over() {
    let opts = ClusterOptions {
        etcd_controllers: 2,
        ..ClusterOptions::default()
    };
    let mut c = Cluster::start_with("failover", 3, opts);
    let first = c.wait_leader(Duration::from_secs(20));
    let uri = c.attached_volume("v", "64MiB", 2, "n1");
    let target = NbdTarget::from_unix_uri(&uri);
    let writer = Writer::start(target.clone(), WriterOptions::default());
    writer.wait_acks(ACKS, ACK_TIMEOUT);

    // kill -9 of the leading controller: I/O does not wait for it.
    let killed = Instant::now();
    c.kill_controller(first);
    writer.wait_acks(ACKS, ACK_TIMEOUT);
    let second = c.wait_leader(Duration::from_secs(10));
    let takeover = killed.elapsed();
    println!("controller takeover after kill -9 of the leader: {takeover:?}");
    assert_ne!(first, second);
    assert!(takeover < Duration::from_secs(10), "{takeover:?}");
    assert!(
        writer.stats().longest_gap < Duration::from_secs(2),
        "I/O stalled while the leader changed: {:?}",
        writer.stats()
    );

    // Everything written before is there (the CLI is given both URLs, the dead one first).
    let v = c.volume("v");
    assert_eq!(v.attached_node.as_deref(), Some("n1"));
    assert_eq!(v.replicas.len(), 2);
    assert!(
        v.replicas.iter().all(|r| r.state == ReplicaState::InSync),
        "{v:?}"
    );
    assert_eq!(c.nodes().len(), 3);

    // A replica lost now must be outdated through the new leader before writes go on.
    let victim = v
        .replicas
        .iter()
        .find(|r| r.node != "n1")
        .expect("a replica off the attached node")
        .clone();
    let i = c
        .agents
        .iter()
        .position(|a| a.name == victim.node)
        .expect("agent");
    let _ = c.agents[i].child.kill();
    let _ = c.agents[i].child.wait();
    writer.wait_acks(ACKS, ACK_TIMEOUT);
    wait_until("the lost replica outdated", Duration::from_secs(20), || {
        c.volume("v")
            .replicas
            .iter()
            .any(|r| r.id == victim.id && r.state != ReplicaState::InSync)
    });

    let (log, stats) = writer.stop();
    println!("writer: {stats:?}");
    assert_eq!(stats.errors, 0, "{stats:?}");
    verify_nbd(&target, &log)
        .expect("read the volume back")
        .assert_ok();
    let log = c.log(&c.controllers[second].name);
    assert!(log.contains("became the leader"), "{log}");
}
