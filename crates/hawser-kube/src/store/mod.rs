//! The Kubernetes backend: every record is a custom resource in one namespace (one CRD per
//! kind of record, see [`objects`]), versions are `resourceVersion`s, leases are
//! `coordination.k8s.io` Leases, and watches are the API server's.
//!
//! What maps directly:
//! - **Compare-and-swap**: a create (`Expect::Absent`), an update carrying the
//!   `resourceVersion` read (`Expect::Version`), a delete with a `resourceVersion`
//!   precondition. The API server checks these in one etcd transaction, so exactly one of
//!   several racing writers wins, as with the other backends.
//! - **Versions** are the API server's `resourceVersion`s, which are etcd revisions: they only
//!   grow, and a recreated object never gets an old one. They are shared with every other
//!   object of the cluster, so the store's revision moves when anything in the cluster
//!   changes, not only Hawser's records.
//!
//! What does not, and how it is built:
//! - **Leases**: Kubernetes deletes nothing when a Lease runs out. Objects written under a
//!   store lease carry its label; every store client runs a reaper ([`leases`]) that deletes
//!   a Lease nobody renewed for its duration (measured on the reaper's own clock from when it
//!   last saw the Lease change, as client-go's leader election does, so clocks need not
//!   agree) and then the objects labelled with it.
//! - **Fences** are checked just before the write they guard (a read of the fence key), not
//!   in the same transaction: the API offers no transaction over two objects. A leader that
//!   loses its lease between the check and the write can land that one write; it is still a
//!   compare-and-swap on the record it read, so it cannot overwrite a newer leader's change
//!   of that record. docs/protocol.md says why the data path does not depend on this.
//! - **Watches** are per kind: a watch of a prefix inside one kind (every watch the
//!   controller makes) sees changes in revision order; one spanning kinds sees each kind's
//!   changes in order, interleaved.

mod leases;
mod objects;
mod status;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

pub use objects::{GROUP, KINDS, VERSION};

use hawser_store::{
    Expect, Fence, LeaseId, Result, Store, StoreError, Versioned, Watch, WriteOptions,
};

use crate::api::{Api, ApiError, SetupError};
use crate::config::{ConfigError, KubeConfig};
use crate::DEFAULT_REQUEST_TIMEOUT;

/// Attempts of an unconditional write that keeps racing other writers.
const MAX_ANY_ATTEMPTS: u32 = 16;

/// The CRDs of every kind of record (the chart installs the same file).
pub const CRDS_YAML: &str = include_str!("../../../../deploy/helm/hawser/crds/hawser.dev.yaml");

/// Why the CRDs could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(transparent)]
    Client(#[from] SetupError),
    #[error("CRD manifest: {0}")]
    Manifest(String),
    #[error("create CRD {name}: {why}")]
    Create { name: String, why: ApiError },
    #[error("CRDs not served after {timeout:?} (served: {served:?})")]
    NotServed {
        timeout: Duration,
        served: Vec<String>,
    },
    #[error("dry-run create of a {kind}: {why}")]
    DryRun { kind: &'static str, why: ApiError },
}

/// Creates the CRDs that do not exist yet and waits until the API server serves all of
/// them. For tests and clusters installed without the chart; needs the right to create
/// CustomResourceDefinitions, which the chart does not give the controller.
pub async fn install_crds(
    cfg: &KubeConfig,
    timeout: Duration,
) -> std::result::Result<(), InstallError> {
    let api = Api::new(cfg, DEFAULT_REQUEST_TIMEOUT)?;
    for doc in serde_yaml::Deserializer::from_str(CRDS_YAML) {
        let v = <serde_json::Value as serde::Deserialize>::deserialize(doc)
            .map_err(|e| InstallError::Manifest(e.to_string()))?;
        if v.is_null() {
            continue;
        }
        match api
            .post(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                &v,
            )
            .await
        {
            Ok(_) | Err(ApiError::Conflict) => {}
            Err(why) => {
                return Err(InstallError::Create {
                    name: v["metadata"]["name"].to_string(),
                    why,
                })
            }
        }
    }
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let served = api.get(&format!("/apis/{GROUP}/{VERSION}")).await;
        let names: Vec<String> = served
            .ok()
            .and_then(|v| {
                v.get("resources")?.as_array().map(|rs| {
                    rs.iter()
                        .filter_map(|r| Some(r.get("name")?.as_str()?.to_string()))
                        .collect()
                })
            })
            .unwrap_or_default();
        if KINDS.iter().all(|k| names.iter().any(|n| n == k.plural)) {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(InstallError::NotServed {
                timeout,
                served: names,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The first write of a new kind waits (about 2 s) for its storage to be ready; have it
    // happen here, with a dry run, rather than in the first real write.
    for kind in &KINDS {
        let key = format!("{}install-check", kind.prefix);
        let body = objects::encode("default", &key, b"{}", None, None, None);
        let path = format!("{}?dryRun=All", objects::path("default", kind, None));
        match api.post(&path, &body).await {
            Ok(_) | Err(ApiError::Conflict) => {}
            Err(why) => {
                return Err(InstallError::DryRun {
                    kind: kind.kind,
                    why,
                })
            }
        }
    }
    Ok(())
}

/// Parsed `k8s://[NAMESPACE][?kubeconfig=PATH]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeStoreUrl {
    /// `None`: the kubeconfig context's or the pod's namespace.
    pub namespace: Option<String>,
    /// A kubeconfig file to use instead of discovering the credentials.
    pub kubeconfig: Option<std::path::PathBuf>,
}

/// Why a store URL is not a `k8s://` one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeUrlError {
    #[error("{url:?} does not start with k8s://")]
    Scheme { url: String },
    #[error("{url:?}: the only option is ?kubeconfig=PATH")]
    Option { url: String },
    #[error("{namespace:?} in {url:?} is not a namespace name")]
    Namespace { namespace: String, url: String },
}

impl KubeStoreUrl {
    pub fn parse(url: &str) -> std::result::Result<KubeStoreUrl, KubeUrlError> {
        let rest = url
            .strip_prefix("k8s://")
            .ok_or_else(|| KubeUrlError::Scheme { url: url.into() })?;
        let (ns, query) = match rest.split_once('?') {
            Some((n, q)) => (n, Some(q)),
            None => (rest, None),
        };
        let kubeconfig = match query {
            None => None,
            Some(q) => match q.strip_prefix("kubeconfig=") {
                Some(p) if !p.is_empty() && !p.contains('&') => Some(p.into()),
                _ => return Err(KubeUrlError::Option { url: url.into() }),
            },
        };
        let ns = ns.trim_end_matches('/');
        if ns.is_empty() {
            return Ok(KubeStoreUrl {
                namespace: None,
                kubeconfig,
            });
        }
        let valid = ns.len() <= 63
            && ns
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !ns.starts_with('-')
            && !ns.ends_with('-');
        if !valid {
            return Err(KubeUrlError::Namespace {
                namespace: ns.into(),
                url: url.into(),
            });
        }
        Ok(KubeStoreUrl {
            namespace: Some(ns.to_string()),
            kubeconfig,
        })
    }

    /// The credentials: the kubeconfig named in the URL, else discovered
    /// ([`KubeConfig::discover`]).
    pub fn config(&self) -> std::result::Result<KubeConfig, ConfigError> {
        match &self.kubeconfig {
            Some(p) => KubeConfig::from_kubeconfig(p),
            None => KubeConfig::discover(),
        }
    }
}

pub(crate) struct Inner {
    api: Api,
    namespace: String,
    /// Who holds the leases this store grants (`holderIdentity`).
    identity: String,
    name: String,
    /// The `status` of each object as last read or written here, by key, with its version:
    /// a write derives the new status from it (condition transition times).
    statuses: std::sync::Mutex<std::collections::HashMap<String, (u64, Value)>>,
}

/// The Kubernetes-backed store. The reaper runs until the store is dropped.
pub struct KubeStore {
    inner: Arc<Inner>,
    reaper: tokio::task::AbortHandle,
}

impl Drop for KubeStore {
    fn drop(&mut self) {
        self.reaper.abort();
    }
}

impl KubeStore {
    /// Connects and checks that the CRDs are installed. `identity` names this client in the
    /// Leases it holds (a pod name, a URL).
    pub async fn connect(
        cfg: &KubeConfig,
        url: &KubeStoreUrl,
        identity: &str,
        request_timeout: Duration,
    ) -> Result<KubeStore> {
        let name = format!("kubernetes {}", cfg.server);
        let namespace = url
            .namespace
            .clone()
            .or_else(|| cfg.namespace.clone())
            .unwrap_or_else(|| "default".into());
        let fail = |op: &'static str, reason: String| StoreError::Unavailable {
            endpoint: name.clone(),
            op,
            key: String::new(),
            reason,
        };
        let api = Api::new(cfg, request_timeout).map_err(|e| fail("connect", e.to_string()))?;
        let inner = Arc::new(Inner {
            api,
            name: format!("{name} (namespace {namespace})"),
            namespace,
            identity: identity.to_string(),
            statuses: Default::default(),
        });
        inner.check_crds().await?;
        let reaper = tokio::spawn(leases::reap(Arc::downgrade(&inner))).abort_handle();
        Ok(KubeStore { inner, reaper })
    }
}

impl Inner {
    fn unavailable(&self, op: &'static str, key: &str, reason: impl ToString) -> StoreError {
        StoreError::Unavailable {
            endpoint: self.name.clone(),
            op,
            key: key.into(),
            reason: reason.to_string(),
        }
    }

    /// Every Hawser CRD must be served; say which is missing and how to install it.
    async fn check_crds(&self) -> Result<()> {
        let path = format!("/apis/{GROUP}/{VERSION}");
        let found = match self.api.get(&path).await {
            Ok(v) => v,
            Err(ApiError::NotFound) => Value::Null,
            Err(e) => return Err(self.unavailable("connect", "", e)),
        };
        let served: Vec<&str> = found
            .get("resources")
            .and_then(Value::as_array)
            .map(|rs| rs.iter().filter_map(|r| r.get("name")?.as_str()).collect())
            .unwrap_or_default();
        let missing: Vec<&str> = KINDS
            .iter()
            .map(|k| k.plural)
            .filter(|p| !served.contains(p))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(self.unavailable(
            "connect",
            "",
            format!(
                "the CRDs {} of {GROUP}/{VERSION} are not installed (helm install the chart, \
                 or kubectl apply -f deploy/helm/hawser/crds/)",
                missing.join(", ")
            ),
        ))
    }

    fn remember_status(&self, key: &str, version: u64, obj: &Value) {
        let mut m = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
        match obj.get("status") {
            Some(st) => {
                m.insert(key.to_string(), (version, st.clone()));
            }
            None => {
                m.remove(key);
            }
        }
    }

    /// The status `key` had at `version`, if this client saw it.
    fn status_at(&self, key: &str, version: u64) -> Option<Value> {
        let m = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
        m.get(key)
            .filter(|(v, _)| *v == version)
            .map(|(_, st)| st.clone())
    }

    fn object_path(&self, key: &str) -> String {
        let (kind, name) = objects::locate(key);
        objects::path(&self.namespace, kind, Some(&name))
    }

    /// The object of `key`, decoded; `None` when absent.
    async fn read(&self, op: &'static str, key: &str) -> Result<Option<Versioned>> {
        let obj = match self.api.get(&self.object_path(key)).await {
            Ok(o) => o,
            Err(ApiError::NotFound) => return Ok(None),
            Err(e) => return Err(self.unavailable(op, key, e)),
        };
        let (found_key, value, version) =
            objects::decode(&obj).map_err(|e| self.unavailable(op, key, e))?;
        self.remember_status(key, version, &obj);
        if found_key != key {
            return Err(self.unavailable(
                op,
                key,
                format!("its object holds key {found_key:?} (a name collision)"),
            ));
        }
        Ok(Some(Versioned { value, version }))
    }

    /// The version `key` has now, for the error of a failed condition.
    async fn found(&self, op: &'static str, key: &str) -> Result<Option<u64>> {
        Ok(self.read(op, key).await?.map(|v| v.version))
    }

    async fn check_fence(&self, op: &'static str, key: &str, fence: Option<&Fence>) -> Result<()> {
        let Some(f) = fence else { return Ok(()) };
        let found = self.found(op, &f.key).await?;
        if found == Some(f.version) {
            return Ok(());
        }
        Err(StoreError::Fenced {
            key: key.into(),
            fence_key: f.key.clone(),
            expected: f.version,
            found,
        })
    }

    fn conflict(key: &str, expected: Expect, found: Option<u64>) -> StoreError {
        StoreError::Conflict {
            key: key.into(),
            expected,
            found,
        }
    }

    /// Creates `key`; `Ok(None)` if it exists.
    async fn create(&self, key: &str, value: &[u8], lease: Option<&str>) -> Result<Option<u64>> {
        let (kind, _) = objects::locate(key);
        let body = objects::encode(&self.namespace, key, value, lease, None, None);
        match self
            .api
            .post(&objects::path(&self.namespace, kind, None), &body)
            .await
        {
            Ok(obj) => {
                let v = self.version_of("put", key, &obj)?;
                self.remember_status(key, v, &body);
                Ok(Some(v))
            }
            Err(ApiError::Conflict) => Ok(None),
            Err(e) => Err(self.unavailable("put", key, e)),
        }
    }

    /// Replaces `key` if it still has `version`; `Ok(None)` if not (or it is gone).
    async fn update(
        &self,
        key: &str,
        value: &[u8],
        lease: Option<&str>,
        version: u64,
    ) -> Result<Option<u64>> {
        let previous = self.status_at(key, version);
        let body = objects::encode(
            &self.namespace,
            key,
            value,
            lease,
            Some(version),
            previous.as_ref(),
        );
        match self.api.put(&self.object_path(key), &body).await {
            Ok(obj) => {
                let v = self.version_of("put", key, &obj)?;
                self.remember_status(key, v, &body);
                Ok(Some(v))
            }
            Err(ApiError::Conflict | ApiError::NotFound) => Ok(None),
            Err(e) => Err(self.unavailable("put", key, e)),
        }
    }

    fn version_of(&self, op: &'static str, key: &str, obj: &Value) -> Result<u64> {
        objects::resource_version(obj)
            .ok_or_else(|| self.unavailable(op, key, "answer without a resourceVersion"))
    }
}

#[async_trait]
impl Store for KubeStore {
    async fn get(&self, key: &str) -> Result<Option<Versioned>> {
        self.inner.read("get", key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>> {
        Ok(self.list_at(prefix).await?.0)
    }

    /// A prefix of several kinds is one list per kind, each at its own resourceVersion: the
    /// smallest is the one to watch from.
    async fn list_at(&self, prefix: &str) -> Result<(Vec<(String, Versioned)>, u64)> {
        let s = &self.inner;
        let mut out = Vec::new();
        let mut at: Option<u64> = None;
        for kind in objects::kinds_for_prefix(prefix) {
            let path = objects::path(&s.namespace, kind, None);
            let list = s
                .api
                .get(&path)
                .await
                .map_err(|e| s.unavailable("list", prefix, e))?;
            let rv = objects::resource_version(&list)
                .ok_or_else(|| s.unavailable("list", prefix, "list without a resourceVersion"))?;
            at = Some(at.map_or(rv, |a| a.min(rv)));
            for obj in list
                .get("items")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let (key, value, version) =
                    objects::decode(obj).map_err(|e| s.unavailable("list", prefix, e))?;
                s.remember_status(&key, version, obj);
                if key.starts_with(prefix) {
                    out.push((key, Versioned { value, version }));
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        let at = match at {
            Some(at) => at,
            // A prefix of no kind holds nothing; any revision will do.
            None => self.revision().await?,
        };
        Ok((out, at))
    }

    async fn put_with(
        &self,
        key: &str,
        value: Vec<u8>,
        expect: Expect,
        opts: &WriteOptions,
    ) -> Result<u64> {
        let s = &self.inner;
        s.check_fence("put", key, opts.fence.as_ref()).await?;
        let lease = match opts.lease {
            Some(l) => {
                leases::check_alive(s, l).await?;
                Some(leases::label(l))
            }
            None => None,
        };
        let lease = lease.as_deref();
        match expect {
            Expect::Absent => match s.create(key, &value, lease).await? {
                Some(v) => Ok(v),
                None => Err(Inner::conflict(key, expect, s.found("put", key).await?)),
            },
            Expect::Version(v) => match s.update(key, &value, lease, v).await? {
                Some(v) => Ok(v),
                None => Err(Inner::conflict(key, expect, s.found("put", key).await?)),
            },
            Expect::Any => {
                for _ in 0..MAX_ANY_ATTEMPTS {
                    let written = match s.found("put", key).await? {
                        None => s.create(key, &value, lease).await?,
                        Some(v) => s.update(key, &value, lease, v).await?,
                    };
                    if let Some(v) = written {
                        return Ok(v);
                    }
                }
                Err(s.unavailable(
                    "put",
                    key,
                    format!("lost {MAX_ANY_ATTEMPTS} races with other writers in a row"),
                ))
            }
        }
    }

    async fn delete_with(&self, key: &str, expect: Expect, opts: &WriteOptions) -> Result<()> {
        let s = &self.inner;
        s.check_fence("delete", key, opts.fence.as_ref()).await?;
        let precondition = match expect {
            Expect::Absent => {
                return match s.found("delete", key).await? {
                    None => Ok(()),
                    found => Err(Inner::conflict(key, expect, found)),
                }
            }
            Expect::Any => None,
            Expect::Version(v) => Some(v),
        };
        match s.api.delete(&s.object_path(key), precondition).await {
            Ok(()) => {
                s.statuses
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(key);
                Ok(())
            }
            Err(ApiError::NotFound) if precondition.is_none() => Ok(()),
            Err(ApiError::NotFound | ApiError::Conflict) => {
                Err(Inner::conflict(key, expect, s.found("delete", key).await?))
            }
            Err(e) => Err(s.unavailable("delete", key, e)),
        }
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        leases::grant(&self.inner, ttl).await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<()> {
        leases::keep_alive(&self.inner, lease).await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        leases::revoke(&self.inner, lease).await
    }

    async fn watch(&self, prefix: &str, after: u64) -> Result<Watch> {
        watch::start(&self.inner, prefix, after).await
    }

    async fn revision(&self) -> Result<u64> {
        // A list without a resourceVersion is a quorum read: its resourceVersion is etcd's
        // current revision.
        let s = &self.inner;
        let path = format!("{}?limit=1", objects::path(&s.namespace, &KINDS[0], None));
        let list = s
            .api
            .get(&path)
            .await
            .map_err(|e| s.unavailable("read revision", "", e))?;
        objects::resource_version(&list)
            .ok_or_else(|| s.unavailable("read revision", "", "list without a resourceVersion"))
    }

    fn describe(&self) -> String {
        self.inner.name.clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn urls_parse() {
        assert_eq!(KubeStoreUrl::parse("k8s://").unwrap().namespace, None);
        assert_eq!(
            KubeStoreUrl::parse("k8s://hawser-system/")
                .unwrap()
                .namespace
                .as_deref(),
            Some("hawser-system")
        );
        let u = KubeStoreUrl::parse("k8s://ns?kubeconfig=/tmp/kc").unwrap();
        assert_eq!(
            u.kubeconfig.as_deref(),
            Some(std::path::Path::new("/tmp/kc"))
        );
        for bad in [
            "etcd://a:1",
            "k8s://Hawser",
            "k8s://a/b",
            "k8s://-a",
            "k8s",
            "k8s://a?x=1",
            "k8s://a?kubeconfig=",
        ] {
            assert!(KubeStoreUrl::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            KubeStoreUrl::parse("etcd://a:1"),
            Err(KubeUrlError::Scheme {
                url: "etcd://a:1".into()
            })
        );
        assert_eq!(
            KubeStoreUrl::parse("k8s://a?x=1"),
            Err(KubeUrlError::Option {
                url: "k8s://a?x=1".into()
            })
        );
        let err = KubeStoreUrl::parse("k8s://Big").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#""Big" in "k8s://Big" is not a namespace name"#
        );
    }
}
