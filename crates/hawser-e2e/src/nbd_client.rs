//! A small blocking NBD client over a unix socket, on the `hawser_wire::nbd` codecs: fixed
//! newstyle handshake with `NBD_OPT_GO`, then pipelined simple requests and replies. Used by
//! the verifying writer and its checker; real clients (fio, qemu-io) cover the rest.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use hawser_wire::nbd::{self, Command, InfoRequest, OptionHeader, OptionReply, Request};
use hawser_wire::nbd::{NbdError, SimpleReply};

/// How long one blocking socket read waits before the caller gets to decide whether to go on.
const READ_POLL: Duration = Duration::from_millis(100);
/// A request that cannot be sent in this long means the server stopped reading.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// An export on a unix socket, as in `nbd+unix:///NAME?socket=PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdTarget {
    pub socket: PathBuf,
    pub export: String,
}

impl NbdTarget {
    /// Parse `nbd+unix:///NAME?socket=PATH` (the form `volume show` prints).
    pub fn from_unix_uri(uri: &str) -> NbdTarget {
        let rest = uri
            .strip_prefix("nbd+unix:///")
            .unwrap_or_else(|| panic!("not an nbd+unix URI: {uri}"));
        let (export, socket) = rest
            .split_once("?socket=")
            .unwrap_or_else(|| panic!("no socket= in {uri}"));
        NbdTarget {
            socket: PathBuf::from(socket),
            export: export.to_owned(),
        }
    }
}

fn invalid(e: NbdError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// One NBD connection in the transmission phase.
pub struct NbdConn {
    stream: UnixStream,
    /// Export size from `NBD_INFO_EXPORT`.
    pub size: u64,
}

impl NbdConn {
    pub fn connect(target: &NbdTarget) -> io::Result<NbdConn> {
        let mut stream = UnixStream::connect(&target.socket)?;
        stream.set_read_timeout(Some(WRITE_TIMEOUT))?;
        stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
        let mut greeting = [0u8; nbd::GREETING_LEN];
        stream.read_exact(&mut greeting)?;
        if greeting[0..16] != *b"NBDMAGICIHAVEOPT" {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "bad greeting"));
        }
        let flags = nbd::CLIENT_FIXED_NEWSTYLE | nbd::CLIENT_NO_ZEROES;
        stream.write_all(&flags.to_be_bytes())?;
        let size = go(&mut stream, &target.export)?;
        stream.set_read_timeout(Some(READ_POLL))?;
        Ok(NbdConn { stream, size })
    }

    pub fn send_write(&mut self, handle: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        let length = u32::try_from(data.len()).map_err(io::Error::other)?;
        let mut msg = request(Command::Write, handle, offset, length).to_vec();
        msg.extend_from_slice(data);
        self.stream.write_all(&msg)
    }

    pub fn send_read(&mut self, handle: u64, offset: u64, length: u32) -> io::Result<()> {
        self.stream
            .write_all(&request(Command::Read, handle, offset, length))
    }

    pub fn send_flush(&mut self, handle: u64) -> io::Result<()> {
        self.stream
            .write_all(&request(Command::Flush, handle, 0, 0))
    }

    /// Read the next reply header. While none is complete, `give_up` is asked every 100 ms;
    /// when it says so the read fails with `TimedOut` (and the stream is no longer usable).
    pub fn read_reply(&mut self, give_up: &mut dyn FnMut() -> bool) -> io::Result<SimpleReply> {
        let mut header = [0u8; nbd::SIMPLE_REPLY_LEN];
        self.read_full(&mut header, give_up)?;
        SimpleReply::decode(&header).map_err(invalid)
    }

    /// Read the data that follows a successful read reply.
    pub fn read_data(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.read_full(buf, &mut || false)
    }

    /// One read at queue depth 1.
    pub fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let length = u32::try_from(buf.len()).map_err(io::Error::other)?;
        self.send_read(0, offset, length)?;
        let reply = self.read_reply(&mut || false)?;
        if reply.error != 0 {
            return Err(io::Error::other(format!(
                "read at {offset}: NBD error {}",
                reply.error
            )));
        }
        self.read_data(buf)
    }

    /// One write at queue depth 1 (for tests that plant data).
    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.send_write(0, offset, data)?;
        let reply = self.read_reply(&mut || false)?;
        match reply.error {
            0 => Ok(()),
            e => Err(io::Error::other(format!(
                "write at {offset}: NBD error {e}"
            ))),
        }
    }

    /// Say goodbye (`NBD_CMD_DISC`); the server answers what is in flight and closes.
    pub fn disconnect(mut self) {
        let _ = self.stream.write_all(&request(Command::Disc, 0, 0, 0));
    }

    fn read_full(&mut self, buf: &mut [u8], give_up: &mut dyn FnMut() -> bool) -> io::Result<()> {
        let mut at = 0;
        while at < buf.len() {
            match self.stream.read(&mut buf[at..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => at += n,
                Err(e) if is_timeout(&e) => {
                    if give_up() {
                        return Err(io::ErrorKind::TimedOut.into());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn request(command: Command, handle: u64, offset: u64, length: u32) -> [u8; nbd::REQUEST_LEN] {
    Request {
        flags: 0,
        command,
        handle,
        offset,
        length,
    }
    .encode()
}

/// `NBD_OPT_GO` on `export`; returns the export size.
fn go(stream: &mut UnixStream, export: &str) -> io::Result<u64> {
    let payload = InfoRequest {
        name: export,
        info_types: vec![],
    }
    .encode()
    .ok_or_else(|| io::Error::other("export name too long"))?;
    let len = u32::try_from(payload.len()).map_err(io::Error::other)?;
    let mut msg = OptionHeader {
        option: nbd::OPT_GO,
        len,
    }
    .encode()
    .to_vec();
    msg.extend_from_slice(&payload);
    stream.write_all(&msg)?;
    let mut size = None;
    loop {
        let mut header = [0u8; nbd::OPTION_REPLY_HEADER_LEN];
        stream.read_exact(&mut header)?;
        let reply = OptionReply::decode(&header).map_err(invalid)?;
        let mut body = vec![0u8; usize::try_from(reply.len).map_err(io::Error::other)?];
        stream.read_exact(&mut body)?;
        if reply.is_error() {
            let msg = format!("GO {export:?} refused: reply type {:#x}", reply.reply_type);
            return Err(io::Error::other(msg));
        }
        let is_export = reply.reply_type == nbd::REP_INFO
            && body.len() == nbd::INFO_EXPORT_LEN
            && body[0..2] == nbd::INFO_EXPORT.to_be_bytes();
        if is_export {
            size = body[2..10].try_into().ok().map(u64::from_be_bytes);
        }
        if reply.reply_type == nbd::REP_ACK {
            return size.ok_or_else(|| io::Error::other("GO reply without NBD_INFO_EXPORT"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_uri_parses() {
        let t = NbdTarget::from_unix_uri("nbd+unix:///vol-1?socket=/tmp/x/nbd.sock");
        assert_eq!(t.export, "vol-1");
        assert_eq!(t.socket, PathBuf::from("/tmp/x/nbd.sock"));
    }
}
