//! Leader election among controllers sharing one etcd, and the fencing of the leader's
//! writes.
//!
//! Every controller holds a lease (TTL [`LEADER_TTL`]) that it renews every
//! [`ELECTION_TICK`], registers its URL under `controllers/` with it (so engines learn every
//! controller), and tries to create the `leader` key under it. Whoever created the key leads
//! until its lease expires or it resigns; the others answer API calls with `not_leader` and
//! the leader's URL. The leader writes every record through [`FencedStore`]: each write is
//! one transaction that also compares the leader key's version with the one this controller
//! created, so a controller that lost its lease (paused, partitioned, or slow to notice)
//! cannot change anything even if it still believes it leads.
//!
//! With the embedded store there is one controller (the file lock ensures it) and it is
//! always the leader: [`Role::Sole`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hawser_store::{
    Expect, Fence, LeaseId, Result, Store, StoreError, Versioned, Watch, WriteOptions,
};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::constants::{ELECTION_TICK, LEADER_TTL};

/// The key whose holder leads; its value is the leader's URL.
pub const LEADER_KEY: &str = "leader";
/// `controllers/<n>` = URL of each live controller, under its lease.
pub const CONTROLLERS_PREFIX: &str = "controllers/";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// The only controller (embedded store).
    Sole,
    /// Leads; writes are fenced on the leader key's version.
    Leader { fence: Fence },
    /// Another controller leads (its URL, when known), or none does yet.
    Follower { leader_url: Option<String> },
}

/// This controller's current role, updated by the election task.
#[derive(Clone)]
pub struct Leadership {
    rx: watch::Receiver<Role>,
    /// When this controller last began to lead (Unix ms; the start for the sole one).
    since_ms: Arc<AtomicU64>,
}

impl Leadership {
    /// Always the leader: the embedded store has one controller.
    pub fn sole() -> Leadership {
        let (_tx, rx) = watch::channel(Role::Sole);
        Leadership {
            rx,
            since_ms: Arc::new(AtomicU64::new(crate::store::model::now_ms())),
        }
    }

    pub fn role(&self) -> Role {
        self.rx.borrow().clone()
    }

    /// When this controller began to lead, Unix ms. Heartbeats sent before then went to
    /// another controller or were lost in an outage: a node is not offline for silence this
    /// controller could not have heard (see `AppState::is_online`).
    pub fn since_ms(&self) -> u64 {
        self.since_ms.load(Ordering::Relaxed)
    }

    /// A leadership whose role a test sets through the returned sender.
    #[cfg(test)]
    pub(crate) fn for_test(role: Role) -> (watch::Sender<Role>, Leadership) {
        let (tx, rx) = watch::channel(role);
        (
            tx,
            Leadership {
                rx,
                since_ms: Arc::new(AtomicU64::new(0)),
            },
        )
    }

    /// The fence every write must carry, or `Fenced` when this controller does not lead.
    fn fence(&self, key: &str) -> Result<Option<Fence>> {
        match &*self.rx.borrow() {
            Role::Sole => Ok(None),
            Role::Leader { fence } => Ok(Some(fence.clone())),
            Role::Follower { .. } => Err(StoreError::Fenced {
                key: key.into(),
                fence_key: LEADER_KEY.into(),
                expected: 0,
                found: None,
            }),
        }
    }
}

/// The store as the controller's records see it: reads pass through, every write carries
/// the leader fence.
pub struct FencedStore {
    inner: Arc<dyn Store>,
    leadership: Leadership,
}

impl FencedStore {
    pub fn new(inner: Arc<dyn Store>, leadership: Leadership) -> FencedStore {
        FencedStore { inner, leadership }
    }
}

#[async_trait]
impl Store for FencedStore {
    async fn get(&self, key: &str) -> Result<Option<Versioned>> {
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>> {
        self.inner.list(prefix).await
    }
    async fn list_at(&self, prefix: &str) -> Result<(Vec<(String, Versioned)>, u64)> {
        self.inner.list_at(prefix).await
    }
    async fn put_with(
        &self,
        key: &str,
        value: Vec<u8>,
        expect: Expect,
        opts: &WriteOptions,
    ) -> Result<u64> {
        let opts = WriteOptions {
            lease: opts.lease,
            fence: self.leadership.fence(key)?,
        };
        self.inner.put_with(key, value, expect, &opts).await
    }
    async fn delete_with(&self, key: &str, expect: Expect, opts: &WriteOptions) -> Result<()> {
        let opts = WriteOptions {
            lease: opts.lease,
            fence: self.leadership.fence(key)?,
        };
        self.inner.delete_with(key, expect, &opts).await
    }
    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        self.inner.grant_lease(ttl).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<()> {
        self.inner.keep_alive(lease).await
    }
    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.inner.revoke_lease(lease).await
    }
    async fn watch(&self, prefix: &str, after: u64) -> Result<Watch> {
        self.inner.watch(prefix, after).await
    }
    async fn revision(&self) -> Result<u64> {
        self.inner.revision().await
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// The election task of one controller. Dropping it stops campaigning without resigning
/// (as a crash would: the lease then expires); [`Election::resign`] hands over at once.
pub struct Election {
    task: tokio::task::JoinHandle<()>,
    store: Arc<dyn Store>,
    lease: watch::Receiver<Option<LeaseId>>,
}

impl Election {
    /// Starts campaigning as `url`. The returned [`Leadership`] starts as a follower.
    pub fn start(store: Arc<dyn Store>, url: String) -> (Election, Leadership) {
        let (role_tx, role_rx) = watch::channel(Role::Follower { leader_url: None });
        let (lease_tx, lease_rx) = watch::channel(None);
        let since_ms = Arc::new(AtomicU64::new(0));
        let campaign = Campaign {
            store: store.clone(),
            url,
            role: role_tx,
            lease: lease_tx,
            since_ms: since_ms.clone(),
        };
        let task = tokio::spawn(campaign.run());
        let election = Election {
            task,
            store,
            lease: lease_rx,
        };
        (
            election,
            Leadership {
                rx: role_rx,
                since_ms,
            },
        )
    }

    /// Stops campaigning and revokes the lease, so another controller can lead at once.
    pub async fn resign(self) {
        self.task.abort();
        let lease = *self.lease.borrow();
        if let Some(lease) = lease {
            match self.store.revoke_lease(lease).await {
                Ok(()) => tracing::info!("resigned leadership"),
                Err(e) => tracing::warn!(error = %e, "cannot revoke the election lease"),
            }
        }
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Campaign {
    store: Arc<dyn Store>,
    url: String,
    role: watch::Sender<Role>,
    lease: watch::Sender<Option<LeaseId>>,
    since_ms: Arc<AtomicU64>,
}

impl Campaign {
    async fn run(self) {
        let mut tick = tokio::time::interval(ELECTION_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The lease of the last term, until it is known to be gone.
        let mut stale: Option<LeaseId> = None;
        loop {
            tick.tick().await;
            if let Some(old) = stale {
                // A leader that stepped down because etcd was unreachable may find its lease
                // alive when etcd comes back (a restarted etcd renews every lease it had),
                // still holding the leader key, so nobody could lead for another TTL.
                // Revoking it first lets this controller (or another) lead at once.
                match self.store.revoke_lease(old).await {
                    Ok(()) => stale = None,
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot revoke the last election lease yet");
                        continue;
                    }
                }
            }
            let lease = match self.store.grant_lease(LEADER_TTL).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot get an election lease; retrying");
                    continue;
                }
            };
            let _ = self.lease.send(Some(lease));
            self.hold(lease, &mut tick).await;
            self.set_role(Role::Follower { leader_url: None });
            stale = Some(lease);
        }
    }

    /// Campaigns and leads under `lease` until it is lost.
    async fn hold(&self, lease: LeaseId, tick: &mut tokio::time::Interval) {
        let mut renewed = Instant::now();
        let member_key = format!("{CONTROLLERS_PREFIX}{lease:x}");
        let mut registered = false;
        loop {
            if !registered {
                registered = self.put_leased(&member_key, lease).await.is_ok();
            }
            self.campaign(lease).await;
            tick.tick().await;
            // The lease lives at least TTL after the renewal was *sent* (on Kubernetes,
            // others time it from when they see it change, which is later), so count from
            // the send, not from the answer.
            let sent = Instant::now();
            match self.store.keep_alive(lease).await {
                Ok(()) => renewed = sent,
                Err(StoreError::LeaseExpired { .. }) => {
                    tracing::warn!(lease, "election lease expired");
                    return;
                }
                Err(e) => {
                    // The store may have expired the lease already: stop acting as leader
                    // before it can have (fenced writes are refused either way).
                    if renewed.elapsed() + ELECTION_TICK >= LEADER_TTL {
                        tracing::warn!(error = %e, "cannot renew the election lease in time");
                        return;
                    }
                    tracing::warn!(error = %e, "cannot renew the election lease; retrying");
                }
            }
        }
    }

    async fn put_leased(&self, key: &str, lease: LeaseId) -> Result<u64> {
        let opts = WriteOptions {
            lease: Some(lease),
            fence: None,
        };
        self.store
            .put_with(key, self.url.clone().into_bytes(), Expect::Any, &opts)
            .await
    }

    /// Becomes leader if nobody is; as leader, checks the key is still ours.
    async fn campaign(&self, lease: LeaseId) {
        let current = self.role.borrow().clone();
        if let Role::Leader { fence } = current {
            match self.store.get(LEADER_KEY).await {
                Ok(Some(v)) if v.version == fence.version => {}
                Ok(other) => {
                    tracing::warn!(found = ?other.map(|v| v.version), "leader key changed");
                    self.set_role(Role::Follower { leader_url: None });
                }
                Err(_) => {} // keep_alive decides whether the lease is lost
            }
            return;
        }
        let opts = WriteOptions {
            lease: Some(lease),
            fence: None,
        };
        let url = self.url.clone().into_bytes();
        match self
            .store
            .put_with(LEADER_KEY, url, Expect::Absent, &opts)
            .await
        {
            Ok(version) => {
                tracing::info!(url = %self.url, version, "became the leader");
                let fence = Fence {
                    key: LEADER_KEY.into(),
                    version,
                };
                self.set_role(Role::Leader { fence });
            }
            Err(StoreError::Conflict { .. }) => {
                let leader_url = match self.store.get(LEADER_KEY).await {
                    Ok(Some(v)) => String::from_utf8(v.value).ok(),
                    _ => None,
                };
                self.set_role(Role::Follower { leader_url });
            }
            Err(e) => tracing::debug!(error = %e, "campaign failed"),
        }
    }

    fn set_role(&self, role: Role) {
        self.role.send_if_modified(|r| {
            if *r == role {
                return false;
            }
            if let (Role::Leader { .. }, Role::Follower { .. }) = (&*r, &role) {
                tracing::warn!("no longer the leader");
            }
            if matches!(role, Role::Leader { .. }) && !matches!(&*r, Role::Leader { .. }) {
                self.since_ms
                    .store(crate::store::model::now_ms(), Ordering::Relaxed);
            }
            *r = role;
            true
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hawser_store::EmbeddedStore;

    async fn wait_role(l: &Leadership, want: impl Fn(&Role) -> bool) -> Role {
        let mut rx = l.rx.clone();
        let r = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|r| want(r)))
            .await
            .expect("role not reached within 10 s")
            .unwrap();
        r.clone()
    }

    /// Two campaigns on one store (the embedded one has leases too): one leads, the other
    /// follows and knows its URL; a leader whose key was taken over cannot write through its
    /// fenced store, even before its own campaign notices.
    #[tokio::test]
    async fn one_leader_and_deposed_leaders_cannot_write() {
        let dir = tempfile::tempdir().unwrap();
        let raw: Arc<dyn Store> = Arc::new(EmbeddedStore::open(dir.path().join("s.json")).unwrap());
        let (ea, la) = Election::start(raw.clone(), "http://a".into());
        let Role::Leader { fence } = wait_role(&la, |r| matches!(r, Role::Leader { .. })).await
        else {
            unreachable!()
        };
        let (_eb, lb) = Election::start(raw.clone(), "http://b".into());
        let want = Role::Follower {
            leader_url: Some("http://a".into()),
        };
        wait_role(&lb, |r| *r == want).await;
        let a = FencedStore::new(raw.clone(), la.clone());
        let b = FencedStore::new(raw.clone(), lb.clone());
        a.put("volumes/x", b"1".to_vec(), Expect::Absent)
            .await
            .unwrap();
        let err = b
            .put("volumes/x", b"2".to_vec(), Expect::Any)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{err:?}");
        // Another writer takes the leader key (as a new leader after an expiry would).
        raw.put(LEADER_KEY, b"http://c".to_vec(), Expect::Any)
            .await
            .unwrap();
        assert!(matches!(la.role(), Role::Leader { .. }), "not noticed yet");
        let err = a
            .put("volumes/x", b"3".to_vec(), Expect::Any)
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Fenced { expected, .. } if expected == fence.version),
            "{err:?}"
        );
        assert_eq!(raw.get("volumes/x").await.unwrap().unwrap().value, b"1");
        // And the campaign notices and steps down.
        wait_role(&la, |r| matches!(r, Role::Follower { .. })).await;
        drop(ea);
    }

    /// Resigning revokes the lease: the follower leads within a tick or two.
    #[tokio::test]
    async fn resign_hands_over() {
        let dir = tempfile::tempdir().unwrap();
        let raw: Arc<dyn Store> = Arc::new(EmbeddedStore::open(dir.path().join("s.json")).unwrap());
        let (ea, la) = Election::start(raw.clone(), "http://a".into());
        wait_role(&la, |r| matches!(r, Role::Leader { .. })).await;
        let (_eb, lb) = Election::start(raw.clone(), "http://b".into());
        wait_role(&lb, |r| {
            matches!(
                r,
                Role::Follower {
                    leader_url: Some(_)
                }
            )
        })
        .await;
        let urls: Vec<String> = raw
            .list(CONTROLLERS_PREFIX)
            .await
            .unwrap()
            .into_iter()
            .map(|(_, v)| String::from_utf8(v.value).unwrap())
            .collect();
        assert_eq!(urls.len(), 2, "{urls:?}");
        let start = Instant::now();
        ea.resign().await;
        wait_role(&lb, |r| matches!(r, Role::Leader { .. })).await;
        assert!(start.elapsed() < ELECTION_TICK * 3, "{:?}", start.elapsed());
    }
}
