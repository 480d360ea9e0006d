//! The verifying writer's record and its checker, with no I/O: what each 4 KiB block of a
//! volume must hold given the writes that were acknowledged and those whose outcome is unknown.
//!
//! Every block the writer writes is self-describing: a header (magic, seed, block index,
//! sequence number), filler derived from those, and a CRC32C of the rest. The checker can
//! therefore regenerate the expected bytes and, on a mismatch, say what the block holds
//! instead (an older write, another block's write, zeros, garbage).
//!
//! The rule checked: a block holds its last acknowledged write, or one of the writes issued
//! after it whose outcome is unknown (error reply, or connection lost before the reply), or,
//! if no write to it was ever acknowledged, zeros (the volume starts empty). The writer never
//! has two writes to the same block in flight, so "last" is well defined. An acknowledged
//! write settles the block: the unknown-outcome writes before it are forgotten (a write that
//! failed or whose connection is gone is assumed finished on the server by the time a later
//! write to the same block is acknowledged; the engine orders overlapping writes, and the
//! writer reconnects only to a new connection).
//!
//! The log also keeps when each write was submitted and acknowledged, on the client's clock
//! ([`WriteTimes`]), so an image of the volume can be checked against a moment (see `cut`).

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

/// Size of every write and read of the writer.
pub const BLOCK_BYTES: usize = 4096;
const MAGIC: [u8; 8] = *b"HWSRWLOG";
const HEADER_BYTES: usize = 32;
const CRC_AT: usize = BLOCK_BYTES - 4;

/// What a valid block says about itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub seed: u64,
    pub block: u64,
    pub seq: u64,
}

/// The bytes write `seq` puts into `block` for a log with `seed`.
pub fn block_content(seed: u64, block: u64, seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_BYTES];
    b[0..8].copy_from_slice(&MAGIC);
    b[8..16].copy_from_slice(&seed.to_le_bytes());
    b[16..24].copy_from_slice(&block.to_le_bytes());
    b[24..32].copy_from_slice(&seq.to_le_bytes());
    let mut state = seed ^ block.rotate_left(21) ^ seq.rotate_left(42);
    for chunk in b[HEADER_BYTES..CRC_AT].chunks_mut(8) {
        let word = splitmix64(&mut state).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    let crc = crc32c::crc32c(&b[..CRC_AT]);
    b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decode a block written by some writer: `None` unless magic and checksum are valid.
pub fn decode_block(data: &[u8]) -> Option<Stamp> {
    if data.len() != BLOCK_BYTES || data[0..8] != MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(data[CRC_AT..].try_into().ok()?);
    if crc32c::crc32c(&data[..CRC_AT]) != crc {
        return None;
    }
    let word = |at: usize| data[at..at + 8].try_into().ok().map(u64::from_le_bytes);
    Some(Stamp {
        seed: word(8)?,
        block: word(16)?,
        seq: word(24)?,
    })
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What is known about the writes to one block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockHistory {
    /// The last acknowledged write (sequence number), if any.
    pub acked: Option<u64>,
    /// Writes issued after `acked` whose outcome is unknown, oldest first.
    pub unknown: Vec<u64>,
    /// The write in flight, if any (at most one per block).
    pub in_flight: Option<u64>,
}

impl BlockHistory {
    /// Sequence numbers the block may hold; `None` in the list stands for zeros.
    fn allowed(&self) -> Vec<Option<u64>> {
        let mut v = vec![self.acked];
        v.extend(self.unknown.iter().chain(&self.in_flight).map(|s| Some(*s)));
        v
    }
}

/// What a block held that it should not have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    Zeros,
    /// A valid block of some writer (possibly another block's, or another seed's).
    Stamp(Stamp),
    /// A block with a valid stamp whose other bytes differ from what that write wrote.
    Altered(Stamp),
    Garbage,
}

/// A block that holds neither its last acknowledged write nor a later unknown-outcome one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub block: u64,
    pub expected: BlockHistory,
    pub found: Found,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let acked = match self.expected.acked {
            Some(s) => format!("acknowledged write #{s}"),
            None => "zeros (no write acknowledged)".into(),
        };
        write!(
            f,
            "block {} (byte {}): expected {acked} or an unknown-outcome write {:?}, found {:?}",
            self.block,
            self.block * BLOCK_BYTES as u64,
            self.expected.unknown,
            self.found
        )
    }
}

/// When one write was sent and when it was acknowledged, as the writer saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteTimes {
    pub seq: u64,
    /// Taken before the request is sent: the server cannot have it earlier.
    pub submitted: Instant,
    /// Taken after the reply is read: the server finished it earlier. `None` while in flight,
    /// or for a write whose outcome is unknown.
    pub acked: Option<Instant>,
}

/// Per block, the writes acknowledged and those whose outcome is unknown, and every write's
/// submit and ack times.
#[derive(Clone, Debug)]
pub struct WriteLog {
    seed: u64,
    next_seq: u64,
    blocks: BTreeMap<u64, BlockHistory>,
    /// Per block, every write begun there, oldest first.
    times: BTreeMap<u64, Vec<WriteTimes>>,
}

impl WriteLog {
    pub fn new(seed: u64) -> WriteLog {
        WriteLog {
            seed,
            next_seq: 1,
            blocks: BTreeMap::new(),
            times: BTreeMap::new(),
        }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Start a write to `block` now: its sequence number, or `None` while one is in flight
    /// there. Call it before sending the request.
    pub fn begin(&mut self, block: u64) -> Option<u64> {
        self.begin_at(block, Instant::now())
    }

    /// [`Self::begin`] with the submit time given.
    pub fn begin_at(&mut self, block: u64, submitted: Instant) -> Option<u64> {
        let h = self.blocks.entry(block).or_default();
        if h.in_flight.is_some() {
            return None;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        h.in_flight = Some(seq);
        self.times.entry(block).or_default().push(WriteTimes {
            seq,
            submitted,
            acked: None,
        });
        Some(seq)
    }

    /// The write `seq` to `block` was acknowledged now: the block must hold it from now on.
    /// Call it after reading the reply.
    pub fn acked(&mut self, block: u64, seq: u64) {
        self.acked_at(block, seq, Instant::now());
    }

    /// [`Self::acked`] with the ack time given.
    pub fn acked_at(&mut self, block: u64, seq: u64, at: Instant) {
        let h = self.in_flight_mut(block, seq);
        h.in_flight = None;
        h.acked = Some(seq);
        h.unknown.clear();
        let w = self.times.get_mut(&block).and_then(|t| t.last_mut());
        let w = w.unwrap_or_else(|| panic!("block {block}: no times for write #{seq}"));
        assert_eq!(
            w.seq, seq,
            "block {block}: write #{seq} is not the last begun"
        );
        assert!(
            at >= w.submitted,
            "block {block}: write #{seq} acknowledged before it was submitted"
        );
        w.acked = Some(at);
    }

    /// The write `seq` to `block` failed or its reply was lost: the block may or may not hold it.
    pub fn unknown(&mut self, block: u64, seq: u64) {
        let h = self.in_flight_mut(block, seq);
        h.in_flight = None;
        h.unknown.push(seq);
    }

    fn in_flight_mut(&mut self, block: u64, seq: u64) -> &mut BlockHistory {
        let h = self.blocks.get_mut(&block);
        let h = h.unwrap_or_else(|| panic!("write #{seq} to block {block} was never begun"));
        assert_eq!(
            h.in_flight,
            Some(seq),
            "block {block}: write #{seq} not in flight"
        );
        h
    }

    /// Every block ever written to, in order.
    pub fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.blocks.keys().copied()
    }

    pub fn history(&self, block: u64) -> Option<&BlockHistory> {
        self.blocks.get(&block)
    }

    /// Every write begun to `block`, oldest first (sequence numbers increase), with its times.
    pub fn writes(&self, block: u64) -> &[WriteTimes] {
        self.times.get(&block).map_or(&[], Vec::as_slice)
    }

    /// Writes acknowledged or begun so far (sequence numbers handed out).
    pub fn writes_begun(&self) -> u64 {
        self.next_seq - 1
    }

    /// Check what `block` holds against its history.
    pub fn check(&self, block: u64, data: &[u8]) -> Result<(), Mismatch> {
        let history = self.blocks.get(&block).cloned().unwrap_or_default();
        for allowed in history.allowed() {
            let ok = match allowed {
                None => data.iter().all(|b| *b == 0),
                Some(seq) => data == block_content(self.seed, block, seq).as_slice(),
            };
            if ok {
                return Ok(());
            }
        }
        Err(Mismatch {
            block,
            expected: history,
            found: describe(data),
        })
    }
}

/// What `data` is: zeros, a write of some writer (intact or altered), or garbage.
pub fn describe(data: &[u8]) -> Found {
    if data.iter().all(|b| *b == 0) {
        return Found::Zeros;
    }
    match decode_block(data) {
        Some(s) if data == block_content(s.seed, s.block, s.seq).as_slice() => Found::Stamp(s),
        Some(s) => Found::Altered(s),
        None => Found::Garbage,
    }
}

/// The longest time without a successful reply, measured from the writer's own acks.
#[derive(Clone, Copy, Debug)]
pub struct GapTracker {
    started: Instant,
    last_ack: Instant,
    longest: Duration,
    /// When (since `started`) the longest gap ended.
    longest_ended: Duration,
}

impl GapTracker {
    pub fn new(now: Instant) -> GapTracker {
        GapTracker {
            started: now,
            last_ack: now,
            longest: Duration::ZERO,
            longest_ended: Duration::ZERO,
        }
    }

    pub fn ack(&mut self, now: Instant) {
        let gap = now.saturating_duration_since(self.last_ack);
        if gap > self.longest {
            self.longest = gap;
            self.longest_ended = now.saturating_duration_since(self.started);
        }
        self.last_ack = now;
    }

    /// The longest gap so far, counting the one still open at `now`, and when it ended
    /// (since the start; `now` for an open gap).
    pub fn longest(&self, now: Instant) -> (Duration, Duration) {
        let open = now.saturating_duration_since(self.last_ack);
        if open > self.longest {
            (open, now.saturating_duration_since(self.started))
        } else {
            (self.longest, self.longest_ended)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(log: &mut WriteLog, block: u64, acked: bool) -> u64 {
        let seq = log.begin(block).expect("no write in flight");
        if acked {
            log.acked(block, seq);
        } else {
            log.unknown(block, seq);
        }
        seq
    }

    fn content(log: &WriteLog, block: u64, seq: u64) -> Vec<u8> {
        block_content(log.seed(), block, seq)
    }

    #[test]
    fn content_decodes_to_its_stamp_and_differs_per_write() {
        let b = block_content(7, 3, 9);
        let stamp = Stamp {
            seed: 7,
            block: 3,
            seq: 9,
        };
        assert_eq!(decode_block(&b), Some(stamp));
        assert_ne!(b, block_content(7, 3, 10));
        assert_ne!(b, block_content(7, 4, 9));
        assert_ne!(b, block_content(8, 3, 9));
        assert_eq!(decode_block(&[0u8; BLOCK_BYTES]), None);
    }

    #[test]
    fn last_acknowledged_write_passes() {
        let mut log = WriteLog::new(1);
        written(&mut log, 5, true);
        let last = written(&mut log, 5, true);
        assert_eq!(log.check(5, &content(&log, 5, last)), Ok(()));
    }

    #[test]
    fn a_lost_acknowledged_write_is_caught() {
        let mut log = WriteLog::new(1);
        let old = written(&mut log, 5, true);
        let new = written(&mut log, 5, true);
        let err = log
            .check(5, &content(&log, 5, old))
            .expect_err("older write");
        assert_eq!(err.expected.acked, Some(new));
        assert_eq!(
            err.found,
            Found::Stamp(Stamp {
                seed: 1,
                block: 5,
                seq: old
            })
        );
        let err = log.check(5, &[0u8; BLOCK_BYTES]).expect_err("zeros");
        assert_eq!(err.found, Found::Zeros);
        assert!(err.to_string().contains("acknowledged write #2"), "{err}");
    }

    #[test]
    fn unknown_outcome_writes_after_the_ack_are_allowed() {
        let mut log = WriteLog::new(2);
        let acked = written(&mut log, 0, true);
        let maybe = written(&mut log, 0, false);
        let maybe2 = written(&mut log, 0, false);
        for seq in [acked, maybe, maybe2] {
            assert_eq!(log.check(0, &content(&log, 0, seq)), Ok(()));
        }
        assert!(log.check(0, &[0u8; BLOCK_BYTES]).is_err());
    }

    #[test]
    fn an_ack_settles_earlier_unknown_writes() {
        let mut log = WriteLog::new(2);
        let maybe = written(&mut log, 0, false);
        assert_eq!(
            log.check(0, &[0u8; BLOCK_BYTES]),
            Ok(()),
            "never acked: zeros ok"
        );
        assert_eq!(log.check(0, &content(&log, 0, maybe)), Ok(()));
        let acked = written(&mut log, 0, true);
        assert!(log.check(0, &content(&log, 0, maybe)).is_err());
        assert!(log.check(0, &[0u8; BLOCK_BYTES]).is_err());
        assert_eq!(log.check(0, &content(&log, 0, acked)), Ok(()));
    }

    #[test]
    fn misdirected_altered_and_garbage_blocks_are_caught() {
        let mut log = WriteLog::new(3);
        let a = written(&mut log, 1, true);
        let b = written(&mut log, 2, true);
        let err = log.check(1, &content(&log, 2, b)).expect_err("other block");
        assert!(matches!(err.found, Found::Stamp(s) if s.block == 2));
        let mut altered = content(&log, 1, a);
        altered[100] ^= 1;
        let crc = crc32c::crc32c(&altered[..CRC_AT]);
        altered[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        let err = log.check(1, &altered).expect_err("altered filler");
        assert!(matches!(err.found, Found::Altered(s) if s.seq == a));
        let mut torn = content(&log, 1, a);
        torn[2048..].fill(0);
        let err = log.check(1, &torn).expect_err("torn");
        assert_eq!(err.found, Found::Garbage);
    }

    #[test]
    fn one_write_in_flight_per_block_and_it_counts_as_possible() {
        let mut log = WriteLog::new(4);
        let acked = written(&mut log, 9, true);
        let seq = log.begin(9).expect("first");
        assert_eq!(log.begin(9), None, "second write to a busy block");
        assert!(log.begin(10).is_some(), "other blocks are free");
        assert_eq!(log.check(9, &content(&log, 9, seq)), Ok(()));
        assert_eq!(log.check(9, &content(&log, 9, acked)), Ok(()));
        log.acked(9, seq);
        assert!(log.check(9, &content(&log, 9, acked)).is_err());
    }

    #[test]
    fn submit_and_ack_times_are_kept_per_write() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut log = WriteLog::new(6);
        let a = log.begin_at(3, at(1)).expect("free");
        let b = log.begin_at(4, at(2)).expect("free");
        log.acked_at(3, a, at(5));
        log.unknown(4, b);
        let c = log.begin_at(3, at(6)).expect("free");
        let times = |seq, submitted, acked: Option<u64>| WriteTimes {
            seq,
            submitted: at(submitted),
            acked: acked.map(at),
        };
        assert_eq!(log.writes(3), [times(a, 1, Some(5)), times(c, 6, None)]);
        assert_eq!(log.writes(4), [times(b, 2, None)]);
        assert!(log.writes(5).is_empty());
    }

    #[test]
    #[should_panic(expected = "not in flight")]
    fn acking_a_write_not_in_flight_panics() {
        let mut log = WriteLog::new(5);
        let seq = written(&mut log, 1, true);
        log.acked(1, seq);
    }

    #[test]
    fn gap_tracker_reports_the_longest_and_the_open_gap() {
        let t0 = Instant::now();
        let mut g = GapTracker::new(t0);
        g.ack(t0 + Duration::from_millis(10));
        g.ack(t0 + Duration::from_millis(510));
        g.ack(t0 + Duration::from_millis(520));
        let at = t0 + Duration::from_millis(600);
        assert_eq!(
            g.longest(at),
            (Duration::from_millis(500), Duration::from_millis(510))
        );
        let later = t0 + Duration::from_millis(1520);
        assert_eq!(
            g.longest(later),
            (Duration::from_millis(1000), Duration::from_millis(1520)),
            "an open gap counts"
        );
    }
}
