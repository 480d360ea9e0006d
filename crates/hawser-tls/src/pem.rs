//! Certificates out of PEM text, for every other file here: a leaf, so that the CA, the
//! certificate and trust slots and the configurations can all read PEM without reaching
//! into each other.

use anyhow::Context;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// Every certificate in a PEM text (at least one).
pub fn certs_from_pem(pem: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("malformed PEM certificate")?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in the PEM text");
    Ok(certs)
}
