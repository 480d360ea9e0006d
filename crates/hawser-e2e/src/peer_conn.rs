//! A connection to a replica port as a peer of the cluster makes it: plain TCP in an
//! `--insecure` cluster, else mutual TLS with a certificate of the cluster naming a node.
//! Tests that send garbage *inside* an authenticated session (the replica protocol's
//! decoders, not TLS's) use it.

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
        Ok(match &self.tls {
            None => Conn::Plain(tcp),
            Some(config) => {
                let name = rustls::pki_types::ServerName::try_from("replica")
                    .map_err(std::io::Error::other)?;
                let conn = rustls::ClientConnection::new(config.clone(), name)
                    .map_err(std::io::Error::other)?;
                Conn::Tls(Box::new(rustls::StreamOwned::new(conn, tcp)))
            }
        })
    }
}

impl Conn {
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
