//! An encrypted volume's replica keeps its volume's wrapped data key (issue 43, item 8): the
//! agent records the one a create carries, lists it in its inventory (what `hawser cluster
//! recover` rebuilds from), and takes a key rotation's newer wrapping, never an older one.
//! A wrapping that names another key check than the replica's, or garbage, changes nothing.
#![allow(clippy::unwrap_used)]

use crate::node_support::admin_node;
use hawser_api::agent::{CreateReplica, ReplicaInventory, ReplicaStatus};
use hawser_api::{KeyCheck, WrappedKey};
use serde_json::json;

const TOKEN: &str = "agent-token-for-the-wrapped-key-test-0123456789";

fn under(kek: u32, fill: u8, check: KeyCheck) -> WrappedKey {
    WrappedKey::from_sealed(kek, &[fill; 92], check)
}

#[tokio::test]
async fn a_replica_keeps_its_wrapped_key_lists_it_and_takes_only_newer_ones() {
    let (_dir, storage, _, base, _) = admin_node("wrapped-key", TOKEN).await;
    let http = reqwest::Client::new();
    let call = |method: reqwest::Method, path: &str| {
        http.request(method, format!("{base}{path}"))
            .header("authorization", format!("Bearer {TOKEN}"))
    };
    let check = KeyCheck([0x3c; 16]);
    let create = |id: &str, wrapped: WrappedKey| CreateReplica {
        replica_id: id.into(),
        volume: "sec".into(),
        size_bytes: 1 << 20,
        pool: "default".into(),
        thin: true,
        cluster_id: None,
        from: None,
        key_check: Some(check),
        checksums: false,
        wrapped_key: Some(wrapped),
        volume_uid: None,
    };

    // A wrapping of another key than the replica's check: refused, nothing created.
    let other = under(1, 0xa1, KeyCheck([0x99; 16]));
    let resp = call(reqwest::Method::POST, "/v1/replicas")
        .json(&create("sec-r0", other))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert!(storage.replica("sec-r0").is_none());

    let first = under(1, 0xa1, check);
    let resp = call(reqwest::Method::POST, "/v1/replicas")
        .json(&create("sec-r0", first.clone()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let made: ReplicaStatus = resp.json().await.unwrap();
    assert_eq!(made.wrapped_key, Some(first.clone()));

    let set = |id: &str, w: serde_json::Value| {
        call(
            reqwest::Method::PUT,
            &format!("/v1/replicas/{id}/wrapped-key"),
        )
        .json(&w)
    };
    let second = under(2, 0xb2, check);
    let resp = set("sec-r0", json!(second)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let now: ReplicaStatus = resp.json().await.unwrap();
    assert_eq!(now.wrapped_key, Some(second.clone()));
    // An older KEK's wrapping (a late rotation) changes nothing; the answer shows the copy
    // held.
    let resp = set("sec-r0", json!(first)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let kept: ReplicaStatus = resp.json().await.unwrap();
    assert_eq!(kept.wrapped_key, Some(second.clone()));
    // Refused, each changing nothing: another key's wrapping, garbage, a plain replica, an
    // unknown one.
    let refusals = [
        ("sec-r0", json!(under(3, 0xc3, KeyCheck([0x99; 16]))), 400),
        (
            "sec-r0",
            json!({"kek": 3, "wrapped": "%%%", "check": check}),
            400,
        ),
        (
            "sec-r0",
            json!({"kek": 3, "wrapped": "A".repeat(400), "check": check}),
            400,
        ),
        ("sec-r0", json!({"kek": 3}), 422),
        ("vol-a", json!(under(3, 0xc3, check)), 400),
        ("nope", json!(under(3, 0xc3, check)), 404),
    ];
    for (id, body, want) in refusals {
        let resp = set(id, body.clone()).send().await.unwrap();
        assert_eq!(resp.status(), want, "{id} {body}");
    }
    assert_eq!(
        storage
            .replica("sec-r0")
            .unwrap()
            .wrapped_key()
            .map(|w| w.kek),
        Some(2)
    );

    // The inventory, which `hawser cluster recover` reads, carries it.
    let resp = call(reqwest::Method::GET, "/v1/replicas/inventory")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let inventory: Vec<ReplicaInventory> = resp.json().await.unwrap();
    let listed = |id: &str| {
        inventory
            .iter()
            .find(|r| r.status.replica_id == id)
            .map(|r| r.status.wrapped_key.clone())
    };
    assert_eq!(listed("sec-r0"), Some(Some(second)));
    assert_eq!(listed("vol-a"), Some(None), "a plain replica has none");
}
