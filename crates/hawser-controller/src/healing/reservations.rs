//! Replicas placed by this controller that the agents' heartbeats may not report yet.
//!
//! Placement and reservation happen under one lock, so two concurrent creates see each
//! other's choices. A reservation lives from placement until its node has sent
//! [`RESERVATION_HEARTBEATS`] heartbeats after the replica was created; counting one more
//! than needed only makes placement briefly conservative, never overbooked.

use std::sync::Mutex;

use crate::constants::RESERVATION_HEARTBEATS;
use crate::healing::placement::{
    apply_reserved, place, Candidate, Placed, PlacementError, Request, Reserved,
};

struct Entry {
    replica_id: String,
    reserved: Reserved,
    /// Set once the agent created the replica; heartbeats count only after that.
    created: bool,
    heartbeats: u32,
}

#[derive(Default)]
pub struct Reservations {
    entries: Mutex<Vec<Entry>>,
}

impl Reservations {
    fn with<R>(&self, f: impl FnOnce(&mut Vec<Entry>) -> R) -> R {
        // A panic while holding this lock cannot leave the list half-edited in a way that
        // matters (worst case a stale reservation), so poisoning is ignored.
        let mut g = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g)
    }

    /// Places the replicas `ids` (one per replica of `req`) and reserves their space,
    /// atomically with respect to other placements.
    pub fn place_and_reserve(
        &self,
        mut candidates: Vec<Candidate>,
        req: &Request,
        ids: &[String],
    ) -> Result<Placed, PlacementError> {
        assert_eq!(ids.len(), req.count, "one id per replica to place");
        self.with(|entries| {
            let reserved: Vec<Reserved> = entries.iter().map(|e| e.reserved.clone()).collect();
            apply_reserved(&mut candidates, &reserved);
            let chosen = place(&candidates, req)?;
            assert_eq!(chosen.replicas.len(), ids.len());
            for (id, p) in ids.iter().zip(&chosen.replicas) {
                entries.push(Entry {
                    replica_id: id.clone(),
                    reserved: Reserved {
                        node: p.node.clone(),
                        pool: p.pool.clone(),
                        size_bytes: req.size_bytes,
                        thin: req.thin,
                    },
                    created: false,
                    heartbeats: 0,
                });
            }
            Ok(chosen)
        })
    }

    /// The agent created the replica: from now on its node's reports will include it.
    pub fn created(&self, replica_id: &str) {
        self.with(|entries| {
            for e in entries.iter_mut().filter(|e| e.replica_id == replica_id) {
                e.created = true;
            }
        })
    }

    /// The replica was not created (or was rolled back): free its space now.
    pub fn release(&self, replica_id: &str) {
        self.with(|entries| entries.retain(|e| e.replica_id != replica_id))
    }

    pub fn heartbeat(&self, node: &str) {
        self.with(|entries| {
            for e in entries
                .iter_mut()
                .filter(|e| e.created && e.reserved.node == node)
            {
                e.heartbeats += 1;
            }
            entries.retain(|e| e.heartbeats < RESERVATION_HEARTBEATS);
        })
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.with(|entries| entries.len())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hawser_api::controller::{PoolInfo, PoolKind, VolumePlacement};

    fn thick(size_bytes: u64) -> Request {
        Request {
            size_bytes,
            thin: false,
            count: 1,
            rules: VolumePlacement::default(),
        }
    }

    fn candidate(node: &str) -> Candidate {
        let pool = PoolInfo {
            node: node.into(),
            name: "p".into(),
            path: "/p".into(),
            capacity_bytes: 10 << 30,
            free_bytes: 10 << 30,
            provisioned_bytes: 0,
            overprovision_ratio: 1.0,
            replicas: 0,
            kind: PoolKind::Any,
            snapshots: 0,
            snapshot_bytes: 0,
        };
        Candidate {
            node: node.into(),
            online: true,
            zone: None,
            pools: vec![pool],
        }
    }

    #[test]
    fn reservations_expire_after_two_heartbeats_once_created() {
        let r = Reservations::default();
        let ids = ["v-r0".to_string()];
        r.place_and_reserve(vec![candidate("n1")], &thick(8 << 30), &ids)
            .unwrap();
        // Not created yet: heartbeats do not count.
        r.heartbeat("n1");
        r.heartbeat("n1");
        assert_eq!(r.len(), 1);
        assert!(r
            .place_and_reserve(vec![candidate("n1")], &thick(8 << 30), &["x".into()])
            .is_err());
        r.created("v-r0");
        r.heartbeat("n2");
        r.heartbeat("n1");
        assert_eq!(r.len(), 1, "the first heartbeat may predate the replica");
        r.heartbeat("n1");
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn release_frees_space_at_once() {
        let r = Reservations::default();
        r.place_and_reserve(vec![candidate("n1")], &thick(8 << 30), &["a".into()])
            .unwrap();
        r.release("a");
        r.place_and_reserve(vec![candidate("n1")], &thick(8 << 30), &["b".into()])
            .unwrap();
        assert_eq!(r.len(), 1);
    }
}
