//! Issue 39, item 7: garbage at the TLS layer of every TLS port, and NBD's STARTTLS
//! negotiation abused, against the real binaries (a controller and two agents, TLS by
//! default as `make demo` runs them, one volume attached at n1 with known data).
//!
//! `bad_input.rs` sends garbage in each port's own protocol, in clear (which a TLS port
//! refuses at its first byte) or inside an authenticated session. What lies between is
//! tested here: the TLS handshake itself, and on NBD the plaintext haggle that leads to it.
//!
//! On every TLS port (the controller's API; each agent's admin API, replica port and NBD
//! port, where TLS begins after an acknowledged `NBD_OPT_STARTTLS`), [`TRIALS`] times:
//! - random bytes instead of a ClientHello: the server closes, having sent alerts at most;
//! - a ClientHello cut short, then EOF: the same; and ([`HELD`] per port, from the start)
//!   one cut short and held open: cut off by the port's handshake deadline;
//! - a record header that announces more than a record may hold: closed at once, alerts at
//!   most;
//! - a whole ClientHello, then garbage records: the server answers the ClientHello with its
//!   handshake records, then closes;
//! - a completed handshake with a client certificate of the cluster (the volume's NBD client
//!   certificate, which opens nothing on the HTTP ports; a node's on the replica port), then
//!   garbage of the port's own protocol: HTTP (answered 4xx, or closed), replica frames
//!   (refused, never Ok), NBD options (each answered as `nbd/handshake.rs` says, the listing
//!   naming only what the certificate opens, and closed where the haggle must end).
//!
//! On n1's NBD port, the STARTTLS negotiation: options before STARTTLS get
//! `NBD_REP_ERR_TLS_REQD` and leave the haggle where it was (a STARTTLS after them still
//! opens the volume), `EXPORT_NAME` before it closes the connection, and 1,024 refused
//! options end it; STARTTLS then plaintext instead of a ClientHello; STARTTLS with a payload
//! (`NBD_REP_ERR_INVALID`, the haggle goes on) or with a length past the limit (closed);
//! STARTTLS again inside TLS (`NBD_REP_ERR_INVALID`, the session goes on) and twice in a row
//! in clear (the second is no ClientHello); a handshake without a client certificate and one
//! with another CA's: no session. The positive control, a handshake with the volume's client
//! certificate, opens the volume and reads its data, before the garbage and after it.
//!
//! Afterwards every process runs, none grew by 64 MiB, every port serves a legitimate client
//! (an API call on each HTTP port, a Hello on each replica port, the volume read over NBD with
//! TLS and over the unix socket), and the cluster's state and the volume's data are unchanged.
//!
//! The trials are seeded; the seed is printed, and `HAWSER_TLS_GARBAGE_SEED` replays it.

use std::io::{Cursor, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_e2e::garbage::{http_garbage, random_bytes};
use hawser_e2e::peer_conn::{Conn, End, Reply};
use hawser_e2e::probe::{self, Tls};
use hawser_e2e::tokens::read_credentials;
use hawser_e2e::{have, qemu_io, rss_kib, Cluster};
use hawser_tls::rustls::ClientConfig;
use hawser_tls::{Credentials, Peer};
use hawser_wire::frame::{FrameHeader, Op, Status, HEADER_LEN};
use hawser_wire::nbd;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Method;

/// Trials of each case on each port.
const TRIALS: usize = 500;
/// How long a trial waits for the server's next byte or its close. The server is expected
/// to answer at once; this only bounds a hang, which fails the trial.
const WAIT: Duration = Duration::from_secs(10);
/// Longest TLS record payload a peer may announce (2^14 plus expansion, RFC 8446 5.2).
const MAX_RECORD: u16 = (1 << 14) + 2048;
/// Options an NBD client may send before it must pick an export
/// (`hawser_agent::nbd::handshake::MAX_OPTIONS_PER_HANDSHAKE`).
const MAX_OPTIONS: usize = 1024;
/// The volume's data: `PATTERN` over its first `DATA` bytes.
const PATTERN: u8 = 0x5a;
const DATA: usize = 1 << 20;

/// TLS record content types (RFC 8446 5.1).
const CHANGE_CIPHER_SPEC: u8 = 20;
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Http,
    Replica,
    Nbd,
}

/// One TLS port and a client that completes its handshake.
struct Target {
    name: String,
    addr: String,
    kind: Kind,
    tls: Arc<ClientConfig>,
    /// NBD: what `NBD_OPT_LIST` shows inside TLS with `tls`'s certificate.
    listed: Vec<String>,
}

impl Target {
    /// A TCP connection where this port's TLS begins: at once, or (NBD) after the greeting
    /// and an acknowledged STARTTLS.
    fn at_tls(&self) -> Conn {
        let tcp = match self.kind {
            Kind::Nbd => probe::nbd_starttls(&self.addr),
            Kind::Http | Kind::Replica => TcpStream::connect(&self.addr),
        };
        let tcp = tcp.unwrap_or_else(|e| panic!("{}: no connection: {e}", self.name));
        let _ = tcp.set_nodelay(true);
        Conn::Plain(tcp)
    }

    /// A completed TLS handshake with this target's client.
    fn in_tls(&self) -> Conn {
        let Conn::Plain(tcp) = self.at_tls() else {
            unreachable!()
        };
        let mut conn = Conn::tls(tcp, self.tls.clone()).expect("a TLS client");
        handshake(&mut conn, WAIT)
            .unwrap_or_else(|e| panic!("{}: the legitimate handshake failed: {e}", self.name));
        conn
    }

    /// The records of a fresh ClientHello of this target's client.
    fn client_hello(&self) -> Vec<u8> {
        let name = hawser_tls::rustls::pki_types::ServerName::try_from("hawser").expect("name");
        let mut c =
            hawser_tls::rustls::ClientConnection::new(self.tls.clone(), name).expect("a client");
        let mut out = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut out).expect("write to a Vec");
        }
        out
    }
}

/// Runs `conn`'s TLS handshake to its end, as far as the client can tell (in TLS 1.3 a
/// server that refuses the client's certificate says so only afterwards).
fn handshake(conn: &mut Conn, wait: Duration) -> std::io::Result<()> {
    conn.set_read_timeout(Some(wait))?;
    if let Conn::Tls(s) = conn {
        while s.conn.is_handshaking() {
            s.conn.complete_io(&mut s.sock)?;
        }
    }
    Ok(())
}

/// Whether `bytes` are whole TLS alert records and nothing else (what a server may send on
/// its way out of a failed handshake; nothing at all is fine too).
fn only_alerts(bytes: &[u8]) -> bool {
    let mut at = 0;
    while let Some(h) = bytes.get(at..at + 5) {
        if h[0] != ALERT || h[1] != 3 {
            return false;
        }
        at += 5 + usize::from(u16::from_be_bytes([h[3], h[4]]));
    }
    at == bytes.len()
}

/// A trial's verdict: panics with what came back, naming the port, case and seed.
fn check(ok: bool, t: &Target, case: &str, r: &Reply, seed: u64) {
    let head: Vec<u8> = r.bytes.iter().take(64).copied().collect();
    assert!(
        ok,
        "{}: {case}: the server answered {} bytes (first: {head:?}) and the connection \
         ended {:?} (seed {seed})",
        t.name,
        r.bytes.len(),
        r.end
    );
}

/// A TLS record of type `kind` (protocol version TLS 1.2, as records carry) with `payload`.
fn record(kind: u8, payload: &[u8]) -> Vec<u8> {
    let len = u16::try_from(payload.len()).expect("a record under 64 KiB");
    let mut r = vec![kind, 3, 3];
    r.extend_from_slice(&len.to_be_bytes());
    r.extend_from_slice(payload);
    r
}

/// The TLS-layer cases on one port, [`TRIALS`] times each. Returns how many trials' garbage
/// inside TLS got an answer of the port's protocol: what shows it reached past TLS.
fn tls_layer(t: &Target, rng: &mut StdRng, seed: u64) -> usize {
    let mut answered = 0;
    for trial in 0..TRIALS {
        // Random bytes instead of a ClientHello. Either held open with a first byte that is
        // no record type (the server must close on its own), or anything, then EOF.
        let mut b = random_bytes(rng, 5..4096);
        let hold = rng.random_bool(0.5);
        if hold {
            b[0] = rng.random_range(APPLICATION_DATA + 1..=u8::MAX);
        }
        let r = t.at_tls().exchange(&b, !hold, WAIT);
        check(
            r.closed() && only_alerts(&r.bytes),
            t,
            "random bytes",
            &r,
            seed,
        );

        // A ClientHello cut short, then EOF.
        let hello = t.client_hello();
        let cut = rng.random_range(1..hello.len());
        let r = t.at_tls().exchange(&hello[..cut], true, WAIT);
        let case = "a truncated ClientHello";
        check(r.closed() && only_alerts(&r.bytes), t, case, &r, seed);

        // A handshake record header announcing more than a record may hold, held open.
        let len = rng.random_range(MAX_RECORD + 1..=u16::MAX);
        let mut b = vec![HANDSHAKE, 3, rng.random_range(1..=3)];
        b.extend_from_slice(&len.to_be_bytes());
        b.extend(random_bytes(rng, 0..1024));
        let r = t.at_tls().exchange(&b, false, WAIT);
        let case = "a record header with a huge length";
        check(r.closed() && only_alerts(&r.bytes), t, case, &r, seed);

        // A whole ClientHello, then garbage records ending in application data no key
        // opens, held open: the server answers the ClientHello, then closes.
        let mut b = hello;
        for _ in 0..rng.random_range(0..3) {
            let kind = rng.random_range(CHANGE_CIPHER_SPEC..=APPLICATION_DATA);
            b.extend(record(kind, &random_bytes(rng, 1..512)));
        }
        b.extend(record(APPLICATION_DATA, &random_bytes(rng, 1..512)));
        let r = t.at_tls().exchange(&b, false, WAIT);
        let server_hello = r.bytes.starts_with(&[HANDSHAKE, 3]);
        let case = "a ClientHello then garbage records";
        check(r.closed() && server_hello, t, case, &r, seed);

        // A completed handshake, then garbage of the port's protocol inside TLS.
        let mut conn = t.in_tls();
        answered += usize::from(match t.kind {
            Kind::Http => http_inside(t, &mut conn, rng, seed),
            Kind::Replica => replica_inside(t, &mut conn, rng, trial, seed),
            Kind::Nbd => nbd_inside(t, &mut conn, rng, seed),
        });
    }
    answered
}

/// Garbage HTTP inside TLS, then close_notify: answered with a 4xx (no garbage opens
/// anything) or not at all, and closed. Whether it was answered.
fn http_inside(t: &Target, conn: &mut Conn, rng: &mut StdRng, seed: u64) -> bool {
    let r = conn.exchange(&http_garbage(rng), true, WAIT);
    let ok = r.bytes.is_empty() || r.bytes.starts_with(b"HTTP/1.1 4");
    check(r.closed() && ok, t, "garbage HTTP inside TLS", &r, seed);
    !r.bytes.is_empty()
}

/// Garbage replica frames inside TLS; the kind goes by `trial`. No session may open:
/// - random bytes, then close_notify: closed unanswered;
/// - a frame of any opcode with random fields (a payload where the opcode carries one),
///   perhaps with a bit flipped, held open. One the wire decoder rejects is closed
///   unanswered; one it accepts gets one reply, never Ok (it is no Hello, or a Hello whose
///   payload does not decode), then the connection closes.
///
/// A frame is sent alone and held open, so that the server has read all of it when it
/// closes: closing with unread bytes resets the connection, which may drop its reply.
/// Whether the trial was answered.
fn replica_inside(t: &Target, conn: &mut Conn, rng: &mut StdRng, trial: usize, seed: u64) -> bool {
    if trial.is_multiple_of(3) {
        let r = conn.exchange(&random_bytes(rng, 1..512), true, WAIT);
        check(
            r.closed() && r.bytes.is_empty(),
            t,
            "random bytes inside TLS",
            &r,
            seed,
        );
        return false;
    }
    let op = Op::from_u16(rng.random_range(1..=11)).expect("an opcode");
    let carries = matches!(
        op,
        Op::Hello | Op::HelloSnapshot | Op::Write | Op::PutJournal
    );
    let payload = if carries {
        random_bytes(rng, 0..512)
    } else {
        vec![]
    };
    let length = match op {
        Op::Write | Op::PutJournal => u32::try_from(payload.len()).expect("short"),
        _ => rng.random_range(0..=1 << 20),
    };
    let h = FrameHeader::request(op, rng.random(), rng.random(), rng.random(), length)
        .with_payload(&payload);
    let mut frame = h.encode().to_vec();
    if trial % 3 == 2 {
        frame[rng.random_range(0..HEADER_LEN)] ^= 1 << rng.random_range(0..8);
    }
    let decodes = FrameHeader::decode(&frame).is_ok();
    frame.extend(payload);
    let r = conn.exchange(&frame, false, WAIT);
    let refused = r.bytes.len() == HEADER_LEN
        && FrameHeader::decode(&r.bytes).is_ok_and(|h| h.is_reply() && h.status != Status::Ok);
    let (ok, case) = if decodes {
        (refused, format!("a {op:?} frame inside TLS"))
    } else {
        (
            r.bytes.is_empty(),
            format!("a {op:?} frame the decoder rejects, inside TLS"),
        )
    };
    check(r.closed() && ok, t, &case, &r, seed);
    decodes
}

/// What an option inside TLS must be answered with.
enum Want {
    /// One reply of this (error) type.
    Error(u32),
    /// `NBD_REP_SERVER` for each export the certificate opens here, then ACK.
    List,
    /// `NBD_REP_INFO` replies, then ACK (INFO of the export the certificate opens).
    Info,
}

impl std::fmt::Debug for Want {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Want::Error(e) => write!(f, "Error({e:#x})"),
            Want::List => f.write_str("List"),
            Want::Info => f.write_str("Info"),
        }
    }
}

/// How a garbage haggle inside TLS ends.
#[derive(Debug)]
enum Ending {
    /// `NBD_OPT_ABORT`: ACK, then closed.
    Abort,
    /// `NBD_OPT_EXPORT_NAME` of an export the certificate does not open: closed unanswered.
    ExportName,
    /// An option header with a bad magic: closed unanswered.
    BadMagic,
    /// An option longer than any may be: closed unanswered.
    TooLong,
    /// close_notify: closed.
    Eof,
}

/// Random options inside TLS with the volume's client certificate, then an ending; every
/// reply must be the one `nbd/handshake.rs` gives. Never an export (no GO of the volume).
fn nbd_inside(t: &Target, conn: &mut Conn, rng: &mut StdRng, seed: u64) -> bool {
    let mut bytes = Vec::new();
    let mut wants = Vec::new();
    for _ in 0..rng.random_range(1..8) {
        let (opt, payload, want) = random_option(t, rng);
        bytes.extend(probe::nbd_option_bytes(opt, &payload));
        wants.push(want);
    }
    let ending = match rng.random_range(0..5) {
        0 => Ending::Abort,
        1 => Ending::ExportName,
        2 => Ending::BadMagic,
        3 => Ending::TooLong,
        _ => Ending::Eof,
    };
    match ending {
        Ending::Abort => bytes.extend(probe::nbd_option_bytes(nbd::OPT_ABORT, &[])),
        Ending::ExportName => {
            let name = format!("x-{}", rng.random::<u32>());
            bytes.extend(probe::nbd_option_bytes(
                nbd::OPT_EXPORT_NAME,
                name.as_bytes(),
            ));
        }
        Ending::BadMagic => {
            let mut h = probe::nbd_option_bytes(nbd::OPT_LIST, &[]);
            h[rng.random_range(0..8)] ^= 1 << rng.random_range(0..8);
            bytes.extend(h);
        }
        Ending::TooLong => {
            let len = rng.random_range(nbd::MAX_OPTION_PAYLOAD_BYTES + 1..=u32::MAX);
            let header = nbd::OptionHeader {
                option: rng.random(),
                len,
            };
            bytes.extend(header.encode());
        }
        Ending::Eof => {}
    }
    let r = conn.exchange(&bytes, matches!(ending, Ending::Eof), WAIT);
    let mut replies = Cursor::new(&r.bytes[..]);
    let mut reply = || probe::nbd_reply(&mut replies);
    for want in &wants {
        let ok = match want {
            Want::Error(e) => reply().is_ok_and(|(kind, _)| kind == *e),
            Want::List => {
                let mut names = Vec::new();
                loop {
                    match reply() {
                        Ok((nbd::REP_SERVER, data)) if data.len() >= 4 => {
                            names.push(String::from_utf8_lossy(&data[4..]).into_owned());
                        }
                        Ok((nbd::REP_ACK, _)) => break names == t.listed,
                        _ => break false,
                    }
                }
            }
            Want::Info => loop {
                match reply() {
                    Ok((nbd::REP_INFO, _)) => {}
                    Ok((nbd::REP_ACK, _)) => break true,
                    _ => break false,
                }
            },
        };
        check(ok, t, &format!("options inside TLS: {wants:?}"), &r, seed);
    }
    if matches!(ending, Ending::Abort) {
        let acked = reply().is_ok_and(|(kind, _)| kind == nbd::REP_ACK);
        check(acked, t, "ABORT inside TLS", &r, seed);
    }
    let rest = r.bytes.len() - usize::try_from(replies.position()).unwrap_or(0);
    let case = format!("options inside TLS ending with {ending:?}");
    check(r.closed() && rest == 0, t, &case, &r, seed);
    true
}

/// A random option other than GO of an export the certificate opens, ABORT and
/// EXPORT_NAME (those end the haggle), with a random payload, and the answer it must get.
fn random_option(t: &Target, rng: &mut StdRng) -> (u32, Vec<u8>, Want) {
    let junk = |rng: &mut StdRng| random_bytes(rng, 0..1024);
    match rng.random_range(0..5) {
        0 => {
            if rng.random_bool(0.5) {
                (nbd::OPT_LIST, vec![], Want::List)
            } else {
                let p = random_bytes(rng, 1..1024);
                (nbd::OPT_LIST, p, Want::Error(nbd::REP_ERR_INVALID))
            }
        }
        1 => (
            nbd::OPT_STARTTLS,
            junk(rng),
            Want::Error(nbd::REP_ERR_INVALID),
        ),
        2 => {
            // INFO or GO of some name, or a payload that is no INFO request.
            let opt = if rng.random_bool(0.5) {
                nbd::OPT_INFO
            } else {
                nbd::OPT_GO
            };
            let names = ["tg", "rv", "nosuch", ""];
            let name = names[rng.random_range(0..names.len())];
            if rng.random_bool(0.3) || (opt == nbd::OPT_GO && t.listed.iter().any(|n| n == name)) {
                let p = junk(rng);
                let want = match nbd::InfoRequest::decode(&p) {
                    Err(_) => Want::Error(nbd::REP_ERR_INVALID),
                    Ok(req) => info_want(t, req.name),
                };
                return (opt, p, want);
            }
            let info_types = (0..rng.random_range(0..4)).map(|_| rng.random()).collect();
            let p = nbd::InfoRequest { name, info_types }
                .encode()
                .expect("a short request");
            (opt, p, info_want(t, name))
        }
        _ => {
            // Any option Hawser does not implement.
            let known = [
                nbd::OPT_EXPORT_NAME,
                nbd::OPT_ABORT,
                nbd::OPT_LIST,
                nbd::OPT_STARTTLS,
                nbd::OPT_INFO,
                nbd::OPT_GO,
            ];
            let opt = loop {
                let o = if rng.random_bool(0.5) {
                    rng.random_range(0..16)
                } else {
                    rng.random()
                };
                if !known.contains(&o) {
                    break o;
                }
            };
            (opt, junk(rng), Want::Error(nbd::REP_ERR_UNSUP))
        }
    }
}

/// What INFO of `name` gets with the volume's client certificate (which names `tg` only):
/// a name it does not open is refused by policy, whether it exists or not; `tg` is
/// described where it is attached and unknown elsewhere.
fn info_want(t: &Target, name: &str) -> Want {
    if name != "tg" {
        Want::Error(nbd::REP_ERR_POLICY)
    } else if t.listed.iter().any(|n| n == name) {
        Want::Info
    } else {
        Want::Error(nbd::REP_ERR_UNKNOWN)
    }
}

/// Reads `len` bytes at offset 0 of `export` over NBD with TLS at `addr`: STARTTLS, the
/// handshake with `tls`, GO, one read.
fn nbd_read(
    addr: &str,
    tls: &Arc<ClientConfig>,
    export: &str,
    len: u32,
) -> std::io::Result<Vec<u8>> {
    let mut s = Conn::tls(probe::nbd_starttls(addr)?, tls.clone())?;
    if !probe::nbd_go(&mut s, export) {
        return Err(std::io::Error::other(format!("GO {export} refused")));
    }
    let read = nbd::Request {
        flags: 0,
        command: nbd::Command::Read,
        handle: 7,
        offset: 0,
        length: len,
    };
    s.write_all(&read.encode())?;
    s.flush()?;
    let mut h = [0u8; nbd::SIMPLE_REPLY_LEN];
    s.read_exact(&mut h)?;
    let reply = nbd::SimpleReply::decode(&h).map_err(std::io::Error::other)?;
    if reply.error != 0 || reply.handle != 7 {
        return Err(std::io::Error::other(format!("read answered {reply:?}")));
    }
    let mut data = vec![0u8; len as usize];
    s.read_exact(&mut data)?;
    Ok(data)
}

/// The cluster and the credentials the checks use.
struct Setup {
    c: Cluster,
    uri: String,
    ca_pem: String,
    admin_token: String,
    /// The client certificate `hawser volume client-cert tg` wrote.
    tg_client: Credentials,
    /// A certificate of the cluster naming node n1.
    n1: Credentials,
    /// Volume rv (detached): its replica on each node, with the replica's epoch.
    rv: Vec<(String, String, u64)>,
}

impl Setup {
    fn tls(&self, expect: Peer, creds: Option<&Credentials>) -> Tls {
        Tls::With {
            ca_pem: self.ca_pem.clone(),
            expect,
            creds: creds.cloned(),
        }
    }

    fn config(&self, expect: Peer, creds: Option<&Credentials>) -> Arc<ClientConfig> {
        self.tls(expect, creds)
            .client_config()
            .expect("a TLS configuration")
    }

    fn n1_nbd_client(&self) -> Arc<ClientConfig> {
        self.config(Peer::Node("n1".into()), Some(&self.tg_client))
    }

    /// Every port serves a legitimate client: an authorized GET on each HTTP API, a granted
    /// Hello on each replica port (rv's replica there, at its epoch: raises nothing), the
    /// volume's data over NBD with TLS at n1, a listing at n2, and the data over the unix
    /// socket.
    fn assert_every_port_serves(&self) {
        let ctl = self.c.url.trim_start_matches("https://");
        let to_ctl = self.tls(Peer::Controller, None);
        let status = probe::http_status(
            &to_ctl,
            Method::GET,
            ctl,
            "/v1/volumes",
            Some(&self.admin_token),
            &[],
            None,
        );
        assert_eq!(status, Some(200), "the controller's API");
        let controller = self.c.tokens.credentials(&Peer::Controller);
        for a in &self.c.agents {
            let to_agent = self.tls(Peer::Node(a.name.clone()), Some(&controller));
            let header = [("x-hawser-node", a.name.as_str())];
            let status = probe::http_status(
                &to_agent,
                Method::GET,
                &a.admin,
                "/v1/status",
                None,
                &header,
                None,
            );
            assert_eq!(status, Some(200), "{}'s admin API", a.name);
        }
        for (node, replica, epoch) in &self.rv {
            let hello = self.c.granted_hello(replica, "rv", "n1", *epoch);
            let tls = self.tls(Peer::Node(node.clone()), Some(&self.n1));
            let addr = &self.c.agent(node).replica;
            let answer = probe::replica_hello(addr, &tls, *epoch, &hello);
            assert_eq!(answer, Some(Status::Ok), "a Hello at {node}'s replica port");
        }
        let data = nbd_read(&self.c.agent("n1").nbd, &self.n1_nbd_client(), "tg", 65536)
            .unwrap_or_else(|e| panic!("tg over NBD with TLS at n1: {e}"));
        assert!(
            data.iter().all(|&b| b == PATTERN),
            "tg's data over NBD with TLS"
        );
        let to_n2 = self.tls(Peer::Node("n2".into()), Some(&self.tg_client));
        assert!(
            probe::nbd_tcp_session(&self.c.agent("n2").nbd, &to_n2),
            "n2's NBD port serves the volume's client certificate"
        );
        qemu_io(&self.uri, &[&format!("read -P {PATTERN:#x} 0 {DATA}")]);
    }
}

fn setup() -> Setup {
    let c = Cluster::start("tlsgarbage", 2);
    let uri = c.attached_volume("tg", "16MiB", 2, "n1");
    qemu_io(&uri, &[&format!("write -P {PATTERN:#x} 0 {DATA}"), "flush"]);
    // A detached volume whose replicas take the final Hellos.
    c.cli_ok(&[
        "volume",
        "create",
        "rv",
        "--size",
        "16MiB",
        "--replicas",
        "2",
    ]);
    c.cli_ok(&["volume", "attach", "rv", "--node", "n1"]);
    c.cli_ok(&["volume", "detach", "rv"]);
    let rv = ["n1", "n2"]
        .iter()
        .map(|node| {
            let id = c.replica_on("rv", node).id;
            let epoch = c
                .agent_status(node)
                .replicas
                .into_iter()
                .find(|r| r.replica_id == id)
                .expect("rv's replica in its agent's status")
                .epoch;
            (node.to_string(), id, epoch)
        })
        .collect();
    let dir = c.dir.path().join("client-tg");
    c.cli_ok(&[
        "volume",
        "client-cert",
        "tg",
        "--out",
        &dir.display().to_string(),
    ]);
    let tg_client = read_credentials(&dir, "client-cert.pem", "client-key.pem");
    let admin_token = std::fs::read_to_string(&c.tokens.admin)
        .expect("the admin token")
        .trim()
        .to_string();
    Setup {
        uri,
        ca_pem: c.tokens.ca_pem().to_string(),
        admin_token,
        tg_client,
        n1: c.tokens.credentials(&Peer::Node("n1".into())),
        rv,
        c,
    }
}

/// Every TLS port, with a client that completes its handshake.
fn targets(s: &Setup) -> Vec<Target> {
    let ctl = s.c.url.trim_start_matches("https://").to_string();
    let mut out = vec![Target {
        name: "controller API".into(),
        addr: ctl,
        kind: Kind::Http,
        tls: s.config(Peer::Controller, Some(&s.tg_client)),
        listed: vec![],
    }];
    for a in &s.c.agents {
        let me = Peer::Node(a.name.clone());
        let port = |what: &str, addr: &str, kind, creds| Target {
            name: format!("{}'s {what}", a.name),
            addr: addr.to_string(),
            kind,
            tls: s.config(me.clone(), Some(creds)),
            listed: if a.name == "n1" {
                vec!["tg".into()]
            } else {
                vec![]
            },
        };
        out.push(port("admin API", &a.admin, Kind::Http, &s.tg_client));
        out.push(port("replica port", &a.replica, Kind::Replica, &s.n1));
        out.push(port("NBD port", &a.nbd, Kind::Nbd, &s.tg_client));
    }
    out
}

/// Connections held open on each port from the start, having sent part of a ClientHello.
const HELD: usize = 4;
/// By when after it was opened a held connection must be cut off: the longest handshake
/// deadline (NBD's 30 s to pick an export; the HTTP APIs give 20 s, the replica port 10 s),
/// with room for a loaded machine.
const CUT_OFF_WITHIN: Duration = Duration::from_secs(45);

/// [`HELD`] connections per port that send part of a ClientHello and then nothing, with the
/// time each was opened.
fn hold_truncated_hellos(targets: &[Target], rng: &mut StdRng) -> Vec<(String, Conn, Instant)> {
    let mut held = Vec::new();
    for t in targets {
        for _ in 0..HELD {
            let opened = Instant::now();
            let mut conn = t.at_tls();
            let hello = t.client_hello();
            conn.write_all(&hello[..rng.random_range(1..hello.len())])
                .unwrap_or_else(|e| panic!("{}: send part of a ClientHello: {e}", t.name));
            held.push((t.name.clone(), conn, opened));
        }
    }
    held
}

/// Every held connection is closed by its server (alerts at most) within
/// [`CUT_OFF_WITHIN`] of its opening: no port waits forever for the rest of a handshake.
fn assert_cut_off(held: Vec<(String, Conn, Instant)>, seed: u64) {
    for (name, mut conn, opened) in held {
        let left = CUT_OFF_WITHIN
            .saturating_sub(opened.elapsed())
            .max(Duration::from_millis(1));
        let r = conn.exchange(&[], false, left);
        assert!(
            r.closed() && only_alerts(&r.bytes),
            "{name}: a connection holding part of a ClientHello was not cut off within \
             {CUT_OFF_WITHIN:?}: {r:?} (seed {seed})"
        );
    }
}

/// The STARTTLS negotiation on n1's NBD port (see the module's documentation).
fn starttls_negotiation(s: &Setup, rng: &mut StdRng, seed: u64) {
    let addr = &s.c.agent("n1").nbd;
    let client = s.n1_nbd_client();
    let go_tg = nbd::InfoRequest {
        name: "tg",
        info_types: vec![],
    }
    .encode()
    .expect("a short request");
    let starttls = probe::nbd_option_bytes(nbd::OPT_STARTTLS, &[]);
    let greeted = || Conn::Plain(probe::nbd_greeted(addr).expect("an NBD greeting at n1"));
    let starttlsed = || Conn::Plain(probe::nbd_starttls(addr).expect("STARTTLS at n1"));
    let into_tls = |conn: Conn, tls: &Arc<ClientConfig>| {
        let Conn::Plain(tcp) = conn else {
            unreachable!()
        };
        Conn::tls(tcp, tls.clone()).expect("a TLS client")
    };
    let fail = |case: &str, r: &Reply| panic!("n1's NBD port: {case}: {r:?} (seed {seed})");

    for _ in 0..TRIALS {
        // Options before STARTTLS: each refused with TLS_REQD; then STARTTLS still works
        // and the volume opens.
        let mut conn = greeted();
        for _ in 0..rng.random_range(1..6) {
            let (opt, payload) = match rng.random_range(0..4) {
                0 => (nbd::OPT_LIST, vec![]),
                1 => (nbd::OPT_INFO, go_tg.clone()),
                2 => (nbd::OPT_GO, go_tg.clone()),
                _ => {
                    let o = loop {
                        let o: u32 = rng.random();
                        let ends = [nbd::OPT_EXPORT_NAME, nbd::OPT_ABORT, nbd::OPT_STARTTLS];
                        if !ends.contains(&o) {
                            break o;
                        }
                    };
                    (o, random_bytes(rng, 0..1024))
                }
            };
            let got = probe::nbd_option(&mut conn, opt, &payload);
            assert_eq!(
                got.ok(),
                Some(nbd::REP_ERR_TLS_REQD),
                "option {opt:#x} before STARTTLS (seed {seed})"
            );
        }
        // STARTTLS with a payload: refused, and the haggle is where it was.
        let payload = random_bytes(rng, 1..1024);
        let got = probe::nbd_option(&mut conn, nbd::OPT_STARTTLS, &payload);
        assert_eq!(
            got.ok(),
            Some(nbd::REP_ERR_INVALID),
            "STARTTLS with a payload (seed {seed})"
        );
        let got = probe::nbd_option(&mut conn, nbd::OPT_LIST, &[]);
        assert_eq!(
            got.ok(),
            Some(nbd::REP_ERR_TLS_REQD),
            "LIST after a refused STARTTLS"
        );
        let got = probe::nbd_option(&mut conn, nbd::OPT_STARTTLS, &[]);
        assert_eq!(
            got.ok(),
            Some(nbd::REP_ACK),
            "STARTTLS after refused options"
        );
        let mut conn = into_tls(conn, &client);
        // STARTTLS again inside TLS: refused, and the session goes on.
        for payload in [vec![], random_bytes(rng, 1..64)] {
            let got = probe::nbd_option(&mut conn, nbd::OPT_STARTTLS, &payload);
            assert_eq!(
                got.ok(),
                Some(nbd::REP_ERR_INVALID),
                "STARTTLS inside TLS (seed {seed})"
            );
        }
        assert!(
            probe::nbd_go(&mut conn, "tg"),
            "GO tg after all that (seed {seed})"
        );

        // EXPORT_NAME before STARTTLS: closed, with no export reply.
        let r = greeted().exchange(
            &probe::nbd_option_bytes(nbd::OPT_EXPORT_NAME, b"tg"),
            false,
            WAIT,
        );
        if !(r.closed() && r.bytes.is_empty()) {
            fail("EXPORT_NAME before STARTTLS", &r);
        }
        // ABORT before STARTTLS: acknowledged, closed.
        let r = greeted().exchange(&probe::nbd_option_bytes(nbd::OPT_ABORT, &[]), false, WAIT);
        let acked = probe::nbd_reply(&mut &r.bytes[..]).is_ok_and(|(k, _)| k == nbd::REP_ACK);
        if !(r.closed() && acked && r.bytes.len() == nbd::OPTION_REPLY_HEADER_LEN) {
            fail("ABORT before STARTTLS", &r);
        }
        // STARTTLS with a length past any option's: closed unanswered.
        let len = rng.random_range(nbd::MAX_OPTION_PAYLOAD_BYTES + 1..=u32::MAX);
        let header = nbd::OptionHeader {
            option: nbd::OPT_STARTTLS,
            len,
        };
        let r = greeted().exchange(&header.encode(), false, WAIT);
        if !(r.closed() && r.bytes.is_empty()) {
            fail("STARTTLS with a huge length", &r);
        }
        // STARTTLS, then an NBD option in clear where the ClientHello should be.
        let r = starttlsed().exchange(&probe::nbd_option_bytes(nbd::OPT_GO, &go_tg), false, WAIT);
        if !(r.closed() && only_alerts(&r.bytes)) {
            fail("STARTTLS then an option in clear", &r);
        }
        // STARTTLS twice in a row in clear: the first is acknowledged, the second is no
        // ClientHello.
        let twice = [starttls.clone(), starttls.clone()].concat();
        let r = greeted().exchange(&twice, false, WAIT);
        let mut rest = &r.bytes[..];
        let acked = probe::nbd_reply(&mut rest).is_ok_and(|(k, _)| k == nbd::REP_ACK);
        if !(r.closed() && acked && only_alerts(rest)) {
            fail("STARTTLS twice in clear", &r);
        }
        // Handshakes without a client certificate, and with another CA's: no session.
        for (case, tls) in [
            (
                "a handshake without a client certificate",
                s.config(Peer::Node("n1".into()), None),
            ),
            (
                "a handshake with another CA's certificate",
                foreign_client(s),
            ),
        ] {
            let mut conn = into_tls(starttlsed(), &tls);
            let r = conn.exchange(&probe::nbd_option_bytes(nbd::OPT_LIST, &[]), false, WAIT);
            let refused = matches!(&r.end, End::Failed(e) if e.contains("alert"));
            if !(r.bytes.is_empty() && refused) {
                fail(case, &r);
            }
        }
    }

    // 1,024 options before STARTTLS end the connection, each refused.
    let list = probe::nbd_option_bytes(nbd::OPT_LIST, &[]);
    let r = greeted().exchange(&list.repeat(MAX_OPTIONS), false, WAIT);
    let mut rest = &r.bytes[..];
    let refused = (0..MAX_OPTIONS)
        .take_while(|_| probe::nbd_reply(&mut rest).is_ok_and(|(k, _)| k == nbd::REP_ERR_TLS_REQD))
        .count();
    if !(r.closed() && refused == MAX_OPTIONS && rest.is_empty()) {
        fail(
            &format!("{MAX_OPTIONS} options before STARTTLS ({refused} refused)"),
            &r,
        );
    }
}

/// A client certificate for tg from another CA, trusting the cluster's CA and expecting n1.
fn foreign_client(s: &Setup) -> Arc<ClientConfig> {
    let other = hawser_tls::Ca::generate("other").expect("another CA");
    let scope = hawser_tls::ClientScope::new(&["tg".to_string()], None).expect("a scope");
    let (issued, key_pem) = other
        .issue_with_key(&Peer::Client(scope), Duration::from_secs(3600))
        .expect("a foreign certificate");
    let foreign = Credentials {
        chain_pem: issued.chain_pem,
        key_pem,
    };
    s.config(Peer::Node("n1".into()), Some(&foreign))
}

#[test]
fn garbage_at_every_tls_port_and_abused_starttls_change_nothing() {
    if !have("qemu-io") {
        eprintln!("SKIP: qemu-io missing (make test installs it)");
        return;
    }
    let mut s = setup();
    let seed: u64 = std::env::var("HAWSER_TLS_GARBAGE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("tls garbage seed {seed} (replay: HAWSER_TLS_GARBAGE_SEED={seed})");

    // The positive controls, before any garbage.
    s.assert_every_port_serves();
    let before = s.c.state_summary();
    let pids: Vec<(String, u32)> =
        std::iter::once(("controller".to_string(), s.c.controllers[0].child.id()))
            .chain(s.c.agents.iter().map(|a| (a.name.clone(), a.child.id())))
            .collect();
    let rss_before: Vec<u64> = pids.iter().map(|(_, p)| rss_kib(*p)).collect();

    let targets = targets(&s);
    let held = hold_truncated_hellos(&targets, &mut StdRng::seed_from_u64(!seed));
    let started = Instant::now();
    std::thread::scope(|scope| {
        for (i, t) in targets.iter().enumerate() {
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ ((i as u64 + 1) << 32));
                let answered = tls_layer(t, &mut rng, seed);
                eprintln!(
                    "{}: {TRIALS} trials of each case; {answered} of the garbage inside TLS \
                     answered",
                    t.name
                );
                assert!(
                    answered > 0,
                    "{}: no garbage inside TLS got an answer of the port's protocol: it \
                     never got past TLS (seed {seed})",
                    t.name
                );
            });
        }
        let mut rng = StdRng::seed_from_u64(seed);
        starttls_negotiation(&s, &mut rng, seed);
    });
    eprintln!("the garbage took {:?}", started.elapsed());

    assert!(
        s.c.agent_alive("n1") && s.c.agent_alive("n2"),
        "an agent died"
    );
    assert!(
        s.c.controllers[0].child.try_wait().expect("wait").is_none(),
        "the controller died"
    );
    for ((name, pid), before) in pids.iter().zip(&rss_before) {
        let after = rss_kib(*pid);
        eprintln!("{name}: RSS {before} KiB before, {after} KiB after");
        assert!(
            after < before + 64 * 1024,
            "{name} grew from {before} KiB to {after} KiB"
        );
    }
    s.assert_every_port_serves();
    assert_cut_off(held, seed);
    assert_eq!(
        s.c.state_summary(),
        before,
        "the garbage changed the cluster"
    );
}
