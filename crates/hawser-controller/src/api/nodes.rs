//! `/v1/nodes`: agents register and heartbeat with `PUT /v1/nodes/{node}`; anyone lists them.

use std::sync::Arc;

use crate::auth::Principal;
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::Extension;
use axum::Json;
use hawser_api::controller::{
    validate_labels, DeviceEvent, Node, RegisterNode, DEVICE_EVENT_MESSAGE_MAX,
};
use hawser_api::validate_name;

use crate::api::extract::{ApiJson, ApiPath, ApiQuery};
use crate::api::paging::{self, PageQuery};
use crate::errors::ControllerError;
use crate::state::AppState;
use crate::store::model::{now_ms, NodeRecord, NodeSettings};

pub async fn register(
    State(st): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<RegisterNode>,
) -> Result<Json<Node>, ControllerError> {
    principal.may_act_as(&name)?;
    validate(&name, &req)?;
    let join =
        crate::cluster::admit(&st, &name, &req.admin_addr, req.cluster_id.as_deref()).await?;
    if let (Some(tls), Some(report)) = (&st.tls, req.tls) {
        tls.note_report(&name, report);
    }
    let record = NodeRecord {
        name: name.clone(),
        admin_addr: req.admin_addr,
        replica_addr: req.replica_addr,
        nbd_addr: req.nbd_addr,
        nbd_socket: req.nbd_socket,
        nbd_tls: req.nbd_tls,
        last_seen_ms: now_ms(),
        pools: req.pools,
        labels: req.labels,
    };
    let previous = st.records.node(&name).await?;
    st.records.put_node(&record).await?;
    st.reservations.heartbeat(&name);
    match previous {
        None => {
            tracing::info!(node = %name, admin = %record.admin_addr, labels = ?record.labels, "node registered")
        }
        Some(p) if !st.is_online(&p) => tracing::info!(node = %name, "node back online"),
        Some(p) if p.admin_addr != record.admin_addr || p.replica_addr != record.replica_addr => {
            tracing::info!(node = %name, admin = %record.admin_addr, "node addresses changed")
        }
        Some(p) if p.labels != record.labels => {
            tracing::info!(node = %name, labels = ?record.labels, "node labels changed")
        }
        Some(_) => tracing::trace!(node = %name, "heartbeat"),
    }
    let mut node = record.to_api(now_ms(), st.node_timeout_ms);
    node.cluster = Some(join);
    Ok(Json(node))
}

fn validate(name: &str, req: &RegisterNode) -> Result<(), ControllerError> {
    validate_name("node", name)?;
    for (what, addr) in [
        ("admin_addr", &req.admin_addr),
        ("replica_addr", &req.replica_addr),
    ] {
        check_addr(what, addr)?;
    }
    if let Some(addr) = &req.nbd_addr {
        check_addr("nbd_addr", addr)?;
    }
    validate_labels(&req.labels)?;
    for (i, p) in req.pools.iter().enumerate() {
        validate_name("pool", &p.name)?;
        if p.node != name {
            return Err(ControllerError::invalid(format!(
                "pool {:?} says it is on node {:?}, but registers as node {name:?}",
                p.name, p.node
            )));
        }
        if !(p.overprovision_ratio.is_finite() && p.overprovision_ratio > 0.0) {
            return Err(ControllerError::invalid(format!(
                "pool {:?}: overprovision_ratio must be a positive number",
                p.name
            )));
        }
        if req.pools[..i].iter().any(|q| q.name == p.name) {
            return Err(ControllerError::invalid(format!(
                "pool {:?} listed twice",
                p.name
            )));
        }
    }
    Ok(())
}

/// `host:port`, where host may be a name or an IP address (IPv6 in brackets).
fn check_addr(what: &str, addr: &str) -> Result<(), ControllerError> {
    let ok = match addr.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0),
        None => false,
    };
    if ok && !addr.contains(['/', ' ']) {
        Ok(())
    } else {
        Err(ControllerError::invalid(format!(
            "{what} {addr:?} is not host:port"
        )))
    }
}

/// Every node; one page of them with `?limit=&after=` (`api::paging`).
pub async fn list(
    State(st): State<Arc<AppState>>,
    uri: Uri,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> Result<(HeaderMap, Json<Vec<Node>>), ControllerError> {
    let now = now_ms();
    let (headers, nodes) = paging::page(st.records.nodes().await?, |n| n.name.clone(), &q, &uri)?;
    let settings = st.records.node_settings().await?;
    let api = nodes
        .iter()
        .map(|n| {
            let mut api = n.to_api(now, st.node_timeout_ms);
            api.evacuating = settings.get(&n.name).is_some_and(|s| s.evacuate);
            api
        })
        .collect();
    Ok((headers, Json(api)))
}

pub async fn show(
    State(st): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Node>, ControllerError> {
    principal.may_read_node(&name)?;
    let node = st
        .records
        .node(&name)
        .await?
        .ok_or(ControllerError::NodeNotFound { node: name.clone() })?;
    let mut api = node.to_api(now_ms(), st.node_timeout_ms);
    api.evacuating = st
        .records
        .node_settings()
        .await?
        .get(&name)
        .is_some_and(|s| s.evacuate);
    Ok(Json(api))
}

/// `POST /v1/nodes/{node}/evacuate`: the node takes no new replicas, and self-healing moves
/// every replica off it, adding each elsewhere before removing it (see `healing/plan.rs`).
pub async fn evacuate(
    State(st): State<Arc<AppState>>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Node>, ControllerError> {
    set_evacuate(&st, name, true).await
}

/// `POST /v1/nodes/{node}/engines`: the node's agent has just started (a restart, an upgrade)
/// and asks for the engines it should run, now; answered at once, started in the background
/// (`cluster/engine_watch.rs`, which would otherwise start them at its next round).
pub async fn start_engines(
    State(st): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
) -> Result<(axum::http::StatusCode, Json<serde_json::Value>), ControllerError> {
    principal.may_act_as(&name)?;
    st.records
        .node(&name)
        .await?
        .ok_or(ControllerError::NodeNotFound { node: name.clone() })?;
    let body = serde_json::json!({ "node": name });
    tokio::spawn(crate::cluster::engine_watch::start_missing_on(
        st.clone(),
        name,
    ));
    Ok((axum::http::StatusCode::ACCEPTED, Json(body)))
}

/// `POST /v1/nodes/{node}/events`: the node's agent tells what happened to a kernel device
/// of a volume attached to it (a frontend passed over); a warning in the volume's events and
/// on its PVC. Only about its own volumes: another node's is refused, except that a device
/// it failed after a restart (`DeviceFailed`) is told whatever the volume's attachment is
/// now, which is when that news matters (the volume moved, or is a namesake).
pub async fn device_event(
    State(st): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<DeviceEvent>,
) -> Result<(axum::http::StatusCode, Json<serde_json::Value>), ControllerError> {
    principal.may_act_as(&name)?;
    validate_name("volume", &req.volume)?;
    let v = st.records.existing_volume(&req.volume).await?;
    let failed_here = req.reason == hawser_api::controller::DeviceEventReason::DeviceFailed;
    if !failed_here && v.attached_node.as_deref() != Some(name.as_str()) {
        return Err(ControllerError::invalid(format!(
            "volume {} is not attached to node {name}",
            req.volume
        )));
    }
    let mut message = req.message;
    if message.len() > DEVICE_EVENT_MESSAGE_MAX {
        let mut cut = DEVICE_EVENT_MESSAGE_MAX;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    let message = format!("node {name}: {message}");
    tracing::warn!(volume = %req.volume, node = %name, reason = req.reason.as_str(), %message, "device event");
    st.events.warning(&req.volume, req.reason.as_str(), message);
    Ok((
        axum::http::StatusCode::ACCEPTED,
        Json(serde_json::json!({ "volume": req.volume })),
    ))
}

/// `POST /v1/nodes/{node}/restore`: the node takes replicas again (replicas already moved
/// off stay where they are).
pub async fn restore(
    State(st): State<Arc<AppState>>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Node>, ControllerError> {
    set_evacuate(&st, name, false).await
}

async fn set_evacuate(
    st: &AppState,
    name: String,
    evacuate: bool,
) -> Result<Json<Node>, ControllerError> {
    let node = st
        .records
        .node(&name)
        .await?
        .ok_or(ControllerError::NodeNotFound { node: name.clone() })?;
    st.records
        .put_node_settings(&name, &NodeSettings { evacuate })
        .await?;
    tracing::warn!(node = %name, evacuate, "node evacuation setting changed");
    let (reason, msg) = if evacuate {
        (
            "NodeEvacuating",
            format!("node {name} is being evacuated: its replicas move away"),
        )
    } else {
        ("NodeRestored", format!("node {name} takes replicas again"))
    };
    st.events.keep(None, Some(&name), evacuate, reason, &msg);
    let mut api = node.to_api(now_ms(), st.node_timeout_ms);
    api.evacuating = evacuate;
    Ok(Json(api))
}
