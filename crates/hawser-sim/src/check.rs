//! The checkers. Each returns a violation as a sentence naming the replica, the sector, what it
//! holds and what the model allows.
//!
//! - `acked`: when the engine acknowledges a write, every replica the store calls in-sync holds
//!   it (or something that raced it): the protocol's safety claim, checked at the moment it is
//!   made. Replicas whose node crashed and that have not reconnected since are exempt: they may
//!   have lost unflushed data with their power, which is why node crashes are only injected
//!   while another copy is in sync (see `world.rs`).
//! - `flushed`: when a flush is acknowledged, the durable layer of every store-in-sync replica
//!   holds every write completed before the flush was submitted.
//! - `marked`: when the store makes a replica in-sync again, it holds every acknowledged write.
//! - `journals_at_crash`: when an engine crashes, the newest journal of the store's in-sync
//!   replicas (the one crash recovery goes by) does not say that a replica this engine
//!   resynced to in sync may lack acknowledged writes (`lost`): the in-sync commit
//!   (docs/protocol.md). Otherwise recovery takes a whole replica for a suspect and may wait
//!   for one it does not need.
//! - `outdated_lacks`: when an engine starts after a crash, every outdated replica holds what
//!   the model allows outside the chunks crash recovery says it lacks (the journals' maps
//!   cover all it lacks; a blank replica's junk is all lacking).
//! - `final_state`: after healing, every replica that did not get a disk error is in sync (in
//!   the engine and the store); every in-sync replica holds exactly what the model allows;
//!   in-sync replicas are byte-identical; nothing is left in flight; resync copied each dirty
//!   chunk at most once per time it was dirtied.

use hawser_core::{Engine, Membership, ReplicaIdx};

use crate::client::Model;
use crate::control::{Control, StoreState};
use crate::pattern::{self, SECTOR};
use crate::replica::Replica;

fn idx(x: u64) -> usize {
    usize::try_from(x).expect("fits")
}

fn sector_of(bytes: &[u8], s: u64) -> &[u8] {
    &bytes[idx(s * SECTOR)..idx((s + 1) * SECTOR)]
}

/// Every sector in `[first, end)` of `bytes` holds a version the model allows.
fn holds(model: &Model, bytes: &[u8], first: u64, end: u64, full: bool) -> Result<(), String> {
    for s in first..end {
        let v = pattern::decode(sector_of(bytes, s), s, full);
        if !v.is_some_and(|v| model.allows(s, v)) {
            return Err(format!(
                "sector {s} holds version {v:?}, the model allows {:?}",
                model.allowed(s)
            ));
        }
    }
    Ok(())
}

fn exempt(volatile_lost: &[bool], r: usize) -> bool {
    volatile_lost[r]
}

/// An engine crashed; `resynced[r]`: replica `r` is in sync because that engine resynced it
/// (and its node has not lost power since).
pub fn journals_at_crash(
    resynced: Vec<bool>,
    replicas: &[Replica],
    control: &Control,
) -> Result<(), String> {
    let newest = replicas
        .iter()
        .enumerate()
        .filter(|(r, _)| control.store[*r] == StoreState::InSync)
        .filter_map(|(_, rep)| rep.journal.as_ref())
        .max_by_key(|j| (j.epoch, j.seq));
    let Some(j) = newest else { return Ok(()) };
    for (r, &whole) in resynced.iter().enumerate() {
        let id = format!("r{r}");
        let named = j.out.iter().find(|o| o.replica == id);
        if whole && named.is_some_and(|o| o.lost) {
            return Err(format!(
                "replica {r} was resynced to in sync, yet the newest journal (epoch {}, seq {}) \
                 says it may lack acknowledged writes",
                j.epoch, j.seq
            ));
        }
    }
    Ok(())
}

/// A new engine starts; `lacks[r]`: the chunks it takes outdated replica `r` to lack (`None`
/// for the others).
pub fn outdated_lacks(
    model: &Model,
    replicas: &[Replica],
    lacks: &[Option<&hawser_core::ChunkMap>],
) -> Result<(), String> {
    for (r, m) in lacks.iter().enumerate() {
        let Some(m) = m else { continue };
        let chunk = m.chunk_bytes();
        let view = replicas[r].disk.view();
        for c in (0..m.chunks()).filter(|&c| !m.is_set(c)) {
            let first = c * chunk / SECTOR;
            let end = ((c + 1) * chunk).min(model.sectors() * SECTOR) / SECTOR;
            holds(model, view, first, end, true).map_err(|e| {
                format!("outdated replica {r} is taken to lack nothing in chunk {c}, but {e}")
            })?;
        }
    }
    Ok(())
}

/// A write (or trim) of `[offset, offset + len)` was acknowledged.
pub fn acked(
    model: &Model,
    control: &Control,
    replicas: &[Replica],
    volatile_lost: &[bool],
    offset: u64,
    len: u64,
) -> Result<(), String> {
    for (r, rep) in replicas.iter().enumerate() {
        if control.store[r] != StoreState::InSync || exempt(volatile_lost, r) {
            continue;
        }
        let (first, end) = (offset / SECTOR, (offset + len) / SECTOR);
        holds(model, rep.disk.view(), first, end, false).map_err(|e| {
            format!(
                "write of bytes {offset}..{} acknowledged while replica {r}, in-sync in the \
                 store, lacks it: {e}",
                offset + len
            )
        })?;
    }
    Ok(())
}

/// A flush submitted at logical time `inv` was acknowledged.
pub fn flushed(
    model: &Model,
    control: &Control,
    replicas: &[Replica],
    volatile_lost: &[bool],
    inv: u64,
) -> Result<(), String> {
    for (r, rep) in replicas.iter().enumerate() {
        if control.store[r] != StoreState::InSync || exempt(volatile_lost, r) {
            continue;
        }
        for s in 0..model.sectors() {
            if !model.settled_before(s, inv) {
                continue;
            }
            holds(model, rep.disk.durable(), s, s + 1, false).map_err(|e| {
                format!(
                    "flush acknowledged while replica {r}, in-sync in the store, has not made \
                     durable a write completed before the flush: {e}"
                )
            })?;
        }
    }
    Ok(())
}

/// Every sector of `rep` holds a version the model allows.
pub fn holds_all(model: &Model, rep: &Replica) -> Result<(), String> {
    holds(model, rep.disk.view(), 0, model.sectors(), false)
}

/// The store just made replica `r` in-sync again.
pub fn marked(model: &Model, rep: &Replica, r: usize) -> Result<(), String> {
    holds(model, rep.disk.view(), 0, model.sectors(), false).map_err(|e| {
        format!("the store made replica {r} in-sync while it lacks an acknowledged write: {e}")
    })
}

/// What the final checks need besides the model.
pub struct FinalView<'a> {
    pub engine: &'a Engine,
    pub control: &'a Control,
    pub replicas: &'a [Replica],
    /// Replicas given a disk error (excluded from "ends in sync").
    pub disk_failed: &'a [bool],
    pub outstanding: usize,
    /// Dirty bytes the engine accumulated per replica (sum of increases).
    pub dirtied: &'a [u64],
}

pub fn final_state(model: &Model, v: &FinalView<'_>) -> Result<(), String> {
    if v.outstanding > 0 {
        return Err(format!(
            "{} client request(s) never completed",
            v.outstanding
        ));
    }
    if v.engine.in_flight() > 0 {
        return Err(format!(
            "the engine still has {} request(s) in flight after healing",
            v.engine.in_flight()
        ));
    }
    let n = v.replicas.len();
    let idxs = (0..n).map(|r| ReplicaIdx(u8::try_from(r).expect("few replicas")));
    let mut reference: Option<usize> = None;
    for (r, ri) in idxs.enumerate() {
        let m = v.engine.membership(ri);
        let store = v.control.store[r];
        if !v.disk_failed[r] && (m != Membership::InSync || store != StoreState::InSync) {
            return Err(format!(
                "replica {r} ended {m:?} in the engine and {store:?} in the store after healing \
                 (expected in sync without manual action)"
            ));
        }
        if m != Membership::InSync {
            continue;
        }
        if store != StoreState::InSync {
            return Err(format!(
                "replica {r} is in sync in the engine, {store:?} in the store"
            ));
        }
        let view = v.replicas[r].disk.view();
        holds(model, view, 0, model.sectors(), true)
            .map_err(|e| format!("in-sync replica {r} after healing: {e}"))?;
        match reference {
            None => reference = Some(r),
            Some(o) => {
                let other = v.replicas[o].disk.view();
                if let Some(s) =
                    (0..model.sectors()).find(|&s| sector_of(view, s) != sector_of(other, s))
                {
                    return Err(format!(
                        "in-sync replicas {o} and {r} differ at sector {s}: versions {:?} and {:?}",
                        pattern::decode(sector_of(other, s), s, true),
                        pattern::decode(sector_of(view, s), s, true),
                    ));
                }
            }
        }
        let copied = v.engine.replica_view(ri).copied_bytes;
        if copied > v.dirtied[r] {
            return Err(format!(
                "resync copied {copied} bytes to replica {r}, more than the {} bytes of chunks \
                 that were ever dirty on it",
                v.dirtied[r]
            ));
        }
    }
    if reference.is_none() {
        return Err("no replica is in sync after healing".into());
    }
    Ok(())
}
