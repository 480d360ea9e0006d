//! Crash recovery's decision, made once for the agent and the simulator: given what an attach
//! found of each replica (the store's state, and for the in-sync ones a journal, an
//! unreachable node or a disk error), whether the new engine may start, from which source,
//! with which initial replica states, or why it must not.
//!
//! The rules (docs/protocol.md, "Crash recovery"):
//! - No reachable in-sync replica: refuse (nothing holds the acknowledged writes).
//! - The source is chosen per chunk: each chunk to reconcile is taken from a replica that
//!   cannot lack it (`own_suspect`: not named as lacking it by its own newest journal, and not
//!   in that journal's log if its node rebooted since), whole replicas first, the local one
//!   first among equals (`source_order`).
//! - A chunk no reachable replica is sure to hold while an in-sync one is unreachable: refuse,
//!   naming the ones waited for; they may hold writes every reachable one lost, and copying
//!   over them later would lose those writes for good.
//! - Such a chunk with none unreachable (every node rebooted): start, and say so; the writes
//!   none of them had flushed are gone whatever we do.
//! - A replica whose journal read failed on its disk is failed, not waited for.
//!
//! The caller does the I/O: reconcile the sources over `Start::plan.reconcile`, each chunk
//! from `Start::source_of` it, flush them, build the engine with [`Start::engine`], and report
//! the unreachable and broken replicas to it.

use hawser_wire::journal::Journal;

use crate::recovery_plan::{own_suspect, source_order};
use crate::{ChunkMap, Engine, EngineConfig, Initial, Plan, ReplicaIdx, ReplicaSpec};

/// A replica as the cluster store records it for the attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    InSync,
    /// Out of sync; `blank`: being built from nothing (a new replica).
    Outdated {
        blank: bool,
    },
    Failed,
}

/// What the attach found of an in-sync replica.
#[derive(Clone, Debug)]
pub enum Found {
    /// Its journal was read (`None`: it has none). `rebooted`: its node rebooted since the
    /// journal was written, so writes it had not flushed may be gone.
    Journal {
        journal: Option<Journal>,
        rebooted: bool,
    },
    /// No session: its node or the network is down.
    Unreachable,
    /// Its disk failed the journal read.
    DiskError,
    /// Not an in-sync replica: nothing was asked of it.
    NotAsked,
}

/// One replica of the volume, in the store's order.
#[derive(Clone, Debug)]
pub struct Member {
    pub id: String,
    /// On the engine's node.
    pub local: bool,
    pub stored: Stored,
    pub found: Found,
}

/// Why the engine must not start.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no in-sync replica is reachable; attach again when one is back")]
    NoneReachable,
    #[error(
        "no reachable in-sync replica is known to hold every acknowledged write (their nodes \
         rebooted since their last journal, or they were being resynced); in-sync replica(s) \
         {} may hold them but cannot be reached. Attach again when one is back, or once it is \
         no longer in sync (self-healing replaces the replicas of a node offline for long on a \
         detached volume)",
        .waiting_for.join(", ")
    )]
    WaitFor { waiting_for: Vec<String> },
}

/// How the engine starts.
pub struct Start {
    /// The reachable in-sync replicas (indices into the members), in the order of preference
    /// as a source (whole ones first, then the local one).
    pub sources: Vec<usize>,
    /// Per entry of `sources`, the chunks of `plan.reconcile` copied from it.
    pub source_chunks: Vec<ChunkMap>,
    /// Some chunk has no source known to hold every acknowledged write there (every node
    /// rebooted): the writes none of them had flushed are lost. Worth a warning.
    pub source_not_whole: bool,
    /// What the journals say: the chunks to reconcile, what the others lack, the next
    /// journal sequence number.
    pub plan: Plan,
    /// In-sync replicas without a session: lost to the new engine at once.
    pub unreachable: Vec<ReplicaIdx>,
    /// In-sync replicas whose disk failed: failed at once.
    pub broken: Vec<ReplicaIdx>,
    specs: Vec<ReplicaSpec>,
    /// Unreachable in-sync replicas: what they may lack, and whether a journal said they may
    /// lack acknowledged writes.
    suspects: Vec<(ReplicaIdx, crate::ChunkMap, bool)>,
}

/// The decision.
pub enum Decision {
    Start(Box<Start>),
    Refuse(Refusal),
}

fn idx(i: usize) -> ReplicaIdx {
    ReplicaIdx(u8::try_from(i).unwrap_or(u8::MAX))
}

/// The rules of the decision, each of which can be switched off: only the simulator's
/// mutation tests do, to show that a seed fails without it (`hawser-sim/tests/mutations.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Each chunk from a replica that cannot lack it; off: every chunk from the first
    /// reachable replica, local first.
    pub source_choice: bool,
    /// A replica whose journal says it lost power (`OutReplica::lost`) is suspect on what it
    /// is named with; off: only a reboot since its journal makes it suspect.
    pub power_loss_suspect: bool,
    /// Wait for an unreachable in-sync replica when some chunk has no sure source; off: start.
    pub refusal: bool,
    /// A blank replica trusts only a journal that names it; off: it is an outdated replica
    /// like any other (lacking only the logs when no journal names it).
    pub blank_needs_naming_journal: bool,
}

impl Rules {
    pub const ALL: Rules = Rules {
        source_choice: true,
        power_loss_suspect: true,
        refusal: true,
        blank_needs_naming_journal: true,
    };
}

/// Decides how the engine of epoch `epoch` starts over `members` (see the module doc).
pub fn decide(epoch: u64, size: u64, chunk_bytes: u64, members: &[Member]) -> Decision {
    decide_with(Rules::ALL, epoch, size, chunk_bytes, members)
}

/// [`decide`] under `rules`.
pub fn decide_with(
    rules: Rules,
    epoch: u64,
    size: u64,
    chunk_bytes: u64,
    members: &[Member],
) -> Decision {
    let (mut reach, mut journals, mut whole, mut local) = (vec![], vec![], vec![], vec![]);
    let mut suspects = vec![];
    let (mut unreachable, mut broken) = (vec![], vec![]);
    for (i, m) in members.iter().enumerate() {
        if m.stored != Stored::InSync {
            continue;
        }
        match &m.found {
            Found::Journal { journal, rebooted } => {
                let suspect = match (rules.source_choice, rules.power_loss_suspect) {
                    (false, _) => Some(ChunkMap::new(size, chunk_bytes)),
                    (true, true) => {
                        own_suspect(journal.as_ref(), &m.id, *rebooted, size, chunk_bytes)
                    }
                    (true, false) => journal.as_ref().map_or_else(
                        || own_suspect(None, &m.id, *rebooted, size, chunk_bytes),
                        |j| {
                            let mut j = j.clone();
                            j.out.iter_mut().for_each(|o| o.lost &= o.dirty.is_none());
                            own_suspect(Some(&j), &m.id, *rebooted, size, chunk_bytes)
                        },
                    ),
                };
                whole.push(suspect.as_ref().is_some_and(ChunkMap::is_empty));
                suspects.push(suspect);
                journals.push(journal.clone());
                local.push(m.local);
                reach.push(i);
            }
            Found::Unreachable | Found::NotAsked => unreachable.push(i),
            Found::DiskError => broken.push(i),
        }
    }
    if reach.is_empty() {
        return Decision::Refuse(Refusal::NoneReachable);
    }
    let order = source_order(&whole, &local);
    let sources: Vec<usize> = order.iter().map(|&k| reach[k]).collect();
    let journals: Vec<Option<Journal>> = order.iter().map(|&k| journals[k].clone()).collect();
    let ids: Vec<&str> = sources.iter().map(|&i| members[i].id.as_str()).collect();
    let plan = Plan::new(epoch, size, chunk_bytes, journals, &ids);
    // Each chunk from the first replica in that order that cannot lack it.
    let mut left = plan.reconcile.clone();
    let mut source_chunks = Vec::with_capacity(order.len());
    for &k in &order {
        let mut take = left.clone();
        match &suspects[k] {
            Some(suspect) => take.subtract(suspect),
            None => take = ChunkMap::new(size, chunk_bytes),
        }
        left.subtract(&take);
        source_chunks.push(take);
    }
    let source_not_whole = !left.is_empty();
    if source_not_whole && !unreachable.is_empty() && rules.refusal {
        let waiting_for = unreachable.iter().map(|&i| members[i].id.clone()).collect();
        return Decision::Refuse(Refusal::WaitFor { waiting_for });
    }
    // No replica is sure to hold these: the first one gives them.
    source_chunks[0].union(&left);
    let specs = members
        .iter()
        .map(|m| ReplicaSpec {
            local: m.local,
            initial: match m.stored {
                Stored::InSync => Initial::InSync,
                // A blank replica lacks everything unless the journal of its build says what
                // is left (a rebuild resumes after an engine restart).
                Stored::Outdated { blank: true } if rules.blank_needs_naming_journal => {
                    Initial::Outdated {
                        dirty: plan.blank_dirty(&m.id),
                    }
                }
                Stored::Outdated { .. } => Initial::Outdated {
                    dirty: plan.outdated_dirty(&m.id),
                },
                Stored::Failed => Initial::Failed,
            },
        })
        .collect();
    let suspects = unreachable
        .iter()
        .map(|&i| {
            let id = &members[i].id;
            (idx(i), plan.suspect_for(id), plan.lost_for(id))
        })
        .collect();
    Decision::Start(Box::new(Start {
        sources,
        source_chunks,
        source_not_whole,
        plan,
        unreachable: unreachable.into_iter().map(idx).collect(),
        broken: broken.into_iter().map(idx).collect(),
        specs,
        suspects,
    }))
}

impl Start {
    /// Which entry of `sources` chunk `c` is copied from (inside `plan.reconcile`; 0 outside).
    pub fn source_of(&self, c: u64) -> usize {
        self.source_chunks
            .iter()
            .position(|m| m.is_set(c))
            .unwrap_or(0)
    }

    /// The new engine: the store's states, what the journals say the outdated ones lack,
    /// and what the unreachable in-sync ones may lack. The caller then runs [`Start::begin`]
    /// on it.
    pub fn engine(&self, size: u64, cfg: EngineConfig) -> Engine {
        let mut e = Engine::with_config(size, &self.specs, cfg);
        for (r, suspect, lost) in &self.suspects {
            e.add_dirty(*r, suspect);
            if *lost {
                e.note_lost(*r);
            }
        }
        e
    }

    /// The new engine's first steps, once the reachable replicas were reconciled: the
    /// unreachable in-sync replicas are lost to it (outdated, or `Down` under the quorum
    /// rule), and those whose disk failed the journal read are failed (never resynced, only
    /// replaced). The driver then commits its first journal before any I/O.
    pub fn begin(&self, e: &mut Engine, out: &mut Vec<crate::Command>) {
        for &r in &self.unreachable {
            e.on_replica_lost(r, out);
        }
        for &r in &self.broken {
            e.on_replica_disk_error(r, out);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hawser_wire::journal::OutReplica;

    const SIZE: u64 = 1 << 20;
    const CHUNK: u64 = 64 << 10;

    fn journal(out: Vec<OutReplica>) -> Journal {
        Journal {
            epoch: 1,
            seq: 3,
            size: SIZE,
            chunk_bytes: CHUNK,
            extent_bytes: 4 << 20,
            active: vec![],
            out,
        }
    }

    fn member(id: &str, local: bool, stored: Stored, found: Found) -> Member {
        Member {
            id: id.into(),
            local,
            stored,
            found,
        }
    }

    fn read(journal: Option<Journal>, rebooted: bool) -> Found {
        Found::Journal { journal, rebooted }
    }

    fn sources(d: &Decision) -> Vec<usize> {
        match d {
            Decision::Start(s) => s.sources.clone(),
            Decision::Refuse(r) => panic!("refused: {r}"),
        }
    }

    /// A journal whose log holds `extents` (of one chunk each).
    fn logged(extents: Vec<(u64, u64)>, out: Vec<OutReplica>) -> Journal {
        Journal {
            extent_bytes: CHUNK,
            active: extents,
            ..journal(out)
        }
    }

    #[test]
    fn a_whole_source_first_then_the_local_one() {
        let j = || Some(journal(vec![]));
        let busy = || Some(logged(vec![(2, 3)], vec![]));
        let m = vec![
            member("a", true, Stored::InSync, read(busy(), true)),
            member("b", false, Stored::InSync, read(j(), false)),
            member("c", false, Stored::InSync, read(j(), false)),
        ];
        // The local one rebooted: the whole remote ones come first.
        assert_eq!(sources(&decide(2, SIZE, CHUNK, &m)), [1, 2, 0]);
        let m = vec![
            member("a", false, Stored::InSync, read(j(), false)),
            member("b", true, Stored::InSync, read(j(), false)),
        ];
        assert_eq!(sources(&decide(2, SIZE, CHUNK, &m)), [1, 0]);
    }

    #[test]
    fn no_whole_source_waits_for_an_unreachable_in_sync_replica() {
        let m = vec![
            member(
                "a",
                true,
                Stored::InSync,
                read(Some(logged(vec![(2, 3)], vec![])), true),
            ),
            member("b", false, Stored::InSync, Found::Unreachable),
            member(
                "c",
                false,
                Stored::Outdated { blank: false },
                Found::NotAsked,
            ),
        ];
        match decide(2, SIZE, CHUNK, &m) {
            Decision::Refuse(Refusal::WaitFor { waiting_for }) => assert_eq!(waiting_for, ["b"]),
            _ => panic!("started without the replica that may hold the writes"),
        }
        // A journal that names the reachable one lacking something: not whole either.
        let lacking = journal(vec![OutReplica {
            replica: "a".into(),
            dirty: None,
            lost: true,
        }]);
        let m = vec![
            member("a", true, Stored::InSync, read(Some(lacking), false)),
            member("b", false, Stored::InSync, Found::Unreachable),
        ];
        assert!(matches!(
            decide(2, SIZE, CHUNK, &m),
            Decision::Refuse(Refusal::WaitFor { .. })
        ));
    }

    #[test]
    fn each_chunk_comes_from_a_replica_that_cannot_lack_it() {
        // "a" (local) lost power once and its resync had not copied chunk 3 back; "b" rebooted with chunk 5
        // in its log. Neither is whole, yet every chunk has a replica sure to hold it, so the
        // attach needs no third replica, unreachable here.
        let a = logged(
            vec![(5, 6)],
            vec![OutReplica {
                replica: "a".into(),
                dirty: Some(vec![(3, 4)]),
                lost: true,
            }],
        );
        let b = logged(vec![(5, 6)], vec![]);
        let m = vec![
            member("a", true, Stored::InSync, read(Some(a), false)),
            member("b", false, Stored::InSync, read(Some(b), true)),
            member("c", false, Stored::InSync, Found::Unreachable),
        ];
        let Decision::Start(s) = decide(2, SIZE, CHUNK, &m) else {
            panic!("refused though every chunk has a sure source");
        };
        assert!(!s.source_not_whole);
        let from = |c: u64| s.sources[s.source_of(c)];
        assert_eq!((from(3), from(5)), (1, 0), "chunk 3 from b, chunk 5 from a");
        assert_eq!(s.plan.reconcile.runs(), [(3, 4), (5, 6)]);
        // c is reported lost to the new engine.
        assert_eq!(s.unreachable, [ReplicaIdx(2)]);
    }

    #[test]
    fn a_rebooted_replica_with_an_empty_log_lost_nothing() {
        // A clean stop commits an empty log: a reboot after it takes no acknowledged write.
        let m = vec![
            member("a", true, Stored::InSync, read(Some(journal(vec![])), true)),
            member("b", false, Stored::InSync, Found::Unreachable),
        ];
        let Decision::Start(s) = decide(2, SIZE, CHUNK, &m) else {
            panic!("waited for a replica though the reachable one lost nothing");
        };
        assert!(!s.source_not_whole);
    }

    #[test]
    fn every_node_rebooted_starts_and_says_so() {
        let m = vec![
            member("a", true, Stored::InSync, read(None, true)),
            member("b", false, Stored::InSync, read(None, true)),
        ];
        match decide(2, SIZE, CHUNK, &m) {
            Decision::Start(s) => {
                assert!(s.source_not_whole);
                assert_eq!(s.sources, [0, 1]);
            }
            Decision::Refuse(r) => panic!("{r}"),
        }
    }

    #[test]
    fn nothing_reachable_is_refused_and_broken_disks_are_not_waited_for() {
        let m = vec![
            member("a", false, Stored::InSync, Found::DiskError),
            member("b", false, Stored::InSync, Found::Unreachable),
        ];
        assert!(matches!(
            decide(2, SIZE, CHUNK, &m),
            Decision::Refuse(Refusal::NoneReachable)
        ));
        let m = vec![
            member("a", false, Stored::InSync, Found::DiskError),
            member(
                "b",
                true,
                Stored::InSync,
                read(Some(journal(vec![])), false),
            ),
            member("c", false, Stored::InSync, Found::Unreachable),
        ];
        let Decision::Start(s) = decide(2, SIZE, CHUNK, &m) else {
            panic!("a whole reachable replica is enough");
        };
        assert_eq!(
            (s.sources, s.broken, s.unreachable),
            (vec![1], vec![ReplicaIdx(0)], vec![ReplicaIdx(2)])
        );
    }

    #[test]
    fn blank_replicas_trust_only_a_journal_that_names_them() {
        let named = journal(vec![OutReplica {
            replica: "new".into(),
            dirty: Some(vec![(0, 1)]),
            lost: false,
        }]);
        let m = |j: Journal| {
            vec![
                member("a", true, Stored::InSync, read(Some(j), false)),
                member(
                    "new",
                    false,
                    Stored::Outdated { blank: true },
                    Found::NotAsked,
                ),
            ]
        };
        let dirty_of = |d: Decision| match d {
            Decision::Start(s) => match &s.specs[1].initial {
                Initial::Outdated { dirty } => dirty.as_ref().map(crate::ChunkMap::count),
                other => panic!("{other:?}"),
            },
            Decision::Refuse(r) => panic!("{r}"),
        };
        assert_eq!(dirty_of(decide(2, SIZE, CHUNK, &m(named))), Some(1));
        assert_eq!(dirty_of(decide(2, SIZE, CHUNK, &m(journal(vec![])))), None);
    }
}
