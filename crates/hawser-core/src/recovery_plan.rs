//! The pure half of crash recovery (the agent's `recovery.rs` does the I/O): what the journals
//! of the reachable in-sync replicas say must be reconciled, and what the replicas that could not
//! be reconciled lack. The reasoning is in `hawser-agent/src/engine/recovery.rs` and docs/protocol.md;
//! it lives here so the simulator runs the same rules as the agent.

use hawser_wire::journal::{Journal, OutReplica, Runs};

use crate::{ChunkMap, Engine, Membership, ReplicaIdx};

/// What a replica returning with `j`, its own journal from an earlier engine, may differ on
/// from the replicas that are or may become the reference (`in_sync`, by id: see
/// `Engine::may_be_reference`): the log of that engine (writes only it may have got), what
/// that journal says it lacks itself, and what that engine recorded as lacking on any of
/// `in_sync` (it may hold writes they lack: an engine that made it the reference after they
/// were lost, then died before they came back). `None`: anything (such an entry was unknown).
pub fn returning_lacks(
    j: &Journal,
    me: &str,
    in_sync: &[&str],
    size: u64,
    chunk_bytes: u64,
) -> Option<ChunkMap> {
    let mut m = log_chunks(j, size, chunk_bytes);
    for o in j
        .out
        .iter()
        .filter(|o| o.replica == me || in_sync.contains(&o.replica.as_str()))
    {
        match &o.dirty {
            Some(runs) => runs_to_chunks(runs, j.chunk_bytes, size, &mut m),
            None => return None,
        }
    }
    Some(m)
}

/// Whether `j` says replica `me` may lack acknowledged writes (`OutReplica::lost`): its node
/// lost power and no resync has copied back what it lost since.
pub fn said_lost(j: &Journal, me: &str) -> bool {
    j.out.iter().any(|o| o.replica == me && o.lost)
}

/// A journal's entry for replica `r` at a commit, from its entry at the last one (`prev`;
/// `None`: no entry, `Some(None)`: unknown). In sync: only what it may not have made durable
/// since it last left (until a flush reaches it), or no entry. Failed: unknown. Otherwise the
/// previous map, which only grows while it is out (`restart` replaces it first: a resync
/// save whose copies are durable), plus its dirty chunks and what it may not have made
/// durable. An unknown map stays unknown until a resync point replaces it.
pub fn out_entry(
    e: &Engine,
    r: ReplicaIdx,
    prev: Option<Option<ChunkMap>>,
    restart: Option<&ChunkMap>,
) -> Option<Option<ChunkMap>> {
    match e.membership(r) {
        Membership::InSync => {
            let unflushed = e.unflushed_at_loss(r);
            (!unflushed.is_empty()).then_some(Some(unflushed))
        }
        Membership::Failed => Some(None),
        _ => {
            let fresh = || ChunkMap::new(e.size(), e.config().chunk_bytes);
            // A holding resync point bounds everything it may lack (the engine was told all
            // of it, an unknown map as everything), so it replaces even an unknown map.
            let mut m = match (prev, restart) {
                (_, Some(restart)) => restart.clone(),
                (Some(None), None) => return Some(None),
                (Some(Some(m)), None) => m,
                (None, None) => fresh(),
            };
            m.union(e.dirty(r));
            m.union(&e.unflushed_at_loss(r));
            Some(Some(m))
        }
    }
}

/// Record in `j` that `replica` lacks `lacks` too (`None`: anything; `lost`: acknowledged
/// writes may be among them). Used when a replica returns: the log of its own older journal
/// says where it may differ, and that journal is about to be overwritten by the current one,
/// so the current one must carry it, or a crash before the next commit forgets it (found by
/// the simulator).
pub fn add_out(j: &mut Journal, replica: &str, lacks: Option<&ChunkMap>, lost: bool) {
    let (size, chunk) = (j.size, j.chunk_bytes);
    let old = j.out.iter().find(|o| o.replica == replica);
    let was_lost = old.is_some_and(|o| o.lost);
    let had = old.map(|o| o.dirty.clone());
    let merged = match (had, lacks) {
        (Some(None), _) | (_, None) => None,
        (Some(Some(runs)), Some(m)) => {
            let mut x = ChunkMap::new(size, chunk);
            runs_to_chunks(&runs, chunk, size, &mut x);
            x.union(m);
            Some(x.runs())
        }
        (None, Some(m)) => Some(m.runs()),
    };
    j.out.retain(|o| o.replica != replica);
    j.out.push(OutReplica {
        replica: replica.to_owned(),
        lost: lost || was_lost || merged.is_none(),
        dirty: merged,
    });
    j.out.sort_by(|a, b| a.replica.cmp(&b.replica));
}

/// Whether replica `me` is whole by its own newest journal `j`: it holds every write
/// acknowledged before that journal, unless its node rebooted since (`rebooted`: writes it
/// had not flushed may be gone) or the journal names it as lacking something (it was being
/// resynced, e.g. after such a reboot, or had been out). A replica without a journal is not.
pub fn is_whole(j: Option<&Journal>, me: &str, rebooted: bool) -> bool {
    let Some(j) = j else { return false };
    let lacks = |o: &OutReplica| o.replica == me && o.dirty.as_ref().is_none_or(|d| !d.is_empty());
    !rebooted && !j.out.iter().any(lacks)
}

/// The chunks in-sync replica `me` may lack acknowledged writes in, by its own newest journal
/// `j` (`None`: anything, it has no journal or the journal does not know). An in-sync replica
/// misses an acknowledged write only to a power loss (every other write it missed was held
/// up until it was resynced or outdated). So: the chunks that journal names it as lacking if
/// it says `lost` (its node lost power before, and no resync has copied them back), and when
/// its node `rebooted` since the journal, those chunks (resync copies not yet flushed are
/// inside them: a save shrinks the map only after a flush) and the journal's log (a write
/// reaches a replica only inside the log of a journal it holds, and its extent leaves the
/// log only after a flush made it durable there).
pub fn own_suspect(
    j: Option<&Journal>,
    me: &str,
    rebooted: bool,
    size: u64,
    chunk_bytes: u64,
) -> Option<ChunkMap> {
    let j = j?;
    let mut m = ChunkMap::new(size, chunk_bytes);
    for o in j
        .out
        .iter()
        .filter(|o| o.replica == me && (o.lost || rebooted))
    {
        match &o.dirty {
            Some(runs) => runs_to_chunks(runs, j.chunk_bytes, size, &mut m),
            None => return None,
        }
    }
    if rebooted {
        m.union(&log_chunks(j, size, chunk_bytes));
    }
    Some(m)
}

/// The order in which crash recovery takes the reachable in-sync replicas, source first
/// (indices into the two slices). A whole replica (`is_whole`) comes before one that is not:
/// the source's blocks are what every other replica gets inside the logs, and one that lost
/// unflushed writes to a reboot, or is still being resynced, would overwrite the
/// acknowledged writes the others hold. Among equals the local replica comes first (its
/// reads are the cheapest), then the given order.
pub fn source_order(whole: &[bool], local: &[bool]) -> Vec<usize> {
    assert_eq!(whole.len(), local.len());
    let mut order: Vec<usize> = (0..whole.len()).collect();
    // Stable: equal keys keep the given order.
    order.sort_by_key(|&i| (!whole[i], !local[i]));
    order
}

/// What the journals of the reachable in-sync replicas say.
pub struct Plan {
    pub size: u64,
    pub chunk_bytes: u64,
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

    /// Whether any journal says `replica` may lack acknowledged writes (`said_lost`).
    pub fn lost_for(&self, replica: &str) -> bool {
        self.journals
            .iter()
            .flatten()
            .any(|j| said_lost(j, replica))
    }

    /// What a blank replica (one being built from nothing) still lacks: the map the newest
    /// journal gives it plus what the logs cover (`outdated_dirty`). A newest journal that does
    /// not name it (one from before its build started; replica ids are never reused) or names
    /// it as unknown knows nothing of it: `None`, copy it all. A build's journals name it with
    /// everything at first, and the map shrinks only by durable resync saves, so it is safe to
    /// trust; without this rule a build started over after every engine restart.
    pub fn blank_dirty(&self, replica: &str) -> Option<ChunkMap> {
        let newest = self
            .journals
            .iter()
            .flatten()
            .max_by_key(|j| (j.epoch, j.seq))?;
        let named = newest
            .out
            .iter()
            .any(|o| o.replica == replica && o.dirty.is_some());
        if !named {
            return None;
        }
        self.outdated_dirty(replica)
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
            lost: dirty.is_none(),
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
    fn a_returning_replicas_own_log_is_added_to_the_journal_it_is_given() {
        let mut jj = j(4, 9, vec![], vec![out("b", Some(vec![(0, 2)]))]).unwrap();
        let mut m = ChunkMap::new(SIZE, CHUNK);
        m.set_chunks(10, 12);
        add_out(&mut jj, "b", Some(&m), false);
        add_out(&mut jj, "a", Some(&m), false);
        assert_eq!(jj.out[0], out("a", Some(vec![(10, 12)])));
        assert_eq!(jj.out[1], out("b", Some(vec![(0, 2), (10, 12)])));
        add_out(&mut jj, "b", None, false);
        assert_eq!(jj.out[1], out("b", None), "unknown stays unknown");
        add_out(&mut jj, "b", Some(&m), false);
        assert_eq!(jj.out[1], out("b", None));
    }

    #[test]
    fn a_returning_replica_lacks_its_log_and_what_it_said_the_in_sync_ones_lacked() {
        let jj = j(
            4,
            9,
            vec![(1, 2)],
            vec![out("b", Some(vec![(0, 2)])), out("c", None), out("a", None)],
        )
        .unwrap();
        let m = returning_lacks(&jj, "d", &["b"], SIZE, CHUNK).unwrap();
        assert_eq!(m.runs(), vec![(0, 2), (64, 128)]);
        assert!(returning_lacks(&jj, "d", &["b", "c"], SIZE, CHUNK).is_none());
        assert!(
            returning_lacks(&jj, "a", &["b"], SIZE, CHUNK).is_none(),
            "its own entry counts: unknown"
        );
    }

    #[test]
    fn a_journal_entry_grows_while_out_restarts_only_when_told_and_unknown_stays_unknown() {
        use crate::{EngineConfig, Initial, ReplicaSpec};
        let cfg = EngineConfig {
            chunk_bytes: CHUNK,
            ..EngineConfig::default()
        };
        let chunks = |v: &[u64]| {
            let mut m = ChunkMap::new(SIZE, CHUNK);
            for &c in v {
                m.set_chunks(c, c + 1);
            }
            m
        };
        let spec = |initial| ReplicaSpec {
            local: false,
            initial,
        };
        let e = Engine::with_config(
            SIZE,
            &[
                spec(Initial::InSync),
                spec(Initial::Outdated {
                    dirty: Some(chunks(&[3])),
                }),
                spec(Initial::Failed),
            ],
            cfg,
        );
        let (r0, r1, r2) = (ReplicaIdx(0), ReplicaIdx(1), ReplicaIdx(2));
        assert_eq!(out_entry(&e, r0, Some(Some(chunks(&[1]))), None), None);
        assert_eq!(out_entry(&e, r2, None, None), Some(None));
        assert_eq!(out_entry(&e, r1, None, None), Some(Some(chunks(&[3]))));
        assert_eq!(
            out_entry(&e, r1, Some(Some(chunks(&[5]))), None),
            Some(Some(chunks(&[3, 5]))),
            "grows while out"
        );
        assert_eq!(
            out_entry(&e, r1, Some(Some(chunks(&[5]))), Some(&chunks(&[7]))),
            Some(Some(chunks(&[3, 7]))),
            "a restart replaces what it had"
        );
        assert_eq!(out_entry(&e, r1, Some(None), None), Some(None));
    }

    #[test]
    fn only_power_loss_makes_an_in_sync_replica_suspect() {
        let named = |lost| OutReplica {
            replica: "a".into(),
            dirty: Some(vec![(100, 101)]),
            lost,
        };
        let jj = |lost| j(4, 9, vec![(0, 1)], vec![named(lost)]).unwrap();
        let suspect = |lost, rebooted| own_suspect(Some(&jj(lost)), "a", rebooted, SIZE, CHUNK);
        // Named lacking only writes it held up (never acknowledged): sure to hold the rest.
        assert_eq!(suspect(false, false).unwrap().count(), 0);
        // Its node lost power once and the resync had not copied chunk 100 back.
        assert_eq!(suspect(true, false).unwrap().runs(), [(100, 101)]);
        // Rebooted since the journal: the log (extent 0: 64 chunks) and what it is named with.
        assert_eq!(suspect(false, true).unwrap().runs(), [(0, 64), (100, 101)]);
        assert!(own_suspect(None, "a", false, SIZE, CHUNK).is_none());
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

    #[test]
    fn a_blank_replica_lacks_what_the_newest_journal_names_else_everything() {
        let p = Plan::new(
            5,
            SIZE,
            CHUNK,
            vec![
                j(
                    4,
                    9,
                    vec![(1, 2)],
                    vec![out("c", Some(vec![(0, 2)])), out("d", None)],
                ),
                // An older journal (a replica that missed the last commit) adds what it says.
                j(4, 8, vec![], vec![out("c", Some(vec![(500, 501)]))]),
            ],
            &["a", "b"],
        );
        // Named with a map: its build saved progress; the rest of the log is added.
        assert_eq!(p.blank_dirty("c").unwrap().count(), 2 + 1 + 64);
        // Named as unknown (no save yet), or not named (a journal from before its build,
        // where an outdated replica would lack only the log): everything.
        assert_eq!(p.blank_dirty("d"), None);
        assert_eq!(p.blank_dirty("e"), None);
        assert_eq!(p.outdated_dirty("e").unwrap().count(), 64);
        // An unreadable journal: everything.
        let p = Plan::new(
            5,
            SIZE,
            CHUNK,
            vec![j(4, 9, vec![], vec![out("c", Some(vec![]))]), None],
            &["a", "b"],
        );
        assert_eq!(p.blank_dirty("c"), None);
    }

    #[test]
    fn a_whole_replica_is_the_source_before_the_local_one() {
        assert_eq!(source_order(&[], &[]), Vec::<usize>::new());
        assert_eq!(source_order(&[true, true], &[false, true]), [1, 0]);
        assert_eq!(source_order(&[false, true], &[true, false]), [1, 0]);
        assert_eq!(
            source_order(&[false, true, true, false], &[false, false, false, true]),
            [1, 2, 3, 0]
        );
        assert_eq!(source_order(&[false, false], &[false, true]), [1, 0]);
    }

    #[test]
    fn a_replica_is_whole_unless_rebooted_or_named_as_lacking() {
        let mut j = j(
            1,
            1,
            vec![],
            vec![out("b", Some(vec![(0, 1)])), out("c", Some(vec![]))],
        )
        .unwrap();
        assert!(is_whole(Some(&j), "a", false));
        assert!(!is_whole(Some(&j), "a", true), "rebooted since");
        assert!(!is_whole(Some(&j), "b", false), "being resynced");
        assert!(is_whole(Some(&j), "c", false), "an empty map lacks nothing");
        j.out[1].dirty = None;
        assert!(
            !is_whole(Some(&j), "c", false),
            "an unknown map may lack anything"
        );
        assert!(
            !is_whole(None, "a", false),
            "no journal vouches for nothing"
        );
    }
}
