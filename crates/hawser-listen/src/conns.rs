//! Connection limits: at most `total` connections at once, and at most `per_peer` from one
//! IP address, so one misbehaving host (or a slowloris from it) cannot take every slot of a
//! listener from the others. A connection over the limit is closed at once, before a byte of
//! it is read.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Counts the connections of one listener (or one phase of it, like the replica port's
/// connections that have not said Hello yet).
#[derive(Clone)]
pub struct ConnLimits {
    inner: Arc<Inner>,
}

struct Inner {
    total: AtomicUsize,
    per_peer: AtomicUsize,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Total,
    Peer,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Total => f.write_str("too many connections"),
            Refused::Peer => f.write_str("too many connections from this peer"),
        }
    }
}

/// A connection's place; dropping it frees the place.
pub struct ConnPermit {
    inner: Arc<Inner>,
    peer: IpAddr,
}

impl ConnLimits {
    /// `total` and `per_peer` are at least 1.
    pub fn new(total: usize, per_peer: usize) -> ConnLimits {
        ConnLimits {
            inner: Arc::new(Inner {
                total: AtomicUsize::new(total.max(1)),
                per_peer: AtomicUsize::new(per_peer.max(1)),
                counts: Mutex::new(Counts::default()),
            }),
        }
    }

    /// A place for a connection from `peer`, or why there is none.
    pub fn admit(&self, peer: IpAddr) -> Result<ConnPermit, Refused> {
        let mut c = self
            .inner
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if c.total >= self.inner.total.load(Ordering::Relaxed) {
            return Err(Refused::Total);
        }
        let n = c.by_peer.entry(peer).or_insert(0);
        if *n >= self.inner.per_peer.load(Ordering::Relaxed) {
            return Err(Refused::Peer);
        }
        *n += 1;
        c.total += 1;
        Ok(ConnPermit {
            inner: self.inner.clone(),
            peer,
        })
    }

    /// Raises the limits to at least `total` and `per_peer` (never lowers them): for a
    /// listener whose legitimate load grows with something it serves, like the replica port
    /// with the replicas it holds.
    pub fn raise_to(&self, total: usize, per_peer: usize) {
        self.inner.total.fetch_max(total, Ordering::Relaxed);
        self.inner.per_peer.fetch_max(per_peer, Ordering::Relaxed);
    }

    /// The limits now: (total, per peer).
    pub fn limits(&self) -> (usize, usize) {
        (
            self.inner.total.load(Ordering::Relaxed),
            self.inner.per_peer.load(Ordering::Relaxed),
        )
    }

    /// Connections admitted and not yet dropped.
    pub fn open(&self) -> usize {
        self.inner
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let mut c = self
            .inner
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.by_peer.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn limits_per_peer_and_in_total_and_frees_on_drop() {
        let l = ConnLimits::new(3, 2);
        let a1 = l.admit(ip(1)).unwrap();
        let _a2 = l.admit(ip(1)).unwrap();
        assert_eq!(l.admit(ip(1)).err(), Some(Refused::Peer));
        let _b1 = l.admit(ip(2)).unwrap();
        assert_eq!(l.admit(ip(3)).err(), Some(Refused::Total));
        assert_eq!(l.open(), 3);
        drop(a1);
        assert_eq!(l.open(), 2);
        let _c1 = l.admit(ip(3)).unwrap();
        assert_eq!(l.admit(ip(1)).err(), Some(Refused::Total));
    }

    #[test]
    fn raised_limits_admit_more_and_are_never_lowered() {
        let l = ConnLimits::new(2, 1);
        let _a = l.admit(ip(1)).unwrap();
        assert_eq!(l.admit(ip(1)).err(), Some(Refused::Peer));
        l.raise_to(3, 2);
        let _b = l.admit(ip(1)).unwrap();
        assert_eq!(l.admit(ip(1)).err(), Some(Refused::Peer));
        l.raise_to(1, 1);
        assert_eq!(l.limits(), (3, 2));
        let _c = l.admit(ip(2)).unwrap();
        assert_eq!(l.admit(ip(3)).err(), Some(Refused::Total));
    }

    #[test]
    fn a_peer_that_left_leaves_no_count_behind() {
        let l = ConnLimits::new(10, 1);
        for _ in 0..100 {
            let p = l.admit(ip(9)).unwrap();
            assert_eq!(l.admit(ip(9)).err(), Some(Refused::Peer));
            drop(p);
        }
        assert_eq!(l.open(), 0);
        assert!(l.inner.counts.lock().unwrap().by_peer.is_empty());
    }
}
