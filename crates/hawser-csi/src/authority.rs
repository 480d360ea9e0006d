//! The kubelet's plugin-registration client (grpc-go, dialing a bare socket path) sends the
//! socket's path as the HTTP/2 `:authority`. That is no valid authority, and the HTTP/2
//! server under tonic (h2) refuses the request (PROTOCOL_ERROR): kubernetes/kubernetes#109081;
//! the kubelet's CSI calls were fixed to send `localhost`, its registration calls were not.
//!
//! So the registration socket's connections pass through this relay: the client's header
//! blocks are decoded (HPACK, with the connection's own dynamic table), `:authority` becomes
//! `localhost`, and each block is encoded again with an encoder of this connection; every
//! other frame and the server's whole direction pass through unchanged.

use fluke_hpack::{Decoder, Encoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::UnixStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The default SETTINGS_MAX_FRAME_SIZE: rewritten blocks are cut into frames of this size.
const MAX_FRAME: usize = 16_384;
/// A header block larger than this is refused (the registration calls send a few hundred
/// bytes).
const MAX_BLOCK: usize = 64 * 1024;
const RELAY_BUFFER: usize = 64 * 1024;

/// Relays `client` to a new in-memory stream for the gRPC server; returns the server's end.
pub fn relay(client: UnixStream) -> DuplexStream {
    let (server_end, relay_end) = tokio::io::duplex(RELAY_BUFFER);
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut relay_rd, mut relay_wr) = tokio::io::split(relay_end);
    tokio::spawn(async move {
        if let Err(e) = rewrite_requests(&mut client_rd, &mut relay_wr).await {
            tracing::debug!(error = %e, "registration connection ended");
        }
        let _ = relay_wr.shutdown().await;
    });
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut relay_rd, &mut client_wr).await;
        let _ = client_wr.shutdown().await;
    });
    server_end
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

async fn rewrite_requests(
    rd: &mut (impl tokio::io::AsyncRead + Unpin),
    wr: &mut (impl tokio::io::AsyncWrite + Unpin),
) -> std::io::Result<()> {
    let mut preface = [0u8; PREFACE.len()];
    rd.read_exact(&mut preface).await?;
    if preface != PREFACE {
        return Err(bad("not an HTTP/2 connection preface"));
    }
    wr.write_all(&preface).await?;
    let mut decoder = Decoder::new();
    let mut encoder = Encoder::new();
    // A header block being collected: (stream id, END_STREAM, fragments so far).
    let mut pending: Option<(u32, bool, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; FRAME_HEADER];
        match rd.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        if len > MAX_BLOCK {
            return Err(bad("frame too large"));
        }
        let mut payload = vec![0u8; len];
        rd.read_exact(&mut payload).await?;
        match kind {
            HEADERS => {
                let fragment = headers_fragment(&payload, flags)?;
                pending = Some((stream, flags & END_STREAM != 0, fragment.to_vec()));
            }
            CONTINUATION => match pending.as_mut() {
                Some((s, _, block)) if *s == stream && block.len() + len <= MAX_BLOCK => {
                    block.extend_from_slice(&payload)
                }
                _ => return Err(bad("unexpected CONTINUATION")),
            },
            _ => {
                if pending.is_some() {
                    return Err(bad("frame inside a header block"));
                }
                wr.write_all(&head).await?;
                wr.write_all(&payload).await?;
                continue;
            }
        }
        if flags & END_HEADERS != 0 {
            if let Some((s, end_stream, block)) = pending.take() {
                let fixed = fix_authority(&mut decoder, &mut encoder, &block)?;
                write_block(wr, s, end_stream, &fixed).await?;
            }
        }
    }
}

/// The header block fragment of a HEADERS frame, without padding and priority fields.
fn headers_fragment(payload: &[u8], flags: u8) -> std::io::Result<&[u8]> {
    let mut from = 0;
    let mut pad = 0;
    if flags & PADDED != 0 {
        pad = usize::from(*payload.first().ok_or_else(|| bad("short HEADERS"))?);
        from += 1;
    }
    if flags & PRIORITY != 0 {
        from += 5;
    }
    let end = payload
        .len()
        .checked_sub(pad)
        .ok_or_else(|| bad("bad padding"))?;
    payload.get(from..end).ok_or_else(|| bad("short HEADERS"))
}

fn fix_authority(
    decoder: &mut Decoder<'_>,
    encoder: &mut Encoder<'_>,
    block: &[u8],
) -> std::io::Result<Vec<u8>> {
    let mut headers = decoder
        .decode(block)
        .map_err(|e| bad(&format!("HPACK: {e:?}")))?;
    for (name, value) in &mut headers {
        if name.as_slice() == b":authority" {
            *value = b"localhost".to_vec();
        }
    }
    Ok(encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))))
}

async fn write_block(
    wr: &mut (impl tokio::io::AsyncWrite + Unpin),
    stream: u32,
    end_stream: bool,
    block: &[u8],
) -> std::io::Result<()> {
    let chunks: Vec<&[u8]> = if block.is_empty() {
        vec![&[][..]]
    } else {
        block.chunks(MAX_FRAME).collect()
    };
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let mut flags = if i == last { END_HEADERS } else { 0 };
        if i == 0 && end_stream {
            flags |= END_STREAM;
        }
        let len = u32::try_from(chunk.len()).map_err(|_| bad("block too large"))?;
        let mut head = [0u8; FRAME_HEADER];
        head[..3].copy_from_slice(&len.to_be_bytes()[1..]);
        head[3] = kind;
        head[4] = flags;
        head[5..].copy_from_slice(&stream.to_be_bytes());
        wr.write_all(&head).await?;
        wr.write_all(chunk).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authority_is_replaced_and_other_headers_kept() {
        let mut client = Encoder::new();
        let sent = [
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (
                b":authority",
                b"/var/lib/kubelet/plugins_registry/x-reg.sock",
            ),
            (b"content-type", b"application/grpc"),
        ];
        let (mut d, mut e, mut server) = (Decoder::new(), Encoder::new(), Decoder::new());
        // Twice: the second block refers to the client's dynamic table.
        for _ in 0..2 {
            let block = client.encode(sent.iter().copied());
            let fixed = fix_authority(&mut d, &mut e, &block).unwrap_or_else(|e| panic!("{e}"));
            let got = server.decode(&fixed).unwrap_or_else(|e| panic!("{e:?}"));
            let authority = got.iter().find(|(n, _)| n == b":authority").map(|h| &h.1);
            assert_eq!(authority.map(Vec::as_slice), Some(&b"localhost"[..]));
            assert_eq!(got.len(), sent.len());
            assert!(got
                .iter()
                .any(|(n, v)| n == b":path" && v.ends_with(b"GetInfo")));
        }
        assert!(headers_fragment(&[5, 1, 2], PADDED).is_err());
        assert_eq!(headers_fragment(&[1, 7, 0], PADDED).ok(), Some(&[7][..]));
    }
}
