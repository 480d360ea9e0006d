//! Store leases as `coordination.k8s.io/v1` Leases, and the reaper that makes them expire.
//!
//! A lease is the Lease `hawser-lease-<id>`: `holderIdentity` is the client that granted it,
//! `leaseDurationSeconds` its TTL, and every keep-alive moves `renewTime` (which changes its
//! `resourceVersion`). Objects written under it carry the label `hawser.dev/lease=<id>`.
//!
//! Expiry is decided by whoever watches, on their own clock: a reaper that has seen the same
//! `resourceVersion` of a Lease for a whole `leaseDurationSeconds` deletes it, on the
//! condition that it still has that `resourceVersion` (so a renewal racing the deletion
//! wins), then deletes the objects labelled with it. Clocks of different nodes never get
//! compared; a reaper that just started waits a full duration from its first look. A
//! holder therefore knows its lease lives at least TTL after it *sent* its last successful
//! renewal. An object whose Lease is gone (written in the instant the Lease expired, or
//! left by a reaper that died half-way) is found by a slower sweep and deleted.

use std::collections::HashMap;
use std::sync::Weak;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use tokio::time::Instant;

use super::objects::{self, KINDS, LEASE_LABEL, MANAGED_BY};
use super::Inner;
use crate::api::ApiError;
use crate::time::micro_time;
use hawser_store::{LeaseId, Result, StoreError};

/// The label that marks Leases as store leases.
const STORE_LEASE_LABEL: &str = "hawser.dev/store-lease";
/// How often the reaper looks at the Leases.
const REAP_TICK: Duration = Duration::from_millis(500);
/// Every this many ticks (5 s), it also looks for objects whose Lease is gone. Not every
/// tick: the sweep reads every object of every kind, and with 10,000 volumes a sweep of
/// etcd every 2 s kept the API server busy enough to time out its own lists
/// (docs/performance.md); it reads the API server's cache now, too.
const ORPHAN_SWEEP_TICKS: u32 = 10;

/// The `hawser.dev/lease` label value of a lease.
pub fn label(lease: LeaseId) -> String {
    format!("{lease:016x}")
}

fn lease_name(lease: LeaseId) -> String {
    format!("hawser-lease-{}", label(lease))
}

fn lease_path(s: &Inner, name: Option<&str>) -> String {
    let base = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases",
        s.namespace
    );
    match name {
        Some(n) => format!("{base}/{n}"),
        None => base,
    }
}

pub async fn grant(s: &Inner, ttl: Duration) -> Result<LeaseId> {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    let secs = i64::try_from(secs.max(1)).unwrap_or(i64::MAX);
    let now = micro_time(SystemTime::now());
    for _ in 0..4 {
        // Positive, so its label and name never start with a sign.
        let lease: LeaseId = rand::random::<i64>() & i64::MAX;
        let body = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": lease_name(lease),
                "namespace": s.namespace,
                "labels": {STORE_LEASE_LABEL: "true", MANAGED_BY.0: MANAGED_BY.1},
            },
            "spec": {
                "holderIdentity": s.identity,
                "leaseDurationSeconds": secs,
                "acquireTime": now,
                "renewTime": now,
            },
        });
        match s.api.post(&lease_path(s, None), &body).await {
            Ok(_) => return Ok(lease),
            Err(ApiError::Conflict) => continue, // an id already taken: draw another
            Err(e) => return Err(s.unavailable("grant lease", "", e)),
        }
    }
    Err(s.unavailable("grant lease", "", "four lease ids in a row were taken"))
}

pub async fn keep_alive(s: &Inner, lease: LeaseId) -> Result<()> {
    let patch = json!({"spec": {"renewTime": micro_time(SystemTime::now())}});
    match s
        .api
        .merge_patch(&lease_path(s, Some(&lease_name(lease))), &patch)
        .await
    {
        Ok(_) => Ok(()),
        Err(ApiError::NotFound) => Err(StoreError::LeaseExpired { lease }),
        Err(e) => Err(s.unavailable("keep lease alive", "", e)),
    }
}

/// `LeaseExpired` unless the lease's Lease exists.
pub async fn check_alive(s: &Inner, lease: LeaseId) -> Result<()> {
    match s.api.get(&lease_path(s, Some(&lease_name(lease)))).await {
        Ok(_) => Ok(()),
        Err(ApiError::NotFound) => Err(StoreError::LeaseExpired { lease }),
        Err(e) => Err(s.unavailable("check lease", "", e)),
    }
}

pub async fn revoke(s: &Inner, lease: LeaseId) -> Result<()> {
    match s
        .api
        .delete(&lease_path(s, Some(&lease_name(lease))), None)
        .await
    {
        Ok(()) | Err(ApiError::NotFound) => {}
        Err(e) => return Err(s.unavailable("revoke lease", "", e)),
    }
    delete_leased(s, &label(lease)).await
}

/// Deletes every object labelled with the lease `label`, each only while unchanged (an
/// object re-written without the lease since the listing keeps living).
async fn delete_leased(s: &Inner, label: &str) -> Result<()> {
    for kind in &KINDS {
        let path = format!(
            "{}?labelSelector={LEASE_LABEL}%3D{label}",
            objects::path(&s.namespace, kind, None)
        );
        let list = s
            .api
            .get(&path)
            .await
            .map_err(|e| s.unavailable("delete leased keys", "", e))?;
        for obj in list
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            delete_object(s, kind, obj).await?;
        }
    }
    Ok(())
}

async fn delete_object(s: &Inner, kind: &objects::Kind, obj: &Value) -> Result<()> {
    let Some(name) = obj
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
    else {
        return Ok(());
    };
    let path = objects::path(&s.namespace, kind, Some(name));
    match s.api.delete(&path, objects::resource_version(obj)).await {
        Ok(()) | Err(ApiError::NotFound | ApiError::Conflict) => Ok(()),
        Err(e) => Err(s.unavailable("delete leased keys", name, e)),
    }
}

/// What the reaper last saw of a Lease.
struct Seen {
    version: u64,
    since: Instant,
}

/// The reaper: runs until the store is dropped.
pub async fn reap(store: Weak<Inner>) {
    let mut seen: HashMap<String, Seen> = HashMap::new();
    let mut tick = tokio::time::interval(REAP_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut round: u32 = 0;
    loop {
        tick.tick().await;
        let Some(s) = store.upgrade() else { return };
        round = round.wrapping_add(1);
        if let Err(e) = reap_once(&s, &mut seen).await {
            tracing::debug!(error = %e, "lease reaper round failed");
        }
        if round.is_multiple_of(ORPHAN_SWEEP_TICKS) {
            if let Err(e) = sweep_orphans(&s).await {
                tracing::debug!(error = %e, "orphan sweep failed");
            }
        }
    }
}

/// The store leases now: name → (resourceVersion, duration).
async fn list_leases(s: &Inner) -> Result<HashMap<String, (u64, Duration)>> {
    let path = format!("{}?labelSelector={STORE_LEASE_LABEL}", lease_path(s, None));
    let list = s
        .api
        .get(&path)
        .await
        .map_err(|e| s.unavailable("list leases", "", e))?;
    let mut out = HashMap::new();
    for l in list
        .get("items")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = l
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str);
        let secs = l
            .get("spec")
            .and_then(|sp| sp.get("leaseDurationSeconds"))
            .and_then(Value::as_u64);
        if let (Some(name), Some(rv), Some(secs)) = (name, objects::resource_version(l), secs) {
            out.insert(name.to_string(), (rv, Duration::from_secs(secs)));
        }
    }
    Ok(out)
}

async fn reap_once(s: &Inner, seen: &mut HashMap<String, Seen>) -> Result<()> {
    let leases = list_leases(s).await?;
    let now = Instant::now();
    seen.retain(|name, _| leases.contains_key(name));
    for (name, (version, ttl)) in leases {
        let entry = seen.entry(name.clone()).or_insert(Seen {
            version,
            since: now,
        });
        if entry.version != version {
            *entry = Seen {
                version,
                since: now,
            };
            continue;
        }
        if now.duration_since(entry.since) < ttl {
            continue;
        }
        match s
            .api
            .delete(&lease_path(s, Some(&name)), Some(version))
            .await
        {
            // Renewed meanwhile: alive after all.
            Err(ApiError::Conflict) => continue,
            Ok(()) | Err(ApiError::NotFound) => {}
            Err(e) => return Err(s.unavailable("expire lease", &name, e)),
        }
        tracing::info!(lease = %name, "store lease expired");
        seen.remove(&name);
        if let Some(label) = name.strip_prefix("hawser-lease-") {
            delete_leased(s, label).await?;
        }
    }
    Ok(())
}

/// Deletes objects labelled with a lease that no longer exists. Objects are listed before
/// the Leases: a Lease missing from the later list was gone after the object was written.
/// The objects come from the API server's cache (`resourceVersion=0`, no read of etcd):
/// an object listed a moment late was still written before the Leases were listed, and its
/// delete is conditional on the version listed.
async fn sweep_orphans(s: &Inner) -> Result<()> {
    let mut labelled = Vec::new();
    for kind in &KINDS {
        let path = format!(
            "{}?labelSelector={LEASE_LABEL}&resourceVersion=0",
            objects::path(&s.namespace, kind, None)
        );
        let list = s
            .api
            .get(&path)
            .await
            .map_err(|e| s.unavailable("sweep leased keys", "", e))?;
        for obj in list
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            labelled.push((kind, obj.clone()));
        }
    }
    if labelled.is_empty() {
        return Ok(());
    }
    let leases = list_leases(s).await?;
    for (kind, obj) in labelled {
        let alive = objects::lease_of(&obj)
            .is_some_and(|l| leases.contains_key(&format!("hawser-lease-{l}")));
        if !alive {
            delete_object(s, kind, &obj).await?;
        }
    }
    Ok(())
}
