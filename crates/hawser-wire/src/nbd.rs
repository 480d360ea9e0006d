//! NBD protocol messages (newstyle fixed handshake and transmission), big-endian.
//!
//! Only what the Hawser server speaks is encoded here: the fixed newstyle handshake, the
//! `INFO`/`GO` extension and simple replies. Structured replies, metadata contexts and
//! extended headers are refused during option haggling, so their wire formats are absent
//! (their numbers are kept so that logs can name them).
//!
//! Every decoder takes untrusted bytes and returns a `Result`; none of them panics on any
//! input (`fuzz/` has a target for each). Encoders take values the server chose itself.

use crate::constants::MAX_PAYLOAD_BYTES;

// ---------------------------------------------------------------------------------------------
// Magics.

/// First 8 bytes the server sends: "NBDMAGIC".
pub const NBDMAGIC: u64 = u64::from_be_bytes(*b"NBDMAGIC");
/// Second greeting word, and the magic of every option request: "IHAVEOPT".
pub const IHAVEOPT: u64 = u64::from_be_bytes(*b"IHAVEOPT");
/// Magic of every transmission-phase request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk (never sent: structured replies are refused).
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// Magic of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

// ---------------------------------------------------------------------------------------------
// Handshake flags (server, 16 bits) and client flags (32 bits).

/// Server handshake flag: speaks fixed newstyle.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Server handshake flag: may omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: the client speaks fixed newstyle.
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: the client does not want the 124 zero bytes.
pub const CLIENT_NO_ZEROES: u32 = 1 << 1;
const KNOWN_CLIENT_FLAGS: u32 = CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES;

// ---------------------------------------------------------------------------------------------
// Option codes.

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_PEEK_EXPORT: u32 = 4;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// ---------------------------------------------------------------------------------------------
// Option reply types. Errors have bit 31 set.

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR | 1;
pub const REP_ERR_POLICY: u32 = REP_ERR | 2;
pub const REP_ERR_INVALID: u32 = REP_ERR | 3;
pub const REP_ERR_PLATFORM: u32 = REP_ERR | 4;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERR | 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_ERR | 8;
pub const REP_ERR_TOO_BIG: u32 = REP_ERR | 9;
pub const REP_ERR_EXT_HEADER_REQD: u32 = REP_ERR | 10;

// ---------------------------------------------------------------------------------------------
// Info types (payload of NBD_REP_INFO, and what a client may ask for in INFO/GO).

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// ---------------------------------------------------------------------------------------------
// Transmission flags (16 bits, per export).

pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_ROTATIONAL: u16 = 1 << 4;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_SEND_DF: u16 = 1 << 7;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TFLAG_SEND_RESIZE: u16 = 1 << 9;
pub const TFLAG_SEND_CACHE: u16 = 1 << 10;
pub const TFLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// ---------------------------------------------------------------------------------------------
// Command flags (16 bits, per request).

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
pub const CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

// ---------------------------------------------------------------------------------------------
// Error values of a simple reply. The protocol fixes these numbers; they are not the host's.

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

// ---------------------------------------------------------------------------------------------
// Bounds and sizes.

/// Largest option payload a client may send. Every option Hawser understands fits in a few
/// KiB (an export name is at most `MAX_NAME_BYTES`); more is an attack or a broken client.
pub const MAX_OPTION_PAYLOAD_BYTES: u32 = 64 * 1024;
/// Longest export name (or any string) the protocol allows.
pub const MAX_NAME_BYTES: usize = 4096;
/// Server greeting: NBDMAGIC, IHAVEOPT, handshake flags.
pub const GREETING_LEN: usize = 18;
/// Client flags, sent once after the greeting.
pub const CLIENT_FLAGS_LEN: usize = 4;
/// Option request header: IHAVEOPT, option, length.
pub const OPTION_HEADER_LEN: usize = 16;
/// Option reply header: magic, option, reply type, length.
pub const OPTION_REPLY_HEADER_LEN: usize = 20;
/// Transmission request header.
pub const REQUEST_LEN: usize = 28;
/// Simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Payload of `NBD_INFO_EXPORT`: type, size, transmission flags.
pub const INFO_EXPORT_LEN: usize = 12;
/// Payload of `NBD_INFO_BLOCK_SIZE`: type, minimum, preferred, maximum.
pub const INFO_BLOCK_SIZE_LEN: usize = 14;
/// Zero padding after the `NBD_OPT_EXPORT_NAME` reply unless both sides agreed on NO_ZEROES.
pub const EXPORT_NAME_ZEROES: usize = 124;

const _: () = assert!(MAX_OPTION_PAYLOAD_BYTES as usize > MAX_NAME_BYTES + 6);

/// Why NBD bytes were rejected. During the handshake and on a bad request header, the server
/// closes the connection; errors in an option payload are answered with `NBD_REP_ERR_INVALID`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NbdError {
    #[error("{what} needs {needed} bytes, got {got}")]
    Truncated {
        what: &'static str,
        needed: usize,
        got: usize,
    },
    #[error("bad {what} magic {found:#x}")]
    BadMagic { what: &'static str, found: u64 },
    #[error("client flags {flags:#x} include unknown bits")]
    UnknownClientFlags { flags: u32 },
    #[error("client flags {flags:#x} lack FIXED_NEWSTYLE")]
    NotFixedNewstyle { flags: u32 },
    #[error("option {option} payload of {len} bytes exceeds {MAX_OPTION_PAYLOAD_BYTES}")]
    OptionTooLong { option: u32, len: u32 },
    #[error("name of {len} bytes exceeds {MAX_NAME_BYTES}")]
    NameTooLong { len: usize },
    #[error("name is not valid UTF-8 or contains NUL")]
    BadName,
    #[error("{what} of {count} does not fit the {available} bytes left")]
    BadCount {
        what: &'static str,
        count: u64,
        available: usize,
    },
    #[error("{extra} bytes after the end of the option payload")]
    TrailingBytes { extra: usize },
}

// ---------------------------------------------------------------------------------------------
// Handshake.

/// The server greeting: NBDMAGIC, IHAVEOPT, handshake flags.
pub fn encode_greeting(flags: u16) -> [u8; GREETING_LEN] {
    let mut b = [0u8; GREETING_LEN];
    b[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&flags.to_be_bytes());
    b
}

/// Decode and check the client flags: unknown bits are refused (the spec requires dropping
/// the connection), and so is a client without FIXED_NEWSTYLE, the only dialect we speak.
pub fn decode_client_flags(bytes: &[u8]) -> Result<u32, NbdError> {
    let flags = be_u32(bytes, 0, "client flags")?;
    if flags & !KNOWN_CLIENT_FLAGS != 0 {
        return Err(NbdError::UnknownClientFlags { flags });
    }
    if flags & CLIENT_FIXED_NEWSTYLE == 0 {
        return Err(NbdError::NotFixedNewstyle { flags });
    }
    Ok(flags)
}

/// Header of an option request. `len` bytes of payload follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

impl OptionHeader {
    pub fn encode(&self) -> [u8; OPTION_HEADER_LEN] {
        let mut b = [0u8; OPTION_HEADER_LEN];
        b[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        b[8..12].copy_from_slice(&self.option.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Decode an option header. The payload length is bounded here so that no caller can be
    /// made to allocate more than `MAX_OPTION_PAYLOAD_BYTES` for it.
    pub fn decode(bytes: &[u8]) -> Result<OptionHeader, NbdError> {
        let magic = be_u64(bytes, 0, "option header")?;
        let option = be_u32(bytes, 8, "option header")?;
        let len = be_u32(bytes, 12, "option header")?;
        if magic != IHAVEOPT {
            return Err(NbdError::BadMagic {
                what: "option",
                found: magic,
            });
        }
        if len > MAX_OPTION_PAYLOAD_BYTES {
            return Err(NbdError::OptionTooLong { option, len });
        }
        Ok(OptionHeader { option, len })
    }
}

/// Header of an option reply; `len` bytes of payload follow it.
pub fn encode_option_reply(
    option: u32,
    reply_type: u32,
    len: u32,
) -> [u8; OPTION_REPLY_HEADER_LEN] {
    let mut b = [0u8; OPTION_REPLY_HEADER_LEN];
    b[0..8].copy_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    b[8..12].copy_from_slice(&option.to_be_bytes());
    b[12..16].copy_from_slice(&reply_type.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// A decoded option reply header (used by clients and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionReply {
    pub option: u32,
    pub reply_type: u32,
    pub len: u32,
}

impl OptionReply {
    pub fn decode(bytes: &[u8]) -> Result<OptionReply, NbdError> {
        let magic = be_u64(bytes, 0, "option reply")?;
        if magic != OPTION_REPLY_MAGIC {
            return Err(NbdError::BadMagic {
                what: "option reply",
                found: magic,
            });
        }
        Ok(OptionReply {
            option: be_u32(bytes, 8, "option reply")?,
            reply_type: be_u32(bytes, 12, "option reply")?,
            len: be_u32(bytes, 16, "option reply")?,
        })
    }

    pub fn is_error(&self) -> bool {
        self.reply_type & REP_ERR != 0
    }
}

/// Check an export name from the wire: UTF-8, no NUL, at most `MAX_NAME_BYTES`.
pub fn parse_name(bytes: &[u8]) -> Result<&str, NbdError> {
    if bytes.len() > MAX_NAME_BYTES {
        return Err(NbdError::NameTooLong { len: bytes.len() });
    }
    let name = std::str::from_utf8(bytes).map_err(|_| NbdError::BadName)?;
    if name.contains('\0') {
        return Err(NbdError::BadName);
    }
    Ok(name)
}

/// Payload of `NBD_OPT_INFO` / `NBD_OPT_GO`: an export name and the info types asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest<'a> {
    pub name: &'a str,
    pub info_types: Vec<u16>,
}

impl<'a> InfoRequest<'a> {
    /// Parse `u32 name length, name, u16 count, count * u16`. Every length is checked against
    /// the bytes actually present before anything is allocated, and trailing bytes are refused.
    pub fn decode(payload: &'a [u8]) -> Result<InfoRequest<'a>, NbdError> {
        let name_len = be_u32(payload, 0, "info request name length")?;
        let rest = payload.get(4..).unwrap_or_default();
        let name_bytes = usize::try_from(name_len)
            .ok()
            .and_then(|n| rest.get(..n))
            .ok_or(NbdError::BadCount {
                what: "name length",
                count: u64::from(name_len),
                available: rest.len(),
            })?;
        let name = parse_name(name_bytes)?;
        let rest = rest.get(name_bytes.len()..).unwrap_or_default();
        let count = be_u16(rest, 0, "info request count")?;
        let list = rest.get(2..).unwrap_or_default();
        let list_len = usize::from(count) * 2;
        if list.len() < list_len {
            return Err(NbdError::BadCount {
                what: "info request count",
                count: u64::from(count),
                available: list.len(),
            });
        }
        if list.len() > list_len {
            return Err(NbdError::TrailingBytes {
                extra: list.len() - list_len,
            });
        }
        let info_types = list
            .chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect();
        Ok(InfoRequest { name, info_types })
    }

    /// The inverse of `decode` (used by tests and clients). `None` when a length overflows.
    pub fn encode(&self) -> Option<Vec<u8>> {
        let name_len = u32::try_from(self.name.len()).ok()?;
        let count = u16::try_from(self.info_types.len()).ok()?;
        let mut b = Vec::with_capacity(6 + self.name.len() + self.info_types.len() * 2);
        b.extend_from_slice(&name_len.to_be_bytes());
        b.extend_from_slice(self.name.as_bytes());
        b.extend_from_slice(&count.to_be_bytes());
        for t in &self.info_types {
            b.extend_from_slice(&t.to_be_bytes());
        }
        Some(b)
    }
}

/// Payload of `NBD_REP_INFO` / `NBD_INFO_EXPORT`.
pub fn encode_info_export(size: u64, transmission_flags: u16) -> [u8; INFO_EXPORT_LEN] {
    let mut b = [0u8; INFO_EXPORT_LEN];
    b[0..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
    b[2..10].copy_from_slice(&size.to_be_bytes());
    b[10..12].copy_from_slice(&transmission_flags.to_be_bytes());
    b
}

/// Block size constraints advertised with `NBD_INFO_BLOCK_SIZE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    pub minimum: u32,
    pub preferred: u32,
    pub maximum: u32,
}

/// Payload of `NBD_REP_INFO` / `NBD_INFO_BLOCK_SIZE`.
pub fn encode_info_block_size(sizes: BlockSizes) -> [u8; INFO_BLOCK_SIZE_LEN] {
    let mut b = [0u8; INFO_BLOCK_SIZE_LEN];
    b[0..2].copy_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    b[2..6].copy_from_slice(&sizes.minimum.to_be_bytes());
    b[6..10].copy_from_slice(&sizes.preferred.to_be_bytes());
    b[10..14].copy_from_slice(&sizes.maximum.to_be_bytes());
    b
}

/// Payload of `NBD_REP_INFO` / `NBD_INFO_NAME`. `None` if the name is longer than the
/// protocol allows (names come from our registry, so this is a bug there, not a peer's).
pub fn encode_info_name(name: &str) -> Option<Vec<u8>> {
    if name.len() > MAX_NAME_BYTES {
        return None;
    }
    let mut b = Vec::with_capacity(2 + name.len());
    b.extend_from_slice(&INFO_NAME.to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    Some(b)
}

/// Payload of `NBD_REP_SERVER`: u32 name length, then the name. `None` if the name is longer
/// than the protocol allows.
pub fn encode_rep_server(name: &str) -> Option<Vec<u8>> {
    if name.len() > MAX_NAME_BYTES {
        return None;
    }
    let len = u32::try_from(name.len()).ok()?;
    let mut b = Vec::with_capacity(4 + name.len());
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    Some(b)
}

/// Reply to `NBD_OPT_EXPORT_NAME`: size, transmission flags, and 124 zero bytes unless the
/// client asked for NO_ZEROES.
pub fn encode_export_name_reply(size: u64, transmission_flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(10 + EXPORT_NAME_ZEROES);
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&transmission_flags.to_be_bytes());
    if !no_zeroes {
        b.resize(b.len() + EXPORT_NAME_ZEROES, 0);
    }
    b
}

// ---------------------------------------------------------------------------------------------
// Transmission.

/// Transmission-phase command types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    WriteZeroes,
    /// Any other type (CACHE, BLOCK_STATUS, RESIZE, garbage): answered with EINVAL.
    Unknown(u16),
}

impl Command {
    pub fn from_u16(v: u16) -> Command {
        match v {
            0 => Command::Read,
            1 => Command::Write,
            2 => Command::Disc,
            3 => Command::Flush,
            4 => Command::Trim,
            6 => Command::WriteZeroes,
            other => Command::Unknown(other),
        }
    }

    pub fn to_u16(self) -> u16 {
        match self {
            Command::Read => 0,
            Command::Write => 1,
            Command::Disc => 2,
            Command::Flush => 3,
            Command::Trim => 4,
            Command::WriteZeroes => 6,
            Command::Unknown(v) => v,
        }
    }
}

/// A transmission-phase request header. For `Write`, `length` bytes of payload follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: Command,
    /// Opaque to the server; echoed in the reply ("cookie" in newer spec text).
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

impl Request {
    /// Decode a request header. Only the framing is checked here (size and magic); whether
    /// the flags, offset and length make sense is a per-request error, not a framing one.
    pub fn decode(bytes: &[u8]) -> Result<Request, NbdError> {
        let magic = be_u32(bytes, 0, "request")?;
        if magic != REQUEST_MAGIC {
            return Err(NbdError::BadMagic {
                what: "request",
                found: u64::from(magic),
            });
        }
        Ok(Request {
            flags: be_u16(bytes, 4, "request")?,
            command: Command::from_u16(be_u16(bytes, 6, "request")?),
            handle: be_u64(bytes, 8, "request")?,
            offset: be_u64(bytes, 16, "request")?,
            length: be_u32(bytes, 24, "request")?,
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.command.to_u16().to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Whether a payload of `length` bytes follows this header on the wire.
    pub fn has_payload(&self) -> bool {
        self.command == Command::Write
    }

    /// Whether a write payload is too large to be trusted: the stream cannot be resynchronised
    /// past it without reading it, and reading it is what the bound forbids.
    pub fn payload_too_large(&self) -> bool {
        self.has_payload() && self.length > MAX_PAYLOAD_BYTES
    }
}

/// A simple reply header; for a successful read, the data follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimpleReply {
    pub error: u32,
    pub handle: u64,
}

impl SimpleReply {
    pub fn encode(&self) -> [u8; SIMPLE_REPLY_LEN] {
        let mut b = [0u8; SIMPLE_REPLY_LEN];
        b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        b[4..8].copy_from_slice(&self.error.to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b
    }

    pub fn decode(bytes: &[u8]) -> Result<SimpleReply, NbdError> {
        let magic = be_u32(bytes, 0, "simple reply")?;
        if magic != SIMPLE_REPLY_MAGIC {
            return Err(NbdError::BadMagic {
                what: "simple reply",
                found: u64::from(magic),
            });
        }
        Ok(SimpleReply {
            error: be_u32(bytes, 4, "simple reply")?,
            handle: be_u64(bytes, 8, "simple reply")?,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Bounds-checked big-endian readers.

fn field<const N: usize>(b: &[u8], at: usize, what: &'static str) -> Result<[u8; N], NbdError> {
    at.checked_add(N)
        .and_then(|end| b.get(at..end))
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or(NbdError::Truncated {
            what,
            needed: at.saturating_add(N),
            got: b.len(),
        })
}

fn be_u16(b: &[u8], at: usize, what: &'static str) -> Result<u16, NbdError> {
    field::<2>(b, at, what).map(u16::from_be_bytes)
}

fn be_u32(b: &[u8], at: usize, what: &'static str) -> Result<u32, NbdError> {
    field::<4>(b, at, what).map(u32::from_be_bytes)
}

fn be_u64(b: &[u8], at: usize, what: &'static str) -> Result<u64, NbdError> {
    field::<8>(b, at, what).map(u64::from_be_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tiny deterministic generator so the garbage tests need no dependency.
    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    fn garbage(seed: u64, max_len: usize) -> impl Iterator<Item = Vec<u8>> {
        let mut s = seed;
        (0..2000).map(move |_| {
            let len = usize::try_from(xorshift(&mut s)).unwrap_or(0) % max_len;
            (0..len)
                .map(|_| xorshift(&mut s).to_le_bytes()[0])
                .collect()
        })
    }

    #[test]
    fn magics_match_the_spec() {
        assert_eq!(NBDMAGIC, 0x4e42_444d_4147_4943);
        assert_eq!(IHAVEOPT, 0x4948_4156_454f_5054);
        assert_eq!(REP_ERR_UNSUP, 0x8000_0001);
        assert_eq!(REP_ERR_UNKNOWN, 0x8000_0006);
    }

    #[test]
    fn greeting_layout() {
        let g = encode_greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        assert_eq!(&g[0..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(&g[16..18], &[0, 3]);
    }

    #[test]
    fn client_flags() {
        assert_eq!(decode_client_flags(&[0, 0, 0, 3]), Ok(3));
        assert_eq!(decode_client_flags(&[0, 0, 0, 1]), Ok(1));
        assert_eq!(
            decode_client_flags(&[0, 0, 0, 2]),
            Err(NbdError::NotFixedNewstyle { flags: 2 })
        );
        assert_eq!(
            decode_client_flags(&[0x80, 0, 0, 1]),
            Err(NbdError::UnknownClientFlags { flags: 0x8000_0001 })
        );
        for n in 0..4 {
            assert!(matches!(
                decode_client_flags(&[1; 4][..n]),
                Err(NbdError::Truncated { .. })
            ));
        }
    }

    #[test]
    fn option_header_roundtrip_and_bounds() {
        let h = OptionHeader {
            option: OPT_GO,
            len: 42,
        };
        assert_eq!(OptionHeader::decode(&h.encode()), Ok(h));
        let big = OptionHeader {
            option: OPT_GO,
            len: MAX_OPTION_PAYLOAD_BYTES + 1,
        };
        assert_eq!(
            OptionHeader::decode(&big.encode()),
            Err(NbdError::OptionTooLong {
                option: OPT_GO,
                len: MAX_OPTION_PAYLOAD_BYTES + 1
            })
        );
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert!(matches!(
            OptionHeader::decode(&bad),
            Err(NbdError::BadMagic { .. })
        ));
        for n in 0..OPTION_HEADER_LEN {
            let r = OptionHeader::decode(&h.encode()[..n]);
            assert!(
                matches!(r, Err(NbdError::Truncated { .. })),
                "{n} bytes: {r:?}"
            );
        }
    }

    #[test]
    fn option_reply_roundtrip() {
        let b = encode_option_reply(OPT_LIST, REP_ERR_POLICY, 7);
        let r = OptionReply::decode(&b).expect("decode");
        assert_eq!(
            r,
            OptionReply {
                option: OPT_LIST,
                reply_type: REP_ERR_POLICY,
                len: 7
            }
        );
        assert!(r.is_error());
        assert!(OptionReply::decode(&b[..19]).is_err());
        assert!(OptionReply::decode(&[0xff; 20]).is_err());
    }

    #[test]
    fn info_request_roundtrip() {
        let r = InfoRequest {
            name: "vol",
            info_types: vec![INFO_NAME, INFO_BLOCK_SIZE],
        };
        let b = r.encode().expect("encode");
        assert_eq!(InfoRequest::decode(&b), Ok(r));
        let empty = InfoRequest {
            name: "",
            info_types: vec![],
        };
        assert_eq!(
            InfoRequest::decode(&empty.encode().expect("encode")),
            Ok(empty)
        );
    }

    #[test]
    fn info_request_rejects_bad_lengths() {
        let r = InfoRequest {
            name: "vol",
            info_types: vec![INFO_NAME],
        };
        let b = r.encode().expect("encode");
        for n in 0..b.len() {
            assert!(
                InfoRequest::decode(&b[..n]).is_err(),
                "truncated at {n} accepted"
            );
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(
            InfoRequest::decode(&long),
            Err(NbdError::TrailingBytes { extra: 1 })
        );
        // Name length larger than the payload (including u32::MAX).
        let mut lie = b.clone();
        lie[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            InfoRequest::decode(&lie),
            Err(NbdError::BadCount { .. })
        ));
        // Info count larger than the payload.
        let mut lie = b;
        lie[7..9].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(matches!(
            InfoRequest::decode(&lie),
            Err(NbdError::BadCount { .. })
        ));
    }

    #[test]
    fn names_are_checked() {
        assert_eq!(parse_name(b"vol-1"), Ok("vol-1"));
        assert_eq!(parse_name(b"a\0b"), Err(NbdError::BadName));
        assert_eq!(parse_name(&[0xff, 0xfe]), Err(NbdError::BadName));
        let long = vec![b'a'; MAX_NAME_BYTES + 1];
        assert_eq!(
            parse_name(&long),
            Err(NbdError::NameTooLong {
                len: MAX_NAME_BYTES + 1
            })
        );
        assert!(encode_rep_server(&"a".repeat(MAX_NAME_BYTES + 1)).is_none());
        assert!(encode_info_name(&"a".repeat(MAX_NAME_BYTES + 1)).is_none());
    }

    #[test]
    fn info_payload_layouts() {
        let e = encode_info_export(0x1122_3344_5566_7788, 0x0171);
        assert_eq!(
            e,
            [0, 0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x01, 0x71]
        );
        let sizes = BlockSizes {
            minimum: 512,
            preferred: 4096,
            maximum: MAX_PAYLOAD_BYTES,
        };
        let b = encode_info_block_size(sizes);
        assert_eq!(&b[0..2], &[0, 3]);
        assert_eq!(&b[2..6], &512u32.to_be_bytes());
        assert_eq!(&b[6..10], &4096u32.to_be_bytes());
        assert_eq!(&b[10..14], &MAX_PAYLOAD_BYTES.to_be_bytes());
        assert_eq!(encode_info_name("vol"), Some(vec![0, 1, b'v', b'o', b'l']));
        assert_eq!(
            encode_rep_server("vol"),
            Some(vec![0, 0, 0, 3, b'v', b'o', b'l'])
        );
    }

    #[test]
    fn export_name_reply_zeroes() {
        assert_eq!(encode_export_name_reply(4096, 1, true).len(), 10);
        let padded = encode_export_name_reply(4096, 1, false);
        assert_eq!(padded.len(), 10 + EXPORT_NAME_ZEROES);
        assert!(padded[10..].iter().all(|&z| z == 0));
    }

    #[test]
    fn request_roundtrip_and_commands() {
        for raw in 0..=u16::MAX {
            assert_eq!(Command::from_u16(raw).to_u16(), raw);
        }
        let r = Request {
            flags: CMD_FLAG_FUA,
            command: Command::Write,
            handle: 0xdead_beef_0000_0001,
            offset: 1 << 40,
            length: 4096,
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        assert!(r.has_payload());
        assert!(!r.payload_too_large());
        let big = Request {
            length: MAX_PAYLOAD_BYTES + 1,
            ..r
        };
        assert!(big.payload_too_large());
        let read = Request {
            command: Command::Read,
            ..big
        };
        assert!(!read.payload_too_large());
    }

    #[test]
    fn request_rejects_bad_magic_and_short_input() {
        let r = Request {
            flags: 0,
            command: Command::Read,
            handle: 1,
            offset: 0,
            length: 512,
        };
        let mut b = r.encode();
        b[3] ^= 0x80;
        assert!(matches!(
            Request::decode(&b),
            Err(NbdError::BadMagic { .. })
        ));
        for n in 0..REQUEST_LEN {
            assert!(matches!(
                Request::decode(&r.encode()[..n]),
                Err(NbdError::Truncated { .. })
            ));
        }
    }

    #[test]
    fn simple_reply_roundtrip() {
        let r = SimpleReply {
            error: EINVAL,
            handle: 77,
        };
        assert_eq!(SimpleReply::decode(&r.encode()), Ok(r));
        assert!(SimpleReply::decode(&r.encode()[..15]).is_err());
        assert!(SimpleReply::decode(&[0; 16]).is_err());
    }

    #[test]
    fn garbage_never_panics() {
        for bytes in garbage(0x5eed, 64) {
            let _ = Request::decode(&bytes);
            let _ = OptionHeader::decode(&bytes);
            let _ = OptionReply::decode(&bytes);
            let _ = SimpleReply::decode(&bytes);
            let _ = decode_client_flags(&bytes);
            let _ = InfoRequest::decode(&bytes);
            let _ = parse_name(&bytes);
        }
    }

    #[test]
    fn garbage_with_valid_magic_never_panics() {
        for mut bytes in garbage(0xfeed, 64) {
            if bytes.len() >= 8 {
                bytes[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
                let _ = OptionHeader::decode(&bytes);
                bytes[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
                let _ = Request::decode(&bytes);
            }
        }
    }
}
