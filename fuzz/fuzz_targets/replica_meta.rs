//! Fuzzes the on-disk replica metadata decoder. Each input is tried as is, and as a 4096-byte
//! record with magic, checksum and a version (the current one; version 1, which still
//! decodes; version 3, which adds a key check; version 4, which adds flags; version 5, which adds a
//! wrapped data key) patched in, so the field checks behind the
//! checksum are reached too. A decoded record must survive an encode/decode roundtrip (an old
//! record re-encodes in the current version).
#![no_main]

use hawser_wire::meta::{
    ReplicaMeta, WrappedKey, KEY_CHECK_BYTES, META_LEN, META_MAGIC, META_VERSION,
    META_VERSION_FLAGS, META_VERSION_KEYED, META_VERSION_WRAPPED,
};
use libfuzzer_sys::fuzz_target;

fn check(data: &[u8]) {
    if let Ok(meta) = ReplicaMeta::decode(data) {
        let bytes = meta.encode().expect("a decoded record re-encodes");
        assert_eq!(ReplicaMeta::decode(&bytes), Ok(meta));
    }
}

fn patched(data: &[u8], version: u32) -> Vec<u8> {
    let mut record = data.to_vec();
    record.resize(META_LEN, 0);
    record[0..8].copy_from_slice(&META_MAGIC.to_le_bytes());
    record[8..12].copy_from_slice(&version.to_le_bytes());
    let crc = crc32c::crc32c(&record[..META_LEN - 4]);
    record[META_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
    record
}

/// A version-1 record laid out by hand (magic | version | state | thin | pad | size | epoch |
/// generation | volume length | replica length | volume | replica | zeroes | crc), and the
/// same replica re-encoded by the current encoder.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut v1 = vec![0u8; 44];
    v1[12] = 1; // state Ok
    v1[13] = 1; // thin
    v1[16..24].copy_from_slice(&(1u64 << 30).to_le_bytes());
    v1[24..32].copy_from_slice(&4u64.to_le_bytes());
    v1[32..40].copy_from_slice(&9u64.to_le_bytes());
    v1[40..42].copy_from_slice(&8u16.to_le_bytes());
    v1[42..44].copy_from_slice(&3u16.to_le_bytes());
    v1.extend_from_slice(b"volume-ar-1");
    let v1 = patched(&v1, 1);
    let meta = ReplicaMeta::decode(&v1).expect("a version-1 record decodes");
    let current = meta.encode().expect("meta");
    let keyed = ReplicaMeta {
        key_check: Some([0x5a; KEY_CHECK_BYTES]),
        ..meta.clone()
    }
    .encode()
    .expect("meta");
    let summed = ReplicaMeta {
        key_check: Some([0x5a; KEY_CHECK_BYTES]),
        checksums: true,
        ..meta.clone()
    }
    .encode()
    .expect("meta");
    let wrapped = ReplicaMeta {
        key_check: Some([0x5a; KEY_CHECK_BYTES]),
        wrapped_key: Some(WrappedKey {
            kek: 2,
            sealed: vec![0xa7; 92],
        }),
        ..meta.clone()
    }
    .encode()
    .expect("meta");
    let uid = ReplicaMeta {
        volume_uid: Some([0xc3; 16]),
        ..meta
    }
    .encode()
    .expect("meta");
    vec![
        ("version-1", v1),
        ("current", current),
        ("keyed", keyed),
        ("summed", summed),
        ("wrapped", wrapped),
        ("uid", uid),
    ]
}

fuzz_target!(init: hawser_fuzz::write_seeds(seeds), |data: &[u8]| {
    check(data);
    check(&patched(data, META_VERSION));
    check(&patched(data, META_VERSION_KEYED));
    check(&patched(data, META_VERSION_FLAGS));
    check(&patched(data, META_VERSION_WRAPPED));
    if META_VERSION != 1 {
        check(&patched(data, 1));
    }
});
