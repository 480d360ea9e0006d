//! The volumes' key-encryption keys on Kubernetes (volume_keys/shared.rs), against a real
//! kube-apiserver: two controllers with data directories of their own share the keys through
//! one Secret; a controller whose directory is new (a restarted pod) opens what another
//! wrapped; concurrent rotations both land; a Secret deleted by mistake is put back from a
//! controller's copies; a key file that differs from the Secret's is refused, naming both.
//! Fails if the Kubernetes binaries (scripts/k8s/build.sh) are missing.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use crate::common::kubectl;
use hawser_controller::kube::Kube;
use hawser_controller::volume_keys::{KekSecret, Keks};

const NS: &str = "hawser-test";
const SECRET: &str = "hc-ca-volume-keys";

fn keks(kube: &Arc<Kube>, dir: &std::path::Path) -> Keks {
    Keks::with_secret(
        dir,
        KekSecret {
            kube: kube.clone(),
            namespace: NS.into(),
            name: SECRET.into(),
        },
    )
}

/// The KEK items the Secret holds.
async fn items(kube: &Kube) -> Vec<String> {
    let mut names: Vec<String> = kube
        .secret(NS, SECRET)
        .await
        .unwrap()
        .map(|d| d.into_keys().collect())
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_share_key_encryption_keys_through_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let (api, kube) = crate::common::apiserver_with_namespace(&dir.path().join("k8s"), NS).await;
    let a = keks(&kube, &dir.path().join("a"));

    // A start makes nothing; the first encrypted volume makes key 1, in the Secret first.
    a.sync().await.unwrap();
    assert!(kube.secret(NS, SECRET).await.unwrap().is_none());
    assert_eq!(a.ready().await.unwrap(), 1);
    assert_eq!(items(&kube).await, ["kek-1"]);
    let (key, wrapped) = a.new_data_key("v").unwrap();

    // Another controller, its data directory new: it fetches key 1 and opens the data key.
    let b = keks(&kube, &dir.path().join("b"));
    assert!(b.unwrap("v", &wrapped).is_err(), "not fetched yet");
    b.fetch(1).await.unwrap();
    assert_eq!(b.unwrap("v", &wrapped).unwrap(), key);

    // It rotates; the first fetches key 2 and re-wraps, the second opens that.
    assert_eq!(b.rotate().await.unwrap(), 2);
    a.fetch(2).await.unwrap();
    let rewrapped = a.rewrap("v", &wrapped).unwrap();
    assert_eq!(rewrapped.kek, 2);
    assert_eq!(b.unwrap("v", &rewrapped).unwrap(), key);

    // Concurrent rotations both land, as different keys.
    let (x, y) = tokio::join!(a.rotate(), b.rotate());
    let mut made = [x.unwrap(), y.unwrap()];
    made.sort_unstable();
    assert_eq!(made, [3, 4]);
    assert_eq!(items(&kube).await, ["kek-1", "kek-2", "kek-3", "kek-4"]);

    // The Secret deleted by mistake: the controllers' starts put their copies back (each has
    // the keys it made or fetched, which may lack the other's last one), and a new
    // controller opens the data key from it.
    kubectl(&api, &["-n", NS, "delete", "secret", SECRET], None);
    assert!(items(&kube).await.is_empty());
    a.sync().await.unwrap();
    assert!(
        items(&kube).await.len() >= 3,
        "a's copies: 1, 2 and its own"
    );
    b.sync().await.unwrap();
    assert_eq!(items(&kube).await, ["kek-1", "kek-2", "kek-3", "kek-4"]);
    let c = keks(&kube, &dir.path().join("c"));
    c.fetch(2).await.unwrap();
    assert_eq!(c.unwrap("v", &rewrapped).unwrap(), key);

    // A key file that is not the Secret's key: refused, naming both, and not overwritten.
    let d_dir = dir.path().join("d");
    std::fs::create_dir_all(d_dir.join("volume-keys")).unwrap();
    let bogus = d_dir.join("volume-keys/kek-1.key");
    std::fs::write(&bogus, [0x5a; 32]).unwrap();
    let d = keks(&kube, &d_dir);
    let e = d.sync().await.unwrap_err().to_string();
    assert!(
        e.contains("key-encryption key 1") && e.contains(SECRET),
        "{e}"
    );
    assert_eq!(std::fs::read(&bogus).unwrap(), [0x5a; 32]);
}
