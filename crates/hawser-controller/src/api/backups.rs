//! `/v1/backup-targets` and `/v1/backups`: where backups go, and the backups themselves (the
//! logic is in `snapshots/backup_targets.rs` and `snapshots/backups.rs`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::Json;
use hawser_api::backup::{
    AddBackupTarget, Backup, BackupSchedule, BackupTarget, CreateBackup, PruneReport,
    SetBackupSchedule,
};
use serde::Deserialize;

use crate::api::extract::{ApiJson, ApiPath, ApiQuery};
use crate::api::paging::{self, PageQuery};
use crate::errors::ControllerError;
use crate::snapshots::{backup_targets, backups, retention, schedules};
use crate::state::AppState;

type Shared = State<Arc<AppState>>;

pub async fn add_target(
    State(st): Shared,
    ApiJson(req): ApiJson<AddBackupTarget>,
) -> Result<(StatusCode, Json<BackupTarget>), ControllerError> {
    Ok((
        StatusCode::CREATED,
        Json(backup_targets::add(&st, req).await?),
    ))
}

/// Every backup target; one page of them with `?limit=&after=` (`api::paging`).
pub async fn list_targets(
    State(st): Shared,
    uri: Uri,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> Result<(HeaderMap, Json<Vec<BackupTarget>>), ControllerError> {
    let all = backup_targets::list(&st).await?;
    let (headers, page) = paging::page(all, |t| t.name.clone(), &q, &uri)?;
    Ok((headers, Json(page)))
}

pub async fn show_target(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<BackupTarget>, ControllerError> {
    Ok(Json(backup_targets::show(&st, &name).await?))
}

pub async fn remove_target(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ControllerError> {
    backup_targets::remove(&st, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Starts a backup: 202, Running; `GET /v1/backups/{name}` follows it.
pub async fn create(
    State(st): Shared,
    ApiJson(req): ApiJson<CreateBackup>,
) -> Result<(StatusCode, Json<Backup>), ControllerError> {
    Ok((StatusCode::ACCEPTED, Json(backups::create(&st, req).await?)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub volume: Option<String>,
    pub target: Option<String>,
    /// A page (`api::paging`), by backup name.
    pub limit: Option<usize>,
    pub after: Option<String>,
}

/// Every backup (of one volume, to one target), oldest first; one page of them, by name,
/// with `?limit=&after=`.
pub async fn list(
    State(st): Shared,
    uri: Uri,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<(HeaderMap, Json<Vec<Backup>>), ControllerError> {
    let all = backups::list(&st, q.volume.as_deref(), q.target.as_deref()).await?;
    let page_q = PageQuery {
        limit: q.limit,
        after: q.after,
    };
    let (headers, page) = paging::page(all, |b| b.name.clone(), &page_q, &uri)?;
    Ok((headers, Json(page)))
}

pub async fn show(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Backup>, ControllerError> {
    Ok(Json(backups::record(&st.records, &name).await?.backup))
}

/// Deletes a backup (ready or failed) from its target and the store; 409 while it runs.
pub async fn delete_backup(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ControllerError> {
    backups::delete(&st, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Prunes a target now: deletes the blocks no backup on it names. 409 while a backup (of
/// any cluster) runs on it.
pub async fn prune_target(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<PruneReport>, ControllerError> {
    hawser_api::validate_name("backup target", &name)?;
    Ok(Json(retention::prune(&st, &name).await?))
}

pub async fn set_schedule(
    State(st): Shared,
    ApiPath((volume, target)): ApiPath<(String, String)>,
    ApiJson(req): ApiJson<SetBackupSchedule>,
) -> Result<Json<BackupSchedule>, ControllerError> {
    Ok(Json(schedules::set(&st, &volume, &target, req).await?))
}

pub async fn remove_schedule(
    State(st): Shared,
    ApiPath((volume, target)): ApiPath<(String, String)>,
) -> Result<StatusCode, ControllerError> {
    schedules::remove(&st.records, &volume, &target).await?;
    Ok(StatusCode::NO_CONTENT)
}
