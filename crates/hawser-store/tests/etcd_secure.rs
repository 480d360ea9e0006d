//! The store over a real etcd run as production should: TLS, client certificates required,
//! authentication on. Every conformance check passes as an authorised user, and every client
//! that is not one (no certificate, another CA's, a user without a role, a wrong password,
//! plaintext, a client that does not check etcd's certificate against the right CA) is
//! refused without changing a key.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use hawser_store::{EtcdConfig, EtcdStore, EtcdTls, EtcdUser, Expect, Store};
use hawser_testkit::etcd_pki::EtcdPki;
use hawser_testkit::etcd_process::{EtcdProcess, NO_ROLE_USER, PASSWORD_USER, SECURE_USER};

async fn start() -> (tempfile::TempDir, EtcdProcess) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let etcd = tokio::task::spawn_blocking(move || EtcdProcess::start_secure(&path))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));
    (dir, etcd)
}

fn quick(mut cfg: EtcdConfig) -> EtcdConfig {
    cfg.request_timeout = Duration::from_secs(2);
    cfg.connect_timeout = Duration::from_secs(1);
    cfg
}

async fn connect(cfg: EtcdConfig) -> EtcdStore {
    EtcdStore::connect(quick(cfg)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_check_passes_over_tls_with_a_client_certificate() {
    let (_dir, etcd) = start().await;
    for (name, check) in hawser_testkit::store_conformance::all() {
        let cfg = etcd.client_config(name, Some(SECURE_USER)).unwrap();
        assert!(cfg.endpoints.iter().all(|e| e.starts_with("https://")));
        check(std::sync::Arc::new(connect(cfg).await)).await;
    }
}

/// What a refused client's write and read give: both errors, with the reasons.
async fn refused(store: &EtcdStore) -> String {
    let put = store
        .put("k", b"intruder".to_vec(), Expect::Any)
        .await
        .unwrap_err();
    let get = store.get("k").await.unwrap_err();
    assert!(
        put.is_unavailable() && get.is_unavailable(),
        "{put:?} {get:?}"
    );
    format!("{put} / {get}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_are_not_authorised_are_refused_and_change_nothing() {
    let (dir, etcd) = start().await;
    let good = connect(etcd.client_config("p", Some(SECURE_USER)).unwrap()).await;
    let v = good
        .put("k", b"mine".to_vec(), Expect::Absent)
        .await
        .unwrap();
    let pki = etcd.pki().unwrap();

    // A known user whose role allows nothing.
    let no_role = connect(etcd.client_config("p", Some(NO_ROLE_USER)).unwrap()).await;
    let why = refused(&no_role).await;
    assert!(why.contains("permission denied"), "{why}");

    // No client certificate: the TLS handshake fails.
    let anonymous = connect(etcd.client_config("p", None).unwrap()).await;
    refused(&anonymous).await;

    // A certificate of another CA, with the name of an authorised user.
    let other = EtcdPki::create(&dir.path().join("other-pki"), &[SECURE_USER]).unwrap();
    let forged = EtcdTls {
        ca_pem: pki.tls(None).unwrap().ca_pem,
        client: other.tls(Some(SECURE_USER)).unwrap().client,
    };
    let base = EtcdConfig::parse(&etcd.store_url("p")).unwrap();
    refused(&connect(base.clone().with_tls(forged)).await).await;

    // A client that would trust another CA does not accept etcd's certificate.
    refused(&connect(base.clone().with_tls(other.tls(Some(SECURE_USER)).unwrap())).await).await;

    // Plaintext to the TLS port.
    refused(&connect(base.clone()).await).await;

    // A wrong password: refused when the client asks for its token.
    let mut wrong = base.clone().with_tls(pki.tls(Some(NO_ROLE_USER)).unwrap());
    wrong.user = Some(EtcdUser {
        name: PASSWORD_USER.into(),
        password: "not-the-password".into(),
    });
    let err = EtcdStore::connect(quick(wrong)).await.err().unwrap();
    assert!(err.to_string().contains("authentication failed"), "{err}");

    // The right password makes the certificate of a user with no role act as the user.
    let mut right = base.with_tls(pki.tls(Some(NO_ROLE_USER)).unwrap());
    right.user = Some(EtcdUser {
        name: PASSWORD_USER.into(),
        password: etcd.password().unwrap().into(),
    });
    let by_password = connect(right).await;
    assert_eq!(by_password.get("k").await.unwrap().unwrap().value, b"mine");

    let after = good.get("k").await.unwrap().unwrap();
    assert_eq!((after.value.as_slice(), after.version), (&b"mine"[..], v));
}
