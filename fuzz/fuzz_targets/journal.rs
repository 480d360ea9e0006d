//! Fuzzes the volume journal decoder (`Journal::decode`, the PutJournal payload and the
//! journal file's slots). Each input is tried as is; as the body of a record with magic,
//! version and checksum patched in, so the field checks behind the checksum are reached; and
//! as the choices of a journal built and encoded here. No input may panic; whatever decodes
//! must encode back to exactly its bytes (the format has one encoding per journal), and
//! whatever encodes must decode to the same journal.
#![no_main]

use hawser_fuzz::{journal, Choices};
use hawser_wire::journal::{Journal, JOURNAL_MAGIC, JOURNAL_VERSION};
use libfuzzer_sys::fuzz_target;

fn check(data: &[u8]) {
    if let Ok(j) = Journal::decode(data) {
        let bytes = j.encode().expect("a decoded journal re-encodes");
        assert_eq!(bytes.as_slice(), data, "decode/encode is not the identity");
    }
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let sample = hawser_fuzz::sample_journal();
    let empty = Journal {
        active: vec![],
        out: vec![],
        ..sample.clone()
    };
    vec![
        ("sample", sample.encode().expect("sample journal")),
        ("empty", empty.encode().expect("empty journal")),
    ]
}

fuzz_target!(init: hawser_fuzz::write_seeds(seeds), |data: &[u8]| {
    check(data);

    let mut record = Vec::with_capacity(data.len() + 16);
    record.extend_from_slice(&JOURNAL_MAGIC.to_le_bytes());
    record.extend_from_slice(&JOURNAL_VERSION.to_le_bytes());
    record.extend_from_slice(data);
    let crc = crc32c::crc32c(&record);
    record.extend_from_slice(&crc.to_le_bytes());
    check(&record);

    let j = journal(&mut Choices::new(data));
    if let Ok(bytes) = j.encode() {
        assert_eq!(Journal::decode(&bytes), Ok(j));
    }
});
