//! Fuzzes the decoder of a GetJournal reply's payload (`StoredReport::decode`: a reboot flag
//! byte, then an encoded journal). Each input is tried as is; as a flag byte and journal body
//! with magic, version and checksum patched in; and as the choices of a report built and
//! encoded here. No input may panic; whatever decodes must encode back to exactly its bytes,
//! and whatever encodes must decode to the same report.
#![no_main]

use hawser_fuzz::{journal, Choices};
use hawser_wire::journal::{StoredReport, JOURNAL_MAGIC, JOURNAL_VERSION};
use libfuzzer_sys::fuzz_target;

fn check(data: &[u8]) {
    if let Ok(r) = StoredReport::decode(data) {
        let bytes = r.encode().expect("a decoded report re-encodes");
        assert_eq!(bytes.as_slice(), data, "decode/encode is not the identity");
    }
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    [false, true]
        .into_iter()
        .map(|rebooted| {
            let r = StoredReport {
                journal: hawser_fuzz::sample_journal(),
                rebooted,
            };
            let name = if rebooted { "rebooted" } else { "same-boot" };
            (name, r.encode().expect("sample report"))
        })
        .collect()
}

fuzz_target!(init: hawser_fuzz::write_seeds(seeds), |data: &[u8]| {
    check(data);

    if let Some((&flag, body)) = data.split_first() {
        let mut journal = Vec::with_capacity(data.len() + 16);
        journal.extend_from_slice(&JOURNAL_MAGIC.to_le_bytes());
        journal.extend_from_slice(&JOURNAL_VERSION.to_le_bytes());
        journal.extend_from_slice(body);
        let crc = crc32c::crc32c(&journal);
        journal.extend_from_slice(&crc.to_le_bytes());
        let mut report = vec![flag % 3];
        report.extend_from_slice(&journal);
        check(&report);
    }

    let mut c = Choices::new(data);
    let rebooted = c.bool();
    let report = StoredReport {
        journal: journal(&mut c),
        rebooted,
    };
    if let Ok(bytes) = report.encode() {
        assert_eq!(StoredReport::decode(&bytes), Ok(report));
    }
});
