//! Fuzzes the replica frame decoders: the header of every frame kind and the payload each kind
//! carries (a Hello request's replica id, a Hello reply's `HelloInfo`, a PutJournal request's
//! journal, a GetJournal reply's stored report, a Checksum reply's digests).
//!
//! Random bytes almost never carry a valid header checksum, so each input is also tried with
//! magic, version and checksum patched in (reaching the opcode, flag, status and length checks
//! behind them), and once more as a header built by the encoder from the input's fields. No
//! input may panic; a decoded header must re-encode to the same bytes, and a decoded payload
//! must survive an encode/decode roundtrip.
#![no_main]

use hawser_wire::frame::{
    checksum_reply_len, HelloInfo, FRAME_MAGIC, FRAME_VERSION, HEADER_LEN, MAX_CHECKSUM_BYTES,
};
use hawser_wire::journal::{Journal, StoredReport};
use hawser_wire::{FrameHeader, Op, Status};
use libfuzzer_sys::fuzz_target;

/// Decode a frame (header, then payload by kind). Returns the header if it decoded.
fn check(data: &[u8]) -> Option<FrameHeader> {
    let header = FrameHeader::decode(data).ok()?;
    let encoded = header.encode();
    assert_eq!(
        &encoded[..],
        &data[..HEADER_LEN],
        "decode/encode is not the identity"
    );
    assert_eq!(FrameHeader::decode(&encoded), Ok(header));
    assert!(header.flags & !0xf == 0, "unknown flag accepted");
    let payload = &data[HEADER_LEN..];
    if header.check_payload(payload).is_ok() {
        assert_eq!(payload.len(), header.payload_len as usize);
        payload_by_kind(&header, payload);
    }
    // Whatever the payload, a header that decoded says how much may follow.
    assert!(header.payload_len <= hawser_wire::constants::MAX_PAYLOAD_BYTES);
    Some(header)
}

fn payload_by_kind(h: &FrameHeader, payload: &[u8]) {
    match (h.op, h.is_reply()) {
        (Op::Hello, false) => {
            let _ = std::str::from_utf8(payload);
        }
        (Op::HelloSnapshot, false) => {
            if let Some(r) = hawser_wire::grant::HelloSnapshotRequest::decode(payload) {
                assert_eq!(r.encode(), payload);
            }
        }
        (Op::Hello | Op::HelloSnapshot, true) => {
            if let Some(info) = HelloInfo::decode(payload) {
                assert_eq!(&info.encode()[..], payload);
            }
        }
        (Op::Write, false) => assert_eq!(h.payload_len, h.length),
        (Op::Read, true) => assert!(payload.is_empty() || payload.len() == h.length as usize),
        (Op::PutJournal, false) => {
            assert_eq!(h.payload_len, h.length);
            if let Ok(j) = Journal::decode(payload) {
                let bytes = j.encode().expect("a decoded journal re-encodes");
                assert_eq!(bytes.as_slice(), payload);
            }
        }
        (Op::GetJournal, true) => {
            if let Ok(r) = StoredReport::decode(payload) {
                let bytes = r.encode().expect("a decoded report re-encodes");
                assert_eq!(bytes.as_slice(), payload);
            }
        }
        (Op::Checksum, true) => assert!(
            payload.is_empty()
                || (h.length <= MAX_CHECKSUM_BYTES
                    && payload.len() == checksum_reply_len(h.length) as usize)
        ),
        _ => assert!(payload.is_empty(), "{:?} carried a payload", h.op),
    }
}

/// A header built by the encoder from the input's bytes, with the input's tail as payload.
fn built(data: &[u8]) -> Option<Vec<u8>> {
    let (fields, payload) = data.split_at_checked(32)?;
    let u64_at = |i: usize| u64::from_le_bytes(fields[i..i + 8].try_into().expect("8 bytes"));
    let op = Op::from_u16(1 + u16::from(fields[0]) % 10)?;
    let status = Status::from_u32(u32::from(fields[1]) % 8)?;
    let mut h = FrameHeader::request(op, u64_at(8), u64_at(16), u64_at(24), 0);
    h.flags = u32::from(fields[2]) & 0xf;
    h.status = status;
    // Lengths that fit the payload (the common case) or the input's own.
    h.length = match fields[3] % 4 {
        0 => u32::try_from(payload.len()).ok()?,
        // Checksum requests and replies count in 64 KiB blocks.
        1 => u32::from(fields[4]) << 16,
        _ => u32::from_le_bytes(fields[4..8].try_into().ok()?),
    };
    let h = h.with_payload(payload);
    let mut frame = h.encode().to_vec();
    frame.extend_from_slice(payload);
    Some(frame)
}

/// One frame of every kind, requests and replies, with the payloads they carry.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let frame = |h: FrameHeader, payload: &[u8]| {
        let mut b = h.with_payload(payload).encode().to_vec();
        b.extend_from_slice(payload);
        b
    };
    let req = |op, length| FrameHeader::request(op, 9, 3, 8192, length);
    let journal = hawser_fuzz::sample_journal();
    let report = StoredReport {
        journal: journal.clone(),
        rebooted: true,
    }
    .encode()
    .expect("sample report");
    let journal = journal.encode().expect("sample journal");
    let info = HelloInfo {
        size: 1 << 30,
        epoch: 3,
        generation: 5,
        boot_id: 0xb007,
    }
    .encode();
    let ok = |op, length| req(op, length).reply(Status::Ok);
    vec![
        ("hello", frame(req(Op::Hello, 0), b"r-1")),
        ("hello-reply", frame(ok(Op::Hello, 0), &info)),
        (
            "hello-stale",
            frame(req(Op::Hello, 0).reply(Status::StaleEpoch), &[]),
        ),
        ("read", frame(req(Op::Read, 4096), &[])),
        ("read-reply", frame(ok(Op::Read, 4096), &[0x5a; 4096])),
        ("write", frame(req(Op::Write, 512), &[0xa5; 512])),
        ("write-reply", frame(ok(Op::Write, 512), &[])),
        ("flush", frame(req(Op::Flush, 0), &[])),
        ("trim", frame(req(Op::Trim, 1 << 20), &[])),
        ("zeroes", frame(req(Op::WriteZeroes, 1 << 16), &[])),
        ("ping", frame(req(Op::Ping, 0), &[])),
        (
            "put-journal",
            frame(req(Op::PutJournal, journal.len() as u32), &journal),
        ),
        ("get-journal", frame(req(Op::GetJournal, 0), &[])),
        ("get-journal-reply", frame(ok(Op::GetJournal, 0), &report)),
        ("checksum", frame(req(Op::Checksum, 1 << 17), &[])),
        (
            "checksum-reply",
            frame(ok(Op::Checksum, 1 << 17), &[0x11; 32]),
        ),
    ]
}

fuzz_target!(init: hawser_fuzz::write_seeds(seeds), |data: &[u8]| {
    check(data);
    if data.len() >= HEADER_LEN {
        let mut patched = data.to_vec();
        patched[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        patched[4..6].copy_from_slice(&FRAME_VERSION.to_le_bytes());
        let crc = crc32c::crc32c(&patched[0..52]);
        patched[52..56].copy_from_slice(&crc.to_le_bytes());
        check(&patched);
    }
    if let Some(frame) = built(data) {
        if let Some(h) = check(&frame) {
            // The encoder's own frame: its payload checksum always matches.
            assert!(h.check_payload(&frame[HEADER_LEN..]).is_ok());
        }
    }
});
