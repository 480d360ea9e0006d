//! Backup targets (docs/backup.md): where backups go. The store keeps each target's
//! [`TargetSpec`] under `backup-targets/<name>`; an S3 target's access key is kept only in a
//! 0600 file of the controller's data directory (`backup-targets/<name>.credentials`), never
//! in the store, as the KEKs are. Removing a target forgets it; nothing on it is deleted.

use hawser_api::backup::{AddBackupTarget, BackupTarget, S3Key, TargetSpec};
use hawser_backup::{S3Credentials, Target};
use hawser_store::{get_json, list_json, put_json, Expect};
use serde::{Deserialize, Serialize};

use crate::errors::ControllerError;
use crate::snapshots::backup_settings::BackupSettings;
use crate::state::AppState;
use crate::store::model::now_ms;
use crate::store::records::Records;

pub(crate) const PREFIX: &str = "backup-targets/";

/// A target as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetRecord {
    pub name: String,
    pub spec: TargetSpec,
    pub created_ms: u64,
}

fn key(name: &str) -> String {
    format!("{PREFIX}{name}")
}

fn view(backups: &BackupSettings, r: &TargetRecord) -> BackupTarget {
    let has = matches!(backups.credentials(&r.name), Ok(Some(_)));
    BackupTarget {
        name: r.name.clone(),
        spec: r.spec.clone(),
        credentials: has,
    }
}

pub async fn target_record(records: &Records, name: &str) -> Result<TargetRecord, ControllerError> {
    get_json::<TargetRecord>(&*records.store(), &key(name))
        .await?
        .map(|(r, _)| r)
        .ok_or_else(|| ControllerError::NotFound {
            kind: "backup target",
            name: name.into(),
        })
}

/// Opens a stored target with this controller's credentials for it.
pub async fn open(
    st: &AppState,
    name: &str,
) -> Result<(TargetRecord, Option<S3Key>, Target), ControllerError> {
    // Opened for requests an API caller waits on: retried briefly.
    open_with_retry(st, name, hawser_backup::constants::CHECK_RETRY_SECS).await
}

/// [`open`], with each request retried for `retry_secs` (work nobody waits on: a prune).
pub async fn open_with_retry(
    st: &AppState,
    name: &str,
    retry: u64,
) -> Result<(TargetRecord, Option<S3Key>, Target), ControllerError> {
    let record = target_record(&st.records, name).await?;
    let creds = st.backups.credentials(name)?;
    if matches!(record.spec, TargetSpec::S3 { .. }) && creds.is_none() {
        return Err(ControllerError::BackupTarget {
            target: name.into(),
            reason: format!(
                "this controller has no credentials for it (expected {}): add the target again \
                 with --credentials-file, or copy that file from another controller",
                st.backups.credentials_path(name).display()
            ),
        });
    }
    let target = Target::open_with(name, &record.spec, creds.as_ref(), retry).map_err(|e| {
        ControllerError::BackupTarget {
            target: name.into(),
            reason: e.to_string(),
        }
    })?;
    Ok((record, creds.as_ref().map(S3Credentials::to_api), target))
}

/// `POST /v1/backup-targets`: checks the target can be written, read and listed from here,
/// then keeps it. The same target added again (same spec) is success, with the new key.
pub async fn add(st: &AppState, req: AddBackupTarget) -> Result<BackupTarget, ControllerError> {
    hawser_api::validate_name("backup target", &req.name)?;
    let bad = |reason: String| ControllerError::BackupTarget {
        target: req.name.clone(),
        reason,
    };
    let creds = match (&req.spec, &req.credentials) {
        (TargetSpec::S3 { .. }, None) => {
            return Err(ControllerError::invalid(format!(
                "backup target {:?}: an S3 target needs credentials (--credentials-file)",
                req.name
            )))
        }
        (TargetSpec::Dir { .. }, Some(_)) => {
            return Err(ControllerError::invalid(
                "a directory target takes no credentials",
            ))
        }
        (_, Some(k)) => Some(S3Credentials::from_api(k).ok_or_else(|| {
            ControllerError::invalid("the S3 secret is not base64 of UTF-8 text")
        })?),
        (_, None) => None,
    };
    let existing = get_json::<TargetRecord>(&*st.records.store(), &key(&req.name)).await?;
    if let Some((r, _)) = &existing {
        if r.spec != req.spec {
            return Err(ControllerError::Exists {
                kind: "backup target",
                name: req.name,
            });
        }
    }
    let retry = hawser_backup::constants::CHECK_RETRY_SECS;
    let target = Target::open_with(&req.name, &req.spec, creds.as_ref(), retry)
        .map_err(|e| ControllerError::invalid(e.to_string()))?;
    target
        .check()
        .await
        .map_err(|e| bad(format!("connection check failed: {e}")))?;
    if let Some(c) = &creds {
        st.backups.save_credentials(&req.name, c)?;
    }
    let record = match existing {
        Some((r, _)) => r,
        None => {
            let r = TargetRecord {
                name: req.name.clone(),
                spec: req.spec,
                created_ms: now_ms(),
            };
            put_json(&*st.records.store(), &key(&r.name), &r, Expect::Absent).await?;
            r
        }
    };
    tracing::info!(target = %record.name, spec = %record.spec.describe(), "backup target added");
    Ok(view(&st.backups, &record))
}

pub async fn list(st: &AppState) -> Result<Vec<BackupTarget>, ControllerError> {
    let all = list_json::<TargetRecord>(&*st.records.store(), PREFIX).await?;
    Ok(all.iter().map(|(_, r, _)| view(&st.backups, r)).collect())
}

pub async fn show(st: &AppState, name: &str) -> Result<BackupTarget, ControllerError> {
    Ok(view(&st.backups, &target_record(&st.records, name).await?))
}

/// Forgets a target and this controller's key for it. Its backups stay where they are.
pub async fn remove(st: &AppState, name: &str) -> Result<(), ControllerError> {
    let Some((_, version)) = get_json::<TargetRecord>(&*st.records.store(), &key(name)).await?
    else {
        return Err(ControllerError::NotFound {
            kind: "backup target",
            name: name.into(),
        });
    };
    st.records
        .store()
        .delete(&key(name), Expect::Version(version))
        .await?;
    let path = st.backups.credentials_path(name);
    if let Err(e) = std::fs::remove_file(&path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a target's key");
        }
    }
    tracing::info!(
        target = name,
        "backup target removed (its backups are kept on it)"
    );
    Ok(())
}
