//! Hawser's CSI driver (`hawser csi`): the CSI Identity, Controller and Node services on a
//! unix socket, backed by the controller's REST API and the node's agent, plus the kubelet's
//! plugin-registration service so no node-driver-registrar sidecar is needed.

pub mod proto;
