//! Fuzzes the decoder of a backup's manifest (`Manifest::decode`: JSON read from a target
//! anyone with its key could have written). Each input is tried under a fixed name, and under
//! the name it carries itself, so the fuzzer gets past the name check to `validate`. No input
//! may panic; whatever decodes must encode and decode back to the same manifest, and every
//! block it names must lie inside the volume.
#![no_main]

use std::collections::BTreeMap;

use hawser_backup::manifest::{BackupStats, Manifest, FORMAT};
use libfuzzer_sys::fuzz_target;

fn check(name: &str, data: &[u8]) {
    let Ok(m) = Manifest::decode(name, data) else {
        return;
    };
    let bytes = m.encode().expect("a decoded manifest encodes");
    let again = Manifest::decode(name, &bytes).expect("an encoded manifest decodes");
    assert_eq!(again, m, "encode/decode differs");
    for &index in m.blocks.keys() {
        let (at, len) = m.block_range(index);
        assert!(len > 0 && at + len <= m.size_bytes, "block {index} outside the volume");
    }
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let m = Manifest {
        format: FORMAT,
        backup: "db-20261128-101500".into(),
        volume: "db".into(),
        cluster: Some("c1".into()),
        snapshot: Some("s".into()),
        taken_ms: 1,
        size_bytes: 3 << 20,
        block_bytes: 1 << 20,
        hash: "sha256".into(),
        compression: "zstd".into(),
        blocks: BTreeMap::from([(0, "ab".repeat(32)), (2, "cd".repeat(32))]),
        encryption: None,
        previous: Some("db-20261128-091500".into()),
        stats: BackupStats::default(),
    };
    vec![("manifest", m.encode().expect("the sample manifest encodes"))]
}

fuzz_target!(init: hawser_fuzz::write_seeds(seeds), |data: &[u8]| {
    check("db-20261128-101500", data);
    // The name the input claims, if it is JSON with one.
    let claimed = serde_json::from_slice::<serde_json::Value>(data)
        .ok()
        .and_then(|v| v.get("backup")?.as_str().map(str::to_owned));
    if let Some(name) = claimed {
        check(&name, data);
    }
});
