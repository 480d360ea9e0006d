//! The replica protocol frame: a fixed 56-byte little-endian header, optionally followed by a
//! payload. Engines send requests to replica servers; replica servers answer with replies that
//! echo the request id.
//!
//! Layout (all little-endian):
//!
//! | offset | size | field        | meaning                                               |
//! |-------:|-----:|--------------|-------------------------------------------------------|
//! |      0 |    4 | magic        | `FRAME_MAGIC`                                         |
//! |      4 |    2 | version      | `FRAME_VERSION`                                       |
//! |      6 |    2 | op           | [`Op`]                                                |
//! |      8 |    4 | flags        | `FLAG_REPLY`, `FLAG_FUA`, `FLAG_MAY_TRIM`, `FLAG_QUIET`|
//! |     12 |    4 | status       | replies: [`Status`]; requests: 0                      |
//! |     16 |    8 | request_id   | chosen by the sender of a request, echoed in the reply |
//! |     24 |    8 | epoch        | the volume epoch the sender acts in (fencing)         |
//! |     32 |    8 | offset       | byte offset in the replica                            |
//! |     40 |    4 | length       | bytes the operation covers                            |
//! |     44 |    4 | payload_len  | bytes of payload that follow the header               |
//! |     48 |    4 | payload_crc  | CRC32C of the payload (0 when there is none)          |
//! |     52 |    4 | header_crc   | CRC32C of bytes 0..52                                 |
//!
//! A frame whose magic, version, header checksum, opcode or lengths are wrong is rejected by
//! [`FrameHeader::decode`]; the receiver then closes the connection. The payload checksum is
//! verified by the receiver before the payload reaches a disk ([`FrameHeader::check_payload`]).

use crate::constants::MAX_PAYLOAD_BYTES;
use crate::journal::MAX_JOURNAL_BYTES;

/// "HWSR" read as a little-endian u32.
pub const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"HWSR");
/// Version of this layout. A peer speaking another version is refused at the first frame.
pub const FRAME_VERSION: u16 = 2;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 56;

/// Set on replies.
pub const FLAG_REPLY: u32 = 1 << 0;
/// Write / write-zeroes: the data must be durable before the reply.
pub const FLAG_FUA: u32 = 1 << 1;
/// Write-zeroes: the replica may deallocate the range instead of writing zeroes.
pub const FLAG_MAY_TRIM: u32 = 1 << 2;
/// A hint: the engine has no other request in flight (queue depth 1), so the replica may run
/// this request inline instead of handing it to its I/O threads. Never affects the result.
pub const FLAG_QUIET: u32 = 1 << 3;
const KNOWN_FLAGS: u32 = FLAG_REPLY | FLAG_FUA | FLAG_MAY_TRIM | FLAG_QUIET;

/// Operations of the replica protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Op {
    /// First request on a connection: payload is the replica id (UTF-8). Binds the connection
    /// to that replica and raises the replica's epoch to the request's epoch, or is refused
    /// with [`Status::StaleEpoch`] when the replica already saw a newer epoch.
    /// The reply's payload is a [`HelloInfo`].
    Hello = 1,
    /// Read `length` bytes at `offset`. The reply carries them.
    Read = 2,
    /// Write the payload at `offset`.
    Write = 3,
    /// Make every write this replica acknowledged durable.
    Flush = 4,
    /// Discard `length` bytes at `offset` (reads back as zeroes afterwards).
    Trim = 5,
    /// Write zeroes over `length` bytes at `offset`.
    WriteZeroes = 6,
    /// Keep-alive; no effect.
    Ping = 7,
    /// Replace the replica's volume journal (see [`crate::journal`]) with the payload, durably,
    /// before the reply. `length` is the payload's length.
    PutJournal = 8,
    /// Read the replica's journal: the reply carries it as a
    /// [`crate::journal::StoredReport`], which also says whether the replica's node rebooted
    /// since it stored it (empty payload: none stored).
    GetJournal = 9,
    /// Digests of `length` bytes at `offset`, one of [`CHECKSUM_DIGEST_BYTES`] per
    /// [`CHECKSUM_BLOCK_BYTES`] (the last block may be short). At most
    /// [`MAX_CHECKSUM_BYTES`] per request. Crash recovery compares replicas with it.
    Checksum = 10,
    /// First request of a read-only snapshot session: payload is a
    /// [`crate::grant::HelloSnapshotRequest`] (replica, snapshot, snapshot-read grant). Binds
    /// the connection to that snapshot copy: Read and Checksum then read it, anything else
    /// is refused. Raises no epoch and replaces no session (the copy never changes). The
    /// reply's payload is a [`HelloInfo`] whose size is the snapshot's.
    HelloSnapshot = 11,
}

/// Granularity of [`Op::Checksum`] digests.
pub const CHECKSUM_BLOCK_BYTES: u64 = 64 * 1024;
/// Bytes of one digest (a truncated SHA-256).
pub const CHECKSUM_DIGEST_BYTES: usize = 16;
/// Most bytes one checksum request may cover.
pub const MAX_CHECKSUM_BYTES: u32 = 4 * 1024 * 1024;

/// Length of the reply payload of a checksum request over `length` bytes.
pub fn checksum_reply_len(length: u32) -> u32 {
    let blocks = u64::from(length).div_ceil(CHECKSUM_BLOCK_BYTES);
    u32::try_from(blocks * CHECKSUM_DIGEST_BYTES as u64).unwrap_or(u32::MAX)
}

impl Op {
    /// Decode an opcode; `None` for unknown values.
    pub fn from_u16(v: u16) -> Option<Op> {
        Some(match v {
            1 => Op::Hello,
            2 => Op::Read,
            3 => Op::Write,
            4 => Op::Flush,
            5 => Op::Trim,
            6 => Op::WriteZeroes,
            7 => Op::Ping,
            8 => Op::PutJournal,
            9 => Op::GetJournal,
            10 => Op::Checksum,
            11 => Op::HelloSnapshot,
            _ => return None,
        })
    }
}

/// Result codes carried in replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Status {
    Ok = 0,
    /// The request's epoch is older than the replica's: a newer engine owns the volume.
    StaleEpoch = 1,
    /// Offset or length outside the replica, or not sector aligned.
    OutOfRange = 2,
    /// The replica's disk returned an I/O error.
    IoError = 3,
    /// The replica's filesystem is full.
    NoSpace = 4,
    /// No such replica on this server.
    NoSuchReplica = 5,
    /// A request other than Hello before Hello, or a malformed request.
    Invalid = 6,
    /// The replica is not usable (failed, being deleted).
    Unavailable = 7,
    /// Hello without a valid epoch grant of the replica's cluster (`grant.rs`).
    Denied = 8,
    /// A read met blocks whose data fails its checksum: the reply's `offset` is the first bad
    /// block's, its `length` the number of bad blocks in the range. The replica is otherwise
    /// fine; the engine reads the range elsewhere and rewrites it here.
    Corrupt = 9,
}

impl Status {
    /// Decode a status; unknown values decode as `None`.
    pub fn from_u32(v: u32) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::StaleEpoch,
            2 => Status::OutOfRange,
            3 => Status::IoError,
            4 => Status::NoSpace,
            5 => Status::NoSuchReplica,
            6 => Status::Invalid,
            7 => Status::Unavailable,
            8 => Status::Denied,
            9 => Status::Corrupt,
            _ => return None,
        })
    }
}

/// Why a frame was rejected. Every variant closes the connection that sent it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("bad magic {found:#010x}")]
    BadMagic { found: u32 },
    #[error("unsupported protocol version {found} (this build speaks {FRAME_VERSION})")]
    BadVersion { found: u16 },
    #[error("header checksum mismatch: computed {computed:#010x}, frame says {found:#010x}")]
    HeaderChecksum { computed: u32, found: u32 },
    #[error("payload checksum mismatch: computed {computed:#010x}, frame says {found:#010x}")]
    PayloadChecksum { computed: u32, found: u32 },
    #[error("unknown opcode {found}")]
    UnknownOp { found: u16 },
    #[error("unknown flags {found:#x}")]
    UnknownFlags { found: u32 },
    #[error("unknown status {found}")]
    UnknownStatus { found: u32 },
    #[error("payload of {len} bytes exceeds the maximum of {MAX_PAYLOAD_BYTES}")]
    PayloadTooLarge { len: u32 },
    #[error("{op:?} frame with payload_len {payload_len} does not fit its length {length}")]
    BadPayloadLen {
        op: Op,
        length: u32,
        payload_len: u32,
    },
    #[error("frame shorter than its header ({len} < {HEADER_LEN} bytes)")]
    Truncated { len: usize },
}

/// A decoded, validated frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub op: Op,
    pub flags: u32,
    pub status: Status,
    pub request_id: u64,
    pub epoch: u64,
    pub offset: u64,
    pub length: u32,
    pub payload_len: u32,
    pub payload_crc: u32,
}

impl FrameHeader {
    /// A request header with no payload.
    pub fn request(op: Op, request_id: u64, epoch: u64, offset: u64, length: u32) -> Self {
        FrameHeader {
            op,
            flags: 0,
            status: Status::Ok,
            request_id,
            epoch,
            offset,
            length,
            payload_len: 0,
            payload_crc: 0,
        }
    }

    /// The reply to `self`, with `status` and no payload.
    pub fn reply(&self, status: Status) -> Self {
        FrameHeader {
            flags: FLAG_REPLY,
            status,
            payload_len: 0,
            payload_crc: 0,
            ..*self
        }
    }

    /// Attach a payload: sets its length and checksum.
    pub fn with_payload(mut self, payload: &[u8]) -> Self {
        // Payloads are bounded by MAX_PAYLOAD_BYTES (u32) by every caller; saturate anyway so
        // an oversized payload is rejected by the receiver instead of wrapping here.
        self.payload_len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        self.payload_crc = crc32c::crc32c(payload);
        self
    }

    pub fn is_reply(&self) -> bool {
        self.flags & FLAG_REPLY != 0
    }

    pub fn is_fua(&self) -> bool {
        self.flags & FLAG_FUA != 0
    }

    pub fn may_trim(&self) -> bool {
        self.flags & FLAG_MAY_TRIM != 0
    }

    pub fn is_quiet(&self) -> bool {
        self.flags & FLAG_QUIET != 0
    }

    /// Serialise into the fixed little-endian layout, computing the header checksum.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&FRAME_VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(self.op as u16).to_le_bytes());
        b[8..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..16].copy_from_slice(&(self.status as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.request_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.epoch.to_le_bytes());
        b[32..40].copy_from_slice(&self.offset.to_le_bytes());
        b[40..44].copy_from_slice(&self.length.to_le_bytes());
        b[44..48].copy_from_slice(&self.payload_len.to_le_bytes());
        b[48..52].copy_from_slice(&self.payload_crc.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..52]);
        b[52..56].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decode and validate a header from untrusted bytes. Never panics.
    pub fn decode(bytes: &[u8]) -> Result<FrameHeader, FrameError> {
        let b: &[u8; HEADER_LEN] = bytes
            .get(..HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(FrameError::Truncated { len: bytes.len() })?;
        let magic = le_u32(b, 0);
        if magic != FRAME_MAGIC {
            return Err(FrameError::BadMagic { found: magic });
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != FRAME_VERSION {
            return Err(FrameError::BadVersion { found: version });
        }
        let computed = crc32c::crc32c(&b[0..52]);
        let found = le_u32(b, 52);
        if computed != found {
            return Err(FrameError::HeaderChecksum { computed, found });
        }
        let op_raw = u16::from_le_bytes([b[6], b[7]]);
        let op = Op::from_u16(op_raw).ok_or(FrameError::UnknownOp { found: op_raw })?;
        let flags = le_u32(b, 8);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(FrameError::UnknownFlags { found: flags });
        }
        let status_raw = le_u32(b, 12);
        let status =
            Status::from_u32(status_raw).ok_or(FrameError::UnknownStatus { found: status_raw })?;
        let header = FrameHeader {
            op,
            flags,
            status,
            request_id: le_u64(b, 16),
            epoch: le_u64(b, 24),
            offset: le_u64(b, 32),
            length: le_u32(b, 40),
            payload_len: le_u32(b, 44),
            payload_crc: le_u32(b, 48),
        };
        header.check_lengths()?;
        Ok(header)
    }

    /// Which frames may carry a payload, and how much.
    fn check_lengths(&self) -> Result<(), FrameError> {
        let (length, payload_len) = (self.length, self.payload_len);
        if payload_len > MAX_PAYLOAD_BYTES {
            return Err(FrameError::PayloadTooLarge { len: payload_len });
        }
        let ok = match (self.op, self.is_reply()) {
            // Hello carries an id one way and a HelloInfo back; HelloSnapshot alike.
            (Op::Hello | Op::HelloSnapshot, _) => true,
            (Op::Write, false) => payload_len == length,
            // A successful read reply carries exactly the bytes asked for.
            (Op::Read, true) => payload_len == 0 || payload_len == length,
            (Op::PutJournal, false) => {
                payload_len == length && payload_len as usize <= MAX_JOURNAL_BYTES
            }
            (Op::GetJournal, true) => payload_len as usize <= MAX_JOURNAL_BYTES + 1,
            (Op::Checksum, true) => {
                payload_len == 0
                    || (length <= MAX_CHECKSUM_BYTES && payload_len == checksum_reply_len(length))
            }
            _ => payload_len == 0,
        };
        if ok {
            Ok(())
        } else {
            Err(FrameError::BadPayloadLen {
                op: self.op,
                length,
                payload_len,
            })
        }
    }

    /// Verify the payload that followed this header.
    pub fn check_payload(&self, payload: &[u8]) -> Result<(), FrameError> {
        let computed = crc32c::crc32c(payload);
        if computed != self.payload_crc || payload.len() != self.payload_len as usize {
            return Err(FrameError::PayloadChecksum {
                computed,
                found: self.payload_crc,
            });
        }
        Ok(())
    }
}

/// Payload of a successful Hello reply: what the replica knows about itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloInfo {
    pub size: u64,
    pub epoch: u64,
    pub generation: u64,
    /// Identifies the replica node's current boot. An engine that sees it change knows the
    /// node restarted, so writes it had not yet flushed may be gone and must be recopied.
    pub boot_id: u64,
}

impl HelloInfo {
    pub const LEN: usize = 32;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..16].copy_from_slice(&self.epoch.to_le_bytes());
        b[16..24].copy_from_slice(&self.generation.to_le_bytes());
        b[24..32].copy_from_slice(&self.boot_id.to_le_bytes());
        b
    }

    pub fn decode(bytes: &[u8]) -> Option<HelloInfo> {
        let b: &[u8; Self::LEN] = bytes.try_into().ok()?;
        Some(HelloInfo {
            size: le_u64(b, 0),
            epoch: le_u64(b, 8),
            generation: le_u64(b, 16),
            boot_id: le_u64(b, 24),
        })
    }
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(v)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

const _: () = assert!(HEADER_LEN == 56);

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> FrameHeader {
        FrameHeader::request(Op::Write, 42, 7, 4096, 8192).with_payload(&[0xab; 8192])
    }

    #[test]
    fn roundtrip() {
        let h = sample();
        assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
        let r = h.reply(Status::NoSpace);
        let d = FrameHeader::decode(&r.encode()).expect("decode reply");
        assert!(d.is_reply());
        assert_eq!(d.status, Status::NoSpace);
        assert_eq!(d.request_id, 42);
    }

    #[test]
    fn every_single_bit_flip_is_rejected() {
        let bytes = sample().encode();
        for bit in 0..HEADER_LEN * 8 {
            let mut b = bytes;
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(FrameHeader::decode(&b).is_err(), "bit {bit} flip accepted");
        }
    }

    #[test]
    fn payload_checksum_detects_corruption() {
        let h = sample();
        let mut payload = vec![0xab; 8192];
        assert!(h.check_payload(&payload).is_ok());
        payload[100] ^= 1;
        assert!(matches!(
            h.check_payload(&payload),
            Err(FrameError::PayloadChecksum { .. })
        ));
    }

    #[test]
    fn oversized_and_mismatched_payloads_are_rejected() {
        let mut h = FrameHeader::request(Op::Write, 1, 1, 0, 4096);
        h.payload_len = MAX_PAYLOAD_BYTES + 1;
        assert!(matches!(
            FrameHeader::decode(&h.encode()),
            Err(FrameError::PayloadTooLarge { .. })
        ));
        h.payload_len = 512;
        assert!(matches!(
            FrameHeader::decode(&h.encode()),
            Err(FrameError::BadPayloadLen { .. })
        ));
        let mut f = FrameHeader::request(Op::Flush, 1, 1, 0, 0);
        f.payload_len = 8;
        assert!(FrameHeader::decode(&f.encode()).is_err());
    }

    #[test]
    fn short_input_is_an_error_not_a_panic() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                FrameHeader::decode(&vec![0; n]),
                Err(FrameError::Truncated { len: n })
            );
        }
    }

    #[test]
    fn hello_info_roundtrip() {
        let i = HelloInfo {
            size: 1 << 30,
            epoch: 3,
            generation: 9,
            boot_id: 0xfeed,
        };
        assert_eq!(HelloInfo::decode(&i.encode()), Some(i));
        assert_eq!(HelloInfo::decode(&[0; 5]), None);
    }
}
