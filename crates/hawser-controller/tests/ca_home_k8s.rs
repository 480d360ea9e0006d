//! The cluster CA kept in a Kubernetes Secret (`--ca-secret`, the chart's way) through a
//! CA rotation, against a real kube-apiserver: the first controller makes the Secret and a
//! second loads the same CA; step 1 of a rotation puts both CAs in the Secret's `ca.pem`
//! (what the nodes' and the CSI driver's mounted file become) and in each controller's
//! `<data-dir>/ca.pem`; step 3 puts the new CA's certificate and key and the grant key's
//! root there, and a controller that starts afterwards loads the new CA with the first
//! CA's grant root. Fails if the Kubernetes binaries (scripts/k8s/build.sh) are missing.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use hawser_controller::ca_home::CaHome;
use hawser_controller::kube::Kube;
use hawser_tls::Ca;

const NS: &str = "hawser-test";
const SECRET: &str = "hc-ca";

fn home(kube: &Arc<Kube>, dir: &std::path::Path) -> CaHome {
    std::fs::create_dir_all(dir).unwrap();
    CaHome::Secret {
        kube: kube.clone(),
        namespace: NS.into(),
        name: SECRET.into(),
        data_dir: dir.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ca_secret_follows_a_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let (_api, kube) = crate::common::apiserver_with_namespace(&dir.path().join("k8s"), NS).await;
    let (a, b) = (
        home(&kube, &dir.path().join("a")),
        home(&kube, &dir.path().join("b")),
    );

    let first = a.load_or_create("x").await.unwrap();
    let old = first.ca;
    let again = b.load_or_create("x").await.unwrap();
    assert_eq!(again.ca.fingerprint(), old.fingerprint(), "one CA for both");
    assert_eq!(again.grant_root, first.grant_root);
    let secret = || async { kube.secret(NS, SECRET).await.unwrap().unwrap() };
    assert!(
        !secret().await.contains_key("grant-root.key"),
        "not before a rotation"
    );

    // Step 1: both CAs, in the Secret and beside each controller that applied it.
    let next = Ca::generate("y").unwrap();
    let both = format!("{}{}", old.cert_pem(), next.cert_pem());
    a.keep_trust(&old, &both).await.unwrap();
    assert_eq!(secret().await["ca.pem"], both);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a/ca.pem")).unwrap(),
        both
    );
    b.keep_trust(&old, &both).await.unwrap(); // the same edit again: no change, no error
    let restarted = b.load_or_create("x").await.unwrap();
    assert_eq!(
        restarted.ca.fingerprint(),
        old.fingerprint(),
        "the old CA issues still"
    );
    assert_eq!(restarted.trust_pem, both);

    // Step 3: the new CA, its key and the grant root; the old key is gone from the Secret.
    a.keep_new(&next, &first.grant_root).await.unwrap();
    let s = secret().await;
    assert_eq!(s["ca.pem"], next.cert_pem());
    assert_eq!(s["ca.key"], next.key_pem());
    assert!(s.contains_key("grant-root.key"));
    assert_ne!(s["ca.key"], old.key_pem());
    let c = home(&kube, &dir.path().join("c"));
    let after = c.load_or_create("x").await.unwrap();
    assert_eq!(after.ca.fingerprint(), next.fingerprint());
    assert_eq!(after.grant_root, first.grant_root, "the grant key stays");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("c/ca.pem")).unwrap(),
        next.cert_pem()
    );
}
