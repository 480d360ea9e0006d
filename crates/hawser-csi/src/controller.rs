//! The CSI Controller service: volumes through the Hawser controller's REST API.
//! Publish and unpublish live in `controller_publish.rs`.

pub mod snapshots;

use std::collections::HashMap;

use hawser_api::controller::{Node, PoolInfo, ReplicaState, Volume, VolumeSource, VolumeState};
use serde_json::json;
use tonic::{Request, Response, Status};

use crate::api::{is_not_found, status, Api};
use crate::capability::{self, Access};
use crate::capacity::{self, size_fits};
use crate::inflight::InFlight;
use crate::names::{volume_id_for, MAX_CSI_NAME_LEN, TOPOLOGY_NODE_KEY};
use crate::paging;
use crate::params::{self, VolumeParams};
use crate::proto::csi::controller_server::Controller;
use crate::proto::csi::controller_service_capability::rpc::Type as Rpc;
use crate::proto::csi::controller_service_capability::{self as ccap, Rpc as RpcCap};
use crate::proto::csi::*;

pub struct ControllerService {
    pub api: Api,
    pub inflight: InFlight,
}

pub(crate) fn required<'a>(field: &str, value: &'a str) -> Result<&'a str, Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is required")));
    }
    Ok(value)
}

pub(crate) fn csi_volume(v: &Volume) -> crate::proto::csi::Volume {
    crate::proto::csi::Volume {
        capacity_bytes: i64::try_from(v.size_bytes).unwrap_or(i64::MAX),
        volume_id: v.name.clone(),
        // A volume is reachable from every node that runs an agent: its engine starts on the
        // node it is attached to and connects to the replicas over the network.
        accessible_topology: vec![],
        content_source: snapshots::content_source(v.origin.as_ref()),
        ..Default::default()
    }
}

/// Degraded (fewer in-sync replicas than asked) is abnormal: data is at risk until resync.
pub(crate) fn condition(v: &Volume) -> VolumeCondition {
    let lagging: Vec<String> = v
        .replicas
        .iter()
        .filter(|r| r.state != ReplicaState::InSync)
        .map(|r| format!("{} on {} is {:?}", r.id, r.node, r.state).to_lowercase())
        .collect();
    let in_sync = v.replicas.len() - lagging.len();
    let missing = (v.replica_count as usize).saturating_sub(v.replicas.len());
    if lagging.is_empty() && missing == 0 {
        return VolumeCondition {
            abnormal: false,
            message: format!("healthy: {in_sync} of {} replicas in sync", v.replica_count),
        };
    }
    VolumeCondition {
        abnormal: true,
        message: format!(
            "degraded: {in_sync} of {} replicas in sync ({}); Hawser resyncs or replaces them",
            v.replica_count,
            if lagging.is_empty() {
                format!("{missing} missing")
            } else {
                lagging.join(", ")
            }
        ),
    }
}

fn published_nodes(v: &Volume) -> Vec<String> {
    match (v.state, &v.attached_node) {
        (VolumeState::Attached, Some(n)) => vec![n.clone()],
        _ => vec![],
    }
}

/// The node Kubernetes picked for the pod (WaitForFirstConsumer), if it said.
fn preferred_node(req: &CreateVolumeRequest) -> Option<&str> {
    let t = req.accessibility_requirements.as_ref()?;
    t.preferred
        .iter()
        .chain(t.requisite.iter())
        .find_map(|seg| seg.segments.get(TOPOLOGY_NODE_KEY))
        .map(String::as_str)
}

impl ControllerService {
    async fn volume(&self, id: &str) -> Result<Option<Volume>, Status> {
        match self.api.get::<Volume>(format!("/v1/volumes/{id}")).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(status(&format!("look up volume {id}"), e)),
        }
    }

    /// An existing volume answers a CreateVolume when it matches the request.
    fn existing(
        v: Volume,
        name: &str,
        req: &CreateVolumeRequest,
        p: &VolumeParams,
        from: Option<&VolumeSource>,
    ) -> Result<Volume, Status> {
        let mismatch = if !size_fits(v.size_bytes, req.capacity_range.as_ref()) {
            Some(format!("its size is {} bytes", v.size_bytes))
        } else if v.origin.as_ref() != from {
            Some(match &v.origin {
                Some(o) => format!("it was created from {o:?}"),
                None => "it was created empty".to_string(),
            })
        } else {
            p.mismatch(&v)
        };
        if let Some(why) = mismatch {
            return Err(Status::already_exists(format!(
                "volume {name:?} exists (as {}) with other parameters: {why}",
                v.name
            )));
        }
        if matches!(v.state, VolumeState::Creating | VolumeState::Deleting) {
            return Err(Status::aborted(format!(
                "volume {} is {:?}; retry when that ends",
                v.name, v.state
            )));
        }
        Ok(v)
    }

    async fn create(&self, req: &CreateVolumeRequest) -> Result<Volume, Status> {
        let name = required("name", &req.name)?;
        if name.len() > MAX_CSI_NAME_LEN {
            return Err(Status::invalid_argument(format!(
                "name is {} bytes; the CSI limit is {MAX_CSI_NAME_LEN}",
                name.len()
            )));
        }
        capability::check_all(&req.volume_capabilities)?;
        let mut p = params::parse(&req.parameters).map_err(Status::invalid_argument)?;
        // A VolumeAttributesClass's parameters: the limits, over the StorageClass's.
        let mutable =
            params::parse_mutable(&req.mutable_parameters).map_err(Status::invalid_argument)?;
        p.qos = p.qos.patched(&mutable);
        let id = volume_id_for(name);
        let _guard = self.inflight.begin(&id)?;
        let source = match &req.volume_content_source {
            Some(src) => Some(self.source(src).await?),
            None => None,
        };
        let from = source.as_ref().and_then(|s| s.from.as_ref());
        if let Some(v) = self.volume(&id).await? {
            return Self::existing(v, name, req, &p, from);
        }
        let size = match &source {
            Some(s) => snapshots::clone_size(req.capacity_range.as_ref(), s.size_bytes)?,
            None => capacity::size_for(req.capacity_range.as_ref())?,
        };
        let mut body = p.create_request(&id, size, preferred_node(req));
        body.from = from.cloned();
        body.from_backup = source.as_ref().and_then(|s| s.from_backup.clone());
        match self.api.post::<_, Volume>("/v1/volumes".into(), body).await {
            Ok(v) => Ok(v),
            // Created by a concurrent call (another provisioner replica): same rules.
            Err(e)
                if matches!(&e, hawser_api::client::ClientError::Api(a)
                if a.code == hawser_api::ErrorCode::AlreadyExists) =>
            {
                match self.volume(&id).await? {
                    Some(v) => Self::existing(v, name, req, &p, from),
                    None => Err(Status::aborted(format!("volume {id} vanished; retry"))),
                }
            }
            Err(e) => Err(status(&format!("create volume {id} for {name:?}"), e)),
        }
    }

    async fn capacity_of(&self, req: &GetCapacityRequest) -> Result<capacity::Capacity, Status> {
        let p = params::parse(&req.parameters).map_err(Status::invalid_argument)?;
        for cap in &req.volume_capabilities {
            if capability::check(cap).is_err() {
                return Ok(capacity::Capacity::default());
            }
        }
        let nodes: Vec<Node> = self
            .api
            .get("/v1/nodes".into())
            .await
            .map_err(|e| status("list nodes", e))?;
        let pools: Vec<PoolInfo> = self
            .api
            .get("/v1/pools".into())
            .await
            .map_err(|e| status("list pools", e))?;
        let empty = HashMap::new();
        let segment = req
            .accessible_topology
            .as_ref()
            .map_or(&empty, |t| &t.segments);
        Ok(capacity::capacity(
            &nodes,
            &pools,
            segment,
            p.thin,
            p.pool.as_deref(),
        ))
    }
}

fn rpc(t: Rpc) -> ControllerServiceCapability {
    ControllerServiceCapability {
        r#type: Some(ccap::Type::Rpc(RpcCap { r#type: t.into() })),
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let v = self.create(request.get_ref()).await?;
        let mut volume = csi_volume(&v);
        // A volume restored from a backup keeps no origin (a clone does): the source is the
        // request's. external-provisioner deletes a volume whose answer lacks its source.
        if volume.content_source.is_none() {
            volume
                .content_source
                .clone_from(&request.get_ref().volume_content_source);
        }
        // The StorageClass's frontend reaches NodeStage in the volume context (a Hawser
        // volume does not keep it: it is how this PV is staged, not what the volume is).
        if let Some(f) = request
            .get_ref()
            .parameters
            .get(params::Frontend::CONTEXT_KEY)
        {
            volume
                .volume_context
                .insert(params::Frontend::CONTEXT_KEY.to_owned(), f.clone());
        }
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(volume),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let id = required("volume_id", &request.get_ref().volume_id)?;
        let _guard = self.inflight.begin(id)?;
        match self.api.delete(format!("/v1/volumes/{id}")).await {
            Ok(()) => Ok(Response::new(DeleteVolumeResponse {})),
            Err(e) if is_not_found(&e) => Ok(Response::new(DeleteVolumeResponse {})),
            Err(e) => Err(status(&format!("delete volume {id}"), e)),
        }
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let publish_context = self.publish(request.get_ref()).await?;
        Ok(Response::new(ControllerPublishVolumeResponse {
            publish_context,
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        self.unpublish(request.get_ref()).await?;
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.get_ref();
        let id = required("volume_id", &req.volume_id)?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        if self.volume(id).await?.is_none() {
            return Err(Status::not_found(format!("volume {id} does not exist")));
        }
        let unsupported = req
            .volume_capabilities
            .iter()
            .find_map(|c| capability::check(c).err())
            .or_else(|| params::parse(&req.parameters).err());
        let response = match unsupported {
            Some(message) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            },
            None => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context.clone(),
                    volume_capabilities: req.volume_capabilities.clone(),
                    parameters: req.parameters.clone(),
                    mutable_parameters: Default::default(),
                }),
                message: String::new(),
            },
        };
        Ok(Response::new(response))
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let req = request.get_ref();
        let vols: Vec<Volume> = self
            .api
            .get("/v1/volumes".into())
            .await
            .map_err(|e| status("list volumes", e))?;
        let (vols, next_token) =
            paging::page(vols, |v| &v.name, req.max_entries, &req.starting_token)?;
        let entries = vols
            .iter()
            .map(|v| list_volumes_response::Entry {
                volume: Some(csi_volume(v)),
                status: Some(list_volumes_response::VolumeStatus {
                    published_node_ids: published_nodes(v),
                    volume_condition: Some(condition(v)),
                }),
            })
            .collect();
        Ok(Response::new(ListVolumesResponse {
            entries,
            next_token,
        }))
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let c = self.capacity_of(request.get_ref()).await?;
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        Ok(Response::new(GetCapacityResponse {
            available_capacity: int(c.available),
            maximum_volume_size: Some(int(c.maximum_volume)),
            minimum_volume_size: Some(i64::try_from(capacity::ALIGN).unwrap_or(4096)),
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let capabilities = [
            Rpc::CreateDeleteVolume,
            Rpc::PublishUnpublishVolume,
            Rpc::ListVolumes,
            Rpc::GetCapacity,
            Rpc::ExpandVolume,
            Rpc::ListVolumesPublishedNodes,
            Rpc::VolumeCondition,
            Rpc::GetVolume,
            Rpc::CreateDeleteSnapshot,
            Rpc::ListSnapshots,
            Rpc::GetSnapshot,
            Rpc::CloneVolume,
            Rpc::ModifyVolume,
        ]
        .into_iter()
        .map(rpc)
        .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let req = request.get_ref();
        let id = required("volume_id", &req.volume_id)?;
        let range = req
            .capacity_range
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("capacity_range is required"))?;
        let size = capacity::size_for(Some(range))?;
        let access = req
            .volume_capability
            .as_ref()
            .map(|c| capability::check(c).map_err(Status::invalid_argument))
            .transpose()?;
        let _guard = self.inflight.begin(id)?;
        let v: Volume = self
            .api
            .post(
                format!("/v1/volumes/{id}/expand"),
                json!({ "size_bytes": size }),
            )
            .await
            .map_err(|e| status(&format!("expand volume {id} to {size} bytes"), e))?;
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(v.size_bytes).unwrap_or(i64::MAX),
            // A filesystem must grow on the node; a raw block volume is done.
            node_expansion_required: !matches!(access, Some(Access::Block)),
        }))
    }

    /// A VolumeAttributesClass changed: its parameters are the volume's limits, which take
    /// effect at once, attached or not.
    async fn controller_modify_volume(
        &self,
        request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        let req = request.get_ref();
        let id = required("volume_id", &req.volume_id)?;
        let patch =
            params::parse_mutable(&req.mutable_parameters).map_err(Status::invalid_argument)?;
        let _guard = self.inflight.begin(id)?;
        if patch.is_empty() {
            // Nothing to change, but the volume must exist.
            self.volume(id)
                .await?
                .ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))?;
        } else {
            let _: Volume = self
                .api
                .post(format!("/v1/volumes/{id}/qos"), patch)
                .await
                .map_err(|e| status(&format!("set the limits of volume {id}"), e))?;
        }
        Ok(Response::new(ControllerModifyVolumeResponse {}))
    }

    async fn controller_get_volume(
        &self,
        request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        let id = required("volume_id", &request.get_ref().volume_id)?;
        let v = self
            .volume(id)
            .await?
            .ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))?;
        Ok(Response::new(ControllerGetVolumeResponse {
            volume: Some(csi_volume(&v)),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: published_nodes(&v),
                volume_condition: Some(condition(&v)),
            }),
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let s = self.take_snapshot(request.get_ref()).await?;
        Ok(Response::new(CreateSnapshotResponse { snapshot: Some(s) }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let id = required("snapshot_id", &request.get_ref().snapshot_id)?;
        self.drop_snapshot(id).await?;
        Ok(Response::new(DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        Ok(Response::new(
            self.list_snapshots_page(request.get_ref()).await?,
        ))
    }

    async fn get_snapshot(
        &self,
        request: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        let s = self
            .get_snapshot_by_id(&request.get_ref().snapshot_id)
            .await?;
        Ok(Response::new(GetSnapshotResponse { snapshot: Some(s) }))
    }
}
