//! Generates the CSI and kubelet plugin-registration gRPC types from their protos (protoc is
//! one of the Makefile's packages).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // RPCs Hawser does not advertise (snapshots, group snapshots, modify) answer
        // UNIMPLEMENTED without a hand-written stub each.
        .generate_default_stubs(true)
        .compile_protos(
            &["proto/csi.proto", "proto/pluginregistration.proto"],
            &["proto"],
        )?;
    Ok(())
}
