//! The connection's end as the replica sees it: against a peer that speaks the protocol by
//! hand, over a real socket.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::timeout;

use super::*;

/// Reports `on_lost`; replies are not expected.
struct LossSink(mpsc::UnboundedSender<bool>);

impl ReplySink for LossSink {
    fn on_reply(&self, sub: SubId, result: ReplicaResult) {
        panic!("a silent replica answered {sub}: {result:?}");
    }
    fn on_lost(&self, corrupt: bool) {
        let _ = self.0.send(corrupt);
    }
}

/// Accepts one connection on `listener` and answers its Hello as a replica of 1 MiB.
async fn accept_hello(listener: &TcpListener) -> tokio::net::TcpStream {
    let (mut s, _) = listener.accept().await.expect("accept");
    let (h, _) = read_frame(&mut s).await.expect("a Hello");
    assert_eq!(h.op, Op::Hello);
    let info = HelloInfo {
        size: 1 << 20,
        epoch: h.epoch,
        generation: 1,
        boot_id: 7,
    }
    .encode();
    let reply = h.reply(Status::Ok).with_payload(&info);
    s.write_all(&reply.encode()).await.expect("write");
    s.write_all(&info).await.expect("write");
    s
}

/// A replica that accepts one connection, answers its Hello, then reads requests and answers
/// none. Resolves to the frames it read once the connection ends.
async fn silent_replica() -> (String, tokio::task::JoinHandle<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let peer = tokio::spawn(async move {
        let mut s = accept_hello(&listener).await;
        let mut frames = 0;
        while read_frame(&mut s).await.is_ok() {
            frames += 1;
        }
        frames
    });
    (addr, peer)
}

/// A client of replica "r" at `addr`, and where its `on_lost` goes.
async fn connect(addr: &str) -> (ReplicaClient, mpsc::UnboundedReceiver<bool>) {
    let (tx, lost) = mpsc::unbounded_channel();
    let hello = HelloRequest {
        replica: "r".into(),
        grant: None,
    };
    let (client, _) = ReplicaClient::connect(addr, None, &hello, 1, Arc::new(LossSink(tx)))
        .await
        .expect("connect");
    (client, lost)
}

/// The watchdog gives up on a replica that stopped answering, and the replica sees the
/// connection end at once, although the client object is still held (by a request waiting
/// for a reply, say): a replica whose connection lingers keeps its session, and with it the
/// replica, open (a restore or a trash is refused as "in use").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_given_up_on_sees_the_connection_end_while_the_client_is_held() {
    let (addr, peer) = silent_replica().await;
    let (client, mut lost) = connect(&addr).await;
    client.send(
        1,
        &ClientOp::Read {
            offset: 0,
            len: 4096,
        },
        false,
    );
    let wait = REPLICA_SILENCE_TIMEOUT + REPLICA_WATCHDOG_INTERVAL * 20;
    let corrupt = timeout(wait, lost.recv())
        .await
        .expect("the watchdog gives up on a silent replica")
        .expect("the sink is alive");
    assert!(!corrupt);
    let frames = timeout(Duration::from_secs(5), peer)
        .await
        .expect("the replica sees the connection end while the client is still held")
        .expect("the peer task");
    // The read, and the pings the watchdog sent before it gave up.
    assert!(frames >= 2, "{frames} frames");
    // A call on the dead connection fails at once rather than waiting for ever.
    let answer = timeout(Duration::from_secs(5), client.call(Op::Flush, 0, 0, None))
        .await
        .expect("a call on a closed connection returns");
    assert!(answer.is_none());
    drop(client);
}

/// Dropping the client ends the connection, whatever its tasks were doing: the outbox's drain
/// task, which holds the socket, used to outlive it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_client_ends_its_connection() {
    let (addr, peer) = silent_replica().await;
    let (client, _lost) = connect(&addr).await;
    drop(client);
    let frames = timeout(Duration::from_secs(5), peer)
        .await
        .expect("the replica sees the connection of a dropped client end")
        .expect("the peer task");
    assert_eq!(frames, 0);
}

/// A replica that answers Hello, then answers every frame `delay` after it read it, in
/// order (pings too).
async fn slow_replica(delay: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        let mut s = accept_hello(&listener).await;
        while let Ok((h, _)) = read_frame(&mut s).await {
            tokio::time::sleep(delay).await;
            if s.write_all(&h.reply(Status::Ok).encode()).await.is_err() {
                break;
            }
        }
    });
    addr
}

/// A connection idle for longer than the silence timeout has heard nothing for that long;
/// its next request, answered well within the timeout, must not be taken for a partition.
/// (It was: the watchdog counted silence from the last reply of the busy spell before, and
/// dropped the connection whenever it ticked while that request was in flight.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_after_a_long_idle_spell_is_not_taken_for_silence() {
    // Answers take several watchdog ticks, and far less than the silence timeout.
    let delay = REPLICA_WATCHDOG_INTERVAL * 2;
    assert!(delay * 2 < REPLICA_SILENCE_TIMEOUT);
    let addr = slow_replica(delay).await;
    let (client, mut lost) = connect(&addr).await;
    // The idle spell is the scenario, not a wait for something to happen.
    tokio::time::sleep(REPLICA_SILENCE_TIMEOUT + REPLICA_WATCHDOG_INTERVAL * 2).await;
    for _ in 0..2 {
        let answer = timeout(Duration::from_secs(5), client.call(Op::Flush, 0, 0, None))
            .await
            .expect("the call returns");
        assert_eq!(
            answer.map(|(s, _)| s),
            Some(Status::Ok),
            "the flush is answered"
        );
    }
    assert!(lost.try_recv().is_err(), "the connection was dropped");
    drop(client);
}
