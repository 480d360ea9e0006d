//! The cluster's certificate authority: made once when the cluster is created, kept (with
//! its key) in the cluster's store so that every controller sharing the store issues for
//! the same cluster, and used to issue the controller's and each node's certificate.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use rand::RngCore;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber, SubjectPublicKeyInfo,
    PKCS_ECDSA_P256_SHA256,
};
use rustls_pki_types::CertificateDer;
use time::OffsetDateTime;

use crate::peer::{valid_name, Peer};

/// How long the CA is valid. Replacing it means issuing every certificate anew (see
/// docs/security.md); ten years keeps that an exceptional event.
pub const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// How long a node's or a controller's certificate is valid. Holders renew at two thirds
/// of it, so a certificate taken from a retired node stops working within this time.
pub const NODE_CERT_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

/// The most extra names ([`Ca::issue_with_names`]) one certificate carries: a server's
/// addresses and a few DNS names; more is a mistake or an abuse.
pub const MAX_EXTRA_NAMES: usize = 32;

/// Certificates are valid from a little before they are made: clocks of a cluster differ.
pub(crate) const CLOCK_SKEW: Duration = Duration::from_secs(300);

pub struct Ca {
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    key: KeyPair,
}

/// A certificate the CA issued.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The certificate, then the CA's (the chain a TLS peer presents).
    pub chain_pem: String,
    /// When it expires, in seconds since the Unix epoch.
    pub not_after_unix: u64,
}

impl Ca {
    /// A new CA for the cluster `cluster_id` (a P-256 key: every TLS stack speaks it).
    pub fn generate(cluster_id: &str) -> anyhow::Result<Ca> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("make the CA key")?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(&format!("Hawser cluster {cluster_id}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let (not_before, not_after) = validity(CA_LIFETIME);
        params.not_before = not_before;
        params.not_after = not_after;
        params.serial_number = Some(serial());
        let cert = params
            .self_signed(&key)
            .context("sign the CA certificate")?;
        Ok(Ca {
            cert_der: cert.der().clone(),
            cert_pem: cert.pem(),
            key,
        })
    }

    /// The CA as kept: its certificate and its key, both PEM. During a rotation `cert_pem`
    /// also holds the CA trusted beside it: the certificate taken is the one of the key.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> anyhow::Result<Ca> {
        use x509_parser::prelude::{FromDer, X509Certificate};
        let key = KeyPair::from_pem(key_pem).context("the CA key is not a PEM private key")?;
        let spki = key.subject_public_key_info();
        let certs = crate::pem::certs_from_pem(cert_pem)?;
        let cert_der = certs
            .into_iter()
            .find(|c| {
                X509Certificate::from_der(c)
                    .is_ok_and(|(_, cert)| cert.public_key().raw == spki.as_slice())
            })
            .context("the CA key is not the CA certificate's (nor of any certificate beside it)")?;
        anyhow::ensure!(
            Issuer::from_ca_cert_der(&cert_der, &key).is_ok(),
            "the CA certificate cannot be read as a CA"
        );
        Ok(Ca {
            cert_pem: der_to_pem(&cert_der),
            cert_der,
            key,
        })
    }

    /// The SHA-256 of the CA certificate's DER (what join tokens pin).
    pub fn fingerprint(&self) -> [u8; 32] {
        crate::join::ca_fingerprint(&self.cert_der)
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// The key, PEM (PKCS#8): for the store only.
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A 32-byte secret derived from the CA's private key for `purpose` and `context`
    /// (HKDF-SHA256): keys that must be the same on every controller that holds the CA,
    /// and must not be in the cluster store (the epoch grant key).
    pub fn derive_secret(&self, purpose: &str, context: &str) -> anyhow::Result<[u8; 32]> {
        derive_from_root(&self.secret_root(purpose), context)
    }

    /// The HKDF pseudorandom key of [`Ca::derive_secret`] for `purpose` (HKDF-Extract of the
    /// CA's key with `purpose` as salt): kept when the CA is replaced, so that secrets
    /// derived from the first CA (the grant key) outlive it without keeping its key.
    pub fn secret_root(&self, purpose: &str) -> [u8; 32] {
        let salt = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, purpose.as_bytes());
        let tag = ring::hmac::sign(&salt, &self.key.serialize_der());
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// A certificate naming `peer` for the public key `spki_der` (a DER SubjectPublicKeyInfo,
    /// as a joining agent sends it), usable by servers and clients, valid for `lifetime`.
    pub fn issue(
        &self,
        peer: &Peer,
        spki_der: &[u8],
        lifetime: Duration,
    ) -> anyhow::Result<Issued> {
        self.issue_with_names(peer, spki_der, lifetime, &[])
    }

    /// [`Ca::issue`], also valid for `extra_names` (DNS names or IP addresses): the names
    /// users dial a controller by, for clients that check them (curl, Prometheus).
    pub fn issue_with_names(
        &self,
        peer: &Peer,
        spki_der: &[u8],
        lifetime: Duration,
        extra_names: &[String],
    ) -> anyhow::Result<Issued> {
        if let Peer::Node(n) = peer {
            anyhow::ensure!(valid_name(n), "invalid node name {n:?}");
        }
        anyhow::ensure!(
            extra_names.len() <= MAX_EXTRA_NAMES,
            "{} names: a certificate carries at most {MAX_EXTRA_NAMES}",
            extra_names.len()
        );
        let public =
            SubjectPublicKeyInfo::from_der(spki_der).context("the public key is not valid")?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(&peer.to_string());
        let mut sans = Vec::new();
        for uri in peer.uris() {
            sans.push(SanType::URI(uri.try_into().context("the principal's URI")?));
        }
        sans.push(SanType::DnsName(
            peer.role_dns_name()
                .try_into()
                .context("the role's DNS name")?,
        ));
        for extra in extra_names {
            sans.push(san_of(extra)?);
        }
        params.subject_alt_names = sans;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let (not_before, not_after) = validity(lifetime);
        params.not_before = not_before;
        params.not_after = not_after;
        params.serial_number = Some(serial());
        let issuer = Issuer::from_ca_cert_der(&self.cert_der, &self.key)
            .context("read the CA certificate")?;
        let cert = params
            .signed_by(&public, &issuer)
            .context("sign the certificate")?;
        Ok(Issued {
            chain_pem: format!("{}{}", cert.pem(), self.cert_pem),
            not_after_unix: u64::try_from(not_after.unix_timestamp()).unwrap_or(0),
        })
    }

    /// A new key and a certificate for it naming `peer`: the controller's own, made at
    /// start and renewed while it runs (it never leaves the process).
    pub fn issue_with_key(
        &self,
        peer: &Peer,
        lifetime: Duration,
    ) -> anyhow::Result<(Issued, String)> {
        let (key_pem, spki) = new_key()?;
        Ok((self.issue(peer, &spki, lifetime)?, key_pem))
    }
}

/// [`Ca::derive_secret`] from a kept [`Ca::secret_root`] (HKDF-Expand).
pub fn derive_from_root(root: &[u8; 32], context: &str) -> anyhow::Result<[u8; 32]> {
    struct Len32;
    impl ring::hkdf::KeyType for Len32 {
        fn len(&self) -> usize {
            32
        }
    }
    let prk = ring::hkdf::Prk::new_less_safe(ring::hkdf::HKDF_SHA256, root);
    let info = [context.as_bytes()];
    let mut out = [0u8; 32];
    prk.expand(&info, Len32)
        .and_then(|okm| okm.fill(&mut out))
        .map_err(|_| anyhow::anyhow!("derive a secret"))?;
    Ok(out)
}

/// A certificate's DER as PEM.
pub fn der_to_pem(der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// A new P-256 key: its PEM (PKCS#8) and its public key (DER SubjectPublicKeyInfo).
pub fn new_key() -> anyhow::Result<(String, Vec<u8>)> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("make a key")?;
    Ok((key.serialize_pem(), key.subject_public_key_info()))
}

/// A subject alternative name for `text`: an IP address if it parses as one, else a DNS name.
fn san_of(text: &str) -> anyhow::Result<SanType> {
    if let Ok(ip) = text.parse::<std::net::IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let ok = !text.is_empty()
        && text.len() <= 253
        && text.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-')
        });
    anyhow::ensure!(ok, "{text:?} is neither an IP address nor a DNS name");
    Ok(SanType::DnsName(
        text.to_ascii_lowercase()
            .try_into()
            .with_context(|| format!("the DNS name {text:?}"))?,
    ))
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Hawser");
    dn.push(DnType::CommonName, common_name);
    dn
}

fn serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    bytes[0] &= 0x7f; // positive
    SerialNumber::from_slice(&bytes)
}

fn validity(lifetime: Duration) -> (OffsetDateTime, OffsetDateTime) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let at = |d: Duration| {
        OffsetDateTime::from_unix_timestamp(i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
            .unwrap_or(OffsetDateTime::UNIX_EPOCH)
    };
    (
        at(now.saturating_sub(CLOCK_SKEW)),
        at(now.saturating_add(lifetime)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::{peer_of, CONTROLLER_DNS_NAME};

    #[test]
    fn derived_secrets_are_the_cas_own() {
        let ca = Ca::generate("c").expect("test");
        let again = Ca::from_pem(ca.cert_pem(), &ca.key_pem()).expect("test");
        let other = Ca::generate("c").expect("test");
        let s = ca.derive_secret("p", "x").expect("test");
        assert_eq!(
            s,
            again.derive_secret("p", "x").expect("test"),
            "same CA, same secret"
        );
        assert_ne!(s, other.derive_secret("p", "x").expect("test"));
        assert_ne!(s, ca.derive_secret("p", "y").expect("test"));
        assert_ne!(s, ca.derive_secret("q", "x").expect("test"));
        assert_ne!(s, [0u8; 32]);
        // What HKDF gave before the root was split out: grant keys must not change.
        struct Len32;
        impl ring::hkdf::KeyType for Len32 {
            fn len(&self) -> usize {
                32
            }
        }
        let prk =
            ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"p").extract(&ca.key.serialize_der());
        let mut before = [0u8; 32];
        prk.expand(&[b"x".as_slice()], Len32)
            .and_then(|okm| okm.fill(&mut before))
            .expect("hkdf");
        assert_eq!(s, before);
        assert_eq!(
            derive_from_root(&ca.secret_root("p"), "x").expect("test"),
            s
        );
    }

    #[test]
    fn a_bundle_loads_as_the_keys_ca_and_a_foreign_key_is_refused() {
        let (a, b) = (
            Ca::generate("a").expect("ca"),
            Ca::generate("b").expect("ca"),
        );
        let both = format!("{}{}", a.cert_pem(), b.cert_pem());
        let again = Ca::from_pem(&both, &a.key_pem()).expect("bundle");
        assert_eq!(
            again.cert_pem(),
            a.cert_pem(),
            "only the CA's own certificate"
        );
        assert_eq!(again.fingerprint(), a.fingerprint());
        let second = Ca::from_pem(&both, &b.key_pem()).expect("the key's, second");
        assert_eq!(second.fingerprint(), b.fingerprint());
        let err = Ca::from_pem(a.cert_pem(), &b.key_pem())
            .err()
            .expect("mismatch");
        assert!(
            format!("{err:#}").contains("not the CA certificate's"),
            "{err:#}"
        );
    }

    #[test]
    fn issued_certificates_name_their_peer_and_chain_to_the_ca() {
        let ca = Ca::generate("c1").expect("ca");
        let again = Ca::from_pem(ca.cert_pem(), &ca.key_pem()).expect("reload");
        let (_, spki) = new_key().expect("key");
        let issued = again
            .issue(&Peer::Node("n1".into()), &spki, NODE_CERT_LIFETIME)
            .expect("issue");
        let chain = crate::pem::certs_from_pem(&issued.chain_pem).expect("pem");
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1], *ca.cert_der());
        assert_eq!(peer_of(&chain[0]), Ok(Peer::Node("n1".into())));
        assert!(peer_of(&chain[1]).is_err(), "the CA names nobody");
    }

    #[test]
    fn client_certificates_name_every_volume_and_their_node() {
        let ca = Ca::generate("c1").expect("ca");
        let (_, spki) = new_key().expect("key");
        let uid = |name: &str, uid: Option<&str>| crate::peer::ClientVolume {
            name: name.into(),
            uid: uid.map(str::to_string),
        };
        let scope = crate::peer::ClientScope::of(
            &[uid("b", Some(&"0a".repeat(16))), uid("a", None)],
            Some("n2"),
        )
        .expect("scope");
        let issued = ca
            .issue(&Peer::Client(scope.clone()), &spki, NODE_CERT_LIFETIME)
            .expect("issue");
        let chain = crate::pem::certs_from_pem(&issued.chain_pem).expect("pem");
        assert_eq!(peer_of(&chain[0]), Ok(Peer::Client(scope)));
    }

    #[test]
    fn extra_names_are_dns_names_or_addresses() {
        use x509_parser::extensions::GeneralName;
        use x509_parser::prelude::{FromDer, X509Certificate};
        let ca = Ca::generate("c1").expect("ca");
        let (_, spki) = new_key().expect("key");
        let extra = [
            "hawser.example.org".to_string(),
            "127.0.0.1".into(),
            "::1".into(),
        ];
        let issued = ca
            .issue_with_names(&Peer::Controller, &spki, NODE_CERT_LIFETIME, &extra)
            .expect("issue");
        let chain = crate::pem::certs_from_pem(&issued.chain_pem).expect("pem");
        let (_, cert) = X509Certificate::from_der(&chain[0]).expect("der");
        let san = cert.subject_alternative_name().expect("san").expect("san");
        let names: Vec<String> = san
            .value
            .general_names
            .iter()
            .map(|n| match n {
                GeneralName::DNSName(d) => d.to_string(),
                GeneralName::IPAddress(ip) => format!("ip:{}", ip.len()),
                GeneralName::URI(u) => u.to_string(),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            names,
            [
                "hawser://controller",
                CONTROLLER_DNS_NAME,
                "hawser.example.org",
                "ip:4",
                "ip:16"
            ]
        );
        assert_eq!(
            peer_of(&chain[0]),
            Ok(Peer::Controller),
            "names do not change the principal"
        );
        assert_eq!(
            crate::config::cert_names(&issued.chain_pem).expect("names"),
            [
                CONTROLLER_DNS_NAME,
                "hawser.example.org",
                "127.0.0.1",
                "::1"
            ]
        );
        let too_many: Vec<String> = (0..=MAX_EXTRA_NAMES)
            .map(|i| format!("n{i}.example"))
            .collect();
        assert!(ca
            .issue_with_names(&Peer::Controller, &spki, NODE_CERT_LIFETIME, &too_many)
            .is_err());
        for bad in ["", "a..b", "-a.b", "a_b", "*.example.org", "a b"] {
            assert!(
                ca.issue_with_names(&Peer::Controller, &spki, NODE_CERT_LIFETIME, &[bad.into()])
                    .is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn server_names_cover_loopback_and_the_addresses_listened_on() {
        let listen = [
            "10.1.2.3:9500".parse().expect("addr"),
            "0.0.0.0:9600".parse().expect("addr"),
        ];
        let names = crate::config::server_names(&listen, &[" Node1.Example ".into(), "::1".into()]);
        assert_eq!(
            names,
            ["localhost", "127.0.0.1", "::1", "10.1.2.3", "node1.example"]
        );
    }

    #[test]
    fn bad_input_is_an_error() {
        let ca = Ca::generate("c1").expect("ca");
        let (_, spki) = new_key().expect("key");
        assert!(ca
            .issue(&Peer::Node("A.b".into()), &spki, NODE_CERT_LIFETIME)
            .is_err());
        assert!(ca
            .issue(&Peer::Controller, b"garbage", NODE_CERT_LIFETIME)
            .is_err());
        assert!(Ca::from_pem("nope", &ca.key_pem()).is_err());
        assert!(Ca::from_pem(ca.cert_pem(), "nope").is_err());
    }
}
