//! The Kubernetes objects the failover reads and changes: pods on a node and the Hawser
//! volumes they use, VolumeAttachments, the node's taints and `volumesInUse`, and Events.
//!
//! Every object is handled as JSON through the store's Kubernetes client; a field that is
//! missing or of the wrong type makes the object count as not ours, never a panic.

use std::collections::HashMap;

use hawser_kube::api::{Api, ApiError};
use hawser_kube::KubeConfig;
use serde_json::{json, Value};

/// The pod annotation that opts a pod out of failover.
pub const OPT_OUT_ANNOTATION: &str = "hawser.dev/failover";
/// The taint put on a node whose agent stopped heartbeating, so the scheduler places the
/// replacement pods elsewhere; removed when the agent is back.
pub const UNREACHABLE_TAINT: &str = "hawser.dev/agent-unreachable";
/// The taint put on a node whose engine lost quorum: the node heartbeats, but cannot reach a
/// replica's node, so a pod put back there would find its volume failing again. Removed when
/// the node's agent reaches every heartbeating peer's replica port.
pub const QUORUM_LOST_TAINT: &str = "hawser.dev/quorum-lost";

/// The nodes (by Kubernetes name) that carry each of the failover's taints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tainted {
    pub unreachable: std::collections::HashSet<String>,
    pub quorum_lost: std::collections::HashSet<String>,
}

impl Tainted {
    pub fn is_empty(&self) -> bool {
        self.unreachable.is_empty() && self.quorum_lost.is_empty()
    }
}

/// A pod on a node and the Hawser volumes (by volume id) it mounts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodUse {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `hawser.dev/failover: "false"`.
    pub opted_out: bool,
    /// (volume id, PVC name) of each Hawser volume it uses.
    pub volumes: Vec<(String, String)>,
}

/// A Hawser PersistentVolume: its volume id and PVC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HawserPv {
    pub pv: String,
    pub volume: String,
    pub claim_namespace: String,
    pub claim: String,
}

pub struct Kube {
    api: Api,
    driver: String,
}

type KResult<T> = Result<T, String>;

fn failed(what: &str, e: ApiError) -> String {
    format!("{what}: {e}")
}

fn items(v: &Value) -> &[Value] {
    v.get("items")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(*p)?;
    }
    cur.as_str()
}

impl Kube {
    pub fn new(cfg: &KubeConfig, driver: &str) -> KResult<Kube> {
        let api = Api::new(cfg, std::time::Duration::from_secs(5)).map_err(|e| e.to_string())?;
        Ok(Kube {
            api,
            driver: driver.to_string(),
        })
    }

    /// The Kubernetes node name of each Hawser node, from the CSINode objects (the node
    /// plugin reports the Hawser node as its node id). Hawser nodes not in it are named the
    /// same in Kubernetes, as the chart runs them.
    pub async fn node_names(&self) -> KResult<HashMap<String, String>> {
        let list = self
            .api
            .get("/apis/storage.k8s.io/v1/csinodes")
            .await
            .map_err(|e| failed("list CSINodes", e))?;
        let mut out = HashMap::new();
        for n in items(&list) {
            let Some(name) = str_at(n, &["metadata", "name"]) else {
                continue;
            };
            let drivers = n
                .get("spec")
                .and_then(|s| s.get("drivers"))
                .and_then(Value::as_array)
                .map_or(&[][..], Vec::as_slice);
            for d in drivers {
                if str_at(d, &["name"]) == Some(self.driver.as_str()) {
                    if let Some(id) = str_at(d, &["nodeID"]) {
                        out.insert(id.to_string(), name.to_string());
                    }
                }
            }
        }
        Ok(out)
    }

    /// Every PersistentVolume of this driver that is bound to a claim.
    pub async fn hawser_pvs(&self) -> KResult<Vec<HawserPv>> {
        let list = self
            .api
            .get("/api/v1/persistentvolumes")
            .await
            .map_err(|e| failed("list PersistentVolumes", e))?;
        Ok(items(&list)
            .iter()
            .filter(|pv| str_at(pv, &["spec", "csi", "driver"]) == Some(self.driver.as_str()))
            .filter_map(|pv| {
                Some(HawserPv {
                    pv: str_at(pv, &["metadata", "name"])?.to_string(),
                    volume: str_at(pv, &["spec", "csi", "volumeHandle"])?.to_string(),
                    claim_namespace: str_at(pv, &["spec", "claimRef", "namespace"])?.to_string(),
                    claim: str_at(pv, &["spec", "claimRef", "name"])?.to_string(),
                })
            })
            .collect())
    }

    /// The pods bound to `node` (not finished) that use Hawser volumes.
    pub async fn pods_on(&self, node: &str, pvs: &[HawserPv]) -> KResult<Vec<PodUse>> {
        let path = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}");
        let list = self
            .api
            .get(&path)
            .await
            .map_err(|e| failed("list pods", e))?;
        let by_claim: HashMap<(&str, &str), &HawserPv> = pvs
            .iter()
            .map(|p| ((p.claim_namespace.as_str(), p.claim.as_str()), p))
            .collect();
        let mut out = Vec::new();
        for pod in items(&list) {
            let phase = str_at(pod, &["status", "phase"]).unwrap_or("");
            if phase == "Succeeded" || phase == "Failed" {
                continue;
            }
            let (Some(ns), Some(name), Some(uid)) = (
                str_at(pod, &["metadata", "namespace"]),
                str_at(pod, &["metadata", "name"]),
                str_at(pod, &["metadata", "uid"]),
            ) else {
                continue;
            };
            let claims = pod
                .get("spec")
                .and_then(|s| s.get("volumes"))
                .and_then(Value::as_array)
                .map_or(&[][..], Vec::as_slice);
            let volumes: Vec<(String, String)> = claims
                .iter()
                .filter_map(|v| str_at(v, &["persistentVolumeClaim", "claimName"]))
                .filter_map(|claim| by_claim.get(&(ns, claim)))
                .map(|pv| (pv.volume.clone(), pv.claim.clone()))
                .collect();
            if volumes.is_empty() {
                continue;
            }
            let opted_out = str_at(pod, &["metadata", "annotations", OPT_OUT_ANNOTATION])
                .is_some_and(|v| v.eq_ignore_ascii_case("false"));
            out.push(PodUse {
                namespace: ns.into(),
                name: name.into(),
                uid: uid.into(),
                opted_out,
                volumes,
            });
        }
        Ok(out)
    }

    /// Deletes a pod at once (grace 0: its node cannot confirm anything), only if it is
    /// still the same pod (its uid).
    pub async fn force_delete_pod(&self, pod: &PodUse) -> KResult<()> {
        let path = format!("/api/v1/namespaces/{}/pods/{}", pod.namespace, pod.name);
        let body = json!({
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": pod.uid},
        });
        match self.api.delete_with(&path, &body).await {
            Ok(()) | Err(ApiError::NotFound | ApiError::Conflict) => Ok(()),
            Err(e) => Err(failed(
                &format!("delete pod {}/{}", pod.namespace, pod.name),
                e,
            )),
        }
    }

    /// Deletes the VolumeAttachments of PersistentVolume `pv` to `node`.
    pub async fn delete_attachments(&self, pv: &str, node: &str) -> KResult<usize> {
        let list = self
            .api
            .get("/apis/storage.k8s.io/v1/volumeattachments")
            .await
            .map_err(|e| failed("list VolumeAttachments", e))?;
        let mut n = 0;
        for va in items(&list) {
            if str_at(va, &["spec", "nodeName"]) != Some(node)
                || str_at(va, &["spec", "source", "persistentVolumeName"]) != Some(pv)
            {
                continue;
            }
            let Some(name) = str_at(va, &["metadata", "name"]) else {
                continue;
            };
            let path = format!("/apis/storage.k8s.io/v1/volumeattachments/{name}");
            match self.api.delete(&path, None).await {
                Ok(()) | Err(ApiError::NotFound) => n += 1,
                Err(e) => return Err(failed(&format!("delete VolumeAttachment {name}"), e)),
            }
        }
        Ok(n)
    }

    /// Removes `volumes` from `node`'s `status.volumesInUse`. The attach/detach controller
    /// will not detach a volume the node reports in use until six minutes have passed, and a
    /// dead kubelet never stops reporting it; Hawser has fenced the old engine by epoch, so
    /// the volume is safe to attach elsewhere at once.
    pub async fn release_volumes_in_use(&self, node: &str, volumes: &[String]) -> KResult<()> {
        let unique: Vec<String> = volumes
            .iter()
            .map(|v| format!("kubernetes.io/csi/{}^{v}", self.driver))
            .collect();
        self.update_node(node, true, "volumesInUse", |n| {
            let in_use: Vec<&str> = n
                .get("status")
                .and_then(|s| s.get("volumesInUse"))
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let kept: Vec<&str> = in_use
                .iter()
                .copied()
                .filter(|v| !unique.iter().any(|u| u == v))
                .collect();
            (kept.len() != in_use.len()).then(|| json!({"status": {"volumesInUse": kept}}))
        })
        .await
    }

    /// Applies the merge patch `change` makes of node `node` (its status with `status`), on
    /// the condition that the node did not change since it was read; reads again and retries
    /// when it did. `change` returning `None` means nothing to do, as does a missing node.
    async fn update_node(
        &self,
        node: &str,
        status: bool,
        what: &str,
        change: impl Fn(&Value) -> Option<Value>,
    ) -> KResult<()> {
        let path = format!("/api/v1/nodes/{node}");
        for _ in 0..5 {
            let n = match self.api.get(&path).await {
                Ok(n) => n,
                Err(ApiError::NotFound) => return Ok(()),
                Err(e) => return Err(failed(&format!("get node {node}"), e)),
            };
            let Some(mut patch) = change(&n) else {
                return Ok(());
            };
            patch["metadata"] = json!({"resourceVersion": n["metadata"]["resourceVersion"]});
            let target = if status {
                format!("{path}/status")
            } else {
                path.clone()
            };
            match self.api.merge_patch(&target, &patch).await {
                Ok(_) => return Ok(()),
                Err(ApiError::Conflict) => continue,
                Err(e) => return Err(failed(&format!("update {what} of node {node}"), e)),
            }
        }
        Err(format!("node {node} kept changing; {what} not updated"))
    }

    /// The nodes carrying each of the failover's taints now.
    pub async fn tainted_nodes(&self) -> KResult<Tainted> {
        let list = self
            .api
            .get("/api/v1/nodes")
            .await
            .map_err(|e| failed("list nodes", e))?;
        let mut out = Tainted::default();
        for n in items(&list) {
            let Some(name) = str_at(n, &["metadata", "name"]) else {
                continue;
            };
            let keys = n
                .get("spec")
                .and_then(|s| s.get("taints"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|t| t.get("key").and_then(Value::as_str));
            for key in keys {
                if key == UNREACHABLE_TAINT {
                    out.unreachable.insert(name.to_string());
                } else if key == QUORUM_LOST_TAINT {
                    out.quorum_lost.insert(name.to_string());
                }
            }
        }
        Ok(out)
    }

    /// Adds (`on`) or removes the taint `key` (`NoSchedule`) of `node`; a no-op when it
    /// already is so.
    pub async fn set_taint(&self, node: &str, key: &str, on: bool) -> KResult<()> {
        self.update_node(node, false, "taints", |n| {
            let taints: Vec<Value> = n
                .get("spec")
                .and_then(|s| s.get("taints"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let ours = |t: &Value| t.get("key").and_then(Value::as_str) == Some(key);
            if taints.iter().any(ours) == on {
                return None;
            }
            let mut new: Vec<Value> = taints.into_iter().filter(|t| !ours(t)).collect();
            if on {
                new.push(json!({"key": key, "effect": "NoSchedule"}));
            }
            Some(json!({"spec": {"taints": new}}))
        })
        .await
    }

    /// Records an Event on a PVC or pod (`kind`), for `kubectl describe`.
    pub async fn event(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        warning: bool,
        reason: &str,
        message: &str,
    ) -> KResult<()> {
        let now = hawser_kube::micro_time(std::time::SystemTime::now());
        let secs = now.split('.').next().unwrap_or(&now).to_string() + "Z";
        let suffix: String = (0..8)
            .map(|_| format!("{:x}", rand::random::<u8>() & 0xf))
            .collect();
        let body = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": format!("{name}.{suffix}"), "namespace": namespace},
            "involvedObject": {"kind": kind, "namespace": namespace, "name": name, "apiVersion": "v1"},
            "reason": reason,
            "message": message,
            "type": if warning { "Warning" } else { "Normal" },
            "source": {"component": "hawser-controller"},
            "reportingComponent": "hawser.dev/controller",
            "reportingInstance": "hawser-controller",
            "firstTimestamp": secs,
            "lastTimestamp": secs,
            "count": 1,
        });
        self.api
            .post(&format!("/api/v1/namespaces/{namespace}/events"), &body)
            .await
            .map(|_| ())
            .map_err(|e| failed("create event", e))
    }

    /// The data of Secret `namespace/name` (decoded to text), if it exists.
    pub async fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> KResult<Option<HashMap<String, String>>> {
        Ok(self
            .secret_versioned(namespace, name)
            .await?
            .map(|(data, _)| data))
    }

    /// The data of Secret `namespace/name` (decoded to text) and its resourceVersion, if it
    /// exists.
    pub async fn secret_versioned(
        &self,
        namespace: &str,
        name: &str,
    ) -> KResult<Option<(HashMap<String, String>, String)>> {
        use base64::Engine as _;
        let path = format!("/api/v1/namespaces/{namespace}/secrets/{name}");
        let obj = match self.api.get(&path).await {
            Ok(v) => v,
            Err(ApiError::NotFound) => return Ok(None),
            Err(e) => return Err(failed(&format!("read secret {namespace}/{name}"), e)),
        };
        // Without it a replace would not be a compare-and-swap: an error, not an empty one.
        let version = obj
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("secret {namespace}/{name} has no resourceVersion"))?
            .to_string();
        let mut out = HashMap::new();
        if let Some(data) = obj.get("data").and_then(Value::as_object) {
            for (k, v) in data {
                let text = v
                    .as_str()
                    .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| format!("secret {namespace}/{name}: {k} is not base64 text"))?;
                out.insert(k.clone(), text);
            }
        }
        Ok(Some((out, version)))
    }

    /// Creates Secret `namespace/name` holding `data`; `false` if one of that name exists
    /// already (it is left alone).
    pub async fn create_secret(
        &self,
        namespace: &str,
        name: &str,
        data: &[(&str, &str)],
    ) -> KResult<bool> {
        let body = secret_body(namespace, name, data, None);
        match self
            .api
            .post(&format!("/api/v1/namespaces/{namespace}/secrets"), &body)
            .await
        {
            Ok(_) => Ok(true),
            Err(ApiError::Conflict) => Ok(false),
            Err(e) => Err(failed(&format!("create secret {namespace}/{name}"), e)),
        }
    }

    /// Replaces Secret `namespace/name`'s data with `data` if its resourceVersion is still
    /// `version` (a compare-and-swap); `false` if it changed or went away meanwhile.
    pub async fn replace_secret(
        &self,
        namespace: &str,
        name: &str,
        data: &[(&str, &str)],
        version: &str,
    ) -> KResult<bool> {
        let body = secret_body(namespace, name, data, Some(version));
        let path = format!("/api/v1/namespaces/{namespace}/secrets/{name}");
        match self.api.put(&path, &body).await {
            Ok(_) => Ok(true),
            Err(ApiError::Conflict | ApiError::NotFound) => Ok(false),
            Err(e) => Err(failed(&format!("replace secret {namespace}/{name}"), e)),
        }
    }
}

/// An Opaque Secret holding `data` (base64-encoded here), at `version` for a replace.
fn secret_body(namespace: &str, name: &str, data: &[(&str, &str)], version: Option<&str>) -> Value {
    use base64::Engine as _;
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| {
            let b64 = base64::engine::general_purpose::STANDARD.encode(v.as_bytes());
            ((*k).to_string(), Value::String(b64))
        })
        .collect();
    let mut metadata = json!({
        "name": name,
        "namespace": namespace,
        "labels": {"app.kubernetes.io/part-of": "hawser"},
    });
    if let Some(v) = version {
        metadata["resourceVersion"] = Value::String(v.into());
    }
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata,
        "data": data,
    })
}
