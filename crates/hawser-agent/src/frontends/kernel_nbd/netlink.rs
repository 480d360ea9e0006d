//! The kernel's `nbd` driver driven over generic netlink (what `nbd-client` does without `-L`):
//! CONNECT hands it sockets and makes `/dev/nbdN` live, RECONFIGURE replaces the sockets that
//! died, DISCONNECT ends the device (its pending and later I/O fail with EIO).
//!
//! Why netlink and not the old ioctls: an ioctl-configured device lives only while the process
//! that configured it sits in `NBD_DO_IT`, so an agent restart would fail every request. A
//! netlink-configured one outlives the agent, holds I/O for `dead_conn_timeout` when its
//! sockets die, and takes new ones with RECONFIGURE.
//!
//! Calls block for at most a netlink round trip; callers in async code use `spawn_blocking`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use super::genl::{self, Builder, NbdCmd, Reply};

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink socket: {0}")]
    Socket(io::Error),
    #[error("the kernel has no `nbd` netlink family (module not loaded, or not built)")]
    NoFamily,
    #[error("nbd {cmd:?}{} refused by the kernel: {err}", index.map(|i| format!(" of /dev/nbd{i}")).unwrap_or_default())]
    Refused {
        cmd: NbdCmd,
        index: Option<u32>,
        err: io::Error,
    },
    #[error("netlink answer: {0}")]
    Decode(#[from] genl::DecodeError),
    #[error("netlink: the kernel's answer to {0} had no {1}")]
    Missing(&'static str, &'static str),
}

/// What CONNECT sets up.
#[derive(Clone, Debug)]
pub struct ConnectConfig {
    /// `None`: the kernel picks a free device (or makes one).
    pub index: Option<u32>,
    pub size_bytes: u64,
    pub block_size: u64,
    /// A request unanswered this long is resent on a live socket (its socket is declared
    /// dead first); see `kernel_nbd::link` for why that is cheap.
    pub io_timeout: Duration,
    /// How long I/O waits for a new socket once all died, before failing with EIO.
    pub dead_conn_timeout: Duration,
    /// NBD transmission flags (`NBD_FLAG_*`), as the handshake would advertise them.
    pub server_flags: u64,
    /// Shown in `/sys/block/nbdN/backend`: how a restarted agent knows the device is its own.
    pub backend: String,
}

pub struct NbdNetlink {
    fd: OwnedFd,
    family: u16,
    seq: u32,
}

impl NbdNetlink {
    /// A netlink socket with the `nbd` family resolved.
    pub fn open() -> Result<NbdNetlink, NetlinkError> {
        // SAFETY: plain socket(2); the result is checked before use.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_GENERIC,
            )
        };
        if raw < 0 {
            return Err(NetlinkError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut nl = NbdNetlink {
            fd,
            family: genl::GENL_ID_CTRL,
            seq: 0,
        };
        let mut b = Builder::new(
            genl::GENL_ID_CTRL,
            genl::CTRL_CMD_GETFAMILY,
            1,
            nl.next_seq(),
        );
        b.string(genl::CTRL_ATTR_FAMILY_NAME, genl::NBD_FAMILY);
        let attrs = match nl.request(b.finish()) {
            Ok(a) => a,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Err(NetlinkError::NoFamily),
            Err(e) => return Err(NetlinkError::Socket(e)),
        };
        let id = genl::attr_uint(&attrs, genl::CTRL_ATTR_FAMILY_ID)
            .and_then(|v| u16::try_from(v).ok())
            .ok_or(NetlinkError::Missing("GETFAMILY", "family id"))?;
        nl.family = id;
        Ok(nl)
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Send one request and wait for its ACK; returns the attributes of the data message
    /// that came before the ACK (empty if none), or the kernel's error.
    fn request(&mut self, msg: Vec<u8>) -> io::Result<Vec<(u16, Vec<u8>)>> {
        let seq = u32::from_ne_bytes([msg[8], msg[9], msg[10], msg[11]]);
        // SAFETY: sockaddr_nl is plain data, valid all zeroes (the kernel as destination).
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        // AF_NETLINK is 16.
        addr.nl_family = libc::sa_family_t::try_from(libc::AF_NETLINK).unwrap_or(16);
        // 12 bytes.
        let addr_len =
            libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_nl>()).unwrap_or(12);
        // SAFETY: the buffer and address outlive the call; lengths are theirs.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&addr as *const libc::sockaddr_nl).cast(),
                addr_len,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut data = Vec::new();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            // SAFETY: `buf` is writable for its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let replies = genl::parse(&buf[..n as usize])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            for r in replies {
                match r {
                    Reply::Data { seq: s, attrs } if s == seq => data = attrs,
                    Reply::Ack { seq: s } if s == seq => return Ok(data),
                    Reply::Error { seq: s, errno } if s == seq => {
                        return Err(io::Error::from_raw_os_error(errno))
                    }
                    // An answer to an earlier request that timed out, or a multicast: not ours.
                    _ => {}
                }
            }
        }
    }

    fn nbd(&mut self, cmd: NbdCmd) -> Builder {
        let seq = self.next_seq();
        Builder::new(self.family, cmd as u8, genl::NBD_GENL_VERSION, seq)
    }

    /// Make a device live on `fds` (connected sockets whose other ends serve NBD's
    /// transmission phase); returns its index N (`/dev/nbdN`).
    pub fn connect(&mut self, cfg: &ConnectConfig, fds: &[RawFd]) -> Result<u32, NetlinkError> {
        let mut b = self.nbd(NbdCmd::Connect);
        if let Some(i) = cfg.index {
            b.u32(genl::NBD_ATTR_INDEX, i);
        }
        b.u64(genl::NBD_ATTR_SIZE_BYTES, cfg.size_bytes)
            .u64(genl::NBD_ATTR_BLOCK_SIZE_BYTES, cfg.block_size)
            .u64(genl::NBD_ATTR_TIMEOUT, cfg.io_timeout.as_secs().max(1))
            .u64(
                genl::NBD_ATTR_DEAD_CONN_TIMEOUT,
                cfg.dead_conn_timeout.as_secs().max(1),
            )
            .u64(genl::NBD_ATTR_SERVER_FLAGS, cfg.server_flags)
            .u64(genl::NBD_ATTR_CLIENT_FLAGS, 0)
            .string(genl::NBD_ATTR_BACKEND_IDENTIFIER, &cfg.backend);
        genl::sockets(&mut b, fds);
        let attrs = self
            .request(b.finish())
            .map_err(|err| NetlinkError::Refused {
                cmd: NbdCmd::Connect,
                index: cfg.index,
                err,
            })?;
        genl::attr_uint(&attrs, genl::NBD_ATTR_INDEX)
            .and_then(|v| u32::try_from(v).ok())
            .ok_or(NetlinkError::Missing("CONNECT", "device index"))
    }

    /// Give device `index` new sockets in place of dead ones. `backend` must be the one it
    /// was connected with (the kernel refuses others: EINVAL). When no socket is dead the
    /// kernel takes none, and says yes.
    pub fn reconfigure(
        &mut self,
        index: u32,
        backend: &str,
        fds: &[RawFd],
    ) -> Result<(), NetlinkError> {
        let mut b = self.nbd(NbdCmd::Reconfigure);
        b.u32(genl::NBD_ATTR_INDEX, index)
            .string(genl::NBD_ATTR_BACKEND_IDENTIFIER, backend);
        genl::sockets(&mut b, fds);
        self.request(b.finish())
            .map(drop)
            .map_err(|err| NetlinkError::Refused {
                cmd: NbdCmd::Reconfigure,
                index: Some(index),
                err,
            })
    }

    /// Tell device `index` (named `backend`) that its export is now `size_bytes` long. The
    /// kernel sets the disk's capacity and sends a change uevent; a mounted filesystem can
    /// then be grown. RECONFIGURE takes the size since Linux 5.3.
    pub fn resize(
        &mut self,
        index: u32,
        backend: &str,
        size_bytes: u64,
    ) -> Result<(), NetlinkError> {
        let mut b = self.nbd(NbdCmd::Reconfigure);
        b.u32(genl::NBD_ATTR_INDEX, index)
            .string(genl::NBD_ATTR_BACKEND_IDENTIFIER, backend)
            .u64(genl::NBD_ATTR_SIZE_BYTES, size_bytes);
        self.request(b.finish())
            .map(drop)
            .map_err(|err| NetlinkError::Refused {
                cmd: NbdCmd::Reconfigure,
                index: Some(index),
                err,
            })
    }

    /// End device `index`: what is queued or comes later fails with EIO.
    pub fn disconnect(&mut self, index: u32) -> Result<(), NetlinkError> {
        let mut b = self.nbd(NbdCmd::Disconnect);
        b.u32(genl::NBD_ATTR_INDEX, index);
        self.request(b.finish())
            .map(drop)
            .map_err(|err| NetlinkError::Refused {
                cmd: NbdCmd::Disconnect,
                index: Some(index),
                err,
            })
    }
}

/// The backend identifier of `/dev/nbd{index}` while it is configured (`None` when it is not,
/// or was configured without one).
pub fn backend_of(index: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/sys/block/nbd{index}/backend")).ok()?;
    let t = text.trim_end();
    (!t.is_empty()).then(|| t.to_owned())
}
