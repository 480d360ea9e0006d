//! The CSI Identity service: the driver's name and version, what it offers, and readiness.

use tonic::{Request, Response, Status};

use crate::names::DRIVER_NAME;
use crate::proto::csi::identity_server::Identity;
use crate::proto::csi::plugin_capability::{self, service, volume_expansion};
use crate::proto::csi::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
};

pub struct IdentityService {
    /// Whether this process serves the Controller service (controller mode or both).
    pub controller: bool,
}

fn capability(t: plugin_capability::Type) -> PluginCapability {
    PluginCapability { r#type: Some(t) }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        use plugin_capability::Type;
        let mut capabilities = vec![
            capability(Type::Service(plugin_capability::Service {
                r#type: service::Type::VolumeAccessibilityConstraints.into(),
            })),
            // Online: a volume staged on kernel NBD (or ublk on Linux 6.16 and later) grows
            // under its mounted filesystem. Where the node's device cannot follow (ublk before
            // 6.16), the controller refuses the grow before anything changes
            // (FAILED_PRECONDITION), and Kubernetes retries it until no pod uses the volume:
            // offline, as before (docs/csi.md, "Expansion").
            capability(Type::VolumeExpansion(plugin_capability::VolumeExpansion {
                r#type: volume_expansion::Type::Online.into(),
            })),
        ];
        if self.controller {
            capabilities.insert(
                0,
                capability(Type::Service(plugin_capability::Service {
                    r#type: service::Type::ControllerService.into(),
                })),
            );
        }
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}
