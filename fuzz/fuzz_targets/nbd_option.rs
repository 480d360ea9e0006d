//! Fuzzes the NBD handshake decoders: client flags, option headers and the INFO/GO payload.
//! No input may panic; a decoded option header, option reply header or INFO/GO request must
//! survive an encode/decode roundtrip.
//!
//! The same input is also all a client sends to the agent's option haggling
//! (`nbd::handshake`) on a listener that requires TLS, over an in-memory pipe: before
//! STARTTLS only STARTTLS and ABORT may be acknowledged and nothing is listed or described;
//! after STARTTLS the haggle goes on over the same pipe (TLS itself is the end-to-end test
//! `tls_garbage.rs`'s business) for a client certificate that names volume `tg`, of a node
//! whose registry names `tg` and `other` but opens neither: only `tg` may be listed,
//! STARTTLS is never acknowledged again, and no export is ever entered.
#![no_main]

use std::sync::{Arc, OnceLock};

use hawser_agent::frontends::block::{BlockDevice, ExportRegistry};
use hawser_agent::nbd::handshake::{greet, haggle, Access, Haggled, Security};
use hawser_tls::{ClientScope, Peer};
use hawser_wire::nbd::{
    self, decode_client_flags, encode_option_reply, parse_name, InfoRequest, OptionHeader,
    OptionReply, INFO_BLOCK_SIZE, INFO_NAME, MAX_OPTION_PAYLOAD_BYTES, OPT_GO, REP_INFO,
};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
    // Client streams for the haggle: the client flags, then options.
    let option = |opt: u32, payload: &[u8]| {
        let mut b = OptionHeader {
            option: opt,
            len: payload.len() as u32,
        }
        .encode()
        .to_vec();
        b.extend_from_slice(payload);
        b
    };
    let tg = InfoRequest {
        name: "tg",
        info_types: vec![INFO_NAME],
    }
    .encode()
    .expect("a small request encodes");
    let stream = |options: &[Vec<u8>]| [vec![0, 0, 0, 3], options.concat()].concat();
    let starttls = stream(&[
        option(nbd::OPT_LIST, &[]),
        option(OPT_GO, &tg),
        option(nbd::OPT_STARTTLS, &[]),
        option(nbd::OPT_LIST, &[]),
        option(nbd::OPT_INFO, &tg),
        option(nbd::OPT_STARTTLS, &[]),
        option(OPT_GO, &tg),
    ]);
    let starttls_data = stream(&[
        option(nbd::OPT_STARTTLS, b"tls"),
        option(nbd::OPT_STARTTLS, &[]),
        option(nbd::OPT_ABORT, &[]),
    ]);
    let before_tls = stream(&[
        option(nbd::OPT_INFO, &tg),
        option(nbd::OPT_STRUCTURED_REPLY, &[]),
        option(nbd::OPT_EXPORT_NAME, b"tg"),
    ]);
    vec![
        ("haggle-starttls", starttls),
        ("haggle-starttls-with-data", starttls_data),
        ("haggle-before-starttls", before_tls),
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

/// A node's exports by name, none of which opens (`tg` is the client certificate's).
struct Names;

impl ExportRegistry for Names {
    fn lookup(&self, _: &str) -> Option<Arc<dyn BlockDevice>> {
        None
    }

    fn names(&self) -> Vec<String> {
        vec!["tg".into(), "other".into()]
    }
}

/// Runs the haggle of a TLS listener on `data` (see the module's documentation) and checks
/// every reply it sent.
fn haggle_with_starttls(data: &[u8]) {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let rt = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    });
    let out = rt.block_on(async {
        // Room for every reply of the longest haggle: the server never waits for the client.
        let (mut client, mut server) = tokio::io::duplex(1 << 24);
        client
            .write_all(data)
            .await
            .expect("the pipe holds the input");
        client.shutdown().await.expect("end the input");
        let none = |peer| Access::Certificate {
            here: "n1".into(),
            peer,
        };
        if let Ok(no_zeroes) = greet(&mut server).await {
            let plain = Security::TlsRequired;
            let first = haggle(&mut server, &Names, &none(None), plain, no_zeroes).await;
            assert!(
                !matches!(first, Ok(Haggled::Export(_))),
                "an export before TLS"
            );
            if matches!(first, Ok(Haggled::StartTls)) {
                let scope = ClientScope::new(&["tg".into()], None).expect("a scope");
                let tg = none(Some(Peer::Client(scope)));
                let then = haggle(&mut server, &Names, &tg, Security::Tls, no_zeroes).await;
                assert!(
                    !matches!(then, Ok(Haggled::Export(_))),
                    "an export that is not"
                );
            }
        }
        drop(server);
        let mut out = Vec::new();
        client
            .read_to_end(&mut out)
            .await
            .expect("read the replies");
        out
    });
    let mut rest = out.get(nbd::GREETING_LEN..).unwrap_or_default();
    let mut tls = false;
    while !rest.is_empty() {
        let reply = OptionReply::decode(rest).expect("a whole option reply header");
        let end = nbd::OPTION_REPLY_HEADER_LEN + reply.len as usize;
        let body = rest
            .get(nbd::OPTION_REPLY_HEADER_LEN..end)
            .expect("a whole reply");
        let starttls = reply.option == nbd::OPT_STARTTLS;
        if tls {
            assert!(
                !(starttls && reply.reply_type == nbd::REP_ACK),
                "STARTTLS in TLS"
            );
            if reply.reply_type == nbd::REP_SERVER {
                assert_eq!(body.get(4..), Some(&b"tg"[..]), "listed: {body:?}");
            }
        } else {
            let allowed = match reply.reply_type {
                nbd::REP_ERR_TLS_REQD => !starttls,
                nbd::REP_ERR_INVALID => starttls,
                nbd::REP_ACK => starttls || reply.option == nbd::OPT_ABORT,
                _ => false,
            };
            assert!(allowed, "{reply:?} before STARTTLS");
            tls = starttls && reply.reply_type == nbd::REP_ACK;
        }
        rest = &rest[end..];
    }
}

fuzz_target!(init: hawser_fuzz::write_seeds(seeds), |data: &[u8]| {
    haggle_with_starttls(data);
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
