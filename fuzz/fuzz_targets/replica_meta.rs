//! Fuzzes the on-disk replica metadata decoder. Each input is tried as is and as a 4096-byte
//! record with magic, version and checksum patched in, so the field checks behind the
//! checksum are reached too. A decoded record must survive an encode/decode roundtrip.
#![no_main]

use hawser_wire::meta::{ReplicaMeta, META_LEN, META_MAGIC, META_VERSION};
use libfuzzer_sys::fuzz_target;

fn check(data: &[u8]) {
    if let Ok(meta) = ReplicaMeta::decode(data) {
        let bytes = meta.encode().expect("a decoded record re-encodes");
        assert_eq!(ReplicaMeta::decode(&bytes), Ok(meta));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut record = data.to_vec();
    record.resize(META_LEN, 0);
    record[0..8].copy_from_slice(&META_MAGIC.to_le_bytes());
    record[8..12].copy_from_slice(&META_VERSION.to_le_bytes());
    let crc = crc32c::crc32c(&record[..META_LEN - 4]);
    record[META_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
    check(&record);
});
