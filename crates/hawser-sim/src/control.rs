//! The control plane as the engine sees it: the cluster store's record of the volume (epoch and
//! each replica's state) and the controller's outdate / mark-in-sync handling.
//!
//! Modelled after `hawser-controller::volume_outdate`: an outdate of an in-sync replica is
//! refused while it is the last in-sync one; outdating an outdated (or failed) replica again
//! succeeds, so a lost answer can be retried; `failed` turns an outdated replica failed; marking
//! a failed replica in-sync is refused (final), marking an in-sync one succeeds. The agent side
//! (`hawser-agent::controller_link`) retries while the controller is unreachable, when an answer
//! is lost, and after any refusal of an outdate; the simulator does the same, after random
//! delays, and the controller is sometimes unavailable for a while.
//!
//! Every call carries its engine's epoch; an attach (an engine restart) raises the store's, and
//! calls of older engines are refused (`Outcome::Stale`), as the controller's compare-and-swap
//! on the volume record does. Not modelled: volume states (creating, deleting), and the store's
//! own replication.

/// A replica's state in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreState {
    InSync,
    Outdated,
    Failed,
}

/// A request from the engine's driver to the controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Outdate { r: usize, failed: bool },
    Mark { r: usize },
}

/// The controller's answer to one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Applied (or already so).
    Done,
    /// Refused for good (marking a failed replica).
    Refused,
    /// Refused for now (outdating the last in-sync replica): the agent retries.
    Retry,
    /// From an engine of an older epoch (a newer attach fenced it): refused, changes nothing.
    Stale,
}

/// Deliberate control-plane bugs, to prove the checkers catch them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Broken {
    #[default]
    No,
    /// Confirms outdates without recording them.
    ForgetsOutdates,
}

pub struct Control {
    pub store: Vec<StoreState>,
    /// Outdated replicas being built from nothing (`EngineReplica::blank`): cleared by the
    /// in-sync CAS, as the controller does.
    pub blank: Vec<bool>,
    pub epoch: u64,
    /// Unreachable (an outage): every attempt fails and is retried.
    pub down: bool,
    pub broken: Broken,
    /// Calls sent and not yet answered to the engine.
    pub in_flight: usize,
}

impl Control {
    pub fn new(store: Vec<StoreState>, broken: Broken) -> Control {
        Control {
            blank: vec![false; store.len()],
            store,
            epoch: 1,
            down: false,
            broken,
            in_flight: 0,
        }
    }

    pub fn in_sync_count(&self) -> usize {
        self.store
            .iter()
            .filter(|&&s| s == StoreState::InSync)
            .count()
    }

    /// One attempt of `call` by the engine of `epoch`: refused if a newer attach happened.
    pub fn apply_at(&mut self, call: Call, epoch: u64) -> Outcome {
        if epoch < self.epoch {
            return Outcome::Stale;
        }
        self.apply(call)
    }

    /// One attempt of `call`, as the controller's compare-and-swap does it.
    pub fn apply(&mut self, call: Call) -> Outcome {
        match call {
            Call::Outdate { r, failed } => {
                let to = if failed {
                    StoreState::Failed
                } else {
                    StoreState::Outdated
                };
                match self.store[r] {
                    StoreState::InSync => {}
                    StoreState::Outdated if failed => {
                        self.store[r] = to;
                        return Outcome::Done;
                    }
                    StoreState::Outdated | StoreState::Failed => return Outcome::Done,
                }
                if self.in_sync_count() <= 1 {
                    return Outcome::Retry;
                }
                if self.broken != Broken::ForgetsOutdates {
                    self.store[r] = to;
                }
                Outcome::Done
            }
            Call::Mark { r } => match self.store[r] {
                StoreState::InSync => Outcome::Done,
                StoreState::Outdated => {
                    self.store[r] = StoreState::InSync;
                    self.blank[r] = false;
                    Outcome::Done
                }
                StoreState::Failed => Outcome::Refused,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_in_sync_is_kept_and_retries_are_idempotent() {
        let mut c = Control::new(vec![StoreState::InSync; 2], Broken::No);
        let out0 = Call::Outdate {
            r: 0,
            failed: false,
        };
        assert_eq!(c.apply(out0), Outcome::Done);
        assert_eq!(c.apply(out0), Outcome::Done, "a retried outdate succeeds");
        assert_eq!(
            c.apply(Call::Outdate {
                r: 1,
                failed: false
            }),
            Outcome::Retry,
            "the last in-sync replica was outdated"
        );
        assert_eq!(c.apply(Call::Outdate { r: 0, failed: true }), Outcome::Done);
        assert_eq!(c.store[0], StoreState::Failed);
        assert_eq!(c.apply(Call::Mark { r: 0 }), Outcome::Refused);
    }
}
