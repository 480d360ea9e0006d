//! Epoch grants made the controller's way, for tests that must open replica sessions
//! themselves (garbage after a good Hello): the fixture reads the cluster id from the
//! controller's store (its embedded file, or etcd) and signs with the cluster's grant key,
//! derived from the CA as the controller does (a plaintext cluster's is in the store), so
//! the replica server under test checks real grants with the real key.

use base64::Engine as _;
use hawser_store::{EmbeddedStore, EtcdStore, Store};
use hawser_testkit::etcd_process::SECURE_USER;
use hawser_wire::grant::{Grant, HelloRequest, GRANT_KEY_PURPOSE};

use crate::cluster::Cluster;

const CLUSTER_KEY: &str = "cluster/identity";

impl Cluster {
    /// The cluster record (`cluster/identity`) as JSON.
    fn cluster_record(&self) -> serde_json::Value {
        let bytes = match &self.etcd {
            Some(etcd) => {
                let cfg = etcd
                    .client_config("hawser", Some(SECURE_USER))
                    .expect("etcd client configuration");
                let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
                rt.block_on(async {
                    let store = EtcdStore::connect(cfg).await.expect("connect to etcd");
                    store
                        .get(CLUSTER_KEY)
                        .await
                        .expect("read the cluster record")
                })
                .expect("a cluster record in etcd")
                .value
            }
            None => {
                return embedded_cluster_record(&self.dir.path().join("controller"));
            }
        };
        serde_json::from_slice(&bytes).expect("cluster record JSON")
    }

    /// A grant for an engine of `volume` on `node` at `epoch`, signed with the cluster's key.
    pub fn grant(&self, volume: &str, node: &str, epoch: u64) -> Vec<u8> {
        let ca = (!self.insecure).then(|| self.tokens.ca());
        sign_grant(&self.cluster_record(), ca.as_ref(), volume, node, epoch)
    }

    /// The payload of a Hello to `replica` carrying [`Cluster::grant`].
    pub fn granted_hello(&self, replica: &str, volume: &str, node: &str, epoch: u64) -> Vec<u8> {
        HelloRequest {
            replica: replica.into(),
            grant: Some(self.grant(volume, node, epoch)),
        }
        .encode()
    }
}

/// The cluster record of the embedded store of the controller whose data dir is `dir`.
pub fn embedded_cluster_record(dir: &std::path::Path) -> serde_json::Value {
    let path = dir.join("store.json");
    let bytes = EmbeddedStore::read_file(&path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .remove(CLUSTER_KEY)
        .expect("a cluster record in the embedded store");
    serde_json::from_slice(&bytes).expect("cluster record JSON")
}

/// A grant signed with the key of the cluster `record` names: derived from `ca` (a TLS
/// cluster), else the one in the record.
pub fn sign_grant(
    record: &serde_json::Value,
    ca: Option<&hawser_tls::Ca>,
    volume: &str,
    node: &str,
    epoch: u64,
) -> Vec<u8> {
    let cluster = record["id"].as_str().expect("a cluster id");
    let key = match ca {
        Some(ca) => {
            assert!(
                record.get("grant_key").is_none(),
                "a TLS cluster's grant key is in its store: {record}"
            );
            let seed = ca
                .derive_secret(GRANT_KEY_PURPOSE, cluster)
                .expect("derive the grant key");
            ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed).expect("Ed25519 seed")
        }
        None => {
            let pkcs8 = base64::engine::general_purpose::STANDARD
                .decode(record["grant_key"].as_str().expect("a grant key"))
                .expect("base64 grant key");
            ring::signature::Ed25519KeyPair::from_pkcs8(&pkcs8).expect("Ed25519 key")
        }
    };
    let grant = Grant {
        cluster: cluster.into(),
        volume: volume.into(),
        node: node.into(),
        epoch,
        key_check: None,
    };
    let mut signed = grant.body().expect("grant body");
    signed.extend_from_slice(key.sign(&signed).as_ref());
    signed
}
