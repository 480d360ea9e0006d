//! Certificates for a test etcd that runs as a real one should: TLS on its client port, client
//! certificates required (`--client-cert-auth`), and etcd's own authentication on, so a client
//! is the user its certificate's common name (or its user name and password) says.
//!
//! Made fresh for each test in its directory: a CA, etcd's server certificate (for
//! `127.0.0.1` and `localhost`), and client certificates named by the users of
//! [`crate::etcd_process::EtcdProcess::start_secure`].

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use hawser_store::{EtcdIdentity, EtcdTls};

/// The files of one test etcd's certificates.
pub struct EtcdPki {
    dir: PathBuf,
}

impl EtcdPki {
    /// Makes a CA, a server certificate and one client certificate for each of `clients`
    /// (common names) in `dir`.
    pub fn create(dir: &Path, clients: &[&str]) -> Result<EtcdPki, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let pki = EtcdPki {
            dir: dir.to_path_buf(),
        };
        let ca_key = KeyPair::generate().map_err(|e| format!("CA key: {e}"))?;
        let mut ca = CertificateParams::default();
        ca.distinguished_name = name("test etcd CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca
            .self_signed(&ca_key)
            .map_err(|e| format!("CA certificate: {e}"))?;
        pki.write("ca.pem", ca_cert.pem())?;
        let issuer = Issuer::new(ca, ca_key);

        let mut server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into()])
            .map_err(|e| format!("server names: {e}"))?;
        server.distinguished_name = name("etcd");
        server.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            // etcd also dials itself as a client (its gRPC gateway).
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        pki.issue("server", server, &issuer)?;
        for cn in clients {
            let mut client = CertificateParams::default();
            client.distinguished_name = name(cn);
            client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            pki.issue(cn, client, &issuer)?;
        }
        Ok(pki)
    }

    fn issue(
        &self,
        file: &str,
        params: CertificateParams,
        issuer: &Issuer<'_, KeyPair>,
    ) -> Result<(), String> {
        let key = KeyPair::generate().map_err(|e| format!("{file} key: {e}"))?;
        let cert = params
            .signed_by(&key, issuer)
            .map_err(|e| format!("{file} certificate: {e}"))?;
        self.write(&format!("{file}.pem"), cert.pem())?;
        self.write(&format!("{file}.key"), key.serialize_pem())
    }

    fn write(&self, file: &str, text: String) -> Result<(), String> {
        let path = self.dir.join(file);
        std::fs::write(&path, text).map_err(|e| format!("write {}: {e}", path.display()))
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// `(certificate, key)` files of `name` (`server` or a client's common name).
    pub fn pair(&self, name: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("{name}.pem")),
            self.dir.join(format!("{name}.key")),
        )
    }

    /// TLS options of a client: the CA, and the certificate of `client` if given.
    pub fn tls(&self, client: Option<&str>) -> Result<EtcdTls, String> {
        let read = |p: PathBuf| std::fs::read(&p).map_err(|e| format!("read {}: {e}", p.display()));
        let client = match client {
            Some(cn) => {
                let (cert, key) = self.pair(cn);
                Some(EtcdIdentity {
                    cert_pem: read(cert)?,
                    key_pem: read(key)?,
                })
            }
            None => None,
        };
        Ok(EtcdTls {
            ca_pem: read(self.ca_file())?,
            client,
        })
    }
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}
