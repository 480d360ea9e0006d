//! The HTTP server's limits against real sockets: slowloris headers and bodies are cut off,
//! one peer cannot take every connection, oversized bodies are refused before a handler runs,
//! and well-behaved clients are served throughout.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::routing::{get, post};
use axum::Router;
use hawser_listen::{serve, HttpLimits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const HEADER_TIMEOUT: Duration = Duration::from_millis(500);

async fn start(limits: HttpLimits) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = Router::new().route("/ok", get(|| async { "ok" })).route(
        "/echo",
        post(|b: String| async move { b.len().to_string() }),
    );
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(l, app, limits, None, async move {
        let _ = rx.await;
    }));
    (addr, tx)
}

fn limits() -> HttpLimits {
    HttpLimits {
        max_connections: 64,
        max_per_peer: 8,
        header_read_timeout: HEADER_TIMEOUT,
        body_read_timeout: HEADER_TIMEOUT,
        max_body_bytes: 4096,
        bodies_in_flight: 4,
    }
}

/// A connection from `source` (another loopback address is another peer).
async fn connect_from(source: [u8; 4], addr: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::from((source, 0))).unwrap();
    s.connect(addr).await.unwrap()
}

/// Everything the server sends until it closes; panics if it has not closed by `within`.
async fn until_closed(s: &mut TcpStream, within: Duration) -> String {
    let mut got = Vec::new();
    let r = tokio::time::timeout(within, s.read_to_end(&mut got)).await;
    assert!(
        r.is_ok(),
        "the server kept the connection open for {within:?}"
    );
    String::from_utf8_lossy(&got).into_owned()
}

async fn get_ok(addr: SocketAddr) -> String {
    let mut s = connect_from([127, 0, 0, 1], addr).await;
    s.write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    until_closed(&mut s, Duration::from_secs(5)).await
}

#[tokio::test]
async fn slow_headers_are_cut_off_and_others_are_served_meanwhile() {
    let (addr, _stop) = start(limits()).await;
    let mut slow = connect_from([127, 0, 0, 2], addr).await;
    slow.write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    // A byte now and then does not keep it alive: the whole header has a deadline.
    let trickle = async {
        for _ in 0..20 {
            tokio::time::sleep(HEADER_TIMEOUT / 5).await;
            if slow.write_all(b"x").await.is_err() {
                break;
            }
        }
    };
    let served = async { get_ok(addr).await };
    let ((), answer) = tokio::join!(trickle, served);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let rest = until_closed(&mut slow, Duration::from_secs(5)).await;
    assert!(!rest.contains(" 200 "), "a slow request was served: {rest}");
    assert!(
        started.elapsed() < HEADER_TIMEOUT * 10,
        "closed only after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn an_idle_connection_is_closed() {
    let (addr, _stop) = start(limits()).await;
    let mut idle = connect_from([127, 0, 0, 2], addr).await;
    until_closed(&mut idle, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn one_peer_cannot_take_every_connection() {
    let (addr, _stop) = start(limits()).await;
    let mut held = Vec::new();
    for _ in 0..8 {
        let mut s = connect_from([127, 0, 0, 3], addr).await;
        s.write_all(b"GET").await.unwrap();
        held.push(s);
    }
    // The ninth from the same peer is closed without an answer.
    let mut ninth = connect_from([127, 0, 0, 3], addr).await;
    let _ = ninth
        .write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    let answer = until_closed(&mut ninth, HEADER_TIMEOUT / 2).await;
    assert!(
        answer.is_empty(),
        "served over the per-peer limit: {answer}"
    );
    // Another peer is served.
    assert!(get_ok(addr).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn bodies_too_big_or_too_slow_are_refused_before_the_handler() {
    let (addr, _stop) = start(limits()).await;
    let mut big = connect_from([127, 0, 0, 1], addr).await;
    let body = vec![b'a'; 10_000];
    let head = format!(
        "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    big.write_all(head.as_bytes()).await.unwrap();
    let _ = big.write_all(&body).await;
    let answer = until_closed(&mut big, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("larger than 4096 bytes"), "{answer}");

    let mut slow = connect_from([127, 0, 0, 1], addr).await;
    slow.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nabc")
        .await
        .unwrap();
    let answer = until_closed(&mut slow, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("not received within"), "{answer}");

    let mut fine = connect_from([127, 0, 0, 1], addr).await;
    fine.write_all(
        b"POST /echo HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 5\r\n\r\nhello",
    )
    .await
    .unwrap();
    let answer = until_closed(&mut fine, Duration::from_secs(5)).await;
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("\r\n\r\n5"),
        "{answer}"
    );
}
