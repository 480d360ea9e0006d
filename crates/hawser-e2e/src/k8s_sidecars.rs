//! What the kubernetes-csi sidecars do, for tests that cannot pull their images (no registry
//! here, and the Go module proxy refuses their modules): a thread that drives Hawser's CSI
//! Controller service the way external-provisioner, -attacher and -resizer would.
//!
//! - provisioner: a Pending PVC of a StorageClass of this driver gets CreateVolume (named
//!   `pvc-<uid>`, the class's parameters) and a PV bound to it; a Released PV with reclaim
//!   policy Delete gets DeleteVolume and is deleted.
//! - attacher: a VolumeAttachment gets ControllerPublish (the CSINode's node id) and its
//!   status set attached with the publish context; a deleted one gets ControllerUnpublish
//!   and loses its finalizer.
//! - resizer: a bound PVC asking more than its PV has gets ControllerExpandVolume, the PV's
//!   capacity, and the PVC status that tells the kubelet to grow the filesystem.
//!
//! Each round polls with kubectl; errors are printed and retried next round, as the sidecars
//! do. A round starts every 300 ms, and at once when a VolumeAttachment changes (a `kubectl
//! --watch`), since the real attacher's informer sees one within milliseconds and a failover's
//! measured time should not include this loop's polling. This is test scaffolding, not
//! product code: the Helm chart runs the real sidecars.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hawser_csi::names::DRIVER_NAME;
use hawser_csi::proto::csi::controller_client::ControllerClient;
use hawser_csi::proto::csi::volume_capability::access_mode::Mode;
use hawser_csi::proto::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use hawser_csi::proto::csi::*;
use serde_json::{json, Value};
use tonic::transport::Channel;

use crate::k8s::{quantity_bytes, Kubectl};

const FINALIZER: &str = "external-attacher/csi-hawser-dev";
const ROUND: Duration = Duration::from_millis(300);

pub struct Sidecars {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The `kubectl --watch` of VolumeAttachments, killed on drop; `None` if it did not start
    /// (the loop then only polls).
    watch: Option<std::process::Child>,
}

impl Sidecars {
    /// Starts the loop against the CSI controller socket `endpoint`.
    pub fn start(kube: Kubectl, endpoint: PathBuf) -> Sidecars {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let changed = Arc::new(tokio::sync::Notify::new());
        let watch = match kube.watch("volumeattachments") {
            Ok(mut child) => {
                let out = child.stdout.take();
                let wake = changed.clone();
                std::thread::spawn(move || {
                    use std::io::BufRead;
                    let Some(out) = out else { return };
                    for _ in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                        wake.notify_one();
                    }
                });
                Some(child)
            }
            Err(e) => {
                eprintln!("sidecars: kubectl --watch did not start ({e}); polling only");
                None
            }
        };
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            rt.block_on(async move {
                let channel = crate::csi::unix_channel(endpoint).await;
                let mut s = Loop {
                    kube,
                    csi: ControllerClient::new(channel),
                };
                while !flag.load(Ordering::Relaxed) {
                    s.round().await;
                    let _ = tokio::time::timeout(ROUND, changed.notified()).await;
                }
            });
        });
        Sidecars {
            stop,
            thread: Some(thread),
            watch,
        }
    }
}

impl Drop for Sidecars {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(mut w) = self.watch.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Loop {
    kube: Kubectl,
    csi: ControllerClient<Channel>,
}

fn items(v: Option<Value>) -> Vec<Value> {
    v.and_then(|v| v["items"].as_array().cloned())
        .unwrap_or_default()
}

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter().fold(v, |v, k| &v[*k]).as_str().unwrap_or("")
}

fn capability(block: bool, fs: &str) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter.into(),
        }),
        access_type: Some(if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume {
                fs_type: fs.into(),
                ..Default::default()
            })
        }),
    }
}

impl Loop {
    async fn round(&mut self) {
        let classes: Vec<Value> = items(self.kube.get_json(&["storageclass"]))
            .into_iter()
            .filter(|c| s(c, &["provisioner"]) == DRIVER_NAME)
            .collect();
        let pvcs = items(self.kube.get_json(&["pvc", "-A"]));
        let pvs = items(self.kube.get_json(&["pv"]));
        for pvc in &pvcs {
            let class = classes
                .iter()
                .find(|c| s(c, &["metadata", "name"]) == s(pvc, &["spec", "storageClassName"]));
            let Some(class) = class else { continue };
            let result = match s(pvc, &["status", "phase"]) {
                "Pending" => self.provision(pvc, class).await,
                "Bound" => self.resize(pvc, &pvs).await,
                _ => Ok(()),
            };
            if let Err(e) = result {
                eprintln!("sidecars: pvc {}: {e}", s(pvc, &["metadata", "name"]));
            }
        }
        for pv in &pvs {
            if s(pv, &["spec", "csi", "driver"]) == DRIVER_NAME
                && s(pv, &["status", "phase"]) == "Released"
                && s(pv, &["spec", "persistentVolumeReclaimPolicy"]) == "Delete"
            {
                if let Err(e) = self.delete(pv).await {
                    eprintln!("sidecars: pv {}: {e}", s(pv, &["metadata", "name"]));
                }
            }
        }
        for va in items(self.kube.get_json(&["volumeattachment"])) {
            if s(&va, &["spec", "attacher"]) != DRIVER_NAME {
                continue;
            }
            if let Err(e) = self.attach(&va, &pvs).await {
                eprintln!(
                    "sidecars: volumeattachment {}: {e}",
                    s(&va, &["metadata", "name"])
                );
            }
        }
    }

    async fn provision(&mut self, pvc: &Value, class: &Value) -> Result<(), String> {
        if !s(pvc, &["spec", "volumeName"]).is_empty() {
            return Ok(());
        }
        let uid = s(pvc, &["metadata", "uid"]);
        let name = format!("pvc-{uid}");
        let size = quantity_bytes(s(pvc, &["spec", "resources", "requests", "storage"]))
            .ok_or("bad storage request")?;
        let block = s(pvc, &["spec", "volumeMode"]) == "Block";
        let mut params: std::collections::HashMap<String, String> =
            serde_json::from_value(class["parameters"].clone()).unwrap_or_default();
        let fs = params
            .remove("csi.storage.k8s.io/fstype")
            .unwrap_or_else(|| "ext4".into());
        let vol = self
            .csi
            .create_volume(CreateVolumeRequest {
                name: name.clone(),
                capacity_range: Some(CapacityRange {
                    required_bytes: i64::try_from(size).map_err(|e| e.to_string())?,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![capability(block, &fs)],
                parameters: params,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("CreateVolume: {e}"))?
            .into_inner()
            .volume
            .ok_or("CreateVolume returned no volume")?;
        let mut csi = json!({ "driver": DRIVER_NAME, "volumeHandle": vol.volume_id });
        if !block {
            csi["fsType"] = json!(fs);
        }
        let pv = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": name,
                "annotations": { "pv.kubernetes.io/provisioned-by": DRIVER_NAME }
            },
            "spec": {
                "capacity": { "storage": vol.capacity_bytes.to_string() },
                "accessModes": pvc["spec"]["accessModes"],
                "volumeMode": if block { "Block" } else { "Filesystem" },
                "persistentVolumeReclaimPolicy": class["reclaimPolicy"].as_str().unwrap_or("Delete"),
                "storageClassName": class["metadata"]["name"],
                "claimRef": {
                    "namespace": pvc["metadata"]["namespace"],
                    "name": pvc["metadata"]["name"],
                    "uid": uid
                },
                "csi": csi
            }
        });
        self.kube.apply(&pv.to_string());
        Ok(())
    }

    async fn delete(&mut self, pv: &Value) -> Result<(), String> {
        let handle = s(pv, &["spec", "csi", "volumeHandle"]).to_string();
        self.csi
            .delete_volume(DeleteVolumeRequest {
                volume_id: handle,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("DeleteVolume: {e}"))?;
        self.kube
            .kubectl(&["delete", "pv", s(pv, &["metadata", "name"]), "--wait=false"]);
        Ok(())
    }

    async fn attach(&mut self, va: &Value, pvs: &[Value]) -> Result<(), String> {
        let name = s(va, &["metadata", "name"]);
        let pv_name = s(va, &["spec", "source", "persistentVolumeName"]);
        let pv = pvs
            .iter()
            .find(|p| s(p, &["metadata", "name"]) == pv_name)
            .ok_or_else(|| format!("pv {pv_name} not found"))?;
        let handle = s(pv, &["spec", "csi", "volumeHandle"]).to_string();
        let node_id = self.node_id(s(va, &["spec", "nodeName"]))?;
        let has_finalizer = va["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x.as_str() == Some(FINALIZER)));
        if !s(va, &["metadata", "deletionTimestamp"]).is_empty() {
            self.csi
                .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                    volume_id: handle,
                    node_id,
                    ..Default::default()
                })
                .await
                .map_err(|e| format!("ControllerUnpublish: {e}"))?;
            let patch = json!({ "metadata": { "finalizers": [] } }).to_string();
            self.kube.kubectl(&[
                "patch",
                "volumeattachment",
                name,
                "--type=merge",
                "-p",
                &patch,
            ]);
            return Ok(());
        }
        if va["status"]["attached"].as_bool() == Some(true) {
            return Ok(());
        }
        if !has_finalizer {
            let patch = json!({ "metadata": { "finalizers": [FINALIZER] } }).to_string();
            self.kube.kubectl(&[
                "patch",
                "volumeattachment",
                name,
                "--type=merge",
                "-p",
                &patch,
            ]);
        }
        let block = s(pv, &["spec", "volumeMode"]) == "Block";
        let ctx = self
            .csi
            .controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: handle,
                node_id,
                volume_capability: Some(capability(block, s(pv, &["spec", "csi", "fsType"]))),
                ..Default::default()
            })
            .await
            .map_err(|e| format!("ControllerPublish: {e}"))?
            .into_inner()
            .publish_context;
        let patch =
            json!({ "status": { "attached": true, "attachmentMetadata": ctx } }).to_string();
        let out = self.kube.kubectl(&[
            "patch",
            "volumeattachment",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ]);
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(())
    }

    /// The driver's node id on a Kubernetes node, from its CSINode object.
    fn node_id(&self, node: &str) -> Result<String, String> {
        let csinode = self.kube.get_json(&["csinode", node]).ok_or("no CSINode")?;
        csinode["spec"]["drivers"]
            .as_array()
            .and_then(|d| d.iter().find(|d| s(d, &["name"]) == DRIVER_NAME))
            .map(|d| s(d, &["nodeID"]).to_string())
            .ok_or_else(|| format!("driver not registered on node {node}"))
    }

    async fn resize(&mut self, pvc: &Value, pvs: &[Value]) -> Result<(), String> {
        let want = quantity_bytes(s(pvc, &["spec", "resources", "requests", "storage"]));
        let pv_name = s(pvc, &["spec", "volumeName"]);
        let Some(pv) = pvs.iter().find(|p| s(p, &["metadata", "name"]) == pv_name) else {
            return Ok(());
        };
        let have = quantity_bytes(s(pv, &["spec", "capacity", "storage"]));
        let (Some(want), Some(have)) = (want, have) else {
            return Ok(());
        };
        if want <= have {
            return Ok(());
        }
        let block = s(pv, &["spec", "volumeMode"]) == "Block";
        let r = self
            .csi
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: s(pv, &["spec", "csi", "volumeHandle"]).to_string(),
                capacity_range: Some(CapacityRange {
                    required_bytes: i64::try_from(want).map_err(|e| e.to_string())?,
                    limit_bytes: 0,
                }),
                volume_capability: Some(capability(block, s(pv, &["spec", "csi", "fsType"]))),
                ..Default::default()
            })
            .await
            .map_err(|e| format!("ControllerExpandVolume: {e}"))?
            .into_inner();
        let size = r.capacity_bytes.to_string();
        let patch = json!({ "spec": { "capacity": { "storage": size } } }).to_string();
        self.kube
            .kubectl_ok(&["patch", "pv", pv_name, "--type=merge", "-p", &patch]);
        let status = if r.node_expansion_required {
            json!({ "status": {
                "allocatedResources": { "storage": size },
                "allocatedResourceStatuses": { "storage": "NodeResizePending" },
                "conditions": [{ "type": "FileSystemResizePending", "status": "True" }]
            }})
        } else {
            json!({ "status": { "capacity": { "storage": size },
                                "allocatedResources": { "storage": size } } })
        };
        let ns = s(pvc, &["metadata", "namespace"]);
        self.kube.kubectl_ok(&[
            "patch",
            "pvc",
            s(pvc, &["metadata", "name"]),
            "-n",
            ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ]);
        Ok(())
    }
}
