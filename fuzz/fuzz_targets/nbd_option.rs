//! Fuzzes the NBD handshake decoders: client flags, option headers and the INFO/GO payload.
//! No input may panic; a decoded option header, option reply header or INFO/GO request must
//! survive an encode/decode roundtrip.
#![no_main]

use hawser_wire::nbd::{
    decode_client_flags, encode_option_reply, parse_name, InfoRequest, OptionHeader, OptionReply,
    INFO_BLOCK_SIZE, INFO_NAME, MAX_OPTION_PAYLOAD_BYTES, OPT_GO, REP_INFO,
};
use libfuzzer_sys::fuzz_target;

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let info = InfoRequest {
        name: "volume-a",
        info_types: vec![INFO_NAME, INFO_BLOCK_SIZE],
    }
    .encode()
    .expect("a small request encodes");
    let header = OptionHeader {
        option: OPT_GO,
        len: info.len() as u32,
    };
    let mut go = header.encode().to_vec();
    go.extend_from_slice(&info);
    vec![
        ("client-flags", vec![0, 0, 0, 3]),
        ("go", go),
        ("info-request", info),
        ("export-name", b"volume-a".to_vec()),
        (
            "option-reply",
            encode_option_reply(OPT_GO, REP_INFO, 12).to_vec(),
        ),
    ]
}

fuzz_target!(init: hawser_fuzz::write_seeds(seeds), |data: &[u8]| {
    let _ = decode_client_flags(data);
    if let Ok(reply) = OptionReply::decode(data) {
        let bytes = encode_option_reply(reply.option, reply.reply_type, reply.len);
        assert_eq!(OptionReply::decode(&bytes), Ok(reply));
    }
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
