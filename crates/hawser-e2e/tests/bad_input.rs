//! "Replicated volumes over NBD", acceptance d: bad sizes and names, garbage on the NBD and
//! replica ports, a pool whose filesystem fills up.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use hawser_e2e::garbage::http_garbage;
use hawser_e2e::peer_conn::{Conn, ReplicaPort};
use hawser_e2e::{have, qemu_io, rss_kib, Cluster, ClusterOptions, SmallFs, TempDir};
use rand::{Rng, RngCore, SeedableRng};
use sha2::{Digest, Sha256};

#[test]
fn bad_sizes_and_unknown_names_are_refused_and_create_nothing() {
    let c = Cluster::start("badinput", 2);
    let cases: &[&[&str]] = &[
        &["volume", "create", "v", "--size", "0", "--replicas", "2"],
        &["volume", "create", "v", "--size=-1GiB", "--replicas", "2"],
        &["volume", "create", "v", "--size", "ten", "--replicas", "2"],
        &["volume", "create", "v", "--size", "1000", "--replicas", "2"],
        &["volume", "create", "v", "--size", "1GiB", "--replicas", "0"],
        &["volume", "create", "v", "--size", "1GiB", "--replicas", "3"],
        &[
            "volume",
            "create",
            "Bad_Name",
            "--size",
            "1GiB",
            "--replicas",
            "1",
        ],
        &["volume", "show", "nosuch"],
        &["volume", "attach", "nosuch", "--node", "n1"],
        &["volume", "detach", "nosuch"],
        &["volume", "delete", "nosuch"],
    ];
    for args in cases {
        let out = c.cli(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "hawser {args:?} succeeded");
        assert!(
            err.contains("error"),
            "hawser {args:?}: no clear error: {err}"
        );
        assert!(!err.contains("panicked"), "hawser {args:?} panicked: {err}");
    }
    assert!(
        c.volumes().is_empty(),
        "a refused command created something"
    );
    for a in &c.agents {
        assert!(
            c.agent_status(&a.name).replicas.is_empty(),
            "replica left on {}",
            a.name
        );
    }
    c.cli_ok(&[
        "volume",
        "create",
        "v",
        "--size",
        "64MiB",
        "--replicas",
        "2",
    ]);
    let out = c.cli(&["volume", "attach", "v", "--node", "nosuch"]);
    assert!(!out.status.success(), "attach to an unknown node succeeded");
    assert!(c.volume("v").attached_node.is_none());
}

/// Random bytes and near-valid frames of the current wire version on both data ports: the
/// agents stay up, the replicas do not change, clients still work.
///
/// While the volume is attached (1,000 trials per port), the replica port gets what cannot
/// open a session: random bytes, headers with valid checksums and random fields, a Hello of
/// an older epoch and a Hello for an unknown replica (both with grants the controller's key
/// signed). Then, with the volume detached, a granted Hello at the replica's own epoch
/// (which raises nothing) opens a session, so the frames behind it
/// reach the request loop: writes whose payload checksum is wrong (must close the connection
/// before the disk), writes, zeroings, trims and journals of an older epoch (must be refused
/// StaleEpoch, never applied), and reads, checksums, journal reads, flushes and pings.
#[test]
fn garbage_on_nbd_and_replica_ports_changes_nothing() {
    if !have("qemu-io") {
        eprintln!("SKIP: qemu-io missing");
        return;
    }
    let mut c = Cluster::start("garbage", 2);
    let uri = c.attached_volume("g", "64MiB", 2, "n1");
    qemu_io(&uri, &["write -P 0x42 0 4M", "flush"]);
    let v = c.volume("g");
    let files: Vec<_> = v.replicas.iter().map(|r| c.replica_path(&r.id)).collect();
    let before: Vec<_> = files
        .iter()
        .map(|f| Sha256::digest(std::fs::read(f).expect("read")))
        .collect();

    let seed: u64 = rand::rng().random();
    eprintln!("garbage seed {seed} (replay: HAWSER_GARBAGE_SEED={seed})");
    let seed = std::env::var("HAWSER_GARBAGE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(seed);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let nbd = c.agent("n1").nbd.clone();
    let replica_port = c.replica_port("n2", "n1");
    let replica_id = c.replica_on("g", "n2").id;
    assert!(v.epoch >= 1, "an attached volume has an epoch: {v:?}");
    let hellos = Hellos::new(&c, "g", &replica_id, v.epoch);
    for trial in 0..1000 {
        send_garbage(&nbd, &nbd_garbage(&mut rng));
        let _ = exchange_replica(
            &replica_port,
            &replica_garbage(&mut rng, &hellos, v.epoch, trial),
            Duration::from_millis(200),
        );
    }
    assert!(c.agent_alive("n1") && c.agent_alive("n2"), "an agent died");
    c.cli_ok(&["volume", "detach", "g"]);

    let epoch = c
        .agent_status("n2")
        .replicas
        .into_iter()
        .find(|r| r.replica_id == replica_id)
        .expect("replica status on n2")
        .epoch;
    assert!(epoch >= 1, "replica {replica_id} has epoch {epoch}");
    let (mut stale, mut closed_early) = (0, 0);
    let granted = c.granted_hello(&replica_id, "g", "n1", epoch);
    for _ in 0..300 {
        let t = session_trial(&replica_port, &mut rng, &granted, epoch);
        stale += t.stale_refused;
        closed_early += usize::from(t.closed_on_bad_frame);
    }
    eprintln!(
        "sessions: {stale} requests of an older epoch refused, {closed_early} bad frames closed"
    );
    assert!(
        stale > 0 && closed_early > 0,
        "the session trials tested nothing"
    );
    assert!(c.agent_alive("n2"), "the replica agent died");

    let after: Vec<_> = files
        .iter()
        .map(|f| Sha256::digest(std::fs::read(f).expect("read")))
        .collect();
    assert_eq!(before, after, "garbage changed a replica (seed {seed})");
    c.cli_ok(&["volume", "attach", "g", "--node", "n1"]);
    qemu_io(&uri, &["read -P 0x42 0 4M"]);
}

/// "Secure by default", acceptance e: 10,000 garbage inputs on each listener (controller
/// REST API, agent admin API, replica port, NBD port), sent side by side, and slowloris
/// connections from another peer (127.0.0.2) held open on all four: no process dies or
/// grows without bound, the slow connections are cut off, and the volume keeps serving
/// (detach and attach, which need the admin API and a Hello, and I/O) throughout.
#[test]
fn garbage_and_slowloris_on_every_listener_leave_every_process_serving() {
    if !have("qemu-io") {
        eprintln!("SKIP: qemu-io missing");
        return;
    }
    const TRIALS: u32 = 10_000;
    const SLOW: usize = 100;
    let mut c = Cluster::start("abuse", 2);
    let uri = c.attached_volume("a", "64MiB", 2, "n1");
    qemu_io(&uri, &["write -P 0x17 0 4M", "flush"]);
    let v = c.volume("a");
    let replica_id = c.replica_on("a", "n2").id;
    let hellos = Hellos::new(&c, "a", &replica_id, v.epoch);
    let rest = c
        .url
        .split_once("://")
        .map_or(&*c.url, |(_, a)| a)
        .to_string();
    let listeners = [
        ("controller REST", rest),
        ("admin API", c.agent("n1").admin.clone()),
        ("replica port", c.agent("n2").replica.clone()),
        ("NBD", c.agent("n1").nbd.clone()),
    ];
    let pids = [
        ("controller", c.controllers[0].child.id()),
        ("n1", c.agent("n1").child.id()),
        ("n2", c.agent("n2").child.id()),
    ];
    let rss_before: Vec<u64> = pids.iter().map(|(_, p)| rss_kib(*p)).collect();

    // Slowloris first: each listener gets SLOW connections from 127.0.0.2 that send half a
    // first message and then nothing.
    let mut slow: Vec<(&str, TcpStream)> = Vec::new();
    for (name, addr) in &listeners {
        let partial: &[u8] = match *name {
            "replica port" => &[b'H', b'W', b'S', b'R', 2, 0, 1, 0],
            "NBD" => &[],
            _ => b"PUT /v1/nodes/x HTTP/1.1\r\nhost: x\r\n",
        };
        for _ in 0..SLOW {
            let s = connect_from([127, 0, 0, 2], addr);
            let _ = (&s).write_all(partial);
            slow.push((name, s));
        }
    }
    // Garbage on all four at once, while the slow connections are held.
    let seed: u64 = std::env::var("HAWSER_GARBAGE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("garbage seed {seed} (replay: HAWSER_GARBAGE_SEED={seed})");
    let hellos = &hellos;
    let epoch = v.epoch;
    let replica_port = &c.replica_port("n2", "n1");
    std::thread::scope(|scope| {
        for (i, (name, addr)) in listeners.iter().enumerate() {
            scope.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ ((i as u64) << 32));
                for trial in 0..TRIALS {
                    let bytes = match *name {
                        "replica port" => replica_garbage(&mut rng, hellos, epoch, trial),
                        "NBD" => nbd_garbage(&mut rng),
                        _ => http_garbage(&mut rng),
                    };
                    let wait = Duration::from_secs(2);
                    // Replica trials: half inside an authenticated session (the replica
                    // protocol's decoders), half raw on the port (its TLS layer's).
                    if *name == "replica port" && (trial / 4) % 2 == 0 {
                        let _ = exchange_replica(replica_port, &bytes, wait);
                    } else {
                        let _ = exchange(addr, &bytes, wait);
                    }
                }
                eprintln!("{name}: {TRIALS} garbage inputs sent");
            });
        }
        // Meanwhile the cluster serves: the API answers, and a detach and attach (admin API
        // calls, Hellos with grants) and I/O work.
        c.cli_ok(&["volume", "list"]);
        c.cli_ok(&["volume", "detach", "a"]);
        c.cli_ok(&["volume", "attach", "a", "--node", "n1"]);
        qemu_io(&uri, &["read -P 0x17 0 4M", "write -P 0x18 4M 1M"]);
    });
    // Every slow connection is cut off by the server (or was refused at once).
    for (name, mut s) in slow {
        let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    panic!("{name}: a slowloris connection is still open after 60 s")
                }
                Err(_) => break,
            }
        }
    }
    assert!(c.agent_alive("n1") && c.agent_alive("n2"), "an agent died");
    assert!(
        c.controllers[0].child.try_wait().expect("wait").is_none(),
        "the controller died"
    );
    let rss_after: Vec<u64> = pids.iter().map(|(_, p)| rss_kib(*p)).collect();
    for (((name, _), before), after) in pids.iter().zip(&rss_before).zip(&rss_after) {
        eprintln!("{name}: RSS {before} KiB before, {after} KiB after");
        assert!(
            *after < before + 64 * 1024,
            "{name} grew from {before} KiB to {after} KiB"
        );
    }
    // Still serving, with the data intact. The garbage includes Hellos with valid grants at
    // the volume's epoch before the detach: one that lands before the detach opens a session
    // that replaces the engine's (as an engine's reconnect would), so the replica may be
    // outdated and resynced by the next engine; it must be back in sync, not stuck.
    qemu_io(&uri, &["read -P 0x17 0 4M", "read -P 0x18 4M 1M"]);
    hawser_e2e::wait_volumes_whole(&c, Duration::from_secs(60));
    let v = c.volume("a");
    assert!(
        v.replicas
            .iter()
            .all(|r| r.state == hawser_api::controller::ReplicaState::InSync),
        "a replica left the in-sync set: {v:?}"
    );
}

/// A connection to `addr` from the loopback address `source`: another peer, as far as
/// per-peer limits go.
fn connect_from(source: [u8; 4], addr: &str) -> TcpStream {
    let target: std::net::SocketAddr = addr.parse().expect("a socket address");
    let sock = connect_bound(source, target);
    sock.set_nodelay(true).expect("nodelay");
    sock
}

/// `connect(2)` from a chosen source address, with std only: bind a listener-less socket via
/// libc, since std's TcpStream cannot bind before connecting.
// AF_INET and the size of sockaddr_in fit their C types.
#[allow(clippy::cast_possible_truncation)]
fn connect_bound(source: [u8; 4], target: std::net::SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let std::net::SocketAddr::V4(t) = target else {
        panic!("IPv4 only: {target}")
    };
    // SAFETY: plain socket calls on a descriptor this function owns until it is handed to
    // TcpStream; the sockaddr structs live across the calls that read them.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let stream = TcpStream::from_raw_fd(fd);
        let mut src: libc::sockaddr_in = std::mem::zeroed();
        src.sin_family = libc::AF_INET as libc::sa_family_t;
        src.sin_addr.s_addr = u32::from_ne_bytes(source);
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let r = libc::bind(fd, std::ptr::addr_of!(src).cast(), len);
        assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
        let mut dst: libc::sockaddr_in = std::mem::zeroed();
        dst.sin_family = libc::AF_INET as libc::sa_family_t;
        dst.sin_port = t.port().to_be();
        dst.sin_addr.s_addr = u32::from_ne_bytes(t.ip().octets());
        let r = libc::connect(fd, std::ptr::addr_of!(dst).cast(), len);
        assert_eq!(
            r,
            0,
            "connect to {target}: {}",
            std::io::Error::last_os_error()
        );
        stream
    }
}

fn send_garbage(addr: &str, bytes: &[u8]) {
    let _ = exchange(addr, bytes, Duration::from_millis(200));
}

/// Send `bytes`, close the sending side, and return what came back until the server closed
/// (or `wait` passed without a byte).
fn exchange(addr: &str, bytes: &[u8], wait: Duration) -> Vec<u8> {
    exchange_on(TcpStream::connect(addr).map(Conn::Plain), addr, bytes, wait)
}

/// [`exchange`] inside an authenticated session of the replica port (TLS with a node's
/// certificate unless the cluster is `--insecure`): what reaches the replica protocol's
/// decoders rather than TLS's.
fn exchange_replica(port: &ReplicaPort, bytes: &[u8], wait: Duration) -> Vec<u8> {
    exchange_on(port.connect(), &port.addr, bytes, wait)
}

fn exchange_on(conn: std::io::Result<Conn>, addr: &str, bytes: &[u8], wait: Duration) -> Vec<u8> {
    let Ok(mut s) = conn else {
        panic!("{addr} stopped accepting")
    };
    s.exchange(bytes, true, wait).bytes
}

fn nbd_garbage(rng: &mut impl RngCore) -> Vec<u8> {
    let mut b = vec![0u8; rng.random_range(0..2048)];
    rng.fill_bytes(&mut b);
    if rng.random_bool(0.5) {
        // A valid client flags word, then a plausible option header with random contents.
        let mut v = vec![0, 0, 0, 3];
        v.extend_from_slice(b"IHAVEOPT");
        v.extend_from_slice(&b);
        return v;
    }
    b
}

/// What cannot open a session of the attached volume's replica (`epoch` is the volume's):
/// random bytes; a header with a valid checksum and random fields (any opcode but Hello),
/// then random bytes; a Hello of an older epoch, then a write whose payload checksum is wrong;
/// a Hello for a replica that does not exist.
fn replica_garbage(rng: &mut impl RngCore, hellos: &Hellos, epoch: u64, trial: u32) -> Vec<u8> {
    use hawser_wire_helpers::*;
    match trial % 4 {
        0 => {
            let mut b = vec![0u8; rng.random_range(0..2048)];
            rng.fill_bytes(&mut b);
            b
        }
        1 => {
            let mut v = random_header(rng);
            let mut tail = vec![0u8; rng.random_range(0..512)];
            rng.fill_bytes(&mut tail);
            v.extend(tail);
            v
        }
        2 => {
            let (older, payload) = &hellos.replica[rng.random_range(0..hellos.replica.len() - 1)];
            let mut v = hello(1, *older, payload);
            v.extend(write(rng, 2, epoch, true));
            v
        }
        _ => {
            let (e, payload) = &hellos.unknown[rng.random_range(0..hellos.unknown.len())];
            hello(1, *e, payload)
        }
    }
}

/// Epochs `0..=epoch` with Hello payloads carrying grants the controller's key signed: for
/// the replica under test and for a replica id that does not exist.
struct Hellos {
    replica: Vec<(u64, Vec<u8>)>,
    unknown: Vec<(u64, Vec<u8>)>,
}

impl Hellos {
    fn new(c: &Cluster, volume: &str, replica: &str, epoch: u64) -> Hellos {
        let make = |id: &str| {
            (0..=epoch)
                .map(|e| (e, c.granted_hello(id, volume, "n1", e)))
                .collect()
        };
        Hellos {
            replica: make(replica),
            unknown: make("no-such-replica"),
        }
    }
}

struct SessionTrial {
    /// Requests of an older epoch that were answered StaleEpoch.
    stale_refused: usize,
    /// The trial ended with a frame the server must close the connection on.
    closed_on_bad_frame: bool,
}

/// A session at the replica's own `epoch` of a detached volume, then 1-8 requests that must
/// change nothing, perhaps ending in a write with a wrong payload checksum and trailing bytes.
/// Every reply must decode; the Hello must be accepted and every request of an older epoch
/// refused.
fn session_trial(
    port: &ReplicaPort,
    rng: &mut impl RngCore,
    hello_payload: &[u8],
    epoch: u64,
) -> SessionTrial {
    use hawser_wire::frame::{FrameError, FrameHeader, Op, Status, HEADER_LEN};
    use hawser_wire_helpers::*;
    let mut bytes = hello(1, epoch, hello_payload);
    let mut stale_ids = Vec::new();
    let mut closed_on_bad_frame = false;
    for id in 2..rng.random_range(3..11u64) {
        let older = rng.random_range(0..epoch);
        let frame = match rng.random_range(0..10) {
            0 => {
                closed_on_bad_frame = true;
                write(rng, id, epoch, true)
            }
            1 => {
                stale_ids.push(id);
                write(rng, id, older, false)
            }
            2 => {
                stale_ids.push(id);
                let op = if rng.random_bool(0.5) {
                    Op::Trim
                } else {
                    Op::WriteZeroes
                };
                request(
                    op,
                    id,
                    older,
                    random_offset(rng),
                    rng.random_range(1..=256) * 4096,
                )
            }
            3 => {
                stale_ids.push(id);
                let mut journal = vec![0u8; rng.random_range(1..256)];
                rng.fill_bytes(&mut journal);
                frame(Op::PutJournal as u16, 0, id, older, 0, &journal, false)
            }
            4 => {
                let len = rng.random_range(0..=64) * 4096;
                request(Op::Read, id, epoch, random_offset(rng), len)
            }
            5 => {
                let len = rng.random_range(0..=64) << 16;
                request(Op::Checksum, id, epoch, random_offset(rng), len)
            }
            6 => request(Op::GetJournal, id, epoch, 0, 0),
            7 => request(Op::Flush, id, epoch, 0, 0),
            8 => request(Op::Ping, id, rng.random_range(0..=epoch), 0, 0),
            _ => {
                stale_ids.push(id);
                request(Op::Read, id, older, 0, 4096)
            }
        };
        bytes.extend(frame);
        if closed_on_bad_frame {
            let mut tail = vec![0u8; rng.random_range(0..256)];
            rng.fill_bytes(&mut tail);
            bytes.extend(tail);
            break;
        }
    }
    let replies = exchange_replica(port, &bytes, Duration::from_secs(5));
    let mut at = 0;
    let mut hello_ok = false;
    let mut stale_refused = 0;
    while at < replies.len() {
        // Closing on a bad frame with our trailing bytes unread resets the connection, which
        // may cut the last reply short; nothing else may.
        let h = match FrameHeader::decode(&replies[at..]) {
            Err(FrameError::Truncated { .. }) if closed_on_bad_frame => break,
            r => r.unwrap_or_else(|e| panic!("the replica server sent a bad frame: {e}")),
        };
        assert!(h.is_reply(), "a reply without the reply flag: {h:?}");
        at += HEADER_LEN + h.payload_len as usize;
        if at > replies.len() {
            assert!(closed_on_bad_frame, "a reply cut short: {h:?}");
            break;
        }
        match h.op {
            Op::Hello => {
                assert_eq!(h.status, Status::Ok, "Hello at the replica's epoch {epoch}");
                hello_ok = true;
            }
            _ if stale_ids.contains(&h.request_id) => {
                assert_eq!(
                    h.status,
                    Status::StaleEpoch,
                    "a request of an older epoch: {h:?}"
                );
                stale_refused += 1;
            }
            _ => assert_ne!(
                h.status,
                Status::StaleEpoch,
                "a request of the current epoch: {h:?}"
            ),
        }
    }
    assert!(
        hello_ok,
        "no answer to a Hello at the replica's epoch {epoch}"
    );
    SessionTrial {
        stale_refused,
        closed_on_bad_frame,
    }
}

/// Frame building for the tests, kept apart so it reads as the wire layout in docs/protocol.md
/// (its own layout and CRC-32C, checked against the real decoder on every frame it builds,
/// so a change of the wire format fails here rather than leaving the trials to stop at the
/// version check).
mod hawser_wire_helpers {
    use hawser_wire::frame::{FrameHeader, Op, FRAME_MAGIC, FRAME_VERSION};
    use rand::{Rng, RngCore};

    /// A frame: the 56-byte header, then the payload. `bad_crc` spoils the payload checksum.
    pub fn frame(
        op: u16,
        flags: u32,
        request_id: u64,
        epoch: u64,
        offset: u64,
        payload: &[u8],
        bad_crc: bool,
    ) -> Vec<u8> {
        let length = u32::try_from(payload.len()).expect("test payloads are small");
        let mut b = header(
            op, flags, request_id, epoch, offset, length, payload, bad_crc,
        );
        b.extend_from_slice(payload);
        b
    }

    /// A request without payload covering `length` bytes.
    pub fn request(op: Op, request_id: u64, epoch: u64, offset: u64, length: u32) -> Vec<u8> {
        header(op as u16, 0, request_id, epoch, offset, length, &[], false)
    }

    #[allow(clippy::too_many_arguments)]
    fn header(
        op: u16,
        flags: u32,
        request_id: u64,
        epoch: u64,
        offset: u64,
        length: u32,
        payload: &[u8],
        bad_crc: bool,
    ) -> Vec<u8> {
        let mut b = vec![0u8; 56];
        b[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&FRAME_VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&op.to_le_bytes());
        b[8..12].copy_from_slice(&flags.to_le_bytes());
        b[16..24].copy_from_slice(&request_id.to_le_bytes());
        b[24..32].copy_from_slice(&epoch.to_le_bytes());
        b[32..40].copy_from_slice(&offset.to_le_bytes());
        b[40..44].copy_from_slice(&length.to_le_bytes());
        let plen = u32::try_from(payload.len()).expect("test payloads are small");
        b[44..48].copy_from_slice(&plen.to_le_bytes());
        let pcrc = crc32c(payload) ^ u32::from(bad_crc);
        b[48..52].copy_from_slice(&pcrc.to_le_bytes());
        let hcrc = crc32c(&b[0..52]);
        b[52..56].copy_from_slice(&hcrc.to_le_bytes());
        // This layout must be the one the replica server decodes.
        let h = FrameHeader::decode(&b).unwrap_or_else(|e| {
            panic!("the test's frame layout is not the wire's (docs/protocol.md): {e}")
        });
        assert_eq!(
            (h.op as u16, h.request_id, h.epoch, h.offset, h.length),
            (op, request_id, epoch, offset, length),
            "the test's frame layout is not the wire's"
        );
        assert_eq!(h.check_payload(payload).is_err(), bad_crc);
        b
    }

    pub fn crc32c(data: &[u8]) -> u32 {
        // Bitwise CRC-32C (Castagnoli), independent of the implementation under test.
        let mut crc = !0u32;
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0x82F6_3B78
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// A Hello with `payload` (a [`hawser_wire::grant::HelloRequest`]).
    pub fn hello(request_id: u64, epoch: u64, payload: &[u8]) -> Vec<u8> {
        frame(Op::Hello as u16, 0, request_id, epoch, 0, payload, false)
    }

    /// A 4 KiB write at a random 4 KiB offset in the first 4 MiB (the data written before the
    /// trials), with a valid or a spoilt payload checksum.
    pub fn write(rng: &mut impl RngCore, request_id: u64, epoch: u64, bad_crc: bool) -> Vec<u8> {
        let mut payload = vec![0u8; 4096];
        rng.fill_bytes(&mut payload);
        let offset = rng.random_range(0..1024u64) * 4096;
        frame(
            Op::Write as u16,
            0,
            request_id,
            epoch,
            offset,
            &payload,
            bad_crc,
        )
    }

    /// Mostly inside the 64 MiB volume; sometimes past its end or unaligned.
    pub fn random_offset(rng: &mut impl RngCore) -> u64 {
        match rng.random_range(0..8) {
            0 => rng.random(),
            1 => rng.random_range(0..(64u64 << 20)),
            _ => rng.random_range(0..16384u64) * 4096,
        }
    }

    /// A header with the current magic and version and a valid checksum, every other field
    /// random (the opcode any but Hello: no session may open while the volume is attached).
    pub fn random_header(rng: &mut impl RngCore) -> Vec<u8> {
        let mut b = vec![0u8; 56];
        rng.fill_bytes(&mut b);
        b[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&FRAME_VERSION.to_le_bytes());
        let op: u16 = match rng.random_range(0..3) {
            0 => rng.random_range(2..=10),
            1 => rng.random_range(11..=u16::MAX),
            _ => 0,
        };
        b[6..8].copy_from_slice(&op.to_le_bytes());
        if rng.random_bool(0.5) {
            // Known flags and statuses, so the length checks behind them are reached.
            b[8..12].copy_from_slice(&rng.random_range(0..16u32).to_le_bytes());
            b[12..16].copy_from_slice(&rng.random_range(0..8u32).to_le_bytes());
        }
        let hcrc = crc32c(&b[0..52]);
        b[52..56].copy_from_slice(&hcrc.to_le_bytes());
        b
    }
}

/// A pool on a 64 MiB filesystem, a thin 128 MiB volume: filling it gives the client ENOSPC,
/// the agent stays up, and data written before is intact.
#[test]
fn full_pool_gives_enospc_and_keeps_earlier_data() {
    if !have("qemu-io") || !have("mkfs.ext4") {
        eprintln!("SKIP: qemu-io or mkfs.ext4 missing");
        return;
    }
    let work = TempDir::new("enospc-fs");
    let fs = SmallFs::new(work.path(), 64);
    let pool = |n: &str| format!("small={}/{n},overprovision=4", fs.mount.dir.display());
    let opts = ClusterOptions {
        pools: vec![vec![pool("a")], vec![pool("b")]],
        ..ClusterOptions::default()
    };
    let mut c = Cluster::start_with("enospc", 2, opts);
    let uri = c.attached_volume("full", "128MiB", 2, "n1");
    qemu_io(&uri, &["write -P 0x77 0 8M", "flush"]);
    let out = std::process::Command::new("qemu-io")
        .args(["-f", "raw", &uri, "-c", "write -P 0x99 8M 100M"])
        .output()
        .expect("qemu-io");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("No space left on device"),
        "expected ENOSPC, got:\n{text}"
    );
    assert!(
        c.agent_alive("n1") && c.agent_alive("n2"),
        "an agent died on a full disk"
    );
    qemu_io(&uri, &["read -P 0x77 0 8M"]);
    let v = c.volume("full");
    // One replica may have taken the last free block while the other hit ENOSPC (it is then
    // outdated, correctly); the last copy is never given up.
    assert!(
        v.replicas
            .iter()
            .any(|r| r.state == hawser_api::controller::ReplicaState::InSync),
        "no in-sync replica left: {v:?}"
    );
    c.cli_ok(&["volume", "detach", "full"]);
    drop(c);
    drop(fs);
}
