//! `hawser volume client-cert`: a certificate for an NBD client of some volumes, written in
//! the layout libnbd and qemu read (`ca-cert.pem`, `client-cert.pem`, `client-key.pem`). The
//! key is made here and never leaves this machine; the controller signs its public half.

use std::path::{Path, PathBuf};

use hawser_api::controller::{ClientCertificate, CreateClientCertificate};

use crate::cli::args::{parse_duration_secs, parse_node_name, parse_volume_name};
use crate::cli::client::{CliError, Client};
use crate::cli::cluster::write_private;

#[derive(clap::Args, Debug)]
pub struct ClientCertArgs {
    /// The volumes whose NBD exports the certificate opens (one or more).
    #[arg(required = true, value_parser = parse_volume_name)]
    names: Vec<String>,
    /// Only at this node's NBD port (where the volume is attached); any node's without it.
    #[arg(long, value_parser = parse_node_name)]
    node: Option<String>,
    /// How long it is valid: e.g. 90s, 30m, 24h, 7d (at most 30 days).
    #[arg(long, default_value = "24h", value_parser = parse_duration_secs)]
    ttl: u64,
    /// The directory to write ca-cert.pem, client-cert.pem and client-key.pem (mode 0600)
    /// into; created if missing. Point `nbds://...?tls-certificates=DIR` or qemu's
    /// `tls-creds-x509,dir=DIR` at it.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(client: &Client, args: ClientCertArgs) -> Result<(), CliError> {
    let local = |what: String| CliError::Token(what);
    let (key_pem, spki) = hawser_tls::new_key().map_err(|e| local(format!("make a key: {e:#}")))?;
    let req = CreateClientCertificate {
        volumes: args.names,
        node: args.node,
        ttl_secs: Some(args.ttl),
        public_key: b64(&spki),
    };
    let cert: ClientCertificate = client.post("/v1/client-certificates", &req)?;
    std::fs::create_dir_all(&args.out)
        .map_err(|e| local(format!("create {}: {e}", args.out.display())))?;
    let file = |name: &str| -> PathBuf { args.out.join(name) };
    write_private(&file("client-key.pem"), key_pem.trim_end())?;
    write_public(&file("client-cert.pem"), &cert.chain_pem)?;
    write_public(&file("ca-cert.pem"), &cert.ca_pem)?;
    let at = cert.node.map_or("any node".into(), |n| format!("node {n}"));
    eprintln!(
        "wrote {}: opens volume {} at {at}'s NBD port, for {} s",
        args.out.display(),
        cert.volumes.join(", "),
        args.ttl
    );
    Ok(())
}

fn write_public(path: &Path, text: &str) -> Result<(), CliError> {
    std::fs::write(path, text)
        .map_err(|e| CliError::Token(format!("write {}: {e}", path.display())))
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
