//! Rotating the key-encryption key (`hawser cluster rotate-volume-key`): a new KEK, and every
//! encrypted volume's data key re-wrapped under it. Data is never re-encrypted: the data key
//! stays, so the replicas' key checks and the running engines are untouched.
//!
//! Each record changes by its own compare-and-swap, from the wrapping it holds at that moment,
//! so a concurrent attach, expand or clone neither loses the change nor is lost by it. A
//! volume created while the rotation runs may still be wrapped under the previous KEK; the
//! answer counts the volumes each KEK still wraps, and a second rotation (or the next one)
//! takes them. An old KEK file can be deleted once no volume names it.

use std::collections::BTreeMap;

use hawser_api::controller::VolumeKeyRotated;

use crate::errors::ControllerError;
use crate::state::AppState;

/// `POST /v1/cluster/volume-key`.
pub async fn rotate_volume_key(
    axum::extract::State(st): axum::extract::State<std::sync::Arc<AppState>>,
) -> Result<axum::Json<VolumeKeyRotated>, ControllerError> {
    rotate(&st).await.map(axum::Json)
}

pub async fn rotate(st: &AppState) -> Result<VolumeKeyRotated, ControllerError> {
    let kek = st.keks.rotate().await.map_err(refused)?;
    tracing::info!(
        kek,
        "made a new key-encryption key; re-wrapping the volumes' data keys"
    );
    let mut rewrapped = Vec::new();
    for v in st.records.volumes().await? {
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
            Ok((_, true)) => rewrapped.push(v.name),
            Ok((_, false)) | Err(ControllerError::VolumeNotFound { .. }) => {}
            Err(e) => {
                // The ones done stay done; a retry finishes the rest.
                tracing::warn!(volume = %v.name, error = %e, "could not re-wrap the data key");
                return Err(e);
            }
        }
    }
    let mut wrapping = BTreeMap::new();
    for v in st.records.volumes().await? {
        if let Some(w) = &v.encryption {
            *wrapping.entry(w.kek).or_insert(0u64) += 1;
        }
    }
    tracing::info!(kek, rewrapped = rewrapped.len(), "data keys re-wrapped");
    Ok(VolumeKeyRotated {
        kek,
        rewrapped,
        wrapping,
    })
}

fn refused(e: crate::volumes::keys::KeyError) -> ControllerError {
    ControllerError::Refused {
        message: e.to_string(),
    }
}
