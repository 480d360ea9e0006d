//! The etcd v3 backend: every key lives under a prefix (default `/hawser/`), versions are
//! etcd's `mod_revision`, conditional writes are single transactions (compare, then put or
//! delete), and leases and watches are etcd's own.
//!
//! Every call has a deadline ([`EtcdConfig::request_timeout`]): while etcd is down a call
//! fails with [`StoreError::Unavailable`] naming the endpoints and the operation instead of
//! hanging, and the client reconnects by itself once etcd is back. Nothing is retried here:
//! a write whose answer was lost may or may not have happened, and only the caller knows
//! whether re-reading or retrying is right (compare-and-swap callers re-read).

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, Identity,
    KeyValue, PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::mpsc;

use crate::store::{
    Expect, Fence, LeaseId, Result, Store, StoreError, Versioned, Watch, WatchEvent, WriteOptions,
};

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "/hawser/";
/// Default deadline of one call.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Default deadline of a connection attempt.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Events a watcher may fall behind by before its stream is ended.
pub const MAX_WATCH_BACKLOG: usize = 4096;

/// Where the etcd cluster is and how to talk to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `http://host:port`, or `https://host:port` with [`Self::tls`], one per member.
    pub endpoints: Vec<String>,
    /// Prepended to every key; ends with `/`.
    pub prefix: String,
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// TLS to etcd; `None` is plaintext.
    pub tls: Option<EtcdTls>,
    /// etcd's own user and password authentication (with a client certificate, etcd takes
    /// the certificate's common name as the user instead).
    pub user: Option<EtcdUser>,
}

/// TLS to etcd: the CA whose certificates etcd's members present, and the certificate this
/// client presents (etcd's `--client-cert-auth`).
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca_pem: Vec<u8>,
    pub client: Option<EtcdIdentity>,
}

/// A client certificate and its private key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdIdentity {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

/// An etcd user and its password.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdUser {
    pub name: String,
    pub password: String,
}

// Keys and passwords never reach a log line through `{:?}`.
impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

impl std::fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Why a store URL is not an etcd one (`--store`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EtcdUrlError {
    #[error("{url:?} does not start with etcd://")]
    Scheme { url: String },
    #[error("endpoint {endpoint:?} in {url:?} is not host:port")]
    Endpoint { endpoint: String, url: String },
}

impl EtcdConfig {
    /// Parses `etcd://host:port[,host:port...][/prefix]`. The prefix defaults to `/hawser/`.
    pub fn parse(url: &str) -> std::result::Result<EtcdConfig, EtcdUrlError> {
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| EtcdUrlError::Scheme { url: url.into() })?;
        let (hosts, prefix) = match rest.split_once('/') {
            Some((h, p)) => (h, p.trim_matches('/')),
            None => (rest, ""),
        };
        let mut endpoints = Vec::new();
        for h in hosts.split(',') {
            let not_host_port = || EtcdUrlError::Endpoint {
                endpoint: h.into(),
                url: url.into(),
            };
            let (host, port) = h.rsplit_once(':').ok_or_else(not_host_port)?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(not_host_port());
            }
            endpoints.push(format!("http://{h}"));
        }
        let prefix = if prefix.is_empty() {
            DEFAULT_PREFIX.to_string()
        } else {
            format!("/{prefix}/")
        };
        Ok(EtcdConfig {
            endpoints,
            prefix,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            tls: None,
            user: None,
        })
    }

    /// Talks TLS to every endpoint (`https://`), checking etcd's certificates against `tls`.
    pub fn with_tls(mut self, tls: EtcdTls) -> EtcdConfig {
        for e in &mut self.endpoints {
            if let Some(rest) = e.strip_prefix("http://") {
                *e = format!("https://{rest}");
            }
        }
        self.tls = Some(tls);
        self
    }

    /// Whether every endpoint is a loopback address (`127.0.0.0/8`, `::1`, `localhost`):
    /// traffic that never leaves this host.
    pub fn all_loopback(&self) -> bool {
        self.endpoints.iter().all(|e| {
            let host_port = e.split_once("://").map_or(e.as_str(), |(_, r)| r);
            let host = host_port
                .rsplit_once(':')
                .map_or(host_port, |(h, _)| h)
                .trim_start_matches('[')
                .trim_end_matches(']');
            host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        })
    }

    fn connect_options(&self) -> ConnectOptions {
        let mut opts = ConnectOptions::new()
            .with_timeout(self.request_timeout)
            .with_connect_timeout(self.connect_timeout)
            .with_keep_alive(Duration::from_secs(2), self.request_timeout);
        if let Some(tls) = &self.tls {
            let mut t = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
            if let Some(id) = &tls.client {
                t = t.identity(Identity::from_pem(&id.cert_pem, &id.key_pem));
            }
            opts = opts.with_tls(t);
        }
        if let Some(u) = &self.user {
            // etcd's tokens expire (`--auth-token-ttl`, 5 minutes by default): take a new
            // one when a call is refused for an expired token.
            opts = opts
                .with_user(u.name.clone(), u.password.clone())
                .with_auto_token_refresh(true);
        }
        opts
    }
}

/// The etcd-backed store. Cheap to share: the client multiplexes one connection per member.
pub struct EtcdStore {
    client: Client,
    cfg: EtcdConfig,
    /// `endpoints` and prefix, for errors and logs.
    name: String,
}

impl EtcdStore {
    /// Creates the client. Without a user it connects lazily, so this succeeds while etcd is
    /// down and the first call then fails with `Unavailable`; with a user it must get a
    /// token first, so etcd has to answer within the request deadline.
    pub async fn connect(cfg: EtcdConfig) -> Result<EtcdStore> {
        let name = format!("etcd {} (prefix {})", cfg.endpoints.join(","), cfg.prefix);
        let unavailable = |reason: String| StoreError::Unavailable {
            endpoint: name.clone(),
            op: "connect",
            key: String::new(),
            reason,
        };
        let deadline = cfg.connect_timeout + cfg.request_timeout;
        let connect = Client::connect(&cfg.endpoints, Some(cfg.connect_options()));
        let client = match tokio::time::timeout(deadline, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(unavailable(e.to_string())),
            Err(_) => return Err(unavailable(format!("no answer within {deadline:?}"))),
        };
        Ok(EtcdStore { client, cfg, name })
    }

    fn full_key(&self, key: &str) -> String {
        format!("{}{key}", self.cfg.prefix)
    }

    fn unavailable(&self, op: &'static str, key: &str, reason: impl ToString) -> StoreError {
        StoreError::Unavailable {
            endpoint: self.name.clone(),
            op,
            key: key.into(),
            reason: reason.to_string(),
        }
    }

    /// Runs one etcd call under the request deadline, mapping its errors.
    async fn call<T>(
        &self,
        op: &'static str,
        key: &str,
        fut: impl std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.cfg.request_timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.unavailable(op, key, e)),
            Err(_) => Err(self.unavailable(
                op,
                key,
                format!("no answer within {:?}", self.cfg.request_timeout),
            )),
        }
    }

    /// A key-value from etcd as (relative key, versioned value).
    fn decode_kv(&self, op: &'static str, kv: &KeyValue) -> Result<(String, Versioned)> {
        let full = std::str::from_utf8(kv.key())
            .map_err(|_| self.unavailable(op, &format!("{:?}", kv.key()), "key is not UTF-8"))?;
        let key = full
            .strip_prefix(&self.cfg.prefix)
            .ok_or_else(|| self.unavailable(op, full, "key outside the prefix"))?;
        let version = revision(kv.mod_revision())
            .ok_or_else(|| self.unavailable(op, key, "etcd sent a revision <= 0"))?;
        let value = Versioned {
            value: kv.value().to_vec(),
            version,
        };
        Ok((key.to_string(), value))
    }

    /// The conditions of a conditional write of `key`, as etcd compares.
    fn compares(&self, key: &str, expect: Expect, fence: Option<&Fence>) -> Vec<Compare> {
        let mut cmps = Vec::new();
        match expect {
            Expect::Any => {}
            // A missing key compares as create_revision 0.
            Expect::Absent => cmps.push(Compare::create_revision(key, CompareOp::Equal, 0)),
            Expect::Version(v) => cmps.push(Compare::mod_revision(
                key,
                CompareOp::Equal,
                i64::try_from(v).unwrap_or(i64::MAX),
            )),
        }
        if let Some(f) = fence {
            cmps.push(Compare::mod_revision(
                self.full_key(&f.key),
                CompareOp::Equal,
                i64::try_from(f.version).unwrap_or(i64::MAX),
            ));
        }
        cmps
    }

    /// Runs `then` if `expect` and `fence` hold on `key`; on failure, reads both keys back to
    /// say which condition failed.
    async fn conditional(
        &self,
        op: &'static str,
        key: &str,
        expect: Expect,
        fence: Option<&Fence>,
        then: Vec<TxnOp>,
    ) -> Result<u64> {
        let full = self.full_key(key);
        let mut reads = vec![TxnOp::get(full.clone(), None)];
        if let Some(f) = fence {
            reads.push(TxnOp::get(self.full_key(&f.key), None));
        }
        let txn = Txn::new()
            .when(self.compares(&full, expect, fence))
            .and_then(then)
            .or_else(reads);
        let mut client = self.client.clone();
        let resp = self.call(op, key, client.txn(txn)).await?;
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        if resp.succeeded() {
            return revision(rev).ok_or_else(|| self.unavailable(op, key, "no revision"));
        }
        let mut found = Vec::new();
        for r in resp.op_responses() {
            let TxnOpResponse::Get(g) = r else {
                return Err(self.unavailable(op, key, "unexpected transaction answer"));
            };
            found.push(g.kvs().first().and_then(|kv| revision(kv.mod_revision())));
        }
        if let (Some(f), Some(&fence_found)) = (fence, found.get(1)) {
            if fence_found != Some(f.version) {
                return Err(StoreError::Fenced {
                    key: key.into(),
                    fence_key: f.key.clone(),
                    expected: f.version,
                    found: fence_found,
                });
            }
        }
        Err(StoreError::Conflict {
            key: key.into(),
            expected: expect,
            found: found.first().copied().flatten(),
        })
    }
}

/// Keys per range request of a list: a page of volume records stays well under a MiB.
const LIST_PAGE: i64 = 500;

/// The end of the range of every key that starts with `prefix` (etcd's own rule: the prefix
/// with its last byte below 0xff incremented, what follows dropped; `\0`, all keys, when
/// every byte is 0xff).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// An etcd revision as a version; revisions of existing keys are >= 1.
fn revision(r: i64) -> Option<u64> {
    u64::try_from(r).ok().filter(|&r| r > 0)
}

/// etcd refuses a put under (or a revoke of) a lease it no longer has with "requested lease
/// not found".
fn is_lease_not_found(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable { reason, .. } if reason.contains("lease not found"))
}

#[async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<Versioned>> {
        let mut client = self.client.clone();
        let resp = self
            .call("get", key, client.get(self.full_key(key), None))
            .await?;
        match resp.kvs().first() {
            None => Ok(None),
            Some(kv) => Ok(Some(self.decode_kv("get", kv)?.1)),
        }
    }

    /// The range in pages of [`LIST_PAGE`] keys, every page read at the first one's revision:
    /// one consistent snapshot, however large. One range of 10,000 volume records would pass
    /// the gRPC client's 4 MiB message limit, and would hold etcd to one large reply.
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>> {
        Ok(self.list_at(prefix).await?.0)
    }

    async fn list_at(&self, prefix: &str) -> Result<(Vec<(String, Versioned)>, u64)> {
        let mut client = self.client.clone();
        let full = self.full_key(prefix);
        let end = prefix_end(full.as_bytes());
        let mut from = full.into_bytes();
        let mut at_revision = 0;
        let mut out = Vec::new();
        loop {
            let mut opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(LIST_PAGE);
            if at_revision > 0 {
                opts = opts.with_revision(at_revision);
            }
            let resp = self
                .call("list", prefix, client.get(from.clone(), Some(opts)))
                .await?;
            if at_revision == 0 {
                at_revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            }
            // etcd answers a range sorted by key.
            for kv in resp.kvs() {
                out.push(self.decode_kv("list", kv)?);
            }
            match resp.kvs().last() {
                Some(last) if resp.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok((out, u64::try_from(at_revision).unwrap_or(0))),
            }
        }
    }

    async fn put_with(
        &self,
        key: &str,
        value: Vec<u8>,
        expect: Expect,
        opts: &WriteOptions,
    ) -> Result<u64> {
        let put_opts = opts.lease.map(|l| PutOptions::new().with_lease(l));
        let then = vec![TxnOp::put(self.full_key(key), value, put_opts)];
        self.conditional("put", key, expect, opts.fence.as_ref(), then)
            .await
            .map_err(|e| match opts.lease {
                Some(lease) if is_lease_not_found(&e) => StoreError::LeaseExpired { lease },
                _ => e,
            })
    }

    async fn delete_with(&self, key: &str, expect: Expect, opts: &WriteOptions) -> Result<()> {
        // Under Absent the key is missing when the condition holds: nothing to delete.
        let then = match expect {
            Expect::Absent => vec![],
            Expect::Any | Expect::Version(_) => {
                vec![TxnOp::delete(self.full_key(key), None::<DeleteOptions>)]
            }
        };
        self.conditional("delete", key, expect, opts.fence.as_ref(), then)
            .await?;
        Ok(())
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let secs = i64::try_from(secs.max(1)).unwrap_or(i64::MAX);
        let mut client = self.client.clone();
        let resp = self
            .call("grant lease", "", client.lease_grant(secs, None))
            .await?;
        Ok(resp.id())
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<()> {
        let mut client = self.client.clone();
        // Opening the keep-alive stream sends one renewal and waits for its answer (an
        // expired lease answers TTL 0, which the client reports as "lease not found").
        let fut = async move { client.lease_keep_alive(lease).await.map(|_| ()) };
        self.call("keep lease alive", "", fut).await.map_err(|e| {
            if is_lease_not_found(&e) {
                StoreError::LeaseExpired { lease }
            } else {
                e
            }
        })
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        let mut client = self.client.clone();
        match self
            .call("revoke lease", "", client.lease_revoke(lease))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_lease_not_found(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn watch(&self, prefix: &str, after: u64) -> Result<Watch> {
        let start = i64::try_from(after.saturating_add(1)).unwrap_or(i64::MAX);
        let opts = WatchOptions::new().with_prefix().with_start_revision(start);
        let mut client = self.client.clone();
        let stream = self
            .call(
                "watch",
                prefix,
                client.watch(self.full_key(prefix), Some(opts)),
            )
            .await?;
        let (tx, rx) = mpsc::channel(MAX_WATCH_BACKLOG);
        let feeder = WatchFeeder {
            prefix: self.cfg.prefix.clone(),
            name: self.name.clone(),
            watched: prefix.to_string(),
            after,
            tx,
        };
        let task = tokio::spawn(feeder.run(stream));
        Ok(Watch::new(rx, Some(task.abort_handle())))
    }

    async fn revision(&self) -> Result<u64> {
        let mut client = self.client.clone();
        let opts = GetOptions::new().with_count_only();
        let resp = self
            .call(
                "read revision",
                "",
                client.get(self.full_key(""), Some(opts)),
            )
            .await?;
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        Ok(u64::try_from(rev).unwrap_or(0))
    }

    fn describe(&self) -> String {
        self.name.clone()
    }
}

/// Turns an etcd watch stream into [`WatchEvent`]s on a channel.
struct WatchFeeder {
    prefix: String,
    name: String,
    watched: String,
    after: u64,
    tx: mpsc::Sender<Result<WatchEvent>>,
}

impl WatchFeeder {
    async fn run(self, mut stream: etcd_client::WatchStream) {
        loop {
            let msg = match stream.message().await {
                Ok(Some(m)) => m,
                Ok(None) => return,
                Err(e) => {
                    let _ = self.tx.send(Err(self.error(e.to_string()))).await;
                    return;
                }
            };
            if msg.canceled() {
                let err = if msg.compact_revision() > 0 {
                    StoreError::Compacted {
                        prefix: self.watched.clone(),
                        after: self.after,
                        oldest: u64::try_from(msg.compact_revision()).unwrap_or(0),
                    }
                } else {
                    self.error(format!("watch canceled: {}", msg.cancel_reason()))
                };
                let _ = self.tx.send(Err(err)).await;
                return;
            }
            for ev in msg.events() {
                let Some(event) = self.decode(ev) else {
                    let _ = self
                        .tx
                        .send(Err(self.error("undecodable event".into())))
                        .await;
                    return;
                };
                if self.tx.send(Ok(event)).await.is_err() {
                    return;
                }
            }
        }
    }

    fn error(&self, reason: String) -> StoreError {
        StoreError::Unavailable {
            endpoint: self.name.clone(),
            op: "watch",
            key: self.watched.clone(),
            reason,
        }
    }

    /// An etcd event as a [`WatchEvent`]; `None` for anything malformed (never panics: the
    /// client's own `event_type()` does on unknown types).
    fn decode(&self, ev: &etcd_client::Event) -> Option<WatchEvent> {
        let kv = ev.0.kv.as_ref()?;
        let key = std::str::from_utf8(&kv.key)
            .ok()?
            .strip_prefix(&self.prefix)?
            .to_string();
        let rev = revision(kv.mod_revision)?;
        match ev.0.r#type {
            0 => Some(WatchEvent::Put {
                key,
                value: Versioned {
                    value: kv.value.clone(),
                    version: rev,
                },
            }),
            1 => Some(WatchEvent::Delete { key, revision: rev }),
            _ => None,
        }
    }
}
