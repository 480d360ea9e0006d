//! The node's identity in a TLS cluster (issue 16.a): its key and certificate, got by
//! joining with a one-time join token and renewed with the current certificate, kept in
//! `<data-dir>/tls/` (`node.key` mode 0600, `node.pem`, `ca.pem`).
//!
//! The key and the certificate are replaced together in one rename
//! (`hawser_tls::NODE_IDENTITY`: both in a new `identity-<n>/`, the `identity` link renamed
//! over, `node.pem` and `node.key` links into it), because the CSI node plugin and every
//! start read them as a pair: a crash or a full disk between two renames used to leave a key
//! beside a certificate it does not belong to, and a node that could only join again. A
//! start that finds such a cut from an older build keeps the pair that belongs together.
//! `ca.pem` stays a file of its own: a heartbeat answer replaces it alone (a CA rotation).
//!
//! A joining node knows the CA only by the fingerprint in its join token: it accepts a
//! controller only if the controller's chain holds that CA, so the token is never sent to
//! an impostor. The key is made on the node and never leaves it; the controller signs its
//! public half.
//!
//! Each of the agent's TLS listeners gets its policy here, once, from its own function; no
//! listener borrows another's configuration (one did, and NBD served clients without a
//! certificate when the admin API began to take them for Prometheus):
//!
//! | listener | client certificate at the handshake | then |
//! |---|---|---|
//! | admin API ([`NodeTls::admin_server`]) | optional | the controller's certificate for every route; the metrics token for `GET /metrics` only (`admin_api`) |
//! | replica port ([`NodeTls::replica_server`]) | required | a node's certificate, and sessions only for grants naming that node (`replica::server`) |
//! | NBD over TCP ([`NodeTls::nbd_server`]) | required | only the exports an NBD client certificate names (`nbd_handshake::Access`) |

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use hawser_api::auth::digest_hex as hex;
use hawser_api::controller::{
    ClusterCa, JoinNode, NodeCertificate, NodeTlsReport, RenewCertificate,
};
use hawser_tls::rustls::{ClientConfig, ServerConfig};
use hawser_tls::{CertSlot, ClientAuth, Credentials, JoinToken, Peer, TrustSlot, NODE_IDENTITY};

const CA_FILE: &str = "ca.pem";

pub struct NodeTls {
    node: String,
    /// Names and addresses clients dial this node by, in its certificate
    /// (`hawser_tls::server_names`).
    names: Vec<String>,
    /// The saved certificate lacks some of `names` (new addresses, or made before nodes'
    /// certificates had them): renew at once rather than at two thirds of its life.
    renew_now: bool,
    dir: PathBuf,
    /// The CAs this node accepts peers of: the cluster's, and during a CA rotation the one
    /// replacing it (`ClusterCa` in heartbeat answers).
    trust: Arc<TrustSlot>,
    slot: Arc<CertSlot>,
    /// Wakes the renewal at once: the cluster's CA that issues now is not the one that issued
    /// this node's certificate (step 2 of a CA rotation).
    renew_wake: tokio::sync::Notify,
    /// Client configurations for the replica ports of other nodes (each accepts that node).
    to_nodes: std::sync::Mutex<std::collections::HashMap<String, Arc<ClientConfig>>>,
}

/// What a node without a certificate joins with.
pub struct JoinWith<'a> {
    /// A join token (`hawser cluster join-token`): the CA is known by its fingerprint.
    pub join_token_file: Option<&'a Path>,
    /// Else the cluster's agent token with the CA's certificate (the Helm chart's way:
    /// every node gets the same Secret).
    pub agent_token_file: Option<&'a Path>,
    pub ca_file: Option<&'a Path>,
}

/// A joining node's credential and how it knows the controller's CA.
struct Bootstrap {
    token: String,
    ca: KnownCa,
}

enum KnownCa {
    Fingerprint([u8; 32]),
    Pem(String),
}

impl KnownCa {
    /// The CAs it names.
    fn fingerprints(&self) -> anyhow::Result<Vec<[u8; 32]>> {
        Ok(match self {
            KnownCa::Fingerprint(f) => vec![*f],
            KnownCa::Pem(pem) => hawser_tls::certs_from_pem(pem)?
                .iter()
                .map(|c| hawser_tls::ca_fingerprint(c))
                .collect(),
        })
    }
}

impl JoinWith<'_> {
    fn bootstrap(&self) -> anyhow::Result<Bootstrap> {
        let read = |p: &Path, what: &str| {
            std::fs::read_to_string(p).with_context(|| format!("read the {what} {}", p.display()))
        };
        if let Some(path) = self.join_token_file {
            let text = read(path, "join token")?;
            let token = JoinToken::parse(&text).with_context(|| {
                format!("{} does not hold a join token (hjt1.…)", path.display())
            })?;
            return Ok(Bootstrap {
                token: token.to_string(),
                ca: KnownCa::Fingerprint(token.ca_sha256),
            });
        }
        match (self.agent_token_file, self.ca_file) {
            (Some(token), Some(ca)) => Ok(Bootstrap {
                token: hawser_api::auth::read_token_file(token)
                    .with_context(|| format!("read the agent token {}", token.display()))?,
                ca: KnownCa::Pem(read(ca, "cluster CA")?),
            }),
            _ => anyhow::bail!(
                "this node has no certificate yet: give it a join token (--join-token-file; \
                 `hawser cluster join-token` makes one), or the agent token and the cluster's \
                 CA (--token-file and --ca-file)"
            ),
        }
    }
}

impl NodeTls {
    /// The node's certificate from `<data_dir>/tls`, or a new one got by joining through
    /// `controllers` (comma-separated URLs) with what `with` names; valid for `names`.
    pub async fn load_or_join(
        data_dir: &Path,
        node: &str,
        names: Vec<String>,
        controllers: &str,
        with: &JoinWith<'_>,
    ) -> anyhow::Result<NodeTls> {
        let dir = data_dir.join("tls");
        let ca_file = dir.join(CA_FILE);
        // Without the CAs it trusts a node cannot check a controller: it joins again.
        let saved = saved_identity(&dir)?.filter(|_| ca_file.exists());
        let tls = match (saved, stale_identity(&dir, &ca_file, with)?) {
            (Some(creds), None) => load_saved(dir, creds, &ca_file, node, names)?,
            (Some(creds), Some(bootstrap)) => {
                tracing::warn!(dir = %dir.display(), "the bootstrap names a CA this node does not trust (the cluster's CA was rotated while it was away?): joining again");
                match join(&dir, node, names.clone(), controllers, &bootstrap).await {
                    Ok(t) => t,
                    Err(e) => {
                        // A stale bootstrap beside a current identity (an old join token
                        // file): the saved identity is the one that works.
                        tracing::warn!(error = %format!("{e:#}"), "could not join again; keeping the saved certificate");
                        load_saved(dir, creds, &ca_file, node, names)?
                    }
                }
            }
            (None, _) => join(&dir, node, names, controllers, &with.bootstrap()?).await?,
        };
        anyhow::ensure!(
            tls.slot.peer() == Peer::Node(node.into()),
            "the certificate in {} is {}'s, not node {node}'s",
            tls.dir.display(),
            tls.slot.peer()
        );
        Ok(tls)
    }

    /// Presents this node's certificate; accepts only the cluster's controllers.
    pub fn controller_client(&self) -> anyhow::Result<Arc<ClientConfig>> {
        hawser_tls::client_config_trusting(&self.trust, Peer::Controller, Some(self.slot.clone()))
    }

    /// The admin API. A client certificate is optional at the handshake so that Prometheus
    /// can scrape `/metrics` with the metrics token alone; every other route admits the
    /// controller's certificate and nothing else (`admin_api::require_token`), so a client
    /// without one gets a 403 there.
    pub fn admin_server(&self) -> anyhow::Result<Arc<ServerConfig>> {
        hawser_tls::server_config_trusting(&self.trust, self.slot.clone(), ClientAuth::Optional)
    }

    /// The replica port: only clients with a node certificate of the cluster get in (the
    /// server then opens sessions only for grants naming that node).
    pub fn replica_server(&self) -> anyhow::Result<Arc<ServerConfig>> {
        hawser_tls::server_config_trusting(&self.trust, self.slot.clone(), ClientAuth::Required)
    }

    /// NBD over TCP: a client without a certificate of the cluster gets no handshake; with
    /// one, it opens only the exports its certificate names (`hawser volume client-cert`).
    pub fn nbd_server(&self) -> anyhow::Result<Arc<ServerConfig>> {
        hawser_tls::server_config_trusting(&self.trust, self.slot.clone(), ClientAuth::Required)
    }

    /// Presents this node's certificate to `node`'s replica port and accepts only `node`.
    pub fn replica_client(&self, node: &str) -> anyhow::Result<Arc<ClientConfig>> {
        let mut map = self.to_nodes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(node) {
            return Ok(c.clone());
        }
        let c = hawser_tls::client_config_trusting(
            &self.trust,
            Peer::Node(node.into()),
            Some(self.slot.clone()),
        )?;
        map.insert(node.into(), c.clone());
        Ok(c)
    }

    /// Renews the certificate at two thirds of its life, forever; a failed renewal is
    /// retried every minute (the old certificate stays valid meanwhile).
    pub async fn renew_forever(self: Arc<Self>, controllers: String) {
        let mut first = true;
        loop {
            if !(first && self.renew_now) {
                tokio::select! {
                    () = tokio::time::sleep(self.slot.renew_in()) => {}
                    () = self.renew_wake.notified() => {
                        tracing::info!("renewing the node's certificate now: the cluster's CA that issues is another one");
                    }
                }
            } else {
                tracing::info!(names = ?self.names, "renewing the node's certificate now: it lacks some of the names this node is dialled by");
            }
            first = false;
            loop {
                match self.renew(&controllers).await {
                    Ok(()) => {
                        tracing::info!("renewed the node's certificate");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"), "cannot renew the node's certificate; retrying in a minute");
                        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
                    }
                }
            }
        }
    }

    async fn renew(&self, controllers: &str) -> anyhow::Result<()> {
        let (key_pem, spki) = hawser_tls::new_key()?;
        let body = RenewCertificate {
            public_key: b64(&spki),
            names: self.names.clone(),
        };
        let path = format!("/v1/nodes/{}/certificate", self.node);
        let cert: NodeCertificate =
            post_any(controllers, self.controller_client()?, &path, &body).await?;
        let creds = Credentials {
            chain_pem: cert.chain_pem,
            key_pem,
        };
        // Check before writing: a bad answer must not replace a working certificate.
        CertSlot::new(&creds)?;
        save(&self.dir, &creds, &self.trust.pem())?;
        self.slot.replace(&creds)
    }

    /// What this node reports of its CAs with each heartbeat.
    pub fn report(&self) -> NodeTlsReport {
        NodeTlsReport {
            trusts_sha256: self.trust.fingerprints().iter().map(hex).collect(),
            issuer_sha256: self.slot.issuer().map(|f| hex(&f)).unwrap_or_default(),
        }
    }

    /// Takes what a heartbeat answer says of the cluster's CAs (from a controller this node
    /// authenticated with the CAs it trusts): trusts them, and renews at once if another CA
    /// issues now.
    pub fn learn(&self, ca: &ClusterCa) {
        match self.trust.replace(&ca.trust_pem) {
            Ok(false) => {}
            Ok(true) => {
                if let Err(e) = write_replace(&self.dir.join(CA_FILE), &ca.trust_pem, 0o644) {
                    tracing::error!(error = %format!("{e:#}"), "cannot keep the cluster's CAs");
                }
                tracing::info!(
                    cas = self.trust.fingerprints().len(),
                    "trusting the cluster's CAs as the controller says (a CA rotation)"
                );
            }
            Err(e) => {
                return tracing::error!(error = %format!("{e:#}"), "heartbeat answer with unusable CAs ignored");
            }
        }
        let mine = self.slot.issuer().map(|f| hex(&f)).unwrap_or_default();
        if ca.issuer_sha256 != mine {
            self.renew_wake.notify_one();
        }
    }
}

/// The node's saved key and certificate, whole: an older build's cut save is recovered to
/// the pair that belongs together (`hawser_tls::NODE_IDENTITY`'s rules). `None` if there is
/// none, or only a key: a first join cut short before its certificate was written leaves
/// nothing to keep, and the node joins again as it always did.
fn saved_identity(dir: &Path) -> anyhow::Result<Option<Credentials>> {
    match NODE_IDENTITY.recover(dir) {
        Ok(found) => Ok(found),
        Err(e) if !e.found_a_certificate() => {
            tracing::warn!(error = %e, "no saved certificate, only the start of one: joining");
            Ok(None)
        }
        Err(e) => Err(e).context("read the node's saved key and certificate"),
    }
}

/// The node with its saved key and certificate (`creds`) and trusted CAs (`ca_file`).
fn load_saved(
    dir: PathBuf,
    creds: Credentials,
    ca_file: &Path,
    node: &str,
    names: Vec<String>,
) -> anyhow::Result<NodeTls> {
    let read =
        |p: &Path| std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()));
    let slot = CertSlot::new(&creds)
        .with_context(|| format!("the node certificate in {}", dir.display()))?;
    let has = hawser_tls::cert_names(&creds.chain_pem).unwrap_or_default();
    let renew_now = names.iter().any(|n| !has.contains(n));
    let trust = TrustSlot::from_pem(&read(ca_file)?)
        .with_context(|| format!("the trusted CAs in {}", dir.display()))?;
    Ok(NodeTls {
        node: node.into(),
        names,
        renew_now,
        trust,
        dir,
        slot,
        renew_wake: Default::default(),
        to_nodes: Default::default(),
    })
}

/// The bootstrap to join again with, if the node's saved identity is of a CA that the
/// bootstrap it was started with does not name: its CA was rotated while it was away (a
/// join token pins the new CA; the chart's `ca.pem` holds it). `None` keeps the saved one.
fn stale_identity(
    dir: &Path,
    ca_file: &Path,
    with: &JoinWith<'_>,
) -> anyhow::Result<Option<Bootstrap>> {
    if !ca_file.exists() || (with.join_token_file.is_none() && with.ca_file.is_none()) {
        return Ok(None);
    }
    let Ok(bootstrap) = with.bootstrap() else {
        return Ok(None);
    };
    let saved =
        std::fs::read_to_string(ca_file).with_context(|| format!("read {}", ca_file.display()))?;
    let trusted: Vec<[u8; 32]> = hawser_tls::certs_from_pem(&saved)
        .with_context(|| format!("the trusted CAs in {}", dir.display()))?
        .iter()
        .map(|c| hawser_tls::ca_fingerprint(c))
        .collect();
    let named = bootstrap.ca.fingerprints()?;
    Ok((!named.iter().any(|f| trusted.contains(f))).then_some(bootstrap))
}

async fn join(
    dir: &Path,
    node: &str,
    names: Vec<String>,
    controllers: &str,
    with: &Bootstrap,
) -> anyhow::Result<NodeTls> {
    let (key_pem, spki) = hawser_tls::new_key()?;
    let body = JoinNode {
        node: node.into(),
        token: with.token.clone(),
        public_key: b64(&spki),
        names: names.clone(),
    };
    let first_der = |pem: &str| -> anyhow::Result<Vec<u8>> {
        Ok(hawser_tls::certs_from_pem(pem)?
            .into_iter()
            .next()
            .context("no certificate in the CA's PEM")?
            .to_vec())
    };
    let config = match &with.ca {
        KnownCa::Fingerprint(f) => hawser_tls::pinned_client_config(*f)?,
        KnownCa::Pem(pem) => hawser_tls::client_config(pem, Peer::Controller, None)?,
    };
    let cert: NodeCertificate = post_any(controllers, config, "/v1/join", &body)
        .await
        .context("join the cluster")?;
    // The CA that issued (first) must be one this node was told of; the one beside it during
    // a rotation comes over the channel that CA authenticated.
    anyhow::ensure!(
        with.ca
            .fingerprints()?
            .contains(&hawser_tls::ca_fingerprint(&first_der(&cert.ca_pem)?)),
        "the controller sent a CA other than the one this node trusts"
    );
    let creds = Credentials {
        chain_pem: cert.chain_pem,
        key_pem,
    };
    let slot = CertSlot::new(&creds)?;
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    save(dir, &creds, &cert.ca_pem)?;
    tracing::info!(%node, dir = %dir.display(), "joined the cluster: certificate saved");
    Ok(NodeTls {
        node: node.into(),
        names,
        renew_now: false,
        dir: dir.into(),
        trust: TrustSlot::from_pem(&cert.ca_pem).context("the CAs the controller sent")?,
        slot,
        renew_wake: Default::default(),
        to_nodes: Default::default(),
    })
}

/// POSTs `body` to each controller in turn until one answers 2xx.
async fn post_any<B: serde::Serialize, R: serde::de::DeserializeOwned>(
    controllers: &str,
    config: Arc<ClientConfig>,
    path: &str,
    body: &B,
) -> anyhow::Result<R> {
    let http = reqwest::Client::builder()
        .use_preconfigured_tls((*config).clone())
        .timeout(std::time::Duration::from_secs(20))
        .build()
        .context("build the HTTP client")?;
    let mut last = None;
    for base in controllers
        .split(',')
        .map(|u| u.trim().trim_end_matches('/'))
    {
        if base.is_empty() {
            continue;
        }
        let url = format!("{base}{path}");
        match http.post(&url).json(body).send().await {
            Ok(r) if r.status().is_success() => {
                return r
                    .json()
                    .await
                    .with_context(|| format!("read the answer of {url}"))
            }
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                let message = serde_json::from_str::<hawser_api::ApiError>(&text)
                    .map(|e| e.message)
                    .unwrap_or(text);
                last = Some(anyhow::anyhow!("{url}: {status}: {message}"));
            }
            Err(e) => {
                last = Some(anyhow::anyhow!(
                    "{url}: {}",
                    hawser_api::error::error_chain(&e)
                ))
            }
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no controller URL")))
}

/// Writes the key and certificate in one step, then the CAs. A cut between the two leaves
/// the new pair beside the CAs trusted before, which a renewal rewrites unchanged; after a
/// first join there are none yet, and the next start joins again.
fn save(dir: &Path, creds: &Credentials, ca_pem: &str) -> anyhow::Result<()> {
    NODE_IDENTITY
        .save(dir, creds)
        .context("save the node's key and certificate")?;
    write_replace(&dir.join(CA_FILE), ca_pem, 0o644)
}

fn write_replace(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    let tmp = path.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("create {}", tmp.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.sync_all())
        .with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replace {}", path.display()))?;
    if let Some(d) = path.parent() {
        if let Ok(d) = std::fs::File::open(d) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node `n1`'s pair from a certificate of `secs` seconds (so that tests tell pairs apart
    /// by when they expire).
    fn pair(ca: &hawser_tls::Ca, secs: u64) -> Credentials {
        let (issued, key_pem) = ca
            .issue_with_key(
                &Peer::Node("n1".into()),
                std::time::Duration::from_secs(secs),
            )
            .expect("issue");
        Credentials {
            chain_pem: issued.chain_pem,
            key_pem,
        }
    }

    /// An older build's TLS directory in `data/tls`: `ca.pem` and `files`, plain files.
    fn older_build(data: &Path, ca: &hawser_tls::Ca, files: &[(&str, &str)]) {
        let dir = data.join("tls");
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join(CA_FILE), ca.cert_pem()).expect("ca");
        for (name, text) in files {
            std::fs::write(dir.join(name), text).expect("write");
        }
    }

    /// The agent's start with what it saved: no controller is reached.
    async fn start(data: &Path) -> anyhow::Result<NodeTls> {
        let none = JoinWith {
            join_token_file: None,
            agent_token_file: None,
            ca_file: None,
        };
        NodeTls::load_or_join(data, "n1", vec![], "https://127.0.0.1:9", &none).await
    }

    fn expires(creds: &Credentials) -> u64 {
        hawser_tls::not_after_unix(&creds.chain_pem).expect("expiry")
    }

    /// After a recovered start the directory holds the pair whole, and starts again.
    async fn whole_again(data: &Path, kept: &Credentials) {
        let dir = data.join("tls");
        assert!(
            !dir.join("node.new").exists(),
            "the older build's half is gone"
        );
        let link = std::fs::read_link(dir.join("node.pem")).expect("node.pem is a link");
        assert_eq!(link, Path::new("identity/node.pem"));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("read");
        assert_eq!(
            (read("node.pem"), read("node.key")),
            (kept.chain_pem.clone(), kept.key_pem.clone())
        );
        let again = start(data).await.expect("starts again");
        assert_eq!(again.slot.not_after_unix(), expires(kept));
    }

    /// Which pair a start after an older build's renewal cut must take.
    #[derive(Clone, Copy, Debug)]
    enum Keeps {
        Old,
        New,
    }

    /// An older build's renewal, cut: `files` says what it left in node.key, node.pem and
    /// node.new, from the old pair and the new. A start takes the pair `keeps` names and
    /// leaves it whole.
    async fn after_a_renewal_cut(
        files: for<'a> fn(&'a Credentials, &'a Credentials) -> [&'a str; 3],
        keeps: Keeps,
    ) {
        let ca = hawser_tls::Ca::generate("c").expect("ca");
        let (old, new) = (pair(&ca, 3600), pair(&ca, 7200));
        let [key, pem, next] = files(&old, &new);
        let data = tempfile::tempdir().expect("dir");
        older_build(
            data.path(),
            &ca,
            &[("node.key", key), ("node.pem", pem), ("node.new", next)],
        );
        let tls = start(data.path()).await.expect("starts");
        let kept = match keeps {
            Keeps::Old => &old,
            Keeps::New => &new,
        };
        assert_eq!(tls.slot.not_after_unix(), expires(kept), "{keeps:?}");
        whole_again(data.path(), kept).await;
    }

    #[tokio::test]
    async fn a_renewal_cut_between_key_and_certificate_starts_with_the_pair_that_matches() {
        // An older build renamed the new key over node.key, wrote the new certificate to
        // node.new and died (or found the disk full) before renaming it over node.pem.
        after_a_renewal_cut(
            |old, new| [&new.key_pem, &old.chain_pem, &new.chain_pem],
            Keeps::New,
        )
        .await;
    }

    #[tokio::test]
    async fn a_renewal_cut_leaving_the_new_certificate_beside_the_old_key_starts_with_the_new_pair()
    {
        // The other half: node.pem is the new certificate, node.key still the old key, the
        // new key left in node.new (its rename lost: the older build ignored a failed
        // directory sync).
        after_a_renewal_cut(
            |old, new| [&old.key_pem, &new.chain_pem, &new.key_pem],
            Keeps::New,
        )
        .await;
    }

    #[tokio::test]
    async fn a_renewal_cut_before_the_key_was_renamed_starts_with_the_old_pair() {
        after_a_renewal_cut(
            |old, new| [&old.key_pem, &old.chain_pem, &new.key_pem],
            Keeps::Old,
        )
        .await;
    }

    #[tokio::test]
    async fn a_cut_that_leaves_no_pair_refuses_naming_the_files_and_what_to_do() {
        let ca = hawser_tls::Ca::generate("c").expect("ca");
        let (old, new) = (pair(&ca, 3600), pair(&ca, 7200));
        let data = tempfile::tempdir().expect("dir");
        let files = [("node.key", &*new.key_pem), ("node.pem", &*old.chain_pem)];
        older_build(data.path(), &ca, &files);
        let e = format!("{:#}", start(data.path()).await.err().expect("refused"));
        for want in [
            "node.key: a private key",
            "node.pem: 2 certificate(s)",
            "join-token",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
        // Nothing was changed: the files stay for whoever looks.
        assert!(data
            .path()
            .join("tls/node.pem")
            .symlink_metadata()
            .is_ok_and(|m| m.is_file()));
    }

    #[tokio::test]
    async fn a_first_join_cut_before_its_certificate_joins_again() {
        // A key alone: the node joins again as before (here without a bootstrap, so the
        // start says what it needs to join).
        let ca = hawser_tls::Ca::generate("c").expect("ca");
        let data = tempfile::tempdir().expect("dir");
        older_build(data.path(), &ca, &[("node.key", &pair(&ca, 60).key_pem)]);
        let e = format!("{:#}", start(data.path()).await.err().expect("no identity"));
        assert!(e.contains("no certificate yet"), "{e}");
    }
}
