//! Issue 39, item 5: the CSI node plugin reaches the controller with its node's own
//! certificate (`hawser csi --node-identity-dir`, what the Helm chart runs), not the admin
//! token, and that credential reads only what the plugin needs: its node's record and the
//! volumes attached to it. Everything else is refused (403) and changes nothing; another
//! node's volumes cannot be told from volumes that do not exist. The client is the one the
//! plugin uses (`hawser_api::client::Client::with_node_identity`), against the real binaries.
//! (`csi_kubelet.rs` runs the plugin this way under a real kubelet.)

use hawser_api::client::{Client, ClientError};
use hawser_api::controller::{Node, Volume};
use hawser_api::ErrorCode;
use hawser_e2e::Cluster;
use serde_json::{json, Value};

fn refused(r: Result<Value, ClientError>, what: &str) -> String {
    match r {
        Err(ClientError::Api(e)) => {
            assert_eq!(e.code, ErrorCode::Forbidden, "{what}: {e:?}");
            e.message
        }
        other => panic!("{what}: not refused: {other:?}"),
    }
}

#[test]
fn a_node_certificate_reads_only_its_node_and_the_volumes_attached_to_it() {
    let c = Cluster::start("node-credential", 2);
    c.attached_volume("here", "16M", 1, "n1");
    c.attached_volume("there", "16M", 1, "n2");
    c.cli_ok(&[
        "volume",
        "create",
        "idle",
        "--size",
        "16M",
        "--replicas",
        "1",
    ]);
    let before = c.volumes();

    let n1 = Client::with_node_identity(&c.url, &c.agent("n1").data_dir.join("tls"))
        .expect("the node's identity");
    let node: Node = n1.get("/v1/nodes/n1").expect("its own node");
    assert_eq!(node.name, "n1");
    let v: Volume = n1.get("/v1/volumes/here").expect("a volume attached to it");
    assert_eq!(v.attached_node.as_deref(), Some("n1"));
    assert!(
        v.nbd_unix_uri.is_some(),
        "what the plugin needs to stage it"
    );

    let other = refused(n1.get("/v1/nodes/n2"), "another node");
    assert!(other.contains("n1 reads only"), "{other}");
    let a = refused(n1.get("/v1/volumes/there"), "a volume attached elsewhere");
    let b = refused(n1.get("/v1/volumes/nosuch"), "a volume that does not exist");
    assert_eq!(a, b, "other nodes' volumes look like missing ones");
    refused(n1.get("/v1/volumes/idle"), "a detached volume");
    for path in [
        "/v1/volumes",
        "/v1/nodes",
        "/v1/cluster",
        "/v1/status",
        "/v1/snapshots",
    ] {
        refused(n1.get(path), path);
    }
    let create = json!({"name": "x", "size_bytes": 16u64 << 20, "replicas": 1});
    refused(n1.post("/v1/volumes", &create), "create a volume");
    let detach = n1.post::<_, Value>("/v1/volumes/here/detach", &json!({}));
    refused(detach, "detach its own volume");
    match n1.delete("/v1/volumes/here") {
        Err(ClientError::Api(e)) => assert_eq!(e.code, ErrorCode::Forbidden),
        other => panic!("delete: not refused: {other:?}"),
    }
    assert_eq!(c.volumes(), before, "the refusals changed nothing");

    // Without the node's files there is no client at all (the plugin waits for the agent
    // to join).
    let empty = c.dir.path().join("no-identity");
    std::fs::create_dir_all(&empty).expect("dir");
    assert!(Client::with_node_identity(&c.url, &empty).is_err());
}
