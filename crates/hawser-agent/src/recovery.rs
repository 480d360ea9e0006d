//! Crash recovery, run by a starting engine before it serves any I/O.
//!
//! The previous engine may have died mid-write (its node crashed, or every process did), so
//! the in-sync replicas may differ wherever it had requests in flight or unflushed. Those
//! places are in the activity logs of the journals it left (see `hawser_wire::journal` and
//! `activity.rs`). Recovery reads the journal of every reachable in-sync replica and makes them
//! equal over the union of their logs (and over the dirty maps of any of them that a journal
//! says was out), by comparing digests and copying the blocks that differ from one source.
//! Any in-sync replica may be the source: each holds every acknowledged write, and the others
//! in those ranges were never acknowledged, so any one value is correct.
//!
//! It also works out what the replicas it could not reconcile lack:
//! - an unreachable in-sync replica: everything reconciled, plus what any journal says it
//!   lacked (`suspect_for`);
//! - an outdated replica: what the newest journal says it lacks, plus everything reconciled
//!   (writes it missed since that journal are in that journal's log), or everything when the
//!   newest journal does not know.
//!
//! In both cases, when the replica comes back its own journal's log is added too (done by the
//! driver at reconnect): writes only it received are in its own log.

use bytes::Bytes;
use hawser_core::ChunkMap;
use hawser_wire::frame::{CHECKSUM_DIGEST_BYTES, MAX_CHECKSUM_BYTES};
use hawser_wire::journal::{Journal, Runs};

use crate::replica_access::{Access, AccessError};

/// What the journals of the reachable in-sync replicas say.
pub struct Plan {
    size: u64,
    chunk_bytes: u64,
    /// Journals of the reachable in-sync replicas (`None`: missing or unreadable).
    journals: Vec<Option<Journal>>,
    /// Chunks the reachable in-sync replicas may disagree on.
    pub reconcile: ChunkMap,
    /// First journal sequence number for the new engine.
    pub next_seq: u64,
}

/// Chunks (in `chunk_bytes` units over `size`) covering `runs` of `unit`-byte items.
fn runs_to_chunks(runs: &Runs, unit: u64, size: u64, map: &mut ChunkMap) {
    for &(first, end) in runs {
        let from = first.saturating_mul(unit).min(size);
        let to = end.saturating_mul(unit).min(size);
        if to > from {
            map.set_bytes(from, to - from);
        }
    }
}

/// The log (active extents) of `j` as chunks.
pub fn log_chunks(j: &Journal, size: u64, chunk_bytes: u64) -> ChunkMap {
    let mut m = ChunkMap::new(size, chunk_bytes);
    runs_to_chunks(&j.active, j.extent_bytes, size, &mut m);
    m
}

impl Plan {
    pub fn new(
        epoch: u64,
        size: u64,
        chunk_bytes: u64,
        journals: Vec<Option<Journal>>,
        reach_ids: &[&str],
    ) -> Plan {
        let mut reconcile = ChunkMap::new(size, chunk_bytes);
        let mut unknown = false;
        for j in &journals {
            let Some(j) = j else {
                unknown = true;
                continue;
            };
            reconcile.union(&log_chunks(j, size, chunk_bytes));
            for o in j
                .out
                .iter()
                .filter(|o| reach_ids.contains(&o.replica.as_str()))
            {
                match &o.dirty {
                    Some(runs) => runs_to_chunks(runs, j.chunk_bytes, size, &mut reconcile),
                    None => unknown = true,
                }
            }
        }
        if unknown {
            reconcile = ChunkMap::full(size, chunk_bytes);
        }
        let next_seq = journals
            .iter()
            .flatten()
            .filter(|j| j.epoch == epoch)
            .map(|j| j.seq + 1)
            .max()
            .unwrap_or(1);
        Plan {
            size,
            chunk_bytes,
            journals,
            reconcile,
            next_seq,
        }
    }

    /// What an in-sync replica that could not be reached may lack.
    pub fn suspect_for(&self, replica: &str) -> ChunkMap {
        let mut m = self.reconcile.clone();
        for j in self.journals.iter().flatten() {
            for o in j.out.iter().filter(|o| o.replica == replica) {
                match &o.dirty {
                    Some(runs) => runs_to_chunks(runs, j.chunk_bytes, self.size, &mut m),
                    None => return ChunkMap::full(self.size, self.chunk_bytes),
                }
            }
        }
        m
    }

    /// What an outdated replica lacks; `None` when unknown (copy it all).
    pub fn outdated_dirty(&self, replica: &str) -> Option<ChunkMap> {
        if self.journals.iter().any(Option::is_none) {
            return None;
        }
        let newest = self
            .journals
            .iter()
            .flatten()
            .max_by_key(|j| (j.epoch, j.seq))?;
        if newest
            .out
            .iter()
            .any(|o| o.replica == replica && o.dirty.is_none())
        {
            return None;
        }
        Some(self.suspect_for(replica))
    }
}

/// Totals of one reconciliation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reconciled {
    pub compared_bytes: u64,
    pub copied_bytes: u64,
}

/// Make `reach` (source first) equal over `plan.reconcile`, then flush the ones written to.
pub async fn reconcile(
    epoch: u64,
    reach: &[Access],
    plan: &Plan,
) -> Result<Reconciled, AccessError> {
    let mut total = Reconciled::default();
    if reach.len() < 2 {
        return Ok(total);
    }
    let chunk = plan.chunk_bytes;
    let piece_chunks = (u64::from(MAX_CHECKSUM_BYTES) / chunk).max(1);
    let mut written = vec![false; reach.len()];
    let mut from = 0;
    // next_run wraps around: a run starting before `from` means the map is done.
    while let Some((first, end)) = plan
        .reconcile
        .next_run(from, piece_chunks)
        .filter(|&(first, _)| first >= from)
    {
        from = end;
        let offset = first * chunk;
        let len = (end * chunk).min(plan.size) - offset;
        let len32 = u32::try_from(len).expect("a piece is at most MAX_CHECKSUM_BYTES");
        let mut tasks = tokio::task::JoinSet::new();
        for (i, a) in reach.iter().enumerate() {
            let a = a.clone();
            tasks.spawn(async move { (i, a.checksum(epoch, offset, len32).await) });
        }
        let mut digests: Vec<Bytes> = vec![Bytes::new(); reach.len()];
        while let Some(done) = tasks.join_next().await {
            // A task that did not finish (runtime shutting down) fails the recovery, which
            // fails the engine's start: nothing is served from unreconciled replicas.
            let (i, d) = done.map_err(|e| AccessError::Failed {
                replica: reach[0].id().to_owned(),
                op: "checksum",
                detail: format!("checksum task ended: {e}"),
            })?;
            digests[i] = d?;
        }
        total.compared_bytes += len;
        let block = hawser_wire::frame::CHECKSUM_BLOCK_BYTES;
        for b in 0..len.div_ceil(block) {
            let d = usize::try_from(b).expect("at most 64 blocks per piece");
            let at = d * CHECKSUM_DIGEST_BYTES..(d + 1) * CHECKSUM_DIGEST_BYTES;
            let differs: Vec<usize> = (1..reach.len())
                .filter(|&i| digests[i].get(at.clone()) != digests[0].get(at.clone()))
                .collect();
            if differs.is_empty() {
                continue;
            }
            let boff = offset + b * block;
            let blen = block.min(offset + len - boff);
            let blen32 = u32::try_from(blen).expect("one block");
            let data = reach[0].read(epoch, boff, blen32).await?;
            for i in differs {
                reach[i].write(epoch, boff, data.clone()).await?;
                written[i] = true;
                total.copied_bytes += blen;
            }
        }
    }
    for (i, a) in reach.iter().enumerate() {
        if written[i] {
            a.flush(epoch).await?;
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hawser_wire::journal::{OutReplica, ACTIVITY_EXTENT_BYTES};

    const MIB: u64 = 1 << 20;
    const CHUNK: u64 = 64 << 10;
    const SIZE: u64 = 64 * MIB;

    fn j(epoch: u64, seq: u64, active: Runs, out: Vec<OutReplica>) -> Option<Journal> {
        Some(Journal {
            epoch,
            seq,
            size: SIZE,
            extent_bytes: ACTIVITY_EXTENT_BYTES,
            chunk_bytes: CHUNK,
            active,
            out,
        })
    }

    fn out(id: &str, dirty: Option<Runs>) -> OutReplica {
        OutReplica {
            replica: id.into(),
            dirty,
        }
    }

    #[test]
    fn reconciles_the_union_of_logs_and_of_reachable_replicas_said_out() {
        let p = Plan::new(
            5,
            SIZE,
            CHUNK,
            vec![
                j(4, 9, vec![(0, 1)], vec![out("b", Some(vec![(1000, 1001)]))]),
                j(4, 8, vec![(3, 4)], vec![]),
            ],
            &["a", "b"],
        );
        // Extent 0 and 3 (64 chunks each) and chunk 1000 (b was out and is reachable).
        assert_eq!(p.reconcile.count(), 64 + 64 + 1);
        assert!(p.reconcile.is_set(1000));
        assert_eq!(p.next_seq, 1, "journals of older epochs do not count");
        let p = Plan::new(4, SIZE, CHUNK, vec![j(4, 9, vec![], vec![])], &["a"]);
        assert_eq!(
            p.next_seq, 10,
            "a restart in the same epoch continues the sequence"
        );
    }

    #[test]
    fn missing_journal_means_everything() {
        let p = Plan::new(
            5,
            SIZE,
            CHUNK,
            vec![j(4, 1, vec![], vec![]), None],
            &["a", "b"],
        );
        assert_eq!(p.reconcile.count(), SIZE / CHUNK);
        assert_eq!(p.outdated_dirty("c"), None);
    }

    #[test]
    fn outdated_replicas_lack_what_the_newest_journal_says_plus_the_logs() {
        let p = Plan::new(
            5,
            SIZE,
            CHUNK,
            vec![j(
                4,
                9,
                vec![(1, 2)],
                vec![out("c", Some(vec![(0, 2)])), out("d", None)],
            )],
            &["a"],
        );
        let c = p.outdated_dirty("c").unwrap();
        assert_eq!(c.count(), 2 + 64);
        assert_eq!(p.outdated_dirty("d"), None);
        // Not in the newest journal: it went out after it, so only the log matters.
        assert_eq!(p.outdated_dirty("e").unwrap().count(), 64);
        // Unreachable in-sync replica: the log plus what it was said to lack.
        assert_eq!(p.suspect_for("c").count(), 66);
        assert_eq!(p.suspect_for("d").count(), SIZE / CHUNK);
    }
}
