//! Rotating the key-encryption key (`hawser cluster rotate-volume-key`): a new KEK, and every
//! encrypted volume's data key re-wrapped under it. Data is never re-encrypted: the data key
//! stays, so the replicas' key checks and the running engines are untouched.
//!
//! Each record changes by its own compare-and-swap, from the wrapping it holds at that moment,
//! so a concurrent attach, expand or clone neither loses the change nor is lost by it. A
//! volume created while the rotation runs may still be wrapped under the previous KEK; the
//! answer counts the volumes each KEK still wraps, and a second rotation (or the next one)
//! takes them.
//!
//! Every replica of an encrypted volume keeps a copy of the wrapped key (for `hawser cluster
//! recover`), so the rotation then gives each replica of every encrypted volume its record's
//! wrapping (an agent admin call; a replica never goes back to an older KEK). The answer
//! lists the replicas it could not reach as `behind`. An old KEK file can be deleted once no
//! volume names it and no replica is behind: then no copy anywhere needs it.

use std::collections::BTreeMap;

use hawser_api::controller::VolumeKeyRotated;

use crate::errors::ControllerError;
use crate::state::AppState;

/// A new KEK, and every encrypted volume's data key re-wrapped under it
/// (`POST /v1/cluster/volume-key`).
pub async fn rotate(st: &AppState) -> Result<VolumeKeyRotated, ControllerError> {
    let kek = st.keks.rotate().await.map_err(refused)?;
    tracing::info!(
        kek,
        "made a new key-encryption key; re-wrapping the volumes' data keys"
    );
    let mut rewrapped = Vec::new();
    for v in st.records.volumes().await?.iter() {
        if v.encryption.as_ref().is_none_or(|w| w.kek >= kek) {
            continue;
        }
        let changed = st
            .records
            .update_volume(&v.name, |r| match &r.encryption {
                Some(w) if w.kek < kek => {
                    r.encryption = Some(st.keks.rewrap(&r.name, w).map_err(refused)?);
                    Ok(true)
                }
                _ => Ok(false),
            })
            .await;
        match changed {
            Ok((_, true)) => rewrapped.push(v.name.clone()),
            Ok((_, false)) | Err(ControllerError::VolumeNotFound { .. }) => {}
            Err(e) => {
                // The ones done stay done; a retry finishes the rest.
                tracing::warn!(volume = %v.name, error = %e, "could not re-wrap the data key");
                return Err(e);
            }
        }
    }
    let behind = update_replicas(st).await?;
    let mut wrapping = BTreeMap::new();
    for v in st.records.volumes().await?.iter() {
        if let Some(w) = &v.encryption {
            *wrapping.entry(w.kek).or_insert(0u64) += 1;
        }
    }
    tracing::info!(
        kek,
        rewrapped = rewrapped.len(),
        behind = behind.len(),
        "data keys re-wrapped"
    );
    Ok(VolumeKeyRotated {
        kek,
        rewrapped,
        wrapping,
        behind,
    })
}

/// Gives every replica of every encrypted volume the wrapping its record holds now; returns
/// those it could not, each with why. Replicas of one volume are called one after the other,
/// each call bounded by the agent timeout.
async fn update_replicas(st: &AppState) -> Result<Vec<String>, ControllerError> {
    let nodes = st.records.nodes().await?;
    let mut behind = Vec::new();
    for v in st.records.volumes().await?.iter() {
        let Some(w) = &v.encryption else { continue };
        for r in &v.replicas {
            let why = match nodes.iter().find(|n| n.name == r.node) {
                None => "its node is not registered".to_string(),
                Some(n) => match st.agents.set_wrapped_key(n.agent(), &r.id, w).await {
                    Ok(s) if s.wrapped_key.as_ref().is_some_and(|h| h.kek >= w.kek) => continue,
                    Ok(_) => "its agent does not keep wrapped keys (an older agent)".into(),
                    Err(e) => e.to_string(),
                },
            };
            tracing::warn!(
                volume = %v.name, replica = %r.id, node = %r.node, why,
                "a replica keeps its copy of the data key under an older key-encryption key"
            );
            behind.push(format!(
                "replica {} of volume {} on node {}: {why}",
                r.id, v.name, r.node
            ));
        }
    }
    Ok(behind)
}

fn refused(e: crate::volumes::keys::KeyError) -> ControllerError {
    ControllerError::Refused {
        message: e.to_string(),
    }
}
