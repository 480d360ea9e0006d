//! Fixed newstyle NBD option haggling: from the server greeting to the export a client chose.
//!
//! Hawser speaks only fixed newstyle and only simple replies. Understood options are
//! `EXPORT_NAME`, `ABORT`, `LIST`, `INFO`, `GO` and, on a listener with TLS, `STARTTLS`;
//! everything else (structured replies, metadata contexts, extended headers) is answered with
//! `NBD_REP_ERR_UNSUP` and the client may carry on.
//!
//! A listener with TLS requires it (the spec's "forced TLS"): before `STARTTLS`, `LIST`,
//! `INFO` and `GO` get `NBD_REP_ERR_TLS_REQD` (no export is named to an unauthenticated
//! client) and `EXPORT_NAME` closes the connection. After `STARTTLS` is acknowledged the
//! caller runs the TLS handshake and haggling goes on inside it, without a new greeting.
//! Inside TLS a client sees and opens only the exports its certificate names ([`Access`]):
//! `LIST` leaves the others out and `INFO`/`GO` for them get `NBD_REP_ERR_POLICY`, whether
//! or not they exist, so names cannot be probed. Malformed framing (bad magic, oversized
//! option, bad client flags) ends the connection, as does `EXPORT_NAME` for an unknown or
//! refused export, which cannot carry an error reply.
//!
//! The empty export name is not a default export: Hawser exports are always named volumes,
//! and a client that forgot the name must get an error rather than some other volume.

use std::sync::Arc;

use hawser_tls::Peer;
use hawser_wire::constants::{BLOCK_BYTES, MAX_PAYLOAD_BYTES, SECTOR_BYTES};
use hawser_wire::nbd::{self, BlockSizes, InfoRequest, NbdError, OptionHeader};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::debug;

use crate::frontends::block::{BlockDevice, ExportIdentity, ExportRegistry};

/// Options a client may send before it must pick an export. A plain connect needs fewer than
/// ten, but `nbdinfo --list` sends one INFO per export, so this leaves room for a node with
/// hundreds of volumes while still bounding the work one connection can ask for.
pub const MAX_OPTIONS_PER_HANDSHAKE: u32 = 1024;

/// Transmission flags of every export. `CAN_MULTI_CONN` is honest because a flush goes to
/// every replica through the one engine that all connections to a volume share.
pub const TRANSMISSION_FLAGS: u16 = nbd::TFLAG_HAS_FLAGS
    | nbd::TFLAG_SEND_FLUSH
    | nbd::TFLAG_SEND_FUA
    | nbd::TFLAG_SEND_TRIM
    | nbd::TFLAG_SEND_WRITE_ZEROES
    | nbd::TFLAG_CAN_MULTI_CONN;

const _: () = assert!(SECTOR_BYTES <= u32::MAX as u64);
const _: () = assert!(BLOCK_BYTES <= u32::MAX as u64);

/// Block size constraints advertised with every export: requests must be sector aligned,
/// 4 KiB is what the replicas store natively, and one request carries at most 32 MiB.
#[allow(clippy::cast_possible_truncation)] // Both fit in u32: asserted at compile time above.
pub const BLOCK_SIZES: BlockSizes = BlockSizes {
    minimum: SECTOR_BYTES as u32,
    preferred: BLOCK_BYTES as u32,
    maximum: MAX_PAYLOAD_BYTES,
};

const HANDSHAKE_FLAGS: u16 = nbd::FLAG_FIXED_NEWSTYLE | nbd::FLAG_NO_ZEROES;

/// Why option haggling ended without an export. Every variant closes the connection.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("socket error during the handshake: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed handshake message: {0}")]
    Protocol(#[from] NbdError),
    #[error("client sent more than {MAX_OPTIONS_PER_HANDSHAKE} options")]
    TooManyOptions,
    #[error("NBD_OPT_EXPORT_NAME for unknown export {name:?}")]
    UnknownExport { name: String },
    #[error(
        "NBD_OPT_EXPORT_NAME for export {name:?}, which the client's certificate does not name"
    )]
    NotPermitted { name: String },
    #[error("NBD_OPT_EXPORT_NAME before STARTTLS on a listener that requires TLS")]
    TlsRequired,
    #[error("TLS handshake failed: {0}")]
    Tls(std::io::Error),
}

/// The export a client entered transmission with.
pub struct Negotiated {
    pub name: String,
    pub device: Arc<dyn BlockDevice>,
}

/// What one option led to.
enum Step {
    Continue,
    Transmission(Negotiated),
    Aborted,
    StartTls,
}

/// Where a connection stands as to TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Security {
    /// A listener without TLS: every option but STARTTLS.
    Plain,
    /// A listener with TLS, before STARTTLS: STARTTLS and ABORT only.
    TlsRequired,
    /// Inside TLS: every option; STARTTLS again is invalid.
    Tls,
}

/// Which exports a connection may see and open.
#[derive(Clone, Debug)]
pub enum Access {
    /// Every export: a listener without TLS (the node's own unix socket, or an `--insecure`
    /// agent's TCP port).
    All,
    /// What the client certificate verified by the TLS handshake names, at node `here`:
    /// only an NBD client certificate ([`Peer::Client`]) opens anything, and only its
    /// volumes. A node's or a controller's certificate opens nothing: none of them is an
    /// NBD client, and a node's key must not open volumes on every other node.
    Certificate { here: String, peer: Option<Peer> },
}

impl Access {
    /// Whether the client may open `export`, looked up as `found` (a certificate names the
    /// volume by uid too: a namesake is another volume). With no such export here, whether
    /// its certificate names one of that name: the client then hears "unknown", as it would
    /// have for a volume attached elsewhere, and others hear "not yours".
    pub fn admits(
        &self,
        export: &str,
        found: &Option<(Arc<dyn BlockDevice>, ExportIdentity)>,
    ) -> bool {
        match self {
            Access::All => true,
            Access::Certificate {
                here,
                peer: Some(Peer::Client(scope)),
            } => match found {
                Some((_, id)) => scope.admits(here, export, id.uid.as_deref()),
                None => scope.mentions(here, export),
            },
            Access::Certificate { .. } => false,
        }
    }
}

/// How haggling ended.
pub enum Haggled {
    Export(Negotiated),
    Aborted,
    /// STARTTLS was acknowledged: the TLS handshake comes next, then [`haggle`] again.
    StartTls,
}

/// Run the whole handshake of a listener without TLS. `Ok(None)` means the client aborted
/// politely.
pub async fn negotiate<S>(
    stream: &mut S,
    registry: &dyn ExportRegistry,
) -> Result<Option<Negotiated>, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let no_zeroes = greet(stream).await?;
    match haggle(stream, registry, &Access::All, Security::Plain, no_zeroes).await? {
        Haggled::Export(n) => Ok(Some(n)),
        Haggled::Aborted => Ok(None),
        // A plain listener answers STARTTLS with ERR_UNSUP; it never gets here.
        Haggled::StartTls => Ok(None),
    }
}

/// The server greeting and the client's flags; returns whether the client asked for no
/// zero padding.
pub async fn greet<S>(stream: &mut S) -> Result<bool, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream
        .write_all(&nbd::encode_greeting(HANDSHAKE_FLAGS))
        .await?;
    stream.flush().await?;
    let mut flags = [0u8; nbd::CLIENT_FLAGS_LEN];
    stream.read_exact(&mut flags).await?;
    let client_flags = nbd::decode_client_flags(&flags)?;
    Ok(client_flags & nbd::CLIENT_NO_ZEROES != 0)
}

/// Option haggling, until an export is chosen, the client aborts, or (`TlsRequired`) STARTTLS
/// is acknowledged. Only exports `access` admits are listed or opened.
pub async fn haggle<S>(
    stream: &mut S,
    registry: &dyn ExportRegistry,
    access: &Access,
    security: Security,
    no_zeroes: bool,
) -> Result<Haggled, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    for _ in 0..MAX_OPTIONS_PER_HANDSHAKE {
        let mut header = [0u8; nbd::OPTION_HEADER_LEN];
        stream.read_exact(&mut header).await?;
        let header = OptionHeader::decode(&header)?;
        // `decode` bounded the length by MAX_OPTION_PAYLOAD_BYTES, so this allocation is too.
        let mut payload = vec![0u8; usize::try_from(header.len).unwrap_or(0)];
        stream.read_exact(&mut payload).await?;
        let step = match security {
            Security::TlsRequired => before_tls(stream, header.option, &payload).await?,
            Security::Plain | Security::Tls if header.option == nbd::OPT_STARTTLS => {
                let (kind, msg): (u32, &[u8]) = if security == Security::Tls {
                    (nbd::REP_ERR_INVALID, b"TLS is already on")
                } else {
                    (nbd::REP_ERR_UNSUP, b"this listener has no TLS")
                };
                send_reply(stream, header.option, kind, msg).await?;
                Step::Continue
            }
            Security::Plain | Security::Tls => {
                let scoped = Scoped { registry, access };
                handle_option(stream, &scoped, header.option, &payload, no_zeroes).await?
            }
        };
        stream.flush().await?;
        match step {
            Step::Continue => {}
            Step::Transmission(n) => return Ok(Haggled::Export(n)),
            Step::Aborted => return Ok(Haggled::Aborted),
            Step::StartTls => return Ok(Haggled::StartTls),
        }
    }
    Err(HandshakeError::TooManyOptions)
}

/// An option before STARTTLS on a listener that requires TLS.
async fn before_tls<S>(stream: &mut S, option: u32, payload: &[u8]) -> Result<Step, HandshakeError>
where
    S: AsyncWrite + Unpin,
{
    match option {
        nbd::OPT_STARTTLS if payload.is_empty() => {
            send_reply(stream, option, nbd::REP_ACK, &[]).await?;
            Ok(Step::StartTls)
        }
        nbd::OPT_STARTTLS => {
            send_reply(
                stream,
                option,
                nbd::REP_ERR_INVALID,
                b"STARTTLS takes no data",
            )
            .await?;
            Ok(Step::Continue)
        }
        nbd::OPT_ABORT => {
            let _ = send_reply(stream, option, nbd::REP_ACK, &[]).await;
            Ok(Step::Aborted)
        }
        // It cannot carry an error reply; the spec says to close.
        nbd::OPT_EXPORT_NAME => Err(HandshakeError::TlsRequired),
        _ => {
            send_reply(
                stream,
                option,
                nbd::REP_ERR_TLS_REQD,
                b"TLS required: STARTTLS with a certificate of the cluster",
            )
            .await?;
            Ok(Step::Continue)
        }
    }
}

async fn handle_option<S>(
    stream: &mut S,
    exports: &Scoped<'_>,
    option: u32,
    payload: &[u8],
    no_zeroes: bool,
) -> Result<Step, HandshakeError>
where
    S: AsyncWrite + Unpin,
{
    match option {
        nbd::OPT_EXPORT_NAME => {
            let name = nbd::parse_name(payload)?;
            let found = lookup(exports.registry, name);
            if !exports.access.admits(name, &found) {
                return Err(HandshakeError::NotPermitted {
                    name: name.to_owned(),
                });
            }
            let Some((device, _)) = found else {
                return Err(HandshakeError::UnknownExport {
                    name: name.to_owned(),
                });
            };
            let reply = nbd::encode_export_name_reply(device.size(), TRANSMISSION_FLAGS, no_zeroes);
            stream.write_all(&reply).await?;
            Ok(Step::Transmission(Negotiated {
                name: name.to_owned(),
                device,
            }))
        }
        nbd::OPT_ABORT => {
            // The spec lets the client close without reading this ACK; a failed write is fine.
            let _ = send_reply(stream, option, nbd::REP_ACK, &[]).await;
            Ok(Step::Aborted)
        }
        nbd::OPT_LIST => {
            if !payload.is_empty() {
                send_reply(stream, option, nbd::REP_ERR_INVALID, b"LIST takes no data").await?;
            } else {
                send_list(stream, exports).await?;
            }
            Ok(Step::Continue)
        }
        nbd::OPT_INFO | nbd::OPT_GO => handle_info(stream, exports, option, payload).await,
        other => {
            debug!(option = other, "unsupported NBD option");
            send_reply(stream, other, nbd::REP_ERR_UNSUP, b"option not supported").await?;
            Ok(Step::Continue)
        }
    }
}

/// `NBD_OPT_INFO` and `NBD_OPT_GO`: describe the export; GO then enters transmission.
async fn handle_info<S>(
    stream: &mut S,
    exports: &Scoped<'_>,
    option: u32,
    payload: &[u8],
) -> Result<Step, HandshakeError>
where
    S: AsyncWrite + Unpin,
{
    let request = match InfoRequest::decode(payload) {
        Ok(r) => r,
        Err(e) => {
            debug!(option, error = %e, "malformed INFO/GO payload");
            let msg = e.to_string();
            send_reply(stream, option, nbd::REP_ERR_INVALID, msg.as_bytes()).await?;
            return Ok(Step::Continue);
        }
    };
    let found = lookup(exports.registry, request.name);
    if !exports.access.admits(request.name, &found) {
        debug!(
            export = request.name,
            "export refused to this client certificate"
        );
        let msg = format!(
            "this client's certificate does not open export {:?}",
            request.name
        );
        send_reply(stream, option, nbd::REP_ERR_POLICY, msg.as_bytes()).await?;
        return Ok(Step::Continue);
    }
    let Some((device, _)) = found else {
        let msg = format!("no export named {:?}", request.name);
        send_reply(stream, option, nbd::REP_ERR_UNKNOWN, msg.as_bytes()).await?;
        return Ok(Step::Continue);
    };
    let export = nbd::encode_info_export(device.size(), TRANSMISSION_FLAGS);
    send_reply(stream, option, nbd::REP_INFO, &export).await?;
    // Sent even when not requested (the spec allows it for GO): a client that ignores it
    // still only sends sector-aligned requests of at most 32 MiB or gets EINVAL back.
    let sizes = nbd::encode_info_block_size(BLOCK_SIZES);
    send_reply(stream, option, nbd::REP_INFO, &sizes).await?;
    if request.info_types.contains(&nbd::INFO_NAME) {
        if let Some(name) = nbd::encode_info_name(request.name) {
            send_reply(stream, option, nbd::REP_INFO, &name).await?;
        }
    }
    send_reply(stream, option, nbd::REP_ACK, &[]).await?;
    if option == nbd::OPT_GO {
        let name = request.name.to_owned();
        return Ok(Step::Transmission(Negotiated { name, device }));
    }
    Ok(Step::Continue)
}

/// `NBD_OPT_LIST`: one `NBD_REP_SERVER` per export the client may open, then ACK.
async fn send_list<S>(stream: &mut S, exports: &Scoped<'_>) -> std::io::Result<()>
where
    S: AsyncWrite + Unpin,
{
    let names = exports.registry.names();
    let listed = names.into_iter().filter(|n| {
        let found = lookup(exports.registry, n);
        found.is_some() && exports.access.admits(n, &found)
    });
    for name in listed {
        match nbd::encode_rep_server(&name) {
            Some(entry) => send_reply(stream, nbd::OPT_LIST, nbd::REP_SERVER, &entry).await?,
            None => debug!(len = name.len(), "export name too long for NBD; not listed"),
        }
    }
    send_reply(stream, nbd::OPT_LIST, nbd::REP_ACK, &[]).await
}

/// The exports of one connection: the node's, seen through what the client may open.
struct Scoped<'a> {
    registry: &'a dyn ExportRegistry,
    access: &'a Access,
}

fn lookup(
    registry: &dyn ExportRegistry,
    name: &str,
) -> Option<(Arc<dyn BlockDevice>, ExportIdentity)> {
    if name.is_empty() {
        return None;
    }
    registry.lookup_identified(name)
}

/// One option reply: header and payload in a single write.
async fn send_reply<S>(
    stream: &mut S,
    option: u32,
    kind: u32,
    payload: &[u8],
) -> std::io::Result<()>
where
    S: AsyncWrite + Unpin,
{
    // Payloads are built here from bounded names and fixed-size records, far below u32::MAX.
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut msg = Vec::with_capacity(nbd::OPTION_REPLY_HEADER_LEN + payload.len());
    msg.extend_from_slice(&nbd::encode_option_reply(option, kind, len));
    msg.extend_from_slice(payload);
    stream.write_all(&msg).await
}
