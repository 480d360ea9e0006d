//! The generated gRPC types: `csi::v1` (CSI spec v1.12.0, `proto/csi.proto` as published) and
//! the kubelet's `pluginregistration` (v1).

#[allow(clippy::all, clippy::pedantic, missing_docs, unused_qualifications)]
pub mod csi {
    tonic::include_proto!("csi.v1");
}

#[allow(clippy::all, clippy::pedantic, missing_docs, unused_qualifications)]
pub mod registration {
    tonic::include_proto!("pluginregistration");
}
