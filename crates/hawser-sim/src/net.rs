//! The network between the engine and each replica.
//!
//! Modelled: every message (request, reply, Hello and its answer) takes a random delay, with a
//! long tail, so messages overtake each other (replies come in any order, as on the real
//! replica protocol, whose requests run concurrently). A message can be lost: for the sender
//! that is a broken connection, which the engine's driver notices after a timeout
//! (`on_replica_lost`); a lost request may also still arrive late, after that timeout. Replies
//! can be duplicated (the engine must ignore the copy). A partition drops every message to and
//! from one replica while it lasts; the replica keeps running.
//!
//! Not modelled: corrupt frames (the wire format's checksums and fuzz targets cover those, and
//! a corrupt frame only ever closes a connection, which loss already does), bandwidth limits
//! and head-of-line blocking inside one TCP connection.

use rand::rngs::StdRng;
use rand::Rng;

/// Per-seed network behaviour.
#[derive(Clone, Copy, Debug)]
pub struct NetParams {
    /// Usual one-way delay range, microseconds.
    pub delay_min: u64,
    pub delay_max: u64,
    /// Probability of a slow message, and how slow it can be.
    pub tail_p: f64,
    pub tail_max: u64,
    /// Probability that a message is lost (its connection breaks).
    pub loss_p: f64,
    /// Probability that a reply is delivered twice.
    pub dup_p: f64,
}

/// What happens to one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Arrives after this delay (unless a partition starts meanwhile).
    Deliver(u64),
    /// Lost: the connection breaks.
    Lost,
    /// Lost for the sender (the connection breaks) but still arrives, after this delay.
    Late(u64),
}

pub struct Net {
    pub params: NetParams,
    pub partitioned: Vec<bool>,
    /// Links that never lose or duplicate (the local replica, and everything while healing).
    pub reliable: Vec<bool>,
    /// Links with near-zero delay (the local replica).
    pub local: Vec<bool>,
}

impl Net {
    pub fn new(params: NetParams, local: Vec<bool>) -> Net {
        let n = local.len();
        Net {
            params,
            partitioned: vec![false; n],
            reliable: local.clone(),
            local,
        }
    }

    pub fn delay(&self, rng: &mut StdRng, r: usize) -> u64 {
        let p = &self.params;
        if self.local[r] {
            return rng.random_range(1..=20);
        }
        if rng.random_bool(p.tail_p) {
            rng.random_range(p.delay_max..=p.tail_max)
        } else {
            rng.random_range(p.delay_min..=p.delay_max)
        }
    }

    /// The fate of a message sent to or from replica `r`. `late_ok`: a lost message may still
    /// arrive (requests; a late reply on a closed connection is dropped anyway). `may_lose`:
    /// the world allows losing this one (see `World::may_take_away`).
    pub fn fate(
        &self,
        rng: &mut StdRng,
        r: usize,
        late_ok: bool,
        may_lose: bool,
        timeout: u64,
    ) -> Fate {
        if !self.reliable[r] && may_lose && rng.random_bool(self.params.loss_p) {
            if late_ok && rng.random_bool(0.5) {
                return Fate::Late(timeout + rng.random_range(0..=2 * timeout));
            }
            return Fate::Lost;
        }
        Fate::Deliver(self.delay(rng, r))
    }

    /// Whether a reply to replica `r`'s engine is delivered a second time.
    pub fn duplicate(&self, rng: &mut StdRng, r: usize) -> bool {
        !self.local[r] && rng.random_bool(self.params.dup_p)
    }
}
