//! The generated gRPC types: `csi::v1` (CSI spec v1.12.0, `proto/csi.proto` as published: the
//! last version with VolumeCondition, which Kubernetes 1.33 reads; 1.13 replaced it) and
//! the kubelet's `pluginregistration` (v1).

#[allow(clippy::all, clippy::pedantic, missing_docs, unused_qualifications)]
pub mod csi {
    tonic::include_proto!("csi.v1");
}

#[allow(clippy::all, clippy::pedantic, missing_docs, unused_qualifications)]
pub mod registration {
    tonic::include_proto!("pluginregistration");
}
