//! Stateful fuzzing of the agent's replica server: the real server (`replica::server::serve`,
//! listening on a loopback port the kernel picks) over a real 1 MiB thin replica in a pool in
//! a temporary directory, with one snapshot (`s0`, taken while the replica is all zeros),
//! driven by a program of fuzzer-chosen actions on up to three connections: Hello (any epoch,
//! replica id, flags) or HelloSnapshot (of `s0` or of a replica or snapshot that does not
//! exist), single requests and pipelined bursts of every opcode with chosen epochs, offsets,
//! lengths, flags and payloads, frames with a bit flipped, raw garbage, closes.
//!
//! Beside the server, a model: the replica's epoch, which connection holds its current
//! session and which read the snapshot, the replica's bytes (sector by sector, or unknown
//! where concurrent or unanswered writes make the outcome undefined) and its last stored
//! journal. The properties:
//! - nothing panics, and every exchange ends within a deadline: each request is answered or
//!   the server closes the connection;
//! - a frame the wire decoder rejects (a flipped bit, a bad length, an unknown flag), a reply
//!   sent as a request, or a second Hello in an engine session closes the connection without
//!   an answer; a first frame other than Hello or HelloSnapshot (judged by its header: no
//!   payload is read before one) or a Hello payload that does not decode is answered Invalid,
//!   a Hello longer than any Hello closes unanswered, a Hello for another replica
//!   NoSuchReplica, a Hello with an older epoch StaleEpoch, and the connection closes;
//! - a request of a session replaced by a later Hello is answered Unavailable (Ping aside),
//!   and the connection closes;
//! - a request with an epoch older than the replica's is never executed (StaleEpoch), and a
//!   write, zeroing or trim from such a request never reaches the data;
//! - every other request gets exactly the status the replica's rules give (range, alignment,
//!   journal fit), echoes its header, and reads, checksums and GetJournal return what the
//!   model holds; at the end the replica's epoch and bytes equal the model's;
//! - a HelloSnapshot of `s0` of the replica, whatever its epoch, opens a read-only session
//!   answered with the snapshot's size and the replica's current epoch: it raises no epoch,
//!   replaces no session and is replaced by none; one naming another replica or snapshot is
//!   answered NoSuchReplica and the connection closes;
//! - in a snapshot session, whatever a request's epoch: Ping is answered Ok; a Read of at
//!   most a payload and a Checksum of at most `MAX_CHECKSUM_BYTES` are answered Ok within the
//!   snapshot's size (no alignment asked), else OutOfRange, and the session goes on; Reads
//!   return zeros and Checksums the digests of zeros, whatever was written to the replica
//!   since; a reply or a frame with a payload closes the connection unanswered, and any other
//!   request (a longer Read included) is answered Invalid and closes it; nothing of it
//!   reaches the replica's data, epoch or sessions.
#![no_main]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hawser_agent::storage::pools::NodeStorage;
use hawser_agent::replica;
use hawser_fuzz::{runs, Choices};
use hawser_storage::{node_boot_id, NewReplica, Pool, PoolConfig, PoolKind};
use hawser_wire::constants::MAX_PAYLOAD_BYTES;
use hawser_wire::frame::{
    checksum_reply_len, HelloInfo, CHECKSUM_BLOCK_BYTES, CHECKSUM_DIGEST_BYTES, FLAG_REPLY,
    HEADER_LEN, MAX_CHECKSUM_BYTES,
};
use hawser_wire::grant::{
    HelloRequest, HelloSnapshotRequest, MAX_HELLO_BYTES, MAX_HELLO_SNAPSHOT_BYTES,
};
use hawser_wire::journal::{Journal, OutReplica, StoredReport, ACTIVITY_EXTENT_BYTES};
use hawser_wire::{FrameHeader, Op, Status};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The replica's size: small, so the model and the final comparison are cheap.
const SIZE: u64 = 1 << 20;
const SECTOR: u64 = 512;
const SECTORS: usize = (SIZE / SECTOR) as usize;
const SLOTS: usize = 3;
const MAX_ACTIONS: usize = 48;
const MAX_BURST: u8 = 8;
/// Longest a write payload built here may be (longer asked lengths get no payload, which the
/// decoder rejects).
const MAX_BUILT_PAYLOAD: u32 = 2 << 20;
/// An exchange that neither completes nor closes in this long is a hang.
const DEADLINE: Duration = Duration::from_secs(10);
/// The replica's one snapshot, taken while it is all zeros.
const SNAPSHOT: &str = "s0";

struct Env {
    rt: tokio::runtime::Runtime,
    storage: Arc<NodeStorage>,
    addr: SocketAddr,
    boot: u64,
    next_replica: std::sync::atomic::AtomicU64,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let dir = hawser_fuzz::scratch_dir("session");
        let boot = node_boot_id();
        let pool = Pool::open(PoolConfig {
            name: "p".into(),
            path: dir,
            overprovision_ratio: 1000.0,
            capacity_limit: None,
            kind: PoolKind::Any,
            boot_id: boot,
        })
        .expect("open the fuzz pool");
        let storage = Arc::new(NodeStorage::new("fuzz".into(), vec![pool]));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let addr = rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind a loopback port");
            let addr = listener.local_addr().expect("local address");
            let (stop, stopped) = tokio::sync::watch::channel(false);
            // The server runs for the life of the process.
            std::mem::forget(stop);
            tokio::spawn(replica::server::serve(
                listener,
                storage.clone(),
                None,
                Default::default(),
                stopped,
            ));
            addr
        });
        Env {
            rt,
            storage,
            addr,
            boot,
            next_replica: 0.into(),
        }
    })
}

/// What the server must hold after the exchanges so far.
struct Model {
    id: String,
    epoch: u64,
    /// Successful Hellos so far: the session number of the latest one is current.
    sessions: u64,
    data: Vec<u8>,
    /// Per sector: whether `data` is what the replica must hold there.
    known: Vec<bool>,
    /// Per 4 KiB block: whether its checksum may not match its data. Two mutations of one
    /// block at once (each sums the block from a read-back) or an unanswered one can leave it
    /// so; a write into part of such a block keeps it failing (the replica cannot tell it
    /// from rot); only one mutation covering the whole block sets it right.
    sum_unsure: Vec<bool>,
    /// The last journal stored and the one stored before it (the replica's two slots), if
    /// known: GetJournal must return the greater by (epoch, seq).
    journal: Option<(Option<Journal>, Journal)>,
    next_request: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Connected; the first frame is handled as a Hello.
    AwaitingHello,
    /// Holds the session of this number.
    Session(u64),
    /// Reads the replica's snapshot [`SNAPSHOT`] (all zeros).
    Snapshot,
}

struct Conn {
    stream: TcpStream,
    state: State,
}

/// A frame as sent, and the header the server will decode from it (`None`: it rejects it).
struct Frame {
    request_id: u64,
    bytes: Vec<u8>,
    accepted: Option<FrameHeader>,
    payload: Vec<u8>,
}

/// What the server must do with one frame.
#[derive(Clone, Debug)]
enum Expect {
    /// Answer with this status (and go on).
    Reply(Status),
    /// Answer with this status, then close the connection.
    ReplyThenClose(Status),
    /// Close without answering it.
    Close,
    /// Never read (the connection closes at an earlier frame).
    Unread,
}

fn accepted(bytes: &[u8]) -> Option<FrameHeader> {
    let h = FrameHeader::decode(bytes).ok()?;
    let payload = bytes.get(HEADER_LEN..)?;
    h.check_payload(payload).ok()?;
    Some(h)
}

impl Model {
    #[allow(clippy::too_many_arguments)]
    fn frame(
        &mut self,
        op: Op,
        flags: u32,
        epoch: u64,
        offset: u64,
        length: u32,
        payload: Vec<u8>,
        mangle: Option<u16>,
    ) -> Frame {
        self.next_request += 1;
        let request_id = self.next_request;
        let mut h =
            FrameHeader::request(op, request_id, epoch, offset, length).with_payload(&payload);
        h.flags = flags;
        let mut bytes = h.encode().to_vec();
        bytes.extend_from_slice(&payload);
        if let Some(bit) = mangle {
            let bit = usize::from(bit) % (bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
        }
        Frame {
            request_id,
            accepted: accepted(&bytes),
            bytes,
            payload,
        }
    }

    fn in_range(offset: u64, len: u64) -> bool {
        offset.is_multiple_of(SECTOR)
            && len.is_multiple_of(SECTOR)
            && offset.checked_add(len).is_some_and(|end| end <= SIZE)
    }

    /// The status a request of the current session must get, by the replica's rules.
    fn status_of(&self, h: &FrameHeader, payload: &[u8]) -> Status {
        let (offset, len) = (h.offset, u64::from(h.length));
        match h.op {
            Op::Read if h.length > MAX_PAYLOAD_BYTES => return Status::OutOfRange,
            Op::Checksum if h.length > MAX_CHECKSUM_BYTES => return Status::OutOfRange,
            _ if h.epoch < self.epoch => return Status::StaleEpoch,
            _ => {}
        }
        let ok = match h.op {
            Op::Flush | Op::GetJournal => true,
            Op::PutJournal => {
                Journal::decode(payload).is_ok_and(|j| j.epoch == h.epoch && j.size <= SIZE)
            }
            Op::Read | Op::Write | Op::Trim | Op::WriteZeroes | Op::Checksum => {
                Self::in_range(offset, len)
            }
            Op::Hello | Op::HelloSnapshot | Op::Ping => unreachable!("handled by the caller"),
        };
        if ok {
            Status::Ok
        } else {
            Status::OutOfRange
        }
    }

    fn sectors(offset: u64, len: u64) -> std::ops::Range<usize> {
        (offset / SECTOR) as usize..((offset + len) / SECTOR) as usize
    }

    fn all_known(&self, offset: u64, len: u64) -> bool {
        self.known[Self::sectors(offset, len)].iter().all(|&k| k)
    }
}

/// Decide, frame by frame, what the server must do and in which state of the connection it
/// reads the frame, updating the connection's state and the model's epoch and sessions for
/// Hellos that must succeed.
fn expectations(
    model: &mut Model,
    state: &mut State,
    frames: &[Frame],
) -> (Vec<Expect>, Vec<State>) {
    let mut out = Vec::with_capacity(frames.len());
    let mut sent_in = Vec::with_capacity(frames.len());
    let mut closed = false;
    for f in frames {
        sent_in.push(*state);
        if closed {
            out.push(Expect::Unread);
            continue;
        }
        let e = match (f.accepted, *state) {
            // Before a Hello the server reads a frame's header alone (an unauthenticated peer
            // gets no payload allocated), so a first frame that is not a Hello is answered
            // Invalid whatever its payload holds.
            (None, State::AwaitingHello) => match FrameHeader::decode(&f.bytes) {
                Ok(h) if !matches!(h.op, Op::Hello | Op::HelloSnapshot) || h.is_reply() => {
                    Expect::ReplyThenClose(Status::Invalid)
                }
                _ => Expect::Close,
            },
            (None, _) => Expect::Close,
            (Some(h), State::AwaitingHello) => first_frame(model, state, &h, &f.payload),
            (Some(h), State::Snapshot) => snapshot_request(&h),
            (Some(h), State::Session(_))
                if h.is_reply() || matches!(h.op, Op::Hello | Op::HelloSnapshot) =>
            {
                Expect::Close
            }
            (Some(h), State::Session(_)) if h.op == Op::Ping => Expect::Reply(Status::Ok),
            (Some(_), State::Session(s)) if s != model.sessions => {
                Expect::ReplyThenClose(Status::Unavailable)
            }
            (Some(h), State::Session(_)) => Expect::Reply(model.status_of(&h, &f.payload)),
        };
        closed = !matches!(e, Expect::Reply(_));
        out.push(e);
    }
    (out, sent_in)
}

/// What the server must do with a first frame it accepts; a Hello or HelloSnapshot that must
/// succeed opens its session (a Hello raising the model's epoch).
fn first_frame(model: &mut Model, state: &mut State, h: &FrameHeader, payload: &[u8]) -> Expect {
    if !matches!(h.op, Op::Hello | Op::HelloSnapshot) || h.is_reply() {
        return Expect::ReplyThenClose(Status::Invalid);
    }
    if h.op == Op::HelloSnapshot {
        // Its epoch is not looked at, nor its grant on a node outside a cluster.
        if payload.len() > MAX_HELLO_SNAPSHOT_BYTES {
            return Expect::Close;
        }
        return match HelloSnapshotRequest::decode(payload) {
            None => Expect::ReplyThenClose(Status::Invalid),
            Some(r) if r.replica == model.id && r.snapshot == SNAPSHOT => {
                *state = State::Snapshot;
                Expect::Reply(Status::Ok)
            }
            Some(_) => Expect::ReplyThenClose(Status::NoSuchReplica),
        };
    }
    if payload.len() > MAX_HELLO_BYTES {
        return Expect::Close;
    }
    match HelloRequest::decode(payload) {
        None => Expect::ReplyThenClose(Status::Invalid),
        Some(r) if r.replica != model.id => Expect::ReplyThenClose(Status::NoSuchReplica),
        Some(_) if h.epoch < model.epoch => Expect::ReplyThenClose(Status::StaleEpoch),
        Some(_) => {
            model.epoch = h.epoch;
            model.sessions += 1;
            *state = State::Session(model.sessions);
            Expect::Reply(Status::Ok)
        }
    }
}

/// What a snapshot session (`replica/snapshot_session.rs`) must do with a frame it accepts: serve
/// Ping, Read and Checksum of the snapshot, one by one and whatever their epoch.
fn snapshot_request(h: &FrameHeader) -> Expect {
    if h.is_reply() || h.payload_len > 0 {
        return Expect::Close;
    }
    let within = |most: u32| {
        let end = h.offset.checked_add(u64::from(h.length));
        if h.length <= most && end.is_some_and(|e| e <= SIZE) {
            Status::Ok
        } else {
            Status::OutOfRange
        }
    };
    match h.op {
        Op::Ping => Expect::Reply(Status::Ok),
        // A longer Read is not one the session serves (an engine session answers it
        // OutOfRange and goes on).
        Op::Read if h.length <= MAX_PAYLOAD_BYTES => Expect::Reply(within(MAX_PAYLOAD_BYTES)),
        Op::Checksum => Expect::Reply(within(MAX_CHECKSUM_BYTES)),
        _ => Expect::ReplyThenClose(Status::Invalid),
    }
}

struct Reply {
    header: FrameHeader,
    payload: Vec<u8>,
}

/// Read one reply; `None` when the server closed the connection.
async fn read_reply(rd: &mut (impl AsyncReadExt + Unpin)) -> Option<Reply> {
    let mut hdr = [0u8; HEADER_LEN];
    rd.read_exact(&mut hdr).await.ok()?;
    let header = FrameHeader::decode(&hdr)
        .unwrap_or_else(|e| panic!("the server sent a frame its own decoder rejects: {e}"));
    let mut payload = vec![0u8; header.payload_len as usize];
    // A close with bytes of ours unread is a reset, which may cut a reply short: a close like
    // any other (the caller fails it unless a close was due).
    rd.read_exact(&mut payload).await.ok()?;
    header
        .check_payload(&payload)
        .unwrap_or_else(|e| panic!("reply payload: {e}"));
    Some(reply_checked(Reply { header, payload }))
}

fn reply_checked(r: Reply) -> Reply {
    assert!(
        r.header.is_reply(),
        "a reply without the reply flag: {:?}",
        r.header
    );
    assert_eq!(r.header.flags, FLAG_REPLY, "a reply with request flags");
    r
}

/// Send `frames` (and then `garbage`, closing the sending side) while reading the replies,
/// until every frame that must be answered is, or the server closes. Returns the replies by
/// frame and whether the server closed.
async fn exchange(
    conn: &mut Conn,
    frames: &[Frame],
    garbage: Option<&[u8]>,
    expect: &[Expect],
) -> (Vec<Option<Reply>>, bool) {
    let must_close = garbage.is_some() || expect.iter().any(|e| !matches!(e, Expect::Reply(_)));
    let (mut rd, mut wr) = conn.stream.split();
    let send = async {
        // Frames the server will not read are not sent: unread bytes would turn its close
        // into a reset.
        for (f, e) in frames.iter().zip(expect) {
            if matches!(e, Expect::Unread) || wr.write_all(&f.bytes).await.is_err() {
                return;
            }
        }
        if let Some(g) = garbage {
            let _ = wr.write_all(g).await;
            let _ = wr.shutdown().await;
        }
    };
    let receive = async {
        let mut replies: Vec<Option<Reply>> = frames.iter().map(|_| None).collect();
        let mut pending = if must_close { usize::MAX } else { frames.len() };
        while pending > 0 {
            let Some(r) = read_reply(&mut rd).await else {
                return (replies, true);
            };
            let i = frames
                .iter()
                .position(|f| f.request_id == r.header.request_id)
                .unwrap_or_else(|| panic!("a reply to no request sent: {:?}", r.header));
            assert!(
                replies[i].is_none(),
                "two replies to request {i}: {:?}",
                r.header
            );
            replies[i] = Some(r);
            pending = pending.saturating_sub(1);
        }
        (replies, false)
    };
    let ((), result) = tokio::time::timeout(DEADLINE, async { tokio::join!(send, receive) })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the server neither answered nor closed within {DEADLINE:?} (expected {expect:?})"
            )
        });
    result
}

/// Check the replies against the expectations and bring the model up to date.
fn settle(
    model: &mut Model,
    env: &Env,
    frames: &[Frame],
    (expect, sent_in): (&[Expect], &[State]),
    replies: &[Option<Reply>],
) {
    // Replies: present where required, absent where forbidden, statuses and echoes right.
    for (i, ((f, e), r)) in frames.iter().zip(expect).zip(replies).enumerate() {
        match (e, r) {
            (Expect::Close | Expect::Unread, Some(r)) => {
                panic!("frame {i} ({e:?}) was answered: {:?}", r.header)
            }
            (Expect::ReplyThenClose(s), None) => {
                panic!("frame {i} was not answered {s:?} before the close")
            }
            (Expect::Reply(_), None) | (Expect::Close | Expect::Unread, None) => {}
            (Expect::Reply(s) | Expect::ReplyThenClose(s), Some(r)) => {
                let h = f
                    .accepted
                    .or_else(|| FrameHeader::decode(&f.bytes).ok())
                    .expect("only frames with a valid header are answered");
                let got = r.header;
                if known_deviation(&h, got.status, *s) {
                    continue;
                }
                if got.status == Status::Corrupt && may_be_corrupt(model, frames, expect, i, &h) {
                    continue;
                }
                assert_eq!(
                    got.status, *s,
                    "frame {i} {:?} epoch {} (replica {}) offset {} length {}: wrong status",
                    h.op, h.epoch, model.epoch, h.offset, h.length
                );
                assert_eq!(
                    (got.op, got.request_id, got.epoch, got.offset, got.length),
                    (h.op, h.request_id, h.epoch, h.offset, h.length),
                    "a reply that does not echo its request"
                );
                if *s != Status::Ok {
                    assert!(r.payload.is_empty(), "an error reply with a payload");
                }
            }
        }
    }

    // Mutations that may have reached the replica: answered Ok, or unanswered but bound to
    // succeed (the connection closed while they ran). Stale and refused ones never may.
    let mut mutations = Vec::new();
    let mut journals = 0;
    let mut journal_unknown = false;
    for (((f, e), r), state) in frames.iter().zip(expect).zip(replies).zip(sent_in) {
        let (Some(h), Expect::Reply(Status::Ok), State::Session(_)) = (f.accepted, e, state) else {
            continue;
        };
        match h.op {
            Op::Write | Op::WriteZeroes | Op::Trim => mutations.push((h, f, r.is_some())),
            Op::PutJournal => {
                journals += 1;
                journal_unknown |= r.is_none();
            }
            _ => {}
        }
    }
    let mut touched = vec![0u8; SECTORS];
    // Mutations per 4 KiB block: two at once in one block leave its checksum undefined (each
    // sums the block from a read-back), so its sectors become unknown (`may_be_corrupt`).
    let mut in_block = vec![0u8; SECTORS / 8 + 1];
    for (h, _, _) in &mutations {
        for s in Model::sectors(h.offset, u64::from(h.length)) {
            touched[s] = touched[s].saturating_add(1);
        }
        let (offset, len) = (h.offset, u64::from(h.length));
        for b in (offset / 4096)..(offset + len).div_ceil(4096) {
            if let Some(n) = in_block.get_mut(b as usize) {
                *n = n.saturating_add(1);
            }
        }
    }

    // Reads, checksums and journals that no concurrent mutation may have changed.
    for (((f, e), r), state) in frames.iter().zip(expect).zip(replies).zip(sent_in) {
        let (Some(h), Expect::Reply(Status::Ok), Some(r)) = (f.accepted, e, r) else {
            continue;
        };
        // A read that raced a write of its blocks (`may_be_corrupt`).
        if r.header.status == Status::Corrupt {
            continue;
        }
        if *state == State::Snapshot {
            check_snapshot_reply(&h, r);
            continue;
        }
        let (offset, len) = (h.offset, u64::from(h.length));
        let stable = |m: &Model| {
            m.all_known(offset, len) && Model::sectors(offset, len).all(|s| touched[s] == 0)
        };
        // Only for the reads and checksums answered Ok, which were in range.
        let expected = || &model.data[offset as usize..(offset + len) as usize];
        match h.op {
            Op::Hello => {
                let info = HelloInfo::decode(&r.payload).expect("a Hello reply carries HelloInfo");
                assert_eq!(
                    (info.size, info.boot_id),
                    (SIZE, env.boot),
                    "Hello reply {info:?}"
                );
                assert_eq!(info.epoch, h.epoch, "Hello reply epoch");
            }
            Op::HelloSnapshot => {
                let info =
                    HelloInfo::decode(&r.payload).expect("a HelloSnapshot reply carries HelloInfo");
                // The snapshot's size; the replica's epoch, which the Hello did not raise.
                assert_eq!(
                    (info.size, info.epoch, info.boot_id),
                    (SIZE, model.epoch, env.boot),
                    "HelloSnapshot reply {info:?}"
                );
            }
            Op::Read => {
                assert_eq!(
                    r.payload.len() as u64,
                    len,
                    "a read reply of the wrong length"
                );
                if stable(model) && r.payload != expected() {
                    let at = r.payload.iter().zip(expected()).position(|(a, b)| a != b);
                    panic!("read {offset}+{len} differs from what was written, at byte {at:?}");
                }
            }
            Op::Checksum => {
                assert_eq!(r.payload.len(), checksum_reply_len(h.length) as usize);
                if stable(model) {
                    let want = digests(expected());
                    assert_eq!(r.payload, want, "checksum of {offset}+{len} differs");
                }
            }
            Op::GetJournal if journals == 0 => {
                if let Some((prev, last)) = &model.journal {
                    let report = StoredReport::decode(&r.payload)
                        .unwrap_or_else(|e| panic!("GetJournal after a PutJournal: {e}"));
                    assert!(
                        !report.rebooted,
                        "a journal stored in this boot reported rebooted"
                    );
                    check_journal(&report.journal, prev.as_ref(), last);
                } else if !r.payload.is_empty() {
                    StoredReport::decode(&r.payload).expect("a GetJournal reply decodes");
                }
            }
            _ => {}
        }
    }

    for (h, _, answered) in &mutations {
        let (offset, len) = (h.offset, u64::from(h.length));
        for b in (offset / 4096)..(offset + len).div_ceil(4096) {
            let whole = offset <= b * 4096 && (b + 1) * 4096 <= offset + len;
            let Some(unsure) = model.sum_unsure.get_mut(b as usize) else {
                continue;
            };
            if !answered || in_block[b as usize] > 1 {
                *unsure = true;
            } else if whole {
                *unsure = false;
            }
        }
    }
    for (h, f, answered) in mutations {
        let (offset, len) = (h.offset, u64::from(h.length));
        for s in Model::sectors(offset, len) {
            if !answered || touched[s] > 1 || in_block[s / 8] > 1 {
                model.known[s] = false;
                continue;
            }
            let at = s * SECTOR as usize;
            let sector = &mut model.data[at..at + SECTOR as usize];
            match h.op {
                Op::Write => {
                    let from = at - offset as usize;
                    sector.copy_from_slice(&f.payload[from..from + SECTOR as usize]);
                }
                _ => sector.fill(0),
            }
            model.known[s] = true;
        }
    }
    if journals > 0 {
        let before = model.journal.take();
        if journals == 1 && !journal_unknown {
            let put = frames.iter().zip(expect).find(|(f, e)| {
                matches!(e, Expect::Reply(Status::Ok))
                    && f.accepted.is_some_and(|h| h.op == Op::PutJournal)
            });
            if let Some(j) = put.and_then(|(f, _)| Journal::decode(&f.payload).ok()) {
                model.journal = Some((before.map(|(_, last)| last), j));
            }
        }
    }
}

/// `Op::Checksum`'s digests of `data`: one per block, the last block maybe short.
fn digests(data: &[u8]) -> Vec<u8> {
    data.chunks(CHECKSUM_BLOCK_BYTES as usize)
        .flat_map(|b| Sha256::digest(b)[..CHECKSUM_DIGEST_BYTES].to_vec())
        .collect()
}

/// A snapshot session's Ok answer: the snapshot holds zeros, whatever was written to the
/// replica since it was taken.
fn check_snapshot_reply(h: &FrameHeader, r: &Reply) {
    let (offset, len) = (h.offset, h.length);
    match h.op {
        Op::Read => {
            assert_eq!(
                r.payload.len(),
                len as usize,
                "a snapshot read of the wrong length"
            );
            if let Some(at) = r.payload.iter().position(|&b| b != 0) {
                panic!("snapshot read {offset}+{len} is not zeros at byte {at}");
            }
        }
        Op::Checksum => {
            let want = digests(&vec![0; len as usize]);
            assert_eq!(
                r.payload, want,
                "snapshot checksum of {offset}+{len} differs"
            );
        }
        Op::Ping => assert!(r.payload.is_empty(), "a Ping reply with a payload"),
        _ => panic!("a snapshot session answered {:?} Ok", h.op),
    }
}

/// Answers that differ from the rules in a way already reported, tolerated so the target keeps
/// looking for new ones. Remove an entry once its cause is fixed.
/// The replica keeps block checksums, and writes a block's data before its sum: a read of a
/// block that a write in the same burst is changing may answer Corrupt (the engine's range
/// lock keeps its own reads and writes of a block apart, and re-reads under it), and so may a
/// read of a block that overlapping writes left undefined. Anything else must not.
fn may_be_corrupt(model: &Model, frames: &[Frame], expect: &[Expect], i: usize, h: &FrameHeader) -> bool {
    if h.op != Op::Read {
        return false;
    }
    let block = |offset: u64, len: u64| (offset / 4096 * 4096, (offset + len).div_ceil(4096) * 4096);
    let (a, b) = block(h.offset, u64::from(h.length));
    let racing = frames.iter().zip(expect).enumerate().any(|(j, (f, e))| {
        j != i
            && matches!(e, Expect::Reply(Status::Ok))
            && f.accepted.is_some_and(|m| {
                let (c, d) = block(m.offset, u64::from(m.length));
                matches!(m.op, Op::Write | Op::WriteZeroes | Op::Trim) && c < b && a < d
            })
    });
    let end = b.min(model.data.len() as u64);
    let unsure = (a / 4096..end.div_ceil(4096)).any(|k| model.sum_unsure.get(k as usize) == Some(&true));
    racing || unsure || (a < end && !model.all_known(a, end - a))
}

fn known_deviation(_h: &FrameHeader, _got: Status, _expected: Status) -> bool {
    // None now (a zero-length Trim or WriteZeroes answered IoError until the replica
    // learned to do nothing for it).
    false
}

/// GetJournal's journal, given the last two stored (`prev` unknown: `None`): the greater by
/// (epoch, seq).
fn check_journal(got: &Journal, prev: Option<&Journal>, last: &Journal) {
    let key = |j: &Journal| (j.epoch, j.seq);
    if got == last {
        if let Some(p) = prev {
            assert!(
                key(p) <= key(last),
                "GetJournal returned {:?} though the other slot holds the newer {:?}",
                key(last),
                key(p)
            );
        }
        return;
    }
    match prev {
        Some(p) => {
            assert_eq!(got, p, "GetJournal returned a journal never stored");
            assert!(
                key(p) >= key(last),
                "GetJournal returned the older of two journals"
            );
        }
        None => assert!(
            key(got) >= key(last),
            "GetJournal returned {:?}, older than the last stored {:?}",
            key(got),
            key(last)
        ),
    }
}

fn epoch_choice(c: &mut Choices, current: u64) -> u64 {
    match c.u8() % 8 {
        0..=3 => current,
        4 => current.saturating_sub(1 + u64::from(c.u8() % 4)),
        5 => current.saturating_add(1 + u64::from(c.u8() % 4)),
        6 => 0,
        _ => c.u64(),
    }
}

fn mangle_choice(c: &mut Choices) -> Option<u16> {
    (c.u8() % 16 == 15).then(|| c.u16())
}

fn flags_choice(c: &mut Choices) -> u32 {
    let b = c.u8();
    // FUA, MAY_TRIM and QUIET as chosen; now and then the reply flag or an unknown one.
    let mut flags = u32::from(b & 0x0e);
    match b & 0x70 {
        0x10 => flags |= FLAG_REPLY,
        0x20 => flags |= 1 << 9,
        _ => {}
    }
    flags
}

/// A HelloSnapshot payload: mostly of the replica's snapshot, now and then of a replica or a
/// snapshot that does not exist.
fn snapshot_hello(c: &mut Choices, model: &Model) -> Vec<u8> {
    let nosuch = |c: &mut Choices, id: &str| {
        if c.u8() % 4 == 3 {
            "nosuch".to_string()
        } else {
            id.to_string()
        }
    };
    HelloSnapshotRequest {
        replica: nosuch(c, &model.id),
        snapshot: nosuch(c, SNAPSHOT),
        grant: None,
    }
    .encode()
}

/// A request of any opcode with chosen fields.
fn request(c: &mut Choices, model: &mut Model) -> Frame {
    let op = Op::from_u16(1 + u16::from(c.u8() % 10)).expect("opcodes 1..=10");
    let flags = flags_choice(c);
    let epoch = epoch_choice(c, model.epoch);
    let offset = match c.u8() % 8 {
        0..=3 => u64::from(c.u8()) * 4096,
        4 => u64::from(c.u16()) * SECTOR,
        5 => u64::from(c.u16()),
        6 => SIZE - 4096 * u64::from(c.u8() % 4),
        _ => c.u64(),
    };
    let length = match c.u8() % 8 {
        0..=3 => match op {
            Op::Write => (u32::from(c.u8() % 32) + 1) * 512,
            Op::Read => u32::from(c.u8() % 64) * 4096,
            Op::Checksum => u32::from(c.u8() % 17) << 16,
            Op::Trim | Op::WriteZeroes => u32::from(c.u8()) * 4096,
            _ => 0,
        },
        4 => u32::from(c.u16()) * 512,
        5 => u32::from(c.u16()),
        6 => SIZE as u32,
        _ => c.u32(),
    };
    let mangle = mangle_choice(c);
    let (payload, length) = match op {
        Op::Write => {
            let fill = c.u8();
            let n = if c.u8() % 16 == 15 {
                length / 2
            } else {
                length
            };
            let payload = if n <= MAX_BUILT_PAYLOAD {
                write_payload(model.next_request + 1, fill, n)
            } else {
                Vec::new()
            };
            (payload, length)
        }
        Op::PutJournal => {
            let payload = journal_payload(c, epoch);
            let length = if length == 0 {
                payload.len() as u32
            } else {
                length
            };
            (payload, length)
        }
        _ if c.u8() % 16 == 15 => (c.bytes(64).to_vec(), length),
        _ => (Vec::new(), length),
    };
    model.frame(op, flags, epoch, offset, length, payload, mangle)
}

/// Each sector starts with the request id, so a misplaced or stale write is told apart.
fn write_payload(request_id: u64, fill: u8, len: u32) -> Vec<u8> {
    let mut p = vec![fill; len as usize];
    for sector in p.chunks_mut(SECTOR as usize) {
        let n = sector.len().min(8);
        sector[..n].copy_from_slice(&request_id.to_le_bytes()[..n]);
    }
    p
}

fn journal_payload(c: &mut Choices, epoch: u64) -> Vec<u8> {
    let kind = c.u8() % 4;
    if kind == 3 {
        return hawser_fuzz::journal(c)
            .encode()
            .unwrap_or_else(|_| c.bytes(64).to_vec());
    }
    let j = Journal {
        // Kind 2: a journal that does not fit (another epoch, or a larger volume).
        epoch: if kind == 2 && c.bool() {
            epoch.wrapping_add(1)
        } else {
            epoch
        },
        seq: u64::from(c.u8()),
        size: if kind == 2 { SIZE * 2 } else { SIZE },
        extent_bytes: ACTIVITY_EXTENT_BYTES,
        chunk_bytes: 64 << 10,
        active: if c.bool() { vec![(0, 1)] } else { vec![] },
        out: if c.bool() {
            vec![{
                let dirty = c.bool().then(|| runs(c, SIZE >> 16, false));
                OutReplica {
                    replica: "r-2".into(),
                    lost: dirty.is_none() || c.bool(),
                    dirty,
                }
            }]
        } else {
            vec![]
        },
    };
    j.encode().expect("a valid journal encodes")
}

async fn connect(env: &Env) -> Conn {
    let stream = TcpStream::connect(env.addr)
        .await
        .expect("connect to the replica server");
    let _ = stream.set_nodelay(true);
    Conn {
        stream,
        state: State::AwaitingHello,
    }
}

/// Run frames on a connection; drop it if the server closed it.
async fn run(
    model: &mut Model,
    env: &Env,
    slot: &mut Option<Conn>,
    frames: Vec<Frame>,
    garbage: Option<&[u8]>,
) {
    let Some(conn) = slot.as_mut() else {
        return;
    };
    let mut state = conn.state;
    let (expect, sent_in) = expectations(model, &mut state, &frames);
    let (replies, closed) = exchange(conn, &frames, garbage, &expect).await;
    if std::env::var_os("HAWSER_FUZZ_TRACE").is_some() {
        // Replaying a crash: what was sent, what was due, what came back.
        for (((f, e), r), state) in frames.iter().zip(&expect).zip(&replies).zip(&sent_in) {
            let sent = f
                .accepted
                .map(|h| (h.op, h.epoch, h.offset, h.length, h.flags));
            let got = r.as_ref().map(|r| r.header.status);
            eprintln!("{state:?} {sent:?} expect {e:?} got {got:?}");
        }
        if let Some(g) = garbage {
            eprintln!("garbage {} bytes", g.len());
        }
        eprintln!("closed: {closed}; replica epoch {}", model.epoch);
    }
    let must_close = garbage.is_some() || expect.iter().any(|e| !matches!(e, Expect::Reply(_)));
    if closed != must_close {
        panic!(
            "the server {} (expected {expect:?})",
            if closed {
                "closed the connection"
            } else {
                "kept the connection open"
            }
        );
    }
    settle(model, env, &frames, (&expect, &sent_in), &replies);
    conn.state = state;
    if closed {
        *slot = None;
    }
}

async fn drive(env: &Env, data: &[u8], model: &mut Model) {
    let mut c = Choices::new(data);
    let mut slots: [Option<Conn>; SLOTS] = Default::default();
    for _ in 0..MAX_ACTIONS {
        if c.is_empty() {
            break;
        }
        let action = c.u8();
        let slot = &mut slots[usize::from(c.u8()) % SLOTS];
        match action % 8 {
            // Hello on a new connection.
            0 | 1 => {
                *slot = Some(connect(env).await);
                let epoch = epoch_choice(&mut c, model.epoch);
                let (op, payload) = match c.u8() % 8 {
                    0 => (Op::Hello, b"nosuch".to_vec()),
                    1 => (Op::Hello, vec![0xff, 0xfe]),
                    2 => (Op::Hello, Vec::new()),
                    3..=6 => (Op::Hello, model.id.clone().into_bytes()),
                    _ => (Op::HelloSnapshot, snapshot_hello(&mut c, model)),
                };
                let flags = flags_choice(&mut c);
                let mangle = mangle_choice(&mut c);
                let hello = model.frame(op, flags, epoch, 0, 0, payload, mangle);
                run(model, env, slot, vec![hello], None).await;
            }
            2..=4 => {
                let f = request(&mut c, model);
                run(model, env, slot, vec![f], None).await;
            }
            5 => {
                let n = 1 + c.u8() % MAX_BURST;
                let frames = (0..n).map(|_| request(&mut c, model)).collect();
                run(model, env, slot, frames, None).await;
            }
            6 => {
                if c.bool() {
                    *slot = None;
                } else {
                    *slot = Some(connect(env).await);
                }
            }
            _ => {
                let garbage = c.bytes(255);
                // Bytes that happen to start a valid frame are not garbage.
                if FrameHeader::decode(garbage).is_err() {
                    run(model, env, slot, Vec::new(), Some(garbage)).await;
                }
            }
        }
    }
}

/// Seed programs, in the encoding `drive` reads (see `request` and `epoch_choice`).
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    const CUR: &[u8] = &[0];
    let newer = |n: u8| vec![5, n - 1];
    let older = |n: u8| vec![4, n - 1];
    let hello = |slot: u8, epoch: &[u8]| [&[0, slot][..], epoch, &[3, 0, 0]].concat();
    // replica, snapshot: 0 for the replica's and SNAPSHOT, 3 for "nosuch".
    let snapshot_hello = |slot: u8, epoch: &[u8], replica: u8, snapshot: u8| {
        [&[0, slot][..], epoch, &[7, replica, snapshot, 0, 0]].concat()
    };
    // op: its number minus one; offset in 4 KiB units; len: the op's own length byte.
    let body = |op: u8, epoch: &[u8], offset: u8, len: Option<u8>, tail: &[u8]| {
        let len: Vec<u8> = len.map_or(vec![0], |l| vec![0, l]);
        [&[op, 0][..], epoch, &[0, offset], &len, &[0], tail].concat()
    };
    let req = |slot: u8, body: Vec<u8>| [vec![2, slot], body].concat();
    let (read, write, flush, ping, put_journal, get_journal, checksum) = (1, 2, 3, 6, 7, 8, 9);
    let write_4k =
        |epoch: &[u8], offset: u8, fill: u8| body(write, epoch, offset, Some(7), &[fill, 0]);
    let read_4k = |epoch: &[u8], offset: u8| body(read, epoch, offset, Some(1), &[0]);
    vec![
        (
            "write-read",
            [
                hello(0, &newer(1)),
                req(0, write_4k(CUR, 0, 0xa5)),
                req(0, read_4k(CUR, 0)),
                req(0, body(flush, CUR, 0, None, &[0])),
                req(0, body(checksum, CUR, 0, Some(1), &[0])),
            ]
            .concat(),
        ),
        (
            "stale",
            [
                hello(0, &newer(3)),
                hello(1, &older(1)),
                req(0, write_4k(&older(1), 1, 0x11)),
                req(0, write_4k(CUR, 2, 0x22)),
                req(0, body(read, CUR, 0, Some(4), &[0])),
            ]
            .concat(),
        ),
        (
            "replaced",
            [
                hello(0, &newer(1)),
                hello(1, CUR),
                req(0, write_4k(CUR, 3, 0x33)),
                req(1, read_4k(CUR, 3)),
            ]
            .concat(),
        ),
        (
            "journal",
            [
                hello(0, &newer(2)),
                req(
                    0,
                    body(put_journal, CUR, 0, None, &[0, 5, 1, 1, 1, 1, 1, 3]),
                ),
                req(0, body(get_journal, CUR, 0, None, &[0])),
                req(0, body(put_journal, CUR, 0, None, &[2, 6, 0, 0, 0])),
                req(0, body(get_journal, CUR, 0, None, &[0])),
            ]
            .concat(),
        ),
        (
            "burst",
            [
                hello(2, &newer(1)),
                vec![5, 2, 4],
                write_4k(CUR, 0, 1),
                write_4k(CUR, 0, 2),
                write_4k(CUR, 1, 3),
                read_4k(CUR, 4),
                body(checksum, CUR, 0, Some(16), &[0]),
            ]
            .concat(),
        ),
        (
            "garbage-and-bad-frames",
            [
                vec![6, 0, 0, 7, 0, 5, b'H', b'W', b'S', b'R', 2],
                hello(1, &newer(1)),
                req(
                    1,
                    [&[write, 0][..], CUR, &[0, 0, 0, 7, 15, 9, 0, 0x44, 0]].concat(),
                ),
                vec![6, 2, 0],
                req(2, read_4k(CUR, 0)),
            ]
            .concat(),
        ),
        (
            "snapshot-session",
            [
                hello(0, &newer(2)),
                req(0, write_4k(CUR, 0, 0xa5)),
                // An older epoch than the replica's: not looked at.
                snapshot_hello(1, &older(2), 0, 0),
                req(1, read_4k(CUR, 0)),
                // Past the end: OutOfRange, and the session goes on.
                req(1, body(read, &older(1), 255, Some(2), &[0])),
                // 129 sectors: two digests, the second of a short block.
                req(
                    1,
                    [&[checksum, 0][..], CUR, &[0, 0, 4, 129, 0, 0, 0]].concat(),
                ),
                req(1, body(checksum, CUR, 0, Some(16), &[0])),
                req(1, body(ping, CUR, 0, None, &[0])),
                // A newer engine replaces slot 0's session, not the snapshot session.
                hello(2, &newer(1)),
                vec![5, 1, 2],
                read_4k(CUR, 8),
                body(ping, CUR, 0, None, &[0]),
                body(checksum, CUR, 15, Some(1), &[0]),
                req(0, read_4k(CUR, 0)),
                // A write carries a payload: the connection closes unanswered.
                req(1, write_4k(CUR, 1, 0x22)),
                req(2, read_4k(CUR, 0)),
            ]
            .concat(),
        ),
        (
            "snapshot-refused",
            [
                snapshot_hello(0, CUR, 3, 0),
                snapshot_hello(1, CUR, 0, 3),
                snapshot_hello(2, CUR, 0, 0),
                req(2, body(get_journal, CUR, 0, None, &[0])),
                snapshot_hello(2, CUR, 0, 0),
                // A 64 MiB read, longer than a payload: Invalid, and the connection closes.
                req(
                    2,
                    [&[read, 0][..], CUR, &[0, 0, 7, 0, 0, 0, 4, 0, 0]].concat(),
                ),
            ]
            .concat(),
        ),
    ]
}

fuzz_target!(init: hawser_fuzz::write_seeds(seeds), |data: &[u8]| {
    let env = env();
    let n = env.next_replica.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let id = format!("r{n}");
    let replica = env
        .storage
        .create(
            "p",
            &NewReplica {
                id: id.clone(),
                volume: "v".into(),
                size: SIZE,
                thin: true,
                cluster: None,
                key_check: None,
                // With block checksums: every read is checked and every write summed, so
                // the model's answers hold for that path too (nothing rots here).
                checksums: true,
                wrapped_key: None,
                volume_uid: None,
            },
        )
        .expect("create the replica");
    // Taken while the replica is all zeros, so its bytes are known; deleted with the replica.
    replica
        .take_snapshot(0, SNAPSHOT)
        .expect("take the replica's snapshot");
    let mut model = Model {
        id: id.clone(),
        epoch: 0,
        sessions: 0,
        data: vec![0; SIZE as usize],
        known: vec![true; SECTORS],
        sum_unsure: vec![false; SECTORS / 8],
        journal: None,
        next_request: 0,
    };
    env.rt.block_on(drive(env, data, &mut model));

    assert_eq!(replica.epoch(), model.epoch, "the replica's epoch");
    // Block by block: a block that fails its checksum must be one the model lost track of
    // (`may_be_corrupt`), and every known sector holds what the model says.
    for block in 0..SIZE / 4096 {
        let first = (block * 4096 / SECTOR) as usize;
        let sectors = first..first + (4096 / SECTOR) as usize;
        let bytes = match replica.read(model.epoch, block * 4096, 4096) {
            Ok(b) => b,
            Err(hawser_storage::ReplicaIoError::Corrupt { .. }) => {
                assert!(
                    model.sum_unsure[block as usize] || !model.known[sectors].iter().all(|&k| k),
                    "block {block} fails its checksum though its bytes are known"
                );
                continue;
            }
            Err(e) => panic!("read the replica: {e}"),
        };
        for s in sectors {
            let at = s * SECTOR as usize;
            let range = at..at + SECTOR as usize;
            let got = &bytes[at - first * SECTOR as usize..][..SECTOR as usize];
            if model.known[s] && got != &model.data[range] {
                panic!("sector {s} holds bytes no acknowledged request of the current epoch wrote");
            }
        }
    }
    drop(replica);
    // Its snapshot goes with it.
    env.storage.delete(&id).expect("delete the replica");
});
