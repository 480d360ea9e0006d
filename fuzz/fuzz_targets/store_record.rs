//! Fuzzes the embedded store's file decoder through its public entry point: the input becomes
//! the store file (as is, and as a JSON body under a header whose length and checksum match,
//! so the body's parsing and checks are reached), which `EmbeddedStore::open` reads.
//!
//! No input may panic. A file that opens must round-trip: one write (a new snapshot from the
//! encoder for a format-1 file, a record in the change log for format 2), and the store
//! opened again holds the same entries and versions plus that write, at the next revision.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use hawser_store::EmbeddedStore;
use libfuzzer_sys::fuzz_target;

struct Env {
    rt: tokio::runtime::Runtime,
    file: PathBuf,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let dir = hawser_fuzz::scratch_dir("store");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        Env {
            rt,
            file: dir.join("store.json"),
        }
    })
}

fn check(env: &Env, bytes: &[u8]) {
    std::fs::write(&env.file, bytes).expect("write the store file");
    // The last round's log of changes belongs to the last round's snapshot.
    let _ = std::fs::remove_file(env.file.with_extension("json.log"));
    let Ok(store) = EmbeddedStore::open(&env.file) else {
        return;
    };
    hawser_fuzz::store_round_trip(&env.rt, store, &env.file);
}

/// A store file as the embedded store writes it (text and hex values), and its body alone
/// (which the target wraps in a matching header).
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let body = br#"{
  "revision": 7,
  "entries": {
    "/hawser/nodes/n1": {
      "version": 3,
      "text": "{\"name\":\"n1\",\"address\":\"127.0.0.1:7410\"}"
    },
    "/hawser/volumes/a": {
      "version": 7,
      "hex": "00ff10"
    }
  }
}"#;
    vec![("file", file(body)), ("body", body.to_vec())]
}

fn file(body: &[u8]) -> Vec<u8> {
    let mut file = format!(
        "hawser-store 1 {:08x} {}\n",
        crc32c::crc32c(body),
        body.len()
    )
    .into_bytes();
    file.extend_from_slice(body);
    file
}

fuzz_target!(init: hawser_fuzz::write_seeds(seeds), |data: &[u8]| {
    let env = env();
    check(env, data);
    check(env, &file(data));
});
