//! TLS on replica connections without giving up the outbox's direct writes.
//!
//! The handshake runs on the TCP stream (tokio-rustls); then the stream is split back into
//! its halves and the rustls connection is shared: the outbox seals each frame into TLS
//! records as it queues it (under its queue lock, so records go out in the order they were
//! sealed) and writes them with the same non-blocking `writev` as plaintext, and
//! [`ReadSide::Tls`] feeds what the socket delivers to rustls and reads the plaintext back.
//! Records rustls has to send of its own accord (a key update's answer, an alert) go through
//! the outbox too.

use std::io::{self, Read};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use hawser_tls::rustls;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::replica::outbox::Outbox;
pub use crate::tls::sealer::Sealer;

/// Ciphertext read from the socket at once, at most.
const READ_CHUNK: usize = 64 << 10;

/// The reading half of a replica connection.
pub enum ReadSide {
    Plain(OwnedReadHalf),
    Tls(Box<TlsRead>),
}

impl AsyncRead for ReadSide {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadSide::Plain(r) => Pin::new(r).poll_read(cx, buf),
            ReadSide::Tls(r) => Pin::new(r.as_mut()).poll_read(cx, buf),
        }
    }
}

/// Plaintext out of the TLS records the socket delivers.
pub struct TlsRead {
    raw: OwnedReadHalf,
    sealer: Arc<Sealer>,
    out: Arc<Outbox<OwnedWriteHalf>>,
    buf: Box<[u8]>,
    /// Ciphertext in `buf[start..end]` not yet given to rustls.
    start: usize,
    end: usize,
    eof: bool,
}

impl AsyncRead for TlsRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            {
                let mut c = this.sealer.lock();
                match c.reader().read(buf.initialize_unfilled()) {
                    Ok(n) => {
                        // n == 0: the peer closed the TLS session.
                        buf.advance(n);
                        return Poll::Ready(Ok(()));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    // The socket ended without close_notify: an end like any other here
                    // (every frame is checked whole before it is used).
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        return Poll::Ready(Ok(()))
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            if this.start == this.end {
                if this.eof {
                    return Poll::Ready(Ok(()));
                }
                let mut rb = ReadBuf::new(&mut this.buf);
                ready!(Pin::new(&mut this.raw).poll_read(cx, &mut rb))?;
                this.start = 0;
                this.end = rb.filled().len();
                this.eof = this.end == 0;
            }
            let wants_write = {
                let mut c = this.sealer.lock();
                if this.eof {
                    let _ = c.read_tls(&mut &[][..]);
                } else if c.wants_read() {
                    let mut rd = &this.buf[this.start..this.end];
                    let n = c.read_tls(&mut rd)?;
                    this.start += n;
                } else {
                    // Past the handshake rustls stops reading only with plaintext to give
                    // (read above) or after close_notify (an end, above): anything else
                    // would spin here.
                    return Poll::Ready(Err(io::Error::other("TLS connection stalled")));
                }
                c.process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                c.wants_write()
            };
            if wants_write {
                this.out.push_pending_tls();
            }
        }
    }
}

/// A replica connection ready for frames: plain, or after a TLS handshake (`tls`) whose
/// rustls connection is shared as the module doc says.
pub fn split(
    tcp: TcpStream,
    tls: Option<rustls::Connection>,
) -> (ReadSide, Arc<Outbox<OwnedWriteHalf>>, Option<Arc<Sealer>>) {
    let (rd, wr) = tcp.into_split();
    let Some(conn) = tls else {
        return (ReadSide::Plain(rd), Outbox::new(wr), None);
    };
    let sealer = Sealer::new(conn);
    let out = Outbox::with_tls(wr, sealer.clone());
    // Whatever the handshake left to send (session tickets and the like).
    out.push_pending_tls();
    let read = TlsRead {
        raw: rd,
        sealer: sealer.clone(),
        out: out.clone(),
        buf: vec![0u8; READ_CHUNK].into_boxed_slice(),
        start: 0,
        end: 0,
        eof: false,
    };
    (ReadSide::Tls(Box::new(read)), out, Some(sealer))
}

/// The server side of a replica connection's handshake.
pub async fn accept(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
) -> io::Result<(TcpStream, rustls::Connection)> {
    let tls = tokio_rustls::TlsAcceptor::from(config).accept(tcp).await?;
    let (tcp, conn) = tls.into_inner();
    Ok((tcp, conn.into()))
}

/// The client side: `config` accepts only the node the replica is on.
pub async fn connect(
    tcp: TcpStream,
    config: Arc<rustls::ClientConfig>,
) -> io::Result<(TcpStream, rustls::Connection)> {
    // The name is not checked (the configuration checks the principal) and not secret.
    let name = rustls::pki_types::ServerName::try_from("replica.hawser.invalid")
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await?;
    let (tcp, conn) = tls.into_inner();
    Ok((tcp, conn.into()))
}
