//! Replicas' copies of an encrypted volume's wrapped data key (issue 43, item 8): the
//! controller sends the record's wrapping with every replica it creates, and a key rotation
//! gives each replica the new one; a replica it cannot update (its node down) is listed as
//! behind, so nobody deletes the old key it still needs, and the next rotation catches it up.

use crate::common::{Cluster, Op, GIB};
use hawser_api::controller::VolumeKeyRotated;
use serde_json::json;

/// KEK ids of the copies each node's replicas of `volume` keep, by node.
fn copies(c: &Cluster, volume: &str) -> Vec<(String, Option<u32>)> {
    ["n1", "n2"]
        .iter()
        .flat_map(|n| {
            let a = c.agent(n);
            a.replicas()
                .into_iter()
                .filter_map(|id| a.replica(&id))
                .filter(|r| r.volume == volume)
                .map(|r| (n.to_string(), r.wrapped_key.map(|w| w.kek)))
                .collect::<Vec<_>>()
        })
        .collect()
}

async fn rotate(c: &Cluster) -> VolumeKeyRotated {
    let (status, body) = c.post("/v1/cluster/volume-key", json!({})).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_value(body).expect("a rotation report")
}

#[tokio::test]
async fn a_rotation_updates_every_replicas_copy_and_lists_the_ones_it_could_not() {
    let c = Cluster::start(2).await;
    let (status, body) = c
        .post(
            "/v1/volumes",
            json!({"name": "sec", "size_bytes": GIB, "replicas": 2, "encrypted": true}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = c.create("plain", GIB, 2).await;
    assert_eq!(status, 201, "{body}");
    // Every create of an encrypted volume's replica carries the record's wrapping, whose
    // check is the replica's key check; a plain volume's carries none.
    for n in ["n1", "n2"] {
        let a = c.agent(n);
        for id in a.replicas() {
            let r = a.replica(&id).expect("listed");
            match r.volume.as_str() {
                "sec" => {
                    let w = r.wrapped_key.expect("a copy of the wrapped key");
                    assert_eq!((w.kek, Some(w.check)), (1, r.key_check));
                }
                _ => assert_eq!(r.wrapped_key, None),
            }
        }
    }
    assert_eq!(
        copies(&c, "sec"),
        [("n1".into(), Some(1)), ("n2".into(), Some(1))]
    );

    // n2 is down for the rotation: its replica keeps key 1's copy and is listed.
    c.agent("n2").fail(Op::SetWrappedKey, true);
    let r = rotate(&c).await;
    assert_eq!(r.kek, 2);
    assert_eq!(r.wrapping, [(2, 1)].into_iter().collect());
    assert_eq!(r.behind.len(), 1, "{r:?}");
    assert!(r.behind[0].contains("of volume sec on node n2"), "{r:?}");
    assert_eq!(
        copies(&c, "sec"),
        [("n1".into(), Some(2)), ("n2".into(), Some(1))]
    );

    // Back: the next rotation updates every copy, not only the records it re-wraps.
    c.agent("n2").fail(Op::SetWrappedKey, false);
    let r = rotate(&c).await;
    assert_eq!(r.kek, 3);
    assert!(r.behind.is_empty(), "{r:?}");
    assert_eq!(
        copies(&c, "sec"),
        [("n1".into(), Some(3)), ("n2".into(), Some(3))]
    );
}
