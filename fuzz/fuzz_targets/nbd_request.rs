//! Fuzzes the NBD transmission request decoder: no input may panic, and whatever decodes must
//! encode back to the same 28 bytes.
#![no_main]

use hawser_wire::nbd::{Request, SimpleReply, REQUEST_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = Request::decode(data) {
        assert_eq!(Some(&req.encode()[..]), data.get(..REQUEST_LEN));
        let _ = req.payload_too_large();
    }
    if let Ok(reply) = SimpleReply::decode(data) {
        assert_eq!(SimpleReply::decode(&reply.encode()), Ok(reply));
    }
});
