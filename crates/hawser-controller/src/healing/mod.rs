//! Self-healing: where replicas go (`placement`, pure), which replicas to rebuild or move
//! and when (`plan`, pure), the leader's loop that carries the plan out (`self_heal`), and
//! the capacity it has promised but not yet used (`reservations`). It acts only through the
//! volume operations of `volumes/` and the agents' API (`cluster::agent_client`); moving a
//! volume's engine to another node after a node is lost is `ha/`, not this.

pub(crate) mod placement;
pub(crate) mod plan;
pub(crate) mod reservations;
pub(crate) mod self_heal;
