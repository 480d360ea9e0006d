//! A replica grows while a session of the replica server holds it (an attached volume's):
//! the session, opened before the grow and never opened again, is refused the new range
//! before the grow and served in it after, because the server checks every request against
//! the replica's size when the request runs, not the size its Hello reported.

use std::sync::Arc;

use crate::node_support::{node, TempDir};
use bytes::Bytes;
use hawser_agent::replica;
use hawser_agent::replica::client::{ReplicaClient, ReplySink};
use hawser_core::{ReplicaResult, SubId};
use hawser_wire::frame::{Op, Status};
use hawser_wire::grant::HelloRequest;
use tokio::net::TcpListener;

const MIB: u64 = 1 << 20;

/// This test only makes calls, whose answers do not go through the sink.
struct NoSink;

impl ReplySink for NoSink {
    fn on_reply(&self, sub: SubId, result: ReplicaResult) {
        panic!("a call was answered through the sink: {sub}: {result:?}");
    }
    fn on_lost(&self, _corrupt: bool) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_opened_before_a_grow_writes_and_reads_the_new_range_after_it() {
    let dir = TempDir::new("replica-grow");
    let b = node(&dir.0, "b", MIB);
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(replica::server::serve(
        listener,
        b.clone(),
        None,
        Default::default(),
        stop_rx,
    ));
    let hello = HelloRequest {
        replica: "vol-b".into(),
        grant: None,
    };
    let (session, info) = ReplicaClient::connect(&addr, None, &hello, 1, Arc::new(NoSink))
        .await
        .expect("Hello");
    assert_eq!(info.size, MIB);
    let data = Bytes::from(vec![0x5a; 4096]);
    let write = |offset: u64| session.call(Op::Write, offset, 4096, Some(data.clone()));

    let (status, _) = write(MIB).await.expect("an answer");
    assert_eq!(status, Status::OutOfRange, "past the end before the grow");

    let storage = b.clone();
    let grown = tokio::task::spawn_blocking(move || storage.grow("vol-b", 2 * MIB))
        .await
        .expect("grow task")
        .expect("grow a replica a session holds");
    assert_eq!(grown.size(), 2 * MIB);

    let (status, _) = write(MIB).await.expect("an answer");
    assert_eq!(
        status,
        Status::Ok,
        "the open session writes into the new range"
    );
    let (status, _) = write(2 * MIB - 4096).await.expect("an answer");
    assert_eq!(status, Status::Ok, "up to the new end");
    let (status, _) = write(2 * MIB).await.expect("an answer");
    assert_eq!(status, Status::OutOfRange, "past the new end");
    let (status, read) = session
        .call(Op::Read, MIB, 8192, None)
        .await
        .expect("an answer");
    assert_eq!(status, Status::Ok);
    let read = read.expect("read data");
    assert_eq!(read[..4096], data[..], "what the session wrote");
    assert!(
        read[4096..].iter().all(|&b| b == 0),
        "never written: zeroes"
    );

    session.close();
    let _ = stop.send(true);
}
