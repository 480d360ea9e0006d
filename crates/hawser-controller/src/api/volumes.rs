//! `/v1/volumes`: create, list, show, delete, attach, detach, expand, and the engines' outdate
//! reports. Handlers only translate HTTP; the logic is in the `volume_*` modules.

use std::collections::HashMap;
use std::sync::Arc;

use crate::auth::Principal;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::Extension;
use axum::Json;
use hawser_api::controller::{
    Attach, CreateVolume, ExpandVolume, ForcePromote, MarkInSync, Outdate, RestoreVolume, Volume,
};

use crate::api::extract::{ApiJson, ApiPath, ApiQuery};
use crate::api::paging::{self, PageQuery};
use crate::errors::ControllerError;
use crate::store::model::VolumeRecord;

/// `DELETE /v1/volumes/{name}?with_snapshots=true`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteQuery {
    /// Delete the volume's snapshots with it (refused otherwise when it has any).
    #[serde(default)]
    pub with_snapshots: bool,
}
use crate::state::AppState;
use crate::store::records::Records;

type Shared = State<Arc<AppState>>;

/// The API view of a record, with NBD addresses if it is attached.
async fn view(records: &Records, rec: &VolumeRecord) -> Result<Volume, ControllerError> {
    let node = match &rec.attached_node {
        Some(n) => records.node(n).await?,
        None => None,
    };
    Ok(rec.to_api(node.as_ref()))
}

pub async fn create(
    State(st): Shared,
    ApiJson(req): ApiJson<CreateVolume>,
) -> Result<(StatusCode, Json<Volume>), ControllerError> {
    let rec = crate::volumes::create::create_volume(&st, req).await?;
    Ok((StatusCode::CREATED, Json(rec.to_api(None))))
}

/// Every volume; one page of them with `?limit=&after=` (`api::paging`).
pub async fn list(
    State(st): Shared,
    uri: Uri,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> Result<(HeaderMap, Json<Vec<Volume>>), ControllerError> {
    // In name order (`Records::volumes`), so a page is a slice of it.
    let volumes = st.records.volumes().await?;
    let (headers, range) = paging::window(&volumes, |v| v.name.as_str(), &q, &uri)?;
    let nodes = st.records.nodes().await?;
    let nodes: HashMap<&str, _> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let api = volumes[range]
        .iter()
        .map(|v| {
            v.to_api(
                v.attached_node
                    .as_deref()
                    .and_then(|a| nodes.get(a).copied()),
            )
        })
        .collect();
    Ok((headers, Json(api)))
}

pub async fn show(
    State(st): Shared,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Volume>, ControllerError> {
    if let Principal::Node(n) = &principal {
        // A node reads only the volumes attached to it, and cannot tell the others from
        // volumes that do not exist.
        let attached_here = st
            .records
            .volume(&name)
            .await?
            .is_some_and(|v| v.attached_node.as_deref() == Some(n.as_str()));
        if !attached_here {
            return Err(ControllerError::ForbiddenFor {
                reason: format!("node {n} reads only the volumes attached to it"),
            });
        }
    }
    let rec = st.records.existing_volume(&name).await?;
    let mut v = view(&st.records, &rec).await?;
    add_engine_view(&st, &rec, &mut v).await;
    Ok(Json(v))
}

/// Fill in the attached engine's live view of each replica (resync progress). Best effort:
/// an agent that does not answer quickly leaves it out.
async fn add_engine_view(st: &AppState, rec: &VolumeRecord, v: &mut Volume) {
    let Some(node) = &rec.attached_node else {
        return;
    };
    let Ok(Some(n)) = st.records.node(node).await else {
        return;
    };
    let status = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        st.agents.status(n.agent()),
    )
    .await;
    let Ok(Ok(status)) = status else { return };
    let Some(engine) = status.engines.into_iter().find(|e| e.volume == rec.name) else {
        return;
    };
    let devices = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        st.agents.devices(n.agent()),
    )
    .await;
    let device = match devices {
        Ok(Ok(list)) => list.into_iter().find(|d| d.volume == rec.name),
        _ => None,
    };
    v.engine = Some(hawser_api::controller::VolumeEngineView {
        epoch: engine.epoch,
        recovery: engine.recovery,
        active_extents: engine.active_extents,
        qos: engine.qos,
        scrub: engine.scrub,
        device,
    });
    for r in &mut v.replicas {
        r.engine = engine
            .replicas
            .iter()
            .find(|e| e.replica_id == r.id)
            .cloned();
    }
}

pub async fn delete(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<DeleteQuery>,
) -> Result<StatusCode, ControllerError> {
    crate::volumes::delete::delete_volume(&st, &name, q.with_snapshots).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn attach(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<Attach>,
) -> Result<Json<Volume>, ControllerError> {
    let (rec, node) = crate::volumes::attach::attach_volume(&st, &name, req).await?;
    Ok(Json(rec.to_api(Some(&node))))
}

pub async fn detach(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Volume>, ControllerError> {
    let rec = crate::volumes::attach::detach_volume(&st, &name).await?;
    Ok(Json(rec.to_api(None)))
}

pub async fn expand(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<ExpandVolume>,
) -> Result<Json<Volume>, ControllerError> {
    let rec = crate::volumes::expand::expand_volume(&st, &name, req).await?;
    Ok(Json(view(&st.records, &rec).await?))
}

pub async fn restore(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<RestoreVolume>,
) -> Result<Json<Volume>, ControllerError> {
    let rec = crate::volumes::restore::restore_volume(&st, &name, req).await?;
    Ok(Json(view(&st.records, &rec).await?))
}

/// `POST /v1/volumes/{name}/activate`: a standby volume becomes a normal one, after the
/// newest backup on its target is applied (or at once, `as_is`).
pub async fn activate(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<hawser_api::backup::ActivateVolume>,
) -> Result<Json<Volume>, ControllerError> {
    let rec = crate::snapshots::standby::activate(&st, &name, req.as_is).await?;
    Ok(Json(view(&st.records, &rec).await?))
}

/// `POST /v1/volumes/{name}/qos`: change its limits; the reply shows what the engine's node
/// applies now.
pub async fn set_qos(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<hawser_api::QosPatch>,
) -> Result<Json<Volume>, ControllerError> {
    let rec = crate::volumes::qos::set_qos(&st, &name, req).await?;
    let mut v = view(&st.records, &rec).await?;
    add_engine_view(&st, &rec, &mut v).await;
    Ok(Json(v))
}

/// `POST /v1/volumes/{name}/scrub`: start a scrub pass of an attached volume; the reply's
/// `engine.scrub` shows its progress.
pub async fn scrub(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Volume>, ControllerError> {
    let (rec, _) = crate::volumes::scrub::start(&st, &name).await?;
    let mut v = view(&st.records, &rec).await?;
    add_engine_view(&st, &rec, &mut v).await;
    Ok(Json(v))
}

pub async fn force_promote(
    State(st): Shared,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<ForcePromote>,
) -> Result<Json<Volume>, ControllerError> {
    let rec = crate::volumes::force_promote::force_promote(&st, &name, req).await?;
    Ok(Json(view(&st.records, &rec).await?))
}

pub async fn outdate(
    State(st): Shared,
    Extension(principal): Extension<Principal>,
    ApiPath((name, id)): ApiPath<(String, String)>,
    ApiJson(req): ApiJson<Outdate>,
) -> Result<Json<Volume>, ControllerError> {
    engine_node_only(&st, &principal, &name).await?;
    let rec = crate::volumes::outdate::outdate_replica(&st, &name, &id, req).await?;
    Ok(Json(view(&st.records, &rec).await?))
}

pub async fn mark_in_sync(
    State(st): Shared,
    Extension(principal): Extension<Principal>,
    ApiPath((name, id)): ApiPath<(String, String)>,
    ApiJson(req): ApiJson<MarkInSync>,
) -> Result<Json<Volume>, ControllerError> {
    engine_node_only(&st, &principal, &name).await?;
    let rec = crate::volumes::outdate::mark_in_sync(&st, &name, &id, req).await?;
    Ok(Json(view(&st.records, &rec).await?))
}

/// A node reports on a volume's replicas only while the volume's engine runs there: the
/// volume is attached to it, or (detached) the controller runs a sync engine there for new
/// replicas; the epoch in the report binds it to that engine.
async fn engine_node_only(
    st: &AppState,
    principal: &Principal,
    volume: &str,
) -> Result<(), ControllerError> {
    if !matches!(principal, Principal::Node(_)) {
        return Ok(());
    }
    let engine_node = st
        .records
        .volume(volume)
        .await?
        .and_then(|v| v.attached_node.or(v.sync_node));
    match engine_node {
        Some(node) => principal.may_act_as(&node),
        None => Err(ControllerError::ForbiddenFor {
            reason: format!("volume {volume:?} has no engine: nothing reports on it"),
        }),
    }
}
