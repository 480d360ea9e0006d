//! A connection to a replica port as a peer of the cluster makes it: plain TCP in an
//! `--insecure` cluster, else mutual TLS with a certificate of the cluster naming a node.
//! Tests that send garbage *inside* an authenticated session (the replica protocol's
//! decoders, not TLS's) use it; [`Conn::exchange`] sends bytes on any such connection and
//! says what came back and how the connection ended.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use hawser_tls::rustls;

use crate::cluster::Cluster;

pub enum Conn {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

/// How to reach one node's replica port: its address and, with TLS, the configuration.
#[derive(Clone)]
pub struct ReplicaPort {
    pub addr: String,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Cluster {
    /// The replica port of agent `server`, reached as node `as_node` would (its engine's
    /// sessions: grants must name `as_node`).
    pub fn replica_port(&self, server: &str, as_node: &str) -> ReplicaPort {
        let tls = (!self.insecure).then(|| {
            self.tokens.tls_client(
                hawser_tls::Peer::Node(server.into()),
                &hawser_tls::Peer::Node(as_node.into()),
            )
        });
        ReplicaPort {
            addr: self.agent(server).replica.clone(),
            tls,
        }
    }
}

impl ReplicaPort {
    /// Connects (the TLS handshake happens with the first read or write).
    pub fn connect(&self) -> std::io::Result<Conn> {
        let tcp = TcpStream::connect(&self.addr)?;
        match &self.tls {
            None => Ok(Conn::Plain(tcp)),
            Some(config) => Conn::tls(tcp, config.clone()),
        }
    }
}

/// What came back on a connection after a client's bytes, and how it ended.
#[derive(Debug)]
pub struct Reply {
    /// Everything the server sent (inside TLS: the plaintext).
    pub bytes: Vec<u8>,
    pub end: End,
}

/// How the reading of a [`Reply`] ended.
#[derive(Debug)]
pub enum End {
    /// The server closed the connection (EOF; inside TLS, a close_notify).
    Closed,
    /// A read failed: the server reset the connection, or (TLS) sent a fatal alert or closed
    /// without close_notify. The error's text.
    Failed(String),
    /// No byte came for the whole wait: the server holds the connection open.
    Quiet,
}

impl Reply {
    /// Whether the server ended the connection (closed, reset, or refused it in TLS) rather
    /// than holding it open.
    pub fn closed(&self) -> bool {
        !matches!(self.end, End::Quiet)
    }
}

impl Conn {
    /// TLS over `tcp` with `config` (the handshake happens with the first read or write). The
    /// server name plays no part: Hawser's verifier checks the principal in the certificate.
    pub fn tls(tcp: TcpStream, config: Arc<rustls::ClientConfig>) -> std::io::Result<Conn> {
        let name =
            rustls::pki_types::ServerName::try_from("hawser").map_err(std::io::Error::other)?;
        let conn = rustls::ClientConnection::new(config, name).map_err(std::io::Error::other)?;
        Ok(Conn::Tls(Box::new(rustls::StreamOwned::new(conn, tcp))))
    }

    fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(s) => &s.sock,
        }
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        self.tcp().set_read_timeout(t)
    }

    /// Ends the sending side (TLS: close_notify), keeps reading possible.
    pub fn close_write(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.shutdown(std::net::Shutdown::Write),
            Conn::Tls(s) => {
                s.conn.send_close_notify();
                s.flush()
            }
        }
    }

    /// Sends `bytes` (write errors are ignored: a server may close before reading them all),
    /// then with `close_write` ends the sending side, and reads until the server ends the
    /// connection or `wait` passes without a byte.
    pub fn exchange(&mut self, bytes: &[u8], close_write: bool, wait: Duration) -> Reply {
        let _ = self.set_read_timeout(Some(wait));
        let _ = self.write_all(bytes).and_then(|()| self.flush());
        if close_write {
            let _ = self.close_write();
        }
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let end = loop {
            match self.read(&mut buf) {
                Ok(0) => break End::Closed,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    break End::Quiet
                }
                Err(e) => break End::Failed(e.to_string()),
            }
        };
        Reply { bytes: got, end }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}
