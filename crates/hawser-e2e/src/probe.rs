//! Probes of a listener with one credential, for the tests that show who each port admits
//! (`tests/port_matrix.rs`): an HTTPS call, an NBD option haggle (in clear, or STARTTLS then
//! TLS) up to `NBD_OPT_GO`, a replica Hello, and a connection that sends nothing. Each says
//! only whether the thing was opened; refusals of every kind (no handshake, a closed
//! connection, an error reply, an HTTP error) are "not opened". The NBD steps they are made
//! of (greeting, one option, STARTTLS) are public for tests that take the haggle apart
//! (`tests/tls_garbage.rs`).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use hawser_tls::rustls;
use hawser_tls::{CertSlot, Credentials, Peer};
use hawser_wire::frame::{FrameHeader, Op, Status, HEADER_LEN};
use hawser_wire::nbd;

use crate::peer_conn::Conn;

/// How long a probe waits for any one answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a client brings to a TLS handshake.
#[derive(Clone)]
pub enum Tls {
    /// No TLS at all.
    Plain,
    /// TLS trusting `ca_pem`, expecting the server to be `expect`, presenting `creds` if any.
    With {
        ca_pem: String,
        expect: Peer,
        creds: Option<Credentials>,
    },
}

impl Tls {
    /// The rustls configuration of this client; `None` for [`Tls::Plain`].
    pub fn client_config(&self) -> Option<Arc<rustls::ClientConfig>> {
        match self {
            Tls::Plain => None,
            Tls::With {
                ca_pem,
                expect,
                creds,
            } => {
                let slot = creds
                    .as_ref()
                    .map(|c| CertSlot::new(c).expect("the probe's credentials load"));
                Some(
                    hawser_tls::client_config(ca_pem, expect.clone(), slot)
                        .expect("the probe's client configuration"),
                )
            }
        }
    }
}

/// An HTTP call's status, or `None` when no HTTP answer came (TLS refused, connection
/// closed). `addr` is `host:port`; the scheme follows `tls`.
pub fn http_status(
    tls: &Tls,
    method: reqwest::Method,
    addr: &str,
    path: &str,
    bearer: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<serde_json::Value>,
) -> Option<u16> {
    let mut b = reqwest::blocking::Client::builder().timeout(PROBE_TIMEOUT);
    let scheme = match tls.client_config() {
        Some(config) => {
            b = b.use_preconfigured_tls((*config).clone());
            "https"
        }
        None => "http",
    };
    let http = b.build().expect("the probe's HTTP client");
    let mut req = http.request(method, format!("{scheme}://{addr}{path}"));
    if let Some(t) = bearer {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    req.send().ok().map(|r| r.status().as_u16())
}

/// Connects to `addr`, sends nothing, closes its sending side and reads what the server
/// says until it closes: the bytes it sent. A server that holds the connection past
/// [`PROBE_TIMEOUT`] gives what it sent until then.
pub fn send_nothing(addr: &str) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(PROBE_TIMEOUT)).expect("timeout");
    let _ = s.shutdown(Shutdown::Write);
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

/// A stream a probe speaks over: TCP, a unix socket, or TLS on TCP.
pub trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

fn tls_over(tcp: TcpStream, config: Arc<rustls::ClientConfig>) -> Box<dyn Stream> {
    Box::new(Conn::tls(tcp, config).expect("a TLS client"))
}

/// A TCP connection to the NBD listener `addr` (read timeout [`PROBE_TIMEOUT`]) greeted
/// (fixed newstyle, no zeroes).
pub fn nbd_greeted(addr: &str) -> std::io::Result<TcpStream> {
    let mut tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(PROBE_TIMEOUT))?;
    nbd_greet(&mut tcp)?;
    Ok(tcp)
}

/// [`nbd_greeted`], then `NBD_OPT_STARTTLS` acknowledged: the TLS handshake comes next.
pub fn nbd_starttls(addr: &str) -> std::io::Result<TcpStream> {
    let mut tcp = nbd_greeted(addr)?;
    match nbd_option(&mut tcp, nbd::OPT_STARTTLS, &[])? {
        nbd::REP_ACK => Ok(tcp),
        other => Err(std::io::Error::other(format!(
            "STARTTLS answered {other:#x}"
        ))),
    }
}

/// An NBD connection to the TCP listener `addr` up to option haggling: with TLS it asks for
/// STARTTLS first and goes on inside TLS. `None` if the greeting or TLS failed.
fn nbd_tcp(addr: &str, tls: &Tls) -> Option<Box<dyn Stream>> {
    match tls.client_config() {
        None => Some(Box::new(nbd_greeted(addr).ok()?)),
        Some(config) => Some(tls_over(nbd_starttls(addr).ok()?, config)),
    }
}

/// Whether the TCP listener `addr` serves an NBD client with `tls` at all: it answers
/// `NBD_OPT_LIST` (with whatever list). Before STARTTLS a TLS listener refuses it, and a
/// refused TLS handshake ends the connection.
pub fn nbd_tcp_session(addr: &str, tls: &Tls) -> bool {
    nbd_tcp(addr, tls).is_some_and(|mut s| list_answered(&mut s))
}

/// Whether an NBD client with `tls` opens `export` at the TCP listener `addr`: an ACK to
/// `NBD_OPT_GO` means it would enter transmission.
pub fn nbd_tcp_opens(addr: &str, tls: &Tls, export: &str) -> bool {
    nbd_tcp(addr, tls).is_some_and(|mut s| nbd_go(&mut s, export))
}

fn nbd_unix(path: &std::path::Path) -> Option<Box<dyn Stream>> {
    let s = std::os::unix::net::UnixStream::connect(path).ok()?;
    s.set_read_timeout(Some(PROBE_TIMEOUT)).ok()?;
    let mut s: Box<dyn Stream> = Box::new(s);
    nbd_greet(&mut s).ok()?;
    Some(s)
}

/// Whether the unix socket `path` serves this process (`NBD_OPT_LIST` answered).
pub fn nbd_unix_session(path: &std::path::Path) -> bool {
    nbd_unix(path).is_some_and(|mut s| list_answered(&mut s))
}

/// Whether a client of the unix socket `path` opens `export` (plain NBD, no TLS).
pub fn nbd_unix_opens(path: &std::path::Path, export: &str) -> bool {
    nbd_unix(path).is_some_and(|mut s| nbd_go(&mut s, export))
}

fn list_answered(s: &mut impl Stream) -> bool {
    nbd_option(s, nbd::OPT_LIST, &[]).ok() == Some(nbd::REP_ACK)
}

/// Reads the server's greeting and answers with fixed newstyle and no zeroes.
pub fn nbd_greet(s: &mut impl Stream) -> std::io::Result<()> {
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello)?;
    let ok =
        hello[..8] == nbd::NBDMAGIC.to_be_bytes() && hello[8..16] == nbd::IHAVEOPT.to_be_bytes();
    if !ok {
        return Err(std::io::Error::other("not an NBD newstyle greeting"));
    }
    let flags = nbd::CLIENT_FIXED_NEWSTYLE | nbd::CLIENT_NO_ZEROES;
    s.write_all(&flags.to_be_bytes())
}

/// Sends one option and reads its replies up to the last: the final reply's type (ACK, or
/// an error). INFO and SERVER replies before it are skipped.
pub fn nbd_option(s: &mut impl Stream, opt: u32, payload: &[u8]) -> std::io::Result<u32> {
    s.write_all(&nbd_option_bytes(opt, payload))?;
    s.flush()?;
    for _ in 0..64 {
        let (kind, _) = nbd_reply(s)?;
        if kind != nbd::REP_INFO && kind != nbd::REP_SERVER {
            return Ok(kind);
        }
    }
    Err(std::io::Error::other("too many option replies"))
}

/// One option as a client sends it: `IHAVEOPT`, the option, its length, `payload`.
pub fn nbd_option_bytes(opt: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("an option payload under 4 GiB");
    let mut msg = nbd::OptionHeader { option: opt, len }.encode().to_vec();
    msg.extend_from_slice(payload);
    msg
}

/// Reads one option reply: its type and data.
pub fn nbd_reply(s: &mut impl Read) -> std::io::Result<(u32, Vec<u8>)> {
    let mut h = [0u8; nbd::OPTION_REPLY_HEADER_LEN];
    s.read_exact(&mut h)?;
    let reply = nbd::OptionReply::decode(&h).map_err(std::io::Error::other)?;
    if reply.len > 1 << 20 {
        return Err(std::io::Error::other("an option reply over 1 MiB"));
    }
    let mut data = vec![0u8; reply.len as usize];
    s.read_exact(&mut data)?;
    Ok((reply.reply_type, data))
}

/// `NBD_OPT_GO` for `export`: whether the server acknowledged it (the connection is then in
/// transmission).
pub fn nbd_go(s: &mut impl Stream, export: &str) -> bool {
    let payload = nbd::InfoRequest {
        name: export,
        info_types: vec![],
    }
    .encode()
    .expect("a short export name");
    nbd_option(s, nbd::OPT_GO, &payload).ok() == Some(nbd::REP_ACK)
}

/// The status a replica server answers a Hello with (`payload` a `HelloRequest`), or
/// `None` when no answer came (no handshake, closed).
pub fn replica_hello(addr: &str, tls: &Tls, epoch: u64, payload: &[u8]) -> Option<Status> {
    let tcp = TcpStream::connect(addr).ok()?;
    tcp.set_read_timeout(Some(PROBE_TIMEOUT)).ok()?;
    let mut s: Box<dyn Stream> = match tls.client_config() {
        None => Box::new(tcp),
        Some(config) => tls_over(tcp, config),
    };
    let h = FrameHeader::request(Op::Hello, 1, epoch, 0, 0).with_payload(payload);
    let mut frame = h.encode().to_vec();
    frame.extend_from_slice(payload);
    s.write_all(&frame).ok()?;
    s.flush().ok()?;
    let mut reply = [0u8; HEADER_LEN];
    s.read_exact(&mut reply).ok()?;
    FrameHeader::decode(&reply).ok().map(|h| h.status)
}
