//! The CSI Node service: NodeStage turns the published volume into a block device on this
//! node (`node_device.rs`) and, for a filesystem volume, makes the filesystem if the device
//! is blank and mounts it at the staging path; NodePublish bind-mounts that (or the device
//! file, for a raw block volume) into the pod's target path.
//!
//! Every path the kubelet hands in must lie inside `--kubelet-dir`: the service runs as root
//! with the host's mount namespace, so a path elsewhere is refused, never mounted over.

use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use hawser_api::controller::{Node, Volume, ZONE_LABEL};
use tonic::{Request, Response, Status};

use crate::api::{is_not_found, status, Api};
use crate::capability::{self, Access};
use crate::controller::{condition, required};
use crate::controller_publish::{CTX_NBD_UNIX_URI, CTX_NBD_URI};
use crate::inflight::InFlight;
use crate::mounts;
use crate::names::{TOPOLOGY_NODE_KEY, TOPOLOGY_ZONE_KEY};
use crate::node_device::{DeviceManager, StagedDevice};
use crate::params::Frontend;
use crate::proto::csi::node_server::Node as NodeRpc;
use crate::proto::csi::node_service_capability::rpc::Type as Rpc;
use crate::proto::csi::node_service_capability::{self as ncap, Rpc as RpcCap};
use crate::proto::csi::volume_capability::access_mode::Mode;
use crate::proto::csi::*;

pub struct NodeService {
    node: String,
    api: Api,
    inflight: InFlight,
    kubelet_dir: PathBuf,
    devices: std::sync::Arc<DeviceManager>,
}

impl NodeService {
    pub fn new(
        node: String,
        api: Api,
        inflight: InFlight,
        kubelet_dir: &Path,
        devices: DeviceManager,
    ) -> anyhow::Result<NodeService> {
        hawser_api::validate_name("node", &node).map_err(|e| anyhow::anyhow!(e.message))?;
        let state_dir = devices.state_dir();
        std::fs::create_dir_all(state_dir)
            .map_err(|e| anyhow::anyhow!("create {}: {e}", state_dir.display()))?;
        Ok(NodeService {
            node,
            api,
            inflight,
            kubelet_dir: kubelet_dir.to_path_buf(),
            devices: std::sync::Arc::new(devices),
        })
    }

    /// A path from the kubelet: absolute, no `..`, inside the kubelet's directory.
    fn kubelet_path(&self, field: &str, value: &str) -> Result<PathBuf, Status> {
        let p = PathBuf::from(required(field, value)?);
        let plain = p.is_absolute()
            && p.components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !plain || !p.starts_with(&self.kubelet_dir) || p == self.kubelet_dir {
            return Err(Status::invalid_argument(format!(
                "{field} {value:?} is not a plain absolute path inside the kubelet's directory \
                 {} (see `hawser csi --kubelet-dir`)",
                self.kubelet_dir.display()
            )));
        }
        Ok(p)
    }

    /// Where to reach the volume's engine: the publish context, else the controller.
    async fn nbd_uri(&self, id: &str, ctx: &HashMap<String, String>) -> Result<String, Status> {
        if let Some(uri) = ctx.get(CTX_NBD_UNIX_URI).or_else(|| ctx.get(CTX_NBD_URI)) {
            return Ok(uri.clone());
        }
        let v: Volume = self
            .api
            .get(format!("/v1/volumes/{id}"))
            .await
            .map_err(|e| status(&format!("look up volume {id}"), e))?;
        let here = v.attached_node.as_deref() == Some(self.node.as_str());
        match (here, v.nbd_unix_uri.or(v.nbd_uri)) {
            (true, Some(uri)) => Ok(uri),
            _ => Err(Status::failed_precondition(format!(
                "volume {id} is not published on node {}: ControllerPublishVolume first",
                self.node
            ))),
        }
    }

    /// The staged device of volume `id`, or NOT_FOUND.
    async fn staged(&self, id: &str) -> Result<StagedDevice, Status> {
        let devices = self.devices.clone();
        let owned = id.to_string();
        let found = blocking(move || devices.find(&owned).map_err(internal)).await?;
        found.ok_or_else(|| {
            Status::not_found(format!("volume {id} is not staged on node {}", self.node))
        })
    }
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(Status::internal(format!("node task failed: {e}"))))
}

fn read_only(cap: Option<&VolumeCapability>) -> bool {
    cap.and_then(|c| c.access_mode.as_ref())
        .is_some_and(|m| m.mode() == Mode::SingleNodeReaderOnly)
}

/// Whether `path` shows the device `device`: a block device file for it, or a file on a
/// filesystem that lives on it.
fn shows_device(path: &Path, device: &Path) -> std::io::Result<bool> {
    let dev = std::fs::metadata(device)?.rdev();
    let m = std::fs::metadata(path)?;
    Ok(if m.file_type().is_block_device() {
        m.rdev() == dev
    } else {
        m.dev() == dev
    })
}

fn stage(
    devices: &DeviceManager,
    id: &str,
    uri: &str,
    access: &Access,
    read_only: bool,
    staging: &Path,
    frontend: Frontend,
) -> Result<(), Status> {
    let dev = devices
        .connect(id, uri, read_only, frontend)
        .map_err(internal)?;
    if let Access::Mount { fs, flags } = access {
        std::fs::create_dir_all(staging)
            .map_err(|e| internal(format!("create {}: {e}", staging.display())))?;
        let mut flags = flags.clone();
        if read_only {
            flags.push("ro".into());
        }
        mounts::format_and_mount(&dev.device, fs.name(), &flags, staging).map_err(internal)?;
    }
    Ok(())
}

fn unstage(devices: &DeviceManager, id: &str, staging: &Path) -> Result<(), Status> {
    if mounts::is_mount_point(staging).map_err(internal)? {
        mounts::unmount(staging).map_err(internal)?;
    }
    devices.disconnect(id).map_err(internal)
}

fn publish(
    dev: Option<StagedDevice>,
    access: &Access,
    staging: &Path,
    target: &Path,
    read_only: bool,
    id: &str,
) -> Result<(), Status> {
    let not_staged = || {
        Status::failed_precondition(format!(
            "volume {id} is not staged at {}: NodeStageVolume first",
            staging.display()
        ))
    };
    let dev = dev.ok_or_else(not_staged)?;
    if mounts::is_mount_point(target).map_err(internal)? {
        return Ok(());
    }
    match access {
        Access::Block => mounts::bind_device(&dev.device, target, read_only).map_err(internal),
        Access::Mount { .. } => {
            if !mounts::is_mount_point(staging).map_err(internal)? {
                return Err(not_staged());
            }
            std::fs::create_dir_all(target)
                .map_err(|e| internal(format!("create {}: {e}", target.display())))?;
            mounts::bind_mount(staging, target, read_only).map_err(internal)
        }
    }
}

fn unpublish(target: &Path) -> Result<(), Status> {
    if mounts::is_mount_point(target).map_err(internal)? {
        mounts::unmount(target).map_err(internal)?;
    }
    let removed = match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() => std::fs::remove_dir(target),
        Ok(_) => std::fs::remove_file(target),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    removed.map_err(|e| internal(format!("remove {}: {e}", target.display())))
}

fn rpc(t: Rpc) -> NodeServiceCapability {
    NodeServiceCapability {
        r#type: Some(ncap::Type::Rpc(RpcCap { r#type: t.into() })),
    }
}

#[tonic::async_trait]
impl NodeRpc for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        let id = required("volume_id", &req.volume_id)?.to_string();
        let staging = self.kubelet_path("staging_target_path", &req.staging_target_path)?;
        let access = capability::check_required(req.volume_capability.as_ref())?;
        let ro = read_only(req.volume_capability.as_ref());
        let _guard = self.inflight.begin(&id)?;
        let frontend = match req.volume_context.get(Frontend::CONTEXT_KEY) {
            None => Frontend::Auto,
            Some(f) => Frontend::parse(f).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "volume_context frontend={f:?}: expected auto, ublk, nbd or fuse"
                ))
            })?,
        };
        let uri = self.nbd_uri(&id, &req.publish_context).await?;
        let devices = self.devices.clone();
        blocking(move || stage(&devices, &id, &uri, &access, ro, &staging, frontend)).await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        let id = required("volume_id", &req.volume_id)?.to_string();
        let staging = self.kubelet_path("staging_target_path", &req.staging_target_path)?;
        let _guard = self.inflight.begin(&id)?;
        let devices = self.devices.clone();
        blocking(move || unstage(&devices, &id, &staging)).await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let id = required("volume_id", &req.volume_id)?.to_string();
        let target = self.kubelet_path("target_path", &req.target_path)?;
        let staging = self.kubelet_path("staging_target_path", &req.staging_target_path)?;
        let access = capability::check_required(req.volume_capability.as_ref())?;
        let ro = req.readonly || read_only(req.volume_capability.as_ref());
        let _guard = self.inflight.begin(&id)?;
        let devices = self.devices.clone();
        blocking(move || {
            let dev = devices.find(&id).map_err(internal)?;
            publish(dev, &access, &staging, &target, ro, &id)
        })
        .await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let id = required("volume_id", &req.volume_id)?.to_string();
        let target = self.kubelet_path("target_path", &req.target_path)?;
        let _guard = self.inflight.begin(&id)?;
        blocking(move || unpublish(&target)).await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        let id = required("volume_id", &req.volume_id)?.to_string();
        let path = PathBuf::from(required("volume_path", &req.volume_path)?);
        let dev = self.staged(&id).await?;
        let usage = blocking(move || volume_usage(&id, &dev, &path)).await?;
        // Best effort: the controller may be unreachable; the usage is still right.
        let volume_condition = match self
            .api
            .get::<Volume>(format!("/v1/volumes/{}", req.volume_id))
            .await
        {
            Ok(v) => Some(condition(&v)),
            Err(e) => {
                tracing::debug!(volume = %req.volume_id, error = %e, "no volume condition");
                None
            }
        };
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage,
            volume_condition,
        }))
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        let id = required("volume_id", &req.volume_id)?.to_string();
        let path = PathBuf::from(required("volume_path", &req.volume_path)?);
        let access = req
            .volume_capability
            .as_ref()
            .map(|c| capability::check(c).map_err(Status::invalid_argument))
            .transpose()?;
        let required = req
            .capacity_range
            .as_ref()
            .map_or(0, |r| u64::try_from(r.required_bytes).unwrap_or(0));
        let dev = self.staged(&id).await?;
        let _guard = self.inflight.begin(&id)?;
        let device = dev.device.clone();
        let size = blocking(move || expand(&id, &dev, &path, access.as_ref())).await?;
        if size < required {
            // nbdfuse (and any NBD client) keeps the size it connected with: the filesystem
            // grows when the volume is staged again. Not a success Kubernetes would record.
            return Err(Status::failed_precondition(format!(
                "{} is still {size} bytes, not {required}: its frontend cannot see a \
                 volume grow while staged; the filesystem grows when the volume is staged again \
                 (restart the pod)",
                device.display()
            )));
        }
        Ok(Response::new(NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let capabilities = [
            Rpc::StageUnstageVolume,
            Rpc::GetVolumeStats,
            Rpc::ExpandVolume,
            Rpc::VolumeCondition,
        ]
        .into_iter()
        .map(rpc)
        .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let mut segments = HashMap::from([(TOPOLOGY_NODE_KEY.to_string(), self.node.clone())]);
        match self
            .api
            .get::<Node>(format!("/v1/nodes/{}", self.node))
            .await
        {
            Ok(n) => {
                if let Some(zone) = n.labels.get(ZONE_LABEL) {
                    segments.insert(TOPOLOGY_ZONE_KEY.to_string(), zone.clone());
                }
            }
            Err(e) if is_not_found(&e) => {
                tracing::warn!(node = %self.node, "no agent registered under this node name yet");
            }
            Err(e) => return Err(status(&format!("look up node {}", self.node), e)),
        }
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(Topology { segments }),
        }))
    }
}

fn volume_usage(id: &str, dev: &StagedDevice, path: &Path) -> Result<Vec<VolumeUsage>, Status> {
    let shows = match shows_device(path, &dev.device) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Status::not_found(format!(
                "{} does not exist",
                path.display()
            )))
        }
        Err(e) => return Err(internal(format!("stat {}: {e}", path.display()))),
    };
    if !shows {
        return Err(Status::not_found(format!(
            "volume {id} is not at {}",
            path.display()
        )));
    }
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let is_block = std::fs::metadata(path)
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false);
    if is_block {
        let total = mounts::block_device_size(&dev.device).map_err(internal)?;
        return Ok(vec![VolumeUsage {
            total: int(total),
            unit: volume_usage::Unit::Bytes.into(),
            ..Default::default()
        }]);
    }
    let s = mounts::fs_stats(path).map_err(internal)?;
    Ok(vec![
        VolumeUsage {
            available: int(s.available_bytes),
            total: int(s.total_bytes),
            used: int(s.used_bytes),
            unit: volume_usage::Unit::Bytes.into(),
        },
        VolumeUsage {
            available: int(s.free_inodes),
            total: int(s.total_inodes),
            used: int(s.used_inodes),
            unit: volume_usage::Unit::Inodes.into(),
        },
    ])
}

fn expand(
    id: &str,
    dev: &StagedDevice,
    path: &Path,
    access: Option<&Access>,
) -> Result<u64, Status> {
    if !path.exists() {
        return Err(Status::not_found(format!(
            "{} does not exist",
            path.display()
        )));
    }
    // A kernel device of the agent was told the new size by the agent before the controller
    // answered the expand; a loop device (over nbdfuse) rereads its file's.
    if dev.device.starts_with("/dev/loop") {
        mounts::refresh_loop_size(&dev.device).map_err(internal)?;
    }
    let is_block = matches!(access, Some(Access::Block))
        || std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
    if !is_block {
        let fs = match access {
            Some(Access::Mount { fs, .. }) => fs.name().to_string(),
            _ => mounts::fs_type_of(&dev.device)
                .map_err(internal)?
                .ok_or_else(|| internal(format!("volume {id} has no filesystem to grow")))?,
        };
        mounts::grow_fs(&dev.device, path, &fs).map_err(internal)?;
    }
    mounts::block_device_size(&dev.device).map_err(internal)
}
