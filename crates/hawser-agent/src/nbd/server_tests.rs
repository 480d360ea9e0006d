//! A listener at its connection limit: it stops accepting, counts and logs that it is full,
//! and serves the waiting client once a connection ends. The runtime has one thread, so when
//! a client has read its greeting the accept loop has already gone round once more (it runs
//! until it waits for a permit before the connection's task can greet).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;

use super::*;
use crate::frontends::block::BlockDevice;

struct NoExports;

impl ExportRegistry for NoExports {
    fn lookup(&self, _: &str) -> Option<Arc<dyn BlockDevice>> {
        None
    }
    fn names(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Connects and reads the server's greeting (it speaks first).
async fn greeted(path: &std::path::Path) -> UnixStream {
    let mut s = UnixStream::connect(path).await.unwrap();
    read_greeting(&mut s).await;
    s
}

async fn read_greeting(s: &mut UnixStream) {
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).await.unwrap();
    assert_eq!(&greeting[..8], b"NBDMAGIC");
}

fn full_count(m: &RefusalMetrics) -> String {
    let mut r = Registry::default();
    m.register(&mut r);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
    out.lines()
        .find(|l| l.starts_with("nbd_listener_full_total{"))
        .unwrap_or("none")
        .to_string()
}

#[tokio::test]
async fn a_full_listener_counts_it_and_serves_the_next_client_when_one_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nbd.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let refusals = RefusalMetrics::default();
    let (stop, rx) = watch::channel(false);
    let limit = Limit::new("unix", 2, refusals.clone());
    let server = tokio::spawn(serve_unix_within(listener, Arc::new(NoExports), limit, rx));

    let first = greeted(&path).await;
    assert_eq!(full_count(&refusals), "none");
    let _second = greeted(&path).await;
    assert_eq!(
        full_count(&refusals),
        r#"nbd_listener_full_total{listener="unix"} 1"#
    );
    // A third client waits in the backlog: no greeting while two are open. (A wait that ends
    // early cannot make this pass wrongly: the greeting would be there.)
    let mut third = UnixStream::connect(&path).await.unwrap();
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(300), third.read(&mut byte)).await;
    assert!(early.is_err(), "the third client was served past the limit");
    // One leaves (mid-handshake): the third is greeted, and the listener is full again.
    drop(first);
    read_greeting(&mut third).await;
    assert_eq!(
        full_count(&refusals),
        r#"nbd_listener_full_total{listener="unix"} 2"#
    );
    stop.send(true).unwrap();
    server.await.unwrap();
}
