//! `hawser cluster rotate-ca`: replacing the cluster's CA without a detach or an I/O error
//! (issue 39, item 4). Three steps, each refused until the cluster is ready for it:
//!
//! 1. **trust**: a new CA is made and trusted beside the old one, by the controllers at
//!    once and by each node at its next heartbeat (the answer carries both). Nothing is
//!    reissued, so nothing yet depends on the new CA.
//! 2. **issue** (once every online node trusts the new CA): the controllers reissue their
//!    own certificates on the new CA and issue every new one from it; each node renews at
//!    its next heartbeat, because the answer names another issuer than its certificate's.
//!    Both CAs are still trusted, so certificates of either are accepted meanwhile.
//! 3. **retire** (once every online node's certificate is of the new CA): the old CA is
//!    trusted no more and its key is deleted. Nodes drop it at their next heartbeat.
//!
//! Handshakes are checked against the CAs of the moment; connections already open (replica
//! sessions, NBD) carry on through every step. Nodes that were offline meanwhile trust only
//! the old CA: after step 3 they rejoin with a join token (or the agent token and the new
//! `ca.pem`), which the agent does by itself when its bootstrap names a CA it does not trust.
//!
//! The rotation is a record in the store (`auth/ca-rotation`), which every controller
//! follows: the new CA's key and the grant key's root travel in it sealed (AES-256-GCM)
//! under a key derived from the old CA's key, which every controller of the cluster holds
//! and the store never sees. The grant key does not change: it derives from the first CA's
//! secret root, kept as `grant-root.key` once that CA is retired.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hawser_api::auth::digest_hex as hex;
use hawser_api::controller::{CaRotation, CaRotationStep, ClusterCa, StartCaRotationStep};
use hawser_store::{get_json, put_json, Expect};
use hawser_tls::Ca;
use serde::{Deserialize, Serialize};

use crate::auth::ca_home::{b64, decode_root};
use crate::auth::tls::{AppliedRotation, ControllerTls};
use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::now_ms;

const ROTATION_KEY: &str = "auth/ca-rotation";
const SEAL_PURPOSE: &str = "hawser ca rotation seal v1";
/// How often a controller looks for a step another controller took.
const FOLLOW_INTERVAL: Duration = Duration::from_secs(3);

/// A rotation as the store keeps it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RotationRecord {
    /// The last step taken.
    step: CaRotationStep,
    old_ca_pem: String,
    new_ca_pem: String,
    /// [`Sealed`], sealed under the old CA (base64 of nonce, ciphertext and tag).
    sealed: String,
    updated_ms: u64,
}

/// What only controllers holding the old CA may read.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sealed {
    new_ca_key_pem: String,
    /// The grant key's root (base64).
    grant_root: String,
}

/// What a heartbeat answer says of the CAs, once the CA has rotated.
pub fn cluster_ca(tls: &ControllerTls) -> Option<ClusterCa> {
    let applied = tls
        .rotation
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    applied.map(|_| ClusterCa {
        trust_pem: tls.trust_pem(),
        issuer_sha256: hex(&tls.ca().fingerprint()),
    })
}

/// The rotation as it stands (`GET /v1/cluster/ca-rotation`).
pub async fn show(st: &AppState) -> Result<CaRotation, ControllerError> {
    let tls = st.required_tls()?;
    let record = get_json::<RotationRecord>(&*st.records.store(), ROTATION_KEY)
        .await?
        .map(|(r, _)| r);
    status(st, tls, record.as_ref()).await
}

/// Takes one step (`POST /v1/cluster/ca-rotation`), refused until the cluster is ready for
/// it.
pub async fn step(st: &AppState, req: StartCaRotationStep) -> Result<CaRotation, ControllerError> {
    let tls = st.required_tls()?;
    let _one_at_a_time = st.volume_locks.lock(ROTATION_KEY).await;
    let store = st.records.store();
    let current = get_json::<RotationRecord>(&*store, ROTATION_KEY).await?;
    let refused = |message: String| ControllerError::Refused { message };
    let (record, expect) = match (req.step, current) {
        (CaRotationStep::Trust, cur) => {
            if let Some((r, _)) = &cur {
                if r.step != CaRotationStep::Retire {
                    return Err(refused(format!(
                        "a CA rotation is under way (its last step was {}): take its next step \
                         (`hawser cluster rotate-ca`) before starting another",
                        step_name(r.step)
                    )));
                }
            }
            let old = tls.kept();
            if old.fingerprint() != tls.ca().fingerprint() {
                return Err(refused(
                    "this controller has not finished the last rotation yet; retry in a few \
                     seconds"
                        .into(),
                ));
            }
            let new = Ca::generate(&format!("rotated {}", now_ms())).map_err(internal)?;
            let sealed = Sealed {
                new_ca_key_pem: new.key_pem(),
                grant_root: b64(&tls.grant_root()),
            };
            let record = RotationRecord {
                step: CaRotationStep::Trust,
                old_ca_pem: old.cert_pem().into(),
                new_ca_pem: new.cert_pem().into(),
                sealed: seal(&old, &new.fingerprint(), &sealed).map_err(internal)?,
                updated_ms: now_ms(),
            };
            let expect = cur.map_or(Expect::Absent, |(_, v)| Expect::Version(v));
            (record, expect)
        }
        (want, None) => {
            return Err(refused(format!(
                "no CA rotation is under way: `{}` comes after `trust`",
                step_name(want)
            )))
        }
        (want, Some((mut r, version))) => {
            let before = match want {
                CaRotationStep::Issue => CaRotationStep::Trust,
                _ => CaRotationStep::Issue,
            };
            if r.step == want {
                // Taken already (a retried request): answer where it stands.
                return status(st, tls, Some(&r)).await;
            }
            if r.step != before {
                return Err(refused(format!(
                    "the CA rotation's last step was {}: `{}` comes after `{}`",
                    step_name(r.step),
                    step_name(want),
                    step_name(before)
                )));
            }
            let now = status(st, tls, Some(&r)).await?;
            if !now.waiting_for.is_empty() {
                return Err(refused(format!(
                    "not yet: node(s) {} {} (they do at their next heartbeat, within seconds; \
                     a node that stays behind is shown by `hawser cluster rotate-ca --status`)",
                    now.waiting_for.join(", "),
                    match before {
                        CaRotationStep::Trust => "do not trust the new CA yet",
                        _ => "have no certificate of the new CA yet",
                    }
                )));
            }
            r.step = want;
            r.updated_ms = now_ms();
            (r, Expect::Version(version))
        }
    };
    put_json(&*store, ROTATION_KEY, &record, expect).await?;
    apply(tls, &record).await.map_err(internal)?;
    tracing::info!(step = step_name(record.step), "CA rotation: step taken");
    status(st, tls, Some(&record)).await
}

/// Follows the rotation in the store, forever: a step another controller took, or one taken
/// while this one was down.
pub async fn follow_forever(st: Arc<AppState>) {
    let Some(tls) = st.tls.clone() else { return };
    let mut failing = false;
    loop {
        let store = st.records.store();
        let result = match get_json::<RotationRecord>(&*store, ROTATION_KEY).await {
            Ok(Some((r, _))) => apply(&tls, &r).await,
            Ok(None) => Ok(()),
            Err(e) => Err(anyhow::anyhow!(e)),
        };
        match result {
            Ok(()) => failing = false,
            Err(e) if !failing => {
                tracing::error!(error = %format!("{e:#}"), "cannot follow the CA rotation");
                failing = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(FOLLOW_INTERVAL).await;
    }
}

/// Brings this controller's CAs to where `r` says the rotation stands.
async fn apply(tls: &ControllerTls, r: &RotationRecord) -> anyhow::Result<()> {
    let (old_fp, new_fp) = (
        first_fingerprint(&r.old_ca_pem)?,
        first_fingerprint(&r.new_ca_pem)?,
    );
    let applied = AppliedRotation {
        step: r.step,
        old: old_fp,
        new: new_fp,
    };
    if tls
        .rotation
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        == Some(&applied)
    {
        return Ok(());
    }
    let kept = tls.kept();
    let (new, grant_root) = if kept.fingerprint() == old_fp {
        let sealed = unseal(&kept, &new_fp, &r.sealed)?;
        let new = Ca::from_pem(&r.new_ca_pem, &sealed.new_ca_key_pem).context("the new CA")?;
        (
            Arc::new(new),
            decode_root(&sealed.grant_root).context("the sealed grant root")?,
        )
    } else if kept.fingerprint() == new_fp {
        (kept.clone(), tls.grant_root())
    } else {
        anyhow::bail!(
            "the store's CA rotation replaces CA {} with {}, and this controller holds {}: give \
             it the cluster's current ca.pem and ca.key (from another controller)",
            hex(&old_fp),
            hex(&new_fp),
            hex(&kept.fingerprint())
        );
    };
    let both = format!("{}{}", r.old_ca_pem, r.new_ca_pem);
    match r.step {
        CaRotationStep::Trust | CaRotationStep::Issue => {
            if kept.fingerprint() == old_fp {
                tls.home.keep_trust(&kept, &both).await?;
            }
            let issuer = if r.step == CaRotationStep::Trust {
                kept.clone()
            } else {
                new.clone()
            };
            tls.set_cas(issuer, &both)?;
        }
        CaRotationStep::Retire => {
            if kept.fingerprint() == old_fp {
                tls.home.keep_new(&new, &grant_root).await?;
                tls.set_kept(new.clone(), grant_root);
                tracing::info!(old = %hex(&old_fp), "retired the old CA: its key is deleted");
            }
            tls.set_cas(new.clone(), new.cert_pem())?;
        }
    }
    tracing::info!(step = step_name(r.step), new = %hex(&new_fp), "CA rotation applied");
    *tls.rotation.lock().unwrap_or_else(|p| p.into_inner()) = Some(applied);
    Ok(())
}

/// Where the rotation stands, with the nodes the next step waits for.
async fn status(
    st: &AppState,
    tls: &ControllerTls,
    r: Option<&RotationRecord>,
) -> Result<CaRotation, ControllerError> {
    let fp = |pem: &str| first_fingerprint(pem).ok().map(|f| hex(&f));
    let (old, new) = (
        r.and_then(|r| fp(&r.old_ca_pem)),
        r.and_then(|r| fp(&r.new_ca_pem)),
    );
    let mut waiting_for = Vec::new();
    let mut offline = Vec::new();
    for n in st.records.nodes().await? {
        if !st.is_online(&n) {
            offline.push(n.name);
            continue;
        }
        let (Some(r), Some(new)) = (r, &new) else {
            continue;
        };
        let report = tls.report_of(&n.name);
        let ready = match r.step {
            CaRotationStep::Trust => report.is_some_and(|t| t.trusts_sha256.contains(new)),
            CaRotationStep::Issue => report.is_some_and(|t| t.issuer_sha256 == *new),
            CaRotationStep::Retire => true,
        };
        if !ready {
            waiting_for.push(n.name);
        }
    }
    Ok(CaRotation {
        step: r.map(|r| r.step),
        old_sha256: old,
        new_sha256: new,
        trust_pem: tls.trust_pem(),
        waiting_for,
        offline,
    })
}

/// The SHA-256 of the first certificate in a PEM text.
fn first_fingerprint(pem: &str) -> anyhow::Result<[u8; 32]> {
    let der = hawser_tls::certs_from_pem(pem)?;
    Ok(hawser_tls::ca_fingerprint(&der[0]))
}

fn step_name(s: CaRotationStep) -> &'static str {
    match s {
        CaRotationStep::Trust => "trust",
        CaRotationStep::Issue => "issue",
        CaRotationStep::Retire => "retire",
    }
}

fn internal(e: anyhow::Error) -> ControllerError {
    ControllerError::Refused {
        message: format!("the CA rotation: {e:#}"),
    }
}

fn seal_key(old: &Ca, new_fp: &[u8; 32]) -> anyhow::Result<ring::aead::LessSafeKey> {
    let secret = old.derive_secret(SEAL_PURPOSE, &hex(new_fp))?;
    let key = ring::aead::UnboundKey::new(&ring::aead::AES_256_GCM, &secret)
        .map_err(|_| anyhow::anyhow!("make the sealing key"))?;
    Ok(ring::aead::LessSafeKey::new(key))
}

fn seal(old: &Ca, new_fp: &[u8; 32], what: &Sealed) -> anyhow::Result<String> {
    use rand::RngCore;
    let mut nonce = [0u8; 12];
    rand::rng().fill_bytes(&mut nonce);
    let mut buf = serde_json::to_vec(what)?;
    seal_key(old, new_fp)?
        .seal_in_place_append_tag(
            ring::aead::Nonce::assume_unique_for_key(nonce),
            ring::aead::Aad::from(new_fp),
            &mut buf,
        )
        .map_err(|_| anyhow::anyhow!("seal the new CA"))?;
    let mut out = nonce.to_vec();
    out.extend_from_slice(&buf);
    Ok(b64(&out))
}

fn unseal(old: &Ca, new_fp: &[u8; 32], text: &str) -> anyhow::Result<Sealed> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .context("the sealed CA is not base64")?;
    anyhow::ensure!(bytes.len() > 12 + 16, "the sealed CA is too short");
    let (nonce, sealed) = bytes.split_at(12);
    let nonce = ring::aead::Nonce::try_assume_unique_for_key(nonce)
        .map_err(|_| anyhow::anyhow!("the sealed CA's nonce"))?;
    let mut buf = sealed.to_vec();
    let plain = seal_key(old, new_fp)?
        .open_in_place(nonce, ring::aead::Aad::from(new_fp), &mut buf)
        .map_err(|_| {
            anyhow::anyhow!("the sealed CA does not open with this controller's CA key")
        })?;
    serde_json::from_slice(plain).context("the sealed CA")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_old_ca_opens_what_is_sealed_for_the_new_one() {
        let (old, new, other) = (
            Ca::generate("o").expect("ca"),
            Ca::generate("n").expect("ca"),
            Ca::generate("x").expect("ca"),
        );
        let what = Sealed {
            new_ca_key_pem: new.key_pem(),
            grant_root: b64(&[7u8; 32]),
        };
        let text = seal(&old, &new.fingerprint(), &what).expect("seal");
        assert!(!text.contains("PRIVATE"), "the key is not in clear");
        let back = unseal(&old, &new.fingerprint(), &text).expect("open");
        assert_eq!(back.new_ca_key_pem, new.key_pem());
        assert_eq!(decode_root(&back.grant_root).expect("root"), [7u8; 32]);
        assert!(
            unseal(&other, &new.fingerprint(), &text).is_err(),
            "another CA"
        );
        assert!(
            unseal(&old, &other.fingerprint(), &text).is_err(),
            "another new CA"
        );
        let mut tampered = text.clone().into_bytes();
        let mid = tampered.len() / 2;
        tampered[mid] = if tampered[mid] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).expect("ascii");
        assert!(unseal(&old, &new.fingerprint(), &tampered).is_err());
        assert!(unseal(&old, &new.fingerprint(), "!!").is_err());
        assert!(unseal(&old, &new.fingerprint(), "").is_err());
    }
}
