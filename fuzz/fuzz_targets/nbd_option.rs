//! Fuzzes the NBD handshake decoders: client flags, option headers and the INFO/GO payload.
//! No input may panic, and a decoded INFO/GO request must survive an encode/decode roundtrip.
#![no_main]

use hawser_wire::nbd::{
    decode_client_flags, parse_name, InfoRequest, OptionHeader, OptionReply,
    MAX_OPTION_PAYLOAD_BYTES,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_client_flags(data);
    let _ = OptionReply::decode(data);
    let _ = parse_name(data);
    if let Ok(header) = OptionHeader::decode(data) {
        assert!(header.len <= MAX_OPTION_PAYLOAD_BYTES);
        assert_eq!(OptionHeader::decode(&header.encode()), Ok(header));
    }
    if let Ok(request) = InfoRequest::decode(data) {
        let bytes = request.encode().expect("a decoded request re-encodes");
        assert_eq!(bytes.as_slice(), data);
        assert_eq!(InfoRequest::decode(&bytes), Ok(request));
    }
});
