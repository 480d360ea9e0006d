//! Generic netlink messages for the kernel's `nbd` family, built and parsed as bytes: no
//! socket here, so every encoder and decoder is unit-tested, and the decoder refuses what the
//! kernel could send wrong instead of panicking.
//!
//! The layouts are the kernel's UAPI (`linux/netlink.h`, `linux/genetlink.h`,
//! `linux/nbd-netlink.h`): a 16-byte `nlmsghdr`, a 4-byte `genlmsghdr`, then attributes, each
//! a 4-byte header (length including the header, type) padded to 4 bytes. All integers are in
//! the host's byte order, which is little-endian on every machine Hawser runs on (x86_64 and
//! aarch64); the build fails elsewhere rather than send garbage.

#[cfg(not(target_endian = "little"))]
compile_error!("the netlink encoding here assumes a little-endian host");

/// `nlmsghdr` flags.
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
/// `nlmsghdr` types below 0x10 are netlink's own.
pub const NLMSG_ERROR: u16 = 0x2;
pub const NLMSG_DONE: u16 = 0x3;
/// The generic netlink controller's family id, fixed by the kernel.
pub const GENL_ID_CTRL: u16 = 0x10;
pub const CTRL_CMD_GETFAMILY: u8 = 3;
pub const CTRL_ATTR_FAMILY_ID: u16 = 1;
pub const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// A nested attribute's type carries this bit.
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// The `nbd` family (`linux/nbd-netlink.h`).
pub const NBD_FAMILY: &str = "nbd";
pub const NBD_GENL_VERSION: u8 = 1;

/// `nbd` commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum NbdCmd {
    Connect = 1,
    Disconnect = 2,
    Reconfigure = 3,
}

/// `nbd` attributes.
pub const NBD_ATTR_INDEX: u16 = 1;
pub const NBD_ATTR_SIZE_BYTES: u16 = 2;
pub const NBD_ATTR_BLOCK_SIZE_BYTES: u16 = 3;
pub const NBD_ATTR_TIMEOUT: u16 = 4;
pub const NBD_ATTR_SERVER_FLAGS: u16 = 5;
pub const NBD_ATTR_CLIENT_FLAGS: u16 = 6;
pub const NBD_ATTR_SOCKETS: u16 = 7;
pub const NBD_ATTR_DEAD_CONN_TIMEOUT: u16 = 8;
pub const NBD_ATTR_BACKEND_IDENTIFIER: u16 = 10;
pub const NBD_SOCK_ITEM: u16 = 1;
pub const NBD_SOCK_FD: u16 = 1;

const NLMSG_HDR: usize = 16;
const GENL_HDR: usize = 4;
const NLA_HDR: usize = 4;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// A message being built: headers first, attributes appended, lengths filled in by `finish`.
pub struct Builder {
    buf: Vec<u8>,
    /// Start offsets of the nested attributes still open.
    open: Vec<usize>,
}

impl Builder {
    /// A generic netlink request to `family` (its id), `cmd`, asking for an ACK.
    pub fn new(family: u16, cmd: u8, version: u8, seq: u32) -> Builder {
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set by finish
        buf.extend_from_slice(&family.to_ne_bytes());
        buf.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it in
        buf.extend_from_slice(&[cmd, version, 0, 0]);
        Builder {
            buf,
            open: Vec::new(),
        }
    }

    fn attr(&mut self, kind: u16, value: &[u8]) -> &mut Builder {
        let len = NLA_HDR + value.len();
        // Attribute values here are at most a few bytes and a short name.
        let len16 = u16::try_from(len).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len16.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    pub fn u32(&mut self, kind: u16, v: u32) -> &mut Builder {
        self.attr(kind, &v.to_ne_bytes())
    }

    pub fn u64(&mut self, kind: u16, v: u64) -> &mut Builder {
        self.attr(kind, &v.to_ne_bytes())
    }

    /// A NUL-terminated string, as the kernel's NLA_STRING and NLA_NUL_STRING both accept.
    pub fn string(&mut self, kind: u16, s: &str) -> &mut Builder {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.attr(kind, &v)
    }

    pub fn begin_nested(&mut self, kind: u16) -> &mut Builder {
        self.open.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        self
    }

    pub fn end_nested(&mut self) -> &mut Builder {
        if let Some(start) = self.open.pop() {
            let len = u16::try_from(self.buf.len() - start).unwrap_or(u16::MAX);
            self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        }
        self
    }

    /// The message's bytes, with its length set.
    pub fn finish(&mut self) -> Vec<u8> {
        while !self.open.is_empty() {
            self.end_nested();
        }
        let len = u32::try_from(self.buf.len()).unwrap_or(u32::MAX);
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        std::mem::take(&mut self.buf)
    }
}

/// The sockets of an `NBD_ATTR_SOCKETS` list, as CONNECT and RECONFIGURE take them.
pub fn sockets(b: &mut Builder, fds: &[i32]) {
    b.begin_nested(NBD_ATTR_SOCKETS);
    for &fd in fds {
        b.begin_nested(NBD_SOCK_ITEM);
        // File descriptors are never negative once open.
        b.u32(NBD_SOCK_FD, fd as u32);
        b.end_nested();
    }
    b.end_nested();
}

/// What one received message says.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// NLMSG_ERROR with 0: the request with this sequence number succeeded.
    Ack { seq: u32 },
    /// NLMSG_ERROR with a negative errno.
    Error { seq: u32, errno: i32 },
    /// A generic netlink message (a GETFAMILY answer, CONNECT's index): its attributes.
    Data {
        seq: u32,
        attrs: Vec<(u16, Vec<u8>)>,
    },
    /// End of a multi-part answer.
    Done { seq: u32 },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("netlink message truncated: {what} needs {need} bytes, {have} left")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("netlink message length {0} is shorter than its header")]
    BadLength(usize),
}

fn take<'a>(buf: &'a [u8], n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
    buf.get(..n).ok_or(DecodeError::Truncated {
        what,
        need: n,
        have: buf.len(),
    })
}

fn ne_u16(b: &[u8]) -> u16 {
    u16::from_ne_bytes([b[0], b[1]])
}

fn ne_u32(b: &[u8]) -> u32 {
    u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

/// Every message in one datagram the kernel sent.
pub fn parse(mut buf: &[u8]) -> Result<Vec<Reply>, DecodeError> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDR {
        let hdr = take(buf, NLMSG_HDR, "nlmsghdr")?;
        let len = ne_u32(&hdr[0..4]) as usize;
        let kind = ne_u16(&hdr[4..6]);
        let seq = ne_u32(&hdr[8..12]);
        if len < NLMSG_HDR {
            return Err(DecodeError::BadLength(len));
        }
        let msg = take(buf, len, "message")?;
        let body = &msg[NLMSG_HDR..];
        out.push(match kind {
            NLMSG_ERROR => {
                let errno = take(body, 4, "nlmsgerr")?;
                match ne_u32(errno) as i32 {
                    0 => Reply::Ack { seq },
                    e => Reply::Error { seq, errno: -e },
                }
            }
            NLMSG_DONE => Reply::Done { seq },
            _ => {
                take(body, GENL_HDR, "genlmsghdr")?;
                Reply::Data {
                    seq,
                    attrs: attributes(&body[GENL_HDR..])?,
                }
            }
        });
        buf = buf.get(align4(len)..).unwrap_or(&[]);
    }
    Ok(out)
}

/// The attributes of a message body (one level; nested ones keep their bytes).
pub fn attributes(mut buf: &[u8]) -> Result<Vec<(u16, Vec<u8>)>, DecodeError> {
    let mut out = Vec::new();
    while buf.len() >= NLA_HDR {
        let len = ne_u16(&buf[0..2]) as usize;
        let kind = ne_u16(&buf[2..4]) & NLA_TYPE_MASK;
        if len < NLA_HDR {
            return Err(DecodeError::BadLength(len));
        }
        let attr = take(buf, len, "attribute")?;
        out.push((kind, attr[NLA_HDR..].to_vec()));
        buf = buf.get(align4(len)..).unwrap_or(&[]);
    }
    Ok(out)
}

/// Attribute `kind` as an integer of its width (1, 2, 4 or 8 bytes).
pub fn attr_uint(attrs: &[(u16, Vec<u8>)], kind: u16) -> Option<u64> {
    let (_, v) = attrs.iter().find(|(k, _)| *k == kind)?;
    Some(match v.len() {
        1 => u64::from(v[0]),
        2 => u64::from(ne_u16(v)),
        4 => u64::from(ne_u32(v)),
        8 => u64::from_ne_bytes(v[..8].try_into().ok()?),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn connect_request_layout() {
        let mut b = Builder::new(0x20, NbdCmd::Connect as u8, NBD_GENL_VERSION, 7);
        b.u64(NBD_ATTR_SIZE_BYTES, 1 << 30);
        sockets(&mut b, &[5, 6]);
        let m = b.finish();
        assert_eq!(ne_u32(&m[0..4]) as usize, m.len());
        assert_eq!(ne_u16(&m[4..6]), 0x20);
        assert_eq!(ne_u16(&m[6..8]), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(ne_u32(&m[8..12]), 7);
        assert_eq!(&m[16..18], &[1, 1]);
        let attrs = attributes(&m[20..]).unwrap();
        assert_eq!(attrs.len(), 2);
        assert_eq!(attr_uint(&attrs, NBD_ATTR_SIZE_BYTES), Some(1 << 30));
        // SOCKETS { ITEM { FD 5 } ITEM { FD 6 } }
        let (kind, list) = &attrs[1];
        assert_eq!(*kind, NBD_ATTR_SOCKETS);
        let items = attributes(list).unwrap();
        let fds: Vec<u64> = items
            .iter()
            .map(|(k, v)| {
                assert_eq!(*k, NBD_SOCK_ITEM);
                attr_uint(&attributes(v).unwrap(), NBD_SOCK_FD).unwrap()
            })
            .collect();
        assert_eq!(fds, [5, 6]);
        // The nested headers carry NLA_F_NESTED on the wire.
        assert_eq!(ne_u16(&m[20 + 12 + 2..]) & NLA_F_NESTED, NLA_F_NESTED);
    }

    #[test]
    fn string_attributes_are_nul_terminated_and_padded() {
        let mut b = Builder::new(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1, 1);
        b.string(CTRL_ATTR_FAMILY_NAME, NBD_FAMILY);
        let m = b.finish();
        assert_eq!(m.len(), 20 + 8);
        assert_eq!(&m[20..28], &[8, 0, 2, 0, b'n', b'b', b'd', 0]);
    }

    fn error_msg(seq: u32, errno: i32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&36u32.to_ne_bytes());
        m.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&errno.to_ne_bytes());
        m.extend_from_slice(&[0; 16]); // the request's header, echoed
        m
    }

    #[test]
    fn parses_acks_errors_and_data_in_one_datagram() {
        let mut data = Builder::new(0x20, NbdCmd::Connect as u8, 1, 3);
        data.u32(NBD_ATTR_INDEX, 4);
        let mut dgram = data.finish();
        dgram.extend(error_msg(3, 0));
        dgram.extend(error_msg(4, -16));
        let replies = parse(&dgram).unwrap();
        assert_eq!(replies.len(), 3);
        match &replies[0] {
            Reply::Data { seq: 3, attrs } => assert_eq!(attr_uint(attrs, NBD_ATTR_INDEX), Some(4)),
            r => panic!("{r:?}"),
        }
        assert_eq!(replies[1], Reply::Ack { seq: 3 });
        assert_eq!(replies[2], Reply::Error { seq: 4, errno: 16 });
    }

    /// Every prefix and every byte flip of a valid datagram decodes or errs, never panics.
    #[test]
    fn garbage_never_panics() {
        let mut data = Builder::new(0x20, NbdCmd::Reconfigure as u8, 1, 9);
        data.u32(NBD_ATTR_INDEX, 1);
        sockets(&mut data, &[3]);
        let mut dgram = data.finish();
        dgram.extend(error_msg(9, 0));
        for n in 0..=dgram.len() {
            let _ = parse(&dgram[..n]);
        }
        for i in 0..dgram.len() {
            for v in [0u8, 1, 3, 4, 0x7f, 0xff] {
                let mut g = dgram.clone();
                g[i] = v;
                if let Ok(replies) = parse(&g) {
                    for r in replies {
                        if let Reply::Data { attrs, .. } = r {
                            let _ = attr_uint(&attrs, NBD_ATTR_INDEX);
                            for (_, v) in &attrs {
                                let _ = attributes(v);
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(
            parse(&[16, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]),
            Err(DecodeError::Truncated {
                what: "nlmsgerr",
                need: 4,
                have: 0
            })
        );
    }
}
