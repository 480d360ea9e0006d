//! Fuzzes the NBD transmission request decoder: no input may panic, and whatever decodes must
//! encode back to the same 28 bytes.
#![no_main]

use hawser_wire::nbd::{Command, Request, SimpleReply, CMD_FLAG_FUA, REQUEST_LEN};
use libfuzzer_sys::fuzz_target;

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let req = |command, flags, length| Request {
        flags,
        command,
        handle: 0x1234,
        offset: 1 << 20,
        length,
    };
    vec![
        ("read", req(Command::Read, 0, 4096).encode().to_vec()),
        (
            "write-fua",
            req(Command::Write, CMD_FLAG_FUA, 65536).encode().to_vec(),
        ),
        ("flush", req(Command::Flush, 0, 0).encode().to_vec()),
        ("trim", req(Command::Trim, 0, 1 << 20).encode().to_vec()),
        (
            "zeroes",
            req(Command::WriteZeroes, 0, 8192).encode().to_vec(),
        ),
        ("disc", req(Command::Disc, 0, 0).encode().to_vec()),
        (
            "reply",
            SimpleReply {
                error: 5,
                handle: 7,
            }
            .encode()
            .to_vec(),
        ),
    ]
}

fuzz_target!(init: hawser_fuzz::write_seeds(seeds), |data: &[u8]| {
    if let Ok(req) = Request::decode(data) {
        assert_eq!(Some(&req.encode()[..]), data.get(..REQUEST_LEN));
        let _ = req.payload_too_large();
    }
    if let Ok(reply) = SimpleReply::decode(data) {
        assert_eq!(SimpleReply::decode(&reply.encode()), Ok(reply));
    }
});
