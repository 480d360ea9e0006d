//! Fuzzes the replica frame header decoder and payload check. Random bytes almost never carry
//! a valid header checksum, so each input is also tried with magic, version and checksum
//! patched in, which lets the fuzzer reach the opcode, flag and length checks behind them.
#![no_main]

use hawser_wire::frame::{FRAME_MAGIC, FRAME_VERSION, HEADER_LEN};
use hawser_wire::FrameHeader;
use libfuzzer_sys::fuzz_target;

fn check(data: &[u8]) {
    if let Ok(header) = FrameHeader::decode(data) {
        let payload = data.get(HEADER_LEN..).unwrap_or_default();
        let _ = header.check_payload(payload);
        assert_eq!(FrameHeader::decode(&header.encode()), Ok(header));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= HEADER_LEN {
        let mut patched = data.to_vec();
        patched[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        patched[4..6].copy_from_slice(&FRAME_VERSION.to_le_bytes());
        let crc = crc32c::crc32c(&patched[0..52]);
        patched[52..56].copy_from_slice(&crc.to_le_bytes());
        check(&patched);
    }
});
