//! The rustls connection of a replica connection, shared by the reader ([`super::conn`]) and
//! the outbox that seals frames into TLS records ([`crate::replica::outbox`]). A file of its
//! own so that the outbox can seal without knowing how connections are made, and the
//! connection code can build an outbox: each of the two uses this, neither the other's
//! internals.

use std::io::{self, Write};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use hawser_tls::rustls;

/// The rustls connection of one TCP connection, shared by its reader and its outbox.
pub struct Sealer {
    conn: Mutex<rustls::Connection>,
}

impl Sealer {
    pub fn new(conn: impl Into<rustls::Connection>) -> Arc<Sealer> {
        let mut conn = conn.into();
        // Records are taken out as soon as they are made: rustls need not bound them.
        conn.set_buffer_limit(None);
        Arc::new(Sealer {
            conn: Mutex::new(conn),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, rustls::Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The TLS records carrying `segments`, in order, with any records rustls had pending.
    pub fn seal(&self, segments: impl IntoIterator<Item = Bytes>) -> io::Result<Bytes> {
        let mut c = self.lock();
        for s in segments {
            c.writer().write_all(&s)?;
        }
        take_records(&mut c)
    }

    /// Records rustls wants to send of its own accord (may be empty).
    pub fn pending(&self) -> io::Result<Bytes> {
        take_records(&mut self.lock())
    }

    /// The principal of the peer's verified certificate.
    pub fn peer(&self) -> Option<hawser_tls::Peer> {
        hawser_tls::client_peer(self.lock().peer_certificates())
    }
}

fn take_records(c: &mut rustls::Connection) -> io::Result<Bytes> {
    let mut out = Vec::new();
    while c.wants_write() {
        c.write_tls(&mut out)?;
    }
    Ok(Bytes::from(out))
}
