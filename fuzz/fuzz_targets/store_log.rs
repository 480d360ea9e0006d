//! Fuzzes the embedded store's change log (`hawser-store/src/embedded/log.rs`) through its
//! public entry point: the input becomes `store.json.log` beside a fixed snapshot at
//! revision 2 (as is, and as one record body under a header whose length and checksum match,
//! so the body's parsing and checks are reached), and `EmbeddedStore::open` replays it.
//!
//! No input may panic. A log that opens must leave the store at or past the snapshot's
//! revision, and one more write must survive a reopen, at the next revision, with every
//! other entry as it was.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use hawser_store::{EmbeddedStore, Expect, Store};
use libfuzzer_sys::fuzz_target;

struct Env {
    rt: tokio::runtime::Runtime,
    file: PathBuf,
    log: PathBuf,
    snapshot: Vec<u8>,
}

/// The snapshot the log is replayed on: two keys, revision 2.
fn snapshot() -> Vec<u8> {
    let body = br#"{"revision":2,"entries":{"a":{"version":1,"text":"1"},"b":{"version":2,"hex":"00ff"}}}"#;
    let mut file = format!(
        "hawser-store 2 {:08x} {}\n",
        crc32c::crc32c(body),
        body.len()
    )
    .into_bytes();
    file.extend_from_slice(body);
    file
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let dir = hawser_fuzz::scratch_dir("store-log");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        Env {
            rt,
            file: dir.join("store.json"),
            log: dir.join("store.json.log"),
            snapshot: snapshot(),
        }
    })
}

fn check(env: &Env, log: &[u8]) {
    std::fs::write(&env.file, &env.snapshot).expect("write the snapshot");
    std::fs::write(&env.log, log).expect("write the log");
    let Ok(store) = EmbeddedStore::open(&env.file) else {
        return;
    };
    let revision = hawser_fuzz::store_round_trip(&env.rt, store, &env.file);
    assert!(
        revision >= 2,
        "the log took the store back to revision {revision}"
    );
}

/// `body` as one log record.
fn record(body: &[u8]) -> Vec<u8> {
    let mut out = format!("hawser-log {:08x} {}\n", crc32c::crc32c(body), body.len()).into_bytes();
    out.extend_from_slice(body);
    out.push(b'\n');
    out
}

/// A log as the store writes it (puts of text and binary values, a delete), one record's
/// body alone, and a log cut short.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let dir = hawser_fuzz::scratch_dir("store-log-seeds");
    let file = dir.join("store.json");
    let _ = std::fs::remove_file(dir.join("store.json.log"));
    std::fs::write(&file, snapshot()).expect("write the snapshot");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let s = EmbeddedStore::open(&file).expect("open");
        s.put("c", b"{\"x\":1}".to_vec(), Expect::Any)
            .await
            .expect("put");
        s.put("a", vec![0, 1, 255], Expect::Any).await.expect("put");
        s.delete("b", Expect::Any).await.expect("delete");
    });
    let log = std::fs::read(dir.join("store.json.log")).expect("read the log");
    let body = br#"{"revision":3,"ops":[{"key":"c","text":"3"},{"key":"a","deleted":true}]}"#;
    vec![
        ("log", log.clone()),
        ("body", body.to_vec()),
        ("torn", log[..log.len() * 2 / 3].to_vec()),
    ]
}

fuzz_target!(init: hawser_fuzz::write_seeds(seeds), |data: &[u8]| {
    let env = env();
    check(env, data);
    check(env, &record(data));
});
