//! The engine's driver: the rules between the engine and the disks and sockets that both the
//! agent and the simulator run. `recovery`: crash recovery's decision at an engine's start;
//! `journal`: the journal keeper (activity-log admission, journal commits, joins of returning
//! replicas, resync saves) while it runs.

pub mod journal;
pub mod links;
pub mod recovery;

#[cfg(test)]
mod journal_tests;
