//! ControllerPublish / Unpublish: attach a volume's engine on a node, or detach it.
//!
//! A volume is attached on one node at a time. Publishing to a new node while the old one is
//! online is refused (FAILED_PRECONDITION: Kubernetes unpublishes it there first). While the
//! old node is offline (no heartbeat), the volume is detached from it and attached on the
//! new one: the attach takes a new epoch, so the replicas refuse the old engine even if its
//! node comes back (docs/protocol.md, fencing).

use std::collections::HashMap;

use hawser_api::controller::{Attach, Node, NodeState, Volume, VolumeState};
use serde_json::json;
use tonic::Status;

use crate::api::{is_not_found, status};
use crate::capability;
use crate::controller::{required, ControllerService};
use crate::proto::csi::{ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest};

/// Publish-context keys the node service reads.
pub const CTX_NBD_URI: &str = "nbdUri";
pub const CTX_NBD_UNIX_URI: &str = "nbdUnixUri";
pub const CTX_EPOCH: &str = "epoch";

fn context(v: &Volume) -> Result<HashMap<String, String>, Status> {
    let mut ctx = HashMap::new();
    if let Some(uri) = &v.nbd_uri {
        ctx.insert(CTX_NBD_URI.to_string(), uri.clone());
    }
    if let Some(uri) = &v.nbd_unix_uri {
        ctx.insert(CTX_NBD_UNIX_URI.to_string(), uri.clone());
    }
    if ctx.is_empty() {
        return Err(Status::internal(format!(
            "volume {} is attached but its node exports no NBD address",
            v.name
        )));
    }
    ctx.insert(CTX_EPOCH.to_string(), v.epoch.to_string());
    Ok(ctx)
}

impl ControllerService {
    async fn node(&self, name: &str) -> Result<Option<Node>, Status> {
        match self.api.get::<Node>(format!("/v1/nodes/{name}")).await {
            Ok(n) => Ok(Some(n)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(status(&format!("look up node {name}"), e)),
        }
    }

    async fn get_volume(&self, id: &str) -> Result<Volume, Status> {
        match self.api.get::<Volume>(format!("/v1/volumes/{id}")).await {
            Ok(v) => Ok(v),
            Err(e) if is_not_found(&e) => {
                Err(Status::not_found(format!("volume {id} does not exist")))
            }
            Err(e) => Err(status(&format!("look up volume {id}"), e)),
        }
    }

    async fn detach(&self, id: &str) -> Result<(), Status> {
        self.api
            .post::<_, Volume>(format!("/v1/volumes/{id}/detach"), json!({}))
            .await
            .map(|_| ())
            .map_err(|e| status(&format!("detach volume {id}"), e))
    }

    pub(crate) async fn publish(
        &self,
        req: &ControllerPublishVolumeRequest,
    ) -> Result<HashMap<String, String>, Status> {
        let id = required("volume_id", &req.volume_id)?;
        let node_id = required("node_id", &req.node_id)?;
        capability::check_required(req.volume_capability.as_ref())?;
        let _guard = self.inflight.begin(id)?;
        let v = self.get_volume(id).await?;
        if self.node(node_id).await?.is_none() {
            return Err(Status::not_found(format!(
                "node {node_id} is not a Hawser node (no agent registered under that name)"
            )));
        }
        match (v.state, v.attached_node.as_deref()) {
            (VolumeState::Attached, Some(n)) if n == node_id => {}
            (VolumeState::Attached, Some(old)) => {
                let online = self
                    .node(old)
                    .await?
                    .is_some_and(|n| n.state == NodeState::Online);
                if online {
                    return Err(Status::failed_precondition(format!(
                        "volume {id} is published on node {old}, which is online; unpublish \
                         it there first (a Hawser volume is used on one node at a time)"
                    )));
                }
                tracing::warn!(
                    volume = id,
                    old,
                    new = node_id,
                    "publishing on a new node while the old one is offline: fencing the old engine"
                );
                self.detach(id).await?;
            }
            _ => {}
        }
        let attach = Attach {
            node: node_id.to_string(),
        };
        let v: Volume = self
            .api
            .post(format!("/v1/volumes/{id}/attach"), attach)
            .await
            .map_err(|e| status(&format!("attach volume {id} on node {node_id}"), e))?;
        context(&v)
    }

    pub(crate) async fn unpublish(
        &self,
        req: &ControllerUnpublishVolumeRequest,
    ) -> Result<(), Status> {
        let id = required("volume_id", &req.volume_id)?;
        let _guard = self.inflight.begin(id)?;
        let v = match self.get_volume(id).await {
            Ok(v) => v,
            // Nothing to unpublish: the volume is gone (the spec's idempotent case).
            Err(s) if s.code() == tonic::Code::NotFound => return Ok(()),
            Err(s) => return Err(s),
        };
        let attached_here = v.state == VolumeState::Attached
            && v.attached_node
                .as_deref()
                .is_some_and(|n| req.node_id.is_empty() || n == req.node_id);
        if attached_here {
            self.detach(id).await?;
        }
        Ok(())
    }
}
