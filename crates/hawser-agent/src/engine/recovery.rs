//! Crash recovery, run by a starting engine before it serves any I/O.
//!
//! The previous engine may have died mid-write (its node crashed, or every process did), so
//! the in-sync replicas may differ wherever it had requests in flight or unflushed. Those
//! places are in the activity logs of the journals it left (see `hawser_wire::journal` and
//! `hawser_core::activity`). Recovery reads the journal of every reachable in-sync replica and makes them
//! equal over the union of their logs (and over the dirty maps of any of them that a journal
//! says was out), by comparing digests and copying the blocks that differ, each chunk from
//! the replica `hawser_core::driver::recovery` chose for it: one that cannot lack an
//! acknowledged write there (only a power loss takes one from an in-sync replica), so the
//! other values in those ranges were never acknowledged and any sure one is correct.
//!
//! It also works out what the replicas it could not reconcile lack:
//! - an unreachable in-sync replica: everything reconciled, plus what any journal says it
//!   lacked (`suspect_for`);
//! - an outdated replica: what the newest journal says it lacks, plus everything reconciled
//!   (writes it missed since that journal are in that journal's log), or everything when the
//!   newest journal does not know.
//!
//! In both cases, when the replica comes back what its own older journal says is added too
//! (done by the driver at reconnect, `recovery_plan::returning_lacks`): its log (writes only
//! it received), its own map, and what it said replicas that may be the reference lacked.

use bytes::Bytes;
use hawser_wire::frame::{CHECKSUM_DIGEST_BYTES, MAX_CHECKSUM_BYTES};

pub use hawser_core::recovery_plan::Plan;

use crate::replica::access::{Access, AccessError};

/// Totals of one reconciliation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reconciled {
    pub compared_bytes: u64,
    pub copied_bytes: u64,
}

/// Make `reach` equal over `plan.reconcile`, each chunk copied from `reach[source_of(chunk)]`
/// (crash recovery's per-chunk choice, `hawser_core::driver::recovery`), then flush them all.
pub async fn reconcile(
    epoch: u64,
    reach: &[Access],
    plan: &Plan,
    source_of: &(dyn Fn(u64) -> usize + Sync),
) -> Result<Reconciled, AccessError> {
    let mut total = Reconciled::default();
    let chunk = plan.chunk_bytes;
    let piece_chunks = (u64::from(MAX_CHECKSUM_BYTES) / chunk).max(1);
    // With one replica there is nothing to compare, only the flush below.
    let mut from = if reach.len() < 2 { u64::MAX } else { 0 };
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
            let boff = offset + b * block;
            let src = source_of(boff / chunk).min(reach.len() - 1);
            let differs: Vec<usize> = (0..reach.len())
                .filter(|&i| i != src && digests[i].get(at.clone()) != digests[src].get(at.clone()))
                .collect();
            if differs.is_empty() {
                continue;
            }
            let blen = block.min(offset + len - boff);
            let blen32 = u32::try_from(blen).expect("one block");
            let data = reach[src].read(epoch, boff, blen32).await?;
            for i in differs {
                reach[i].write(epoch, boff, data.clone()).await?;
                total.copied_bytes += blen;
            }
        }
    }
    // Every replica is flushed, written to or not: the dead engine's acknowledged writes may
    // still be unflushed on any of them (inside its log, which this engine does not carry
    // over), and a power loss after this engine starts would lose them unnoticed: the replica
    // would later be resynced only over what this engine wrote. Found by the simulator.
    for a in reach {
        a.flush(epoch).await?;
    }
    Ok(total)
}
