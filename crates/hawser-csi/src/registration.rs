//! The kubelet's plugin registration (pluginregistration.v1), served by the node plugin
//! itself: the kubelet watches `<kubelet-dir>/plugins_registry`, calls GetInfo on each socket
//! that appears there, then NotifyRegistrationStatus. This replaces the
//! node-driver-registrar sidecar (one process fewer per node).
//!
//! The kubelet does not ask again after a failed registration (NodeGetInfo failed, e.g. the
//! controller was not reachable yet after a reboot): the server then offers the socket anew
//! (`server.rs`), which the kubelet sees as a new plugin.

use std::path::PathBuf;

use tonic::{Request, Response, Status};

use crate::names::DRIVER_NAME;
use crate::proto::registration::registration_server::Registration;
use crate::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};

/// The plugin type the kubelet routes to its CSI plugin manager.
const CSI_PLUGIN_TYPE: &str = "CSIPlugin";
/// CSI versions the kubelet may use with this driver.
const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

pub struct RegistrationService {
    /// Told when the kubelet refused the registration.
    pub refused: std::sync::Arc<tokio::sync::Notify>,
    /// The CSI socket the kubelet calls for NodeStage and friends.
    pub csi_endpoint: PathBuf,
}

/// The registration socket's path in the kubelet's watched directory.
pub fn socket_path(kubelet_dir: &std::path::Path) -> PathBuf {
    kubelet_dir
        .join("plugins_registry")
        .join(format!("{DRIVER_NAME}-reg.sock"))
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: CSI_PLUGIN_TYPE.into(),
            name: DRIVER_NAME.into(),
            endpoint: self.csi_endpoint.display().to_string(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = request.get_ref();
        if s.plugin_registered {
            tracing::info!(driver = DRIVER_NAME, "registered with the kubelet");
        } else {
            // The kubelet will not call this node plugin until the socket is offered again.
            tracing::error!(driver = DRIVER_NAME, error = %s.error, "the kubelet refused the registration; offering it again shortly");
            self.refused.notify_one();
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
