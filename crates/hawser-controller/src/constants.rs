//! Every limit and timeout of the controller, in one place.

use std::time::Duration;

/// Largest request body the API accepts; larger ones get 413.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Replicas per volume (the API's one definition).
pub use hawser_api::controller::MAX_VOLUME_REPLICAS as MAX_REPLICAS;

/// How many nodes whose agent did not answer one `volume create` skips before it gives up
/// and reports the last one's error. Each skip costs at most a connect timeout.
pub const MAX_UNANSWERED_NODES: usize = 2;

/// How often a read-modify-write of a record retries after losing a compare-and-swap before
/// giving up with a conflict. Writers of one volume are few (its own operation, its engine).
pub const MAX_CAS_RETRIES: u32 = 16;

/// TTL of a controller's election lease: a leader that stops renewing it (crashed, paused,
/// cut off from etcd) is replaced this long after its last renewal. etcd's own minimum is
/// about 2 s; 5 s keeps a slow disk from triggering needless elections.
pub const LEADER_TTL: Duration = Duration::from_secs(5);

/// How often a controller renews its lease and, as a follower, tries to become leader.
/// With [`LEADER_TTL`] this bounds takeover at about TTL + one tick.
pub const ELECTION_TICK: Duration = Duration::from_secs(1);

/// Default seconds without a heartbeat after which a node is offline.
pub const DEFAULT_NODE_TIMEOUT_SECS: u64 = 15;

/// Connecting to an agent's admin API.
pub const AGENT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A whole agent admin request. Starting an engine connects to every replica and stopping
/// one flushes it, so this is generous.
pub const AGENT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Giving an engine's node a volume's new limits (`volumes/qos.rs`): short, as the engine watch
/// retries a node that did not take them, and the caller waits for this.
pub const QOS_PUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// An agent request that copies a replica's data: a snapshot, a clone's seed, a restore. On
/// a pool without reflinks (ext4) it copies every allocated byte (a 1 TiB replica at 500 MB/s
/// is about 35 minutes); an attached volume's snapshot is bounded by its pause lease instead.
/// Giving up sooner would leave the agent copying a file the controller no longer expects.
pub const AGENT_COPY_TIMEOUT: Duration = Duration::from_secs(2 * 3600);

/// A reservation made by placement is dropped after this many heartbeats from its node
/// (counted once the replica exists): the first may have been measured before the replica
/// was created, the second cannot have been.
pub const RESERVATION_HEARTBEATS: u32 = 2;

/// Default seconds between checks that attached volumes' engines run.
pub const DEFAULT_ENGINE_CHECK_SECS: u64 = 5;
/// A week between scrub passes of a volume, as Ceph's deep scrub (`osd_deep_scrub_interval`).
pub const DEFAULT_SCRUB_INTERVAL_SECS: u64 = 7 * 24 * 3600;

/// Default seconds a node's agent may be silent before Kubernetes pods using Hawser volumes
/// on it are failed over (Piraeus' ha-controller reacts in about 10 s too).
pub const DEFAULT_FAILOVER_AFTER_SECS: u64 = 10;
/// The failover asks a silent node's peers about it after this long (`ha/confirm.rs`): one
/// missed heartbeat (the agent's interval is 3 s) and a second of margin.
pub const DEFAULT_FAILOVER_CONFIRM_SECS: u64 = 4;

/// Default seconds a node may be offline before its replicas are replaced elsewhere.
pub const DEFAULT_REPLACE_AFTER_SECS: u64 = 300;

/// Default replicas rebuilt at once, cluster-wide (each copies a whole volume's data).
pub const DEFAULT_MAX_REBUILDS: usize = 2;

/// Default seconds between self-healing rounds.
pub const DEFAULT_HEAL_CHECK_SECS: u64 = 5;

/// How long the records keep retrying a store call that failed because etcd is unreachable
/// (or because this controller stepped down for that reason and nobody else leads). Covers
/// an etcd restart plus the [`LEADER_TTL`] a stale lease may live on after it, and keeps a
/// whole operation (a few such calls) well inside the CLI's 90 s request timeout.
pub const STORE_RETRY_DEADLINE: Duration = Duration::from_secs(20);

/// First wait between store retries; doubles up to [`STORE_RETRY_MAX_BACKOFF`].
pub const STORE_RETRY_FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Longest wait between store retries: an etcd that is back is noticed within this.
pub const STORE_RETRY_MAX_BACKOFF: Duration = Duration::from_secs(1);

/// How often the leader rolls back interrupted creates, finishes interrupted deletes and
/// deletes orphan replicas (`cluster/reconcile.rs`), besides once at the start of each term. Each
/// round asks every agent for its replica list, so not much more often than heartbeats.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(5);

/// The default of `--backup-rate`: what a backup may read per second on its node, as the
/// agent's default resync rate (200 MiB/s), so a backup takes at most what a resync would.
pub const DEFAULT_BACKUP_RATE: u64 = 200 * 1024 * 1024;

/// The default of `--standby-poll-secs`: how often a standby volume's target is read for a
/// newer backup. A minute adds at most a minute to the recovery point a standby holds, for
/// one LIST and one GET a minute per standby.
pub const DEFAULT_STANDBY_POLL_SECS: u64 = 60;
