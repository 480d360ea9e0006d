//! Standby volumes (docs/backup.md): `hawser volume create NAME --standby-of TARGET/VOLUME`
//! in a second cluster keeps a copy of another cluster's volume from its backups on a
//! shared target. It starts as the newest backup, then the leader reads the target every
//! `--standby-poll-secs` and applies each newer backup to every replica: only the blocks
//! that differ from the backup the replicas hold (`hawser-agent` `backup/`). Until
//! `hawser volume activate` the volume is marked `restoring`, so nothing attaches it.
//!
//! Why the replicas never hold a mix that nobody knows of: the record names the backup they
//! hold (`applied`) and the one being written over it (`applying`). An apply that fails or
//! stops half-way is started again with the same two, and writing a backup's blocks over a
//! replica that holds the base plus some of them ends in the same bytes. Activation
//! applies the newest backup first, or (`--as-is`, for a target that cannot be reached)
//! keeps `applied`, and is refused while an apply is half done.
//!
//! The one mix that is not started again: a backup that vanished while it was applied
//! (deleted and pruned at the source, while a standby node was down). Its blocks are gone,
//! so the apply can never end. The record then says the replicas hold parts of it
//! (`mixed`), and the newest backup is applied with every block compared (no base), after
//! which the replicas hold exactly that backup again.

use std::sync::Arc;
use std::time::Duration;

use hawser_api::backup::{AppliedBackup, Standby, StartRestoreJob};
use hawser_api::controller::CreateVolume;

use crate::cluster::events::ClusterEvents;
use crate::errors::ControllerError;
use crate::snapshots::restores::{self, RestoreSource, Turn};
use crate::state::AppState;
use crate::store::model::{now_ms, VolumeRecord};

/// How often the replicas' jobs are read while an apply runs.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// `TARGET/VOLUME`, split.
fn parse(of: &str) -> Result<(&str, &str), ControllerError> {
    of.split_once('/')
        .filter(|(t, v)| !t.is_empty() && !v.is_empty())
        .ok_or_else(|| {
            ControllerError::invalid(format!(
                "--standby-of {of:?}: give TARGET/VOLUME, the volume as its backups name it \
                 (hawser backup list)"
            ))
        })
}

/// The newest backup of the volume `TARGET/VOLUME` names, and the request fitted to it.
pub async fn resolve(
    st: &AppState,
    req: &mut CreateVolume,
    of: &str,
) -> Result<RestoreSource, ControllerError> {
    let (target, volume) = parse(of)?;
    let (record, _, t) = crate::snapshots::backup_targets::open(st, target).await?;
    let manifest = hawser_backup::latest_backup(&t, volume)
        .await
        .map_err(|e| ControllerError::BackupTarget {
            target: target.into(),
            reason: e.to_string(),
        })?
        .ok_or_else(|| ControllerError::NotFound {
            kind: "backup of volume",
            name: of.into(),
        })?;
    crate::snapshots::restores::fit(req, &manifest, &format!("{target}/{}", manifest.backup))?;
    Ok(RestoreSource {
        target: record,
        manifest,
    })
}

/// Marks the created volume a standby (under its lock, before anyone may attach it), applying
/// `src`'s backup to its blank replicas; the leader's loop does the rest.
pub async fn start(
    st: &Arc<AppState>,
    v: &VolumeRecord,
    src: RestoreSource,
) -> Result<VolumeRecord, ControllerError> {
    let standby = Standby {
        target: src.target.name.clone(),
        source: src.manifest.volume.clone(),
        applied: None,
        applying: Some(src.manifest.backup.clone()),
        activating: false,
        checked_ms: Some(now_ms()),
        error: None,
        mixed: None,
    };
    let label = standby.label();
    let (marked, ()) = st
        .records
        .update_volume(&v.name, |v| {
            v.restoring = Some(label.clone());
            v.standby = Some(standby.clone());
            Ok(())
        })
        .await?;
    tracing::info!(volume = %v.name, of = %label, backup = %src.manifest.backup,
        "standby created");
    st.backups.standby_wake.notify_one();
    Ok(marked)
}

/// `POST /v1/volumes/{name}/activate`: with `as_is`, the volume becomes a normal one at once
/// with the backup it holds; otherwise the loop applies the newest backup first.
pub async fn activate(
    st: &AppState,
    name: &str,
    as_is: bool,
) -> Result<VolumeRecord, ControllerError> {
    let _guard = st.volume_locks.lock(name).await;
    let (v, ()) = st
        .records
        .update_volume(name, |v| {
            let Some(s) = v.standby.as_mut() else {
                return Err(ControllerError::invalid(format!(
                    "volume {name:?} is not a standby"
                )));
            };
            if !as_is {
                s.activating = true;
                s.checked_ms = None;
                return Ok(());
            }
            if let Some(b) = s.applying.as_ref().or(s.mixed.as_ref()) {
                return Err(ControllerError::Refused {
                    message: format!(
                        "volume {name:?} is half-way through applying backup {b}: its \
                         replicas hold neither that backup nor the one before. Activate it \
                         without --as-is once its target can be read, which finishes the apply"
                    ),
                });
            }
            v.standby = None;
            v.restoring = None;
            Ok(())
        })
        .await?;
    match &v.standby {
        Some(_) => st.backups.standby_wake.notify_one(),
        None => activated(&st.events, name, "as it is"),
    }
    Ok(v)
}

fn activated(events: &ClusterEvents, name: &str, how: &str) {
    tracing::info!(volume = name, how, "standby activated");
    events.keep(
        Some(name),
        None,
        false,
        "VolumeActivated",
        &format!("standby volume {name} is a normal volume now ({how})"),
    );
}

/// On the leader: applies new backups to every standby volume, and follows every restore
/// from a backup (`restores::step`). Wakes every `poll`, or every second while an apply or
/// a restore runs, or when a standby is created or activated or a restore starts.
pub async fn run(st: Arc<AppState>, poll: Duration) {
    // The first pass comes within a second: a controller that just started or took over
    // resumes the applies and restores it finds half done.
    let mut busy = true;
    loop {
        let wait = if busy { FOLLOW_EVERY } else { poll };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = st.backups.standby_wake.notified() => {}
        }
        if matches!(
            st.leadership.role(),
            crate::store::leader::Role::Follower { .. }
        ) {
            // Looked at again within a second: a follower that becomes the leader takes
            // over the applies and restores at once, not a poll interval later. Its holds
            // on restores' backups go: the leader holds them now.
            st.backups.restore_holds.retain(&Default::default());
            busy = true;
            continue;
        }
        // With this controller's own writes, as the schedules' loop: a wake follows a
        // standby's create or a restore, which the watch-fed copy may not show yet.
        let Ok(volumes) = st.records.volumes().await else {
            continue;
        };
        busy = false;
        let standbys: Vec<VolumeRecord> = volumes
            .iter()
            .filter(|v| v.standby.is_some())
            .cloned()
            .collect();
        for v in standbys {
            busy |= step(&st, &v, poll).await;
        }
        // The restores from a backup, resumed by whichever controller leads now.
        let restoring: Vec<VolumeRecord> = volumes
            .iter()
            .filter(|v| crate::snapshots::restores::source_of(v).is_some())
            .cloned()
            .collect();
        // Holds of volumes deleted, or finished by another leader, go.
        st.backups
            .restore_holds
            .retain(&restoring.iter().map(|v| v.name.clone()).collect());
        for v in restoring {
            busy |= crate::snapshots::restores::step(&st, &v).await;
        }
    }
}

/// One standby's turn: follow its apply, or read its target when due. True while an apply
/// runs (the loop comes back within a second).
async fn step(st: &AppState, v: &VolumeRecord, poll: Duration) -> bool {
    let Some(s) = &v.standby else {
        return false;
    };
    let poll_ms = u64::try_from(poll.as_millis()).unwrap_or(u64::MAX);
    // After a failure, wait a poll interval before trying again.
    let due = s
        .checked_ms
        .is_none_or(|c| now_ms().saturating_sub(c) >= poll_ms);
    match &s.applying {
        Some(b) if s.error.is_none() || due => apply(st, v, s, b).await,
        Some(_) => false,
        None if due || s.activating => check(st, v, s).await,
        None => false,
    }
}

/// Reads the target for a newer backup of the source volume: found, it is applied next;
/// none and activation asked, the volume becomes a normal one.
async fn check(st: &AppState, v: &VolumeRecord, s: &Standby) -> bool {
    let newest = match crate::snapshots::backup_targets::open(st, &s.target).await {
        Ok((_, _, t)) => hawser_backup::latest_backup(&t, &s.source)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let newest = match newest {
        Ok(m) => m,
        Err(e) => {
            failed(st, v, format!("cannot read target {}: {e}", s.target)).await;
            return false;
        }
    };
    // Replicas that hold parts of a vanished backup take the newest one, whichever it is.
    let newer = newest.filter(|m| {
        s.mixed.is_some()
            || s.applied
                .as_ref()
                .is_none_or(|a| m.taken_ms > a.taken_ms && m.backup != a.backup)
    });
    if let Some(m) = &newer {
        if m.size_bytes > v.size_bytes {
            let why = format!(
                "backup {} is of {} bytes, more than this standby's {}: the source volume \
                 grew, and a standby does not grow yet; activate it as it is, or create a \
                 new standby",
                m.backup, m.size_bytes, v.size_bytes
            );
            failed(st, v, why).await;
            return false;
        }
    }
    let activate = newer.is_none() && s.activating;
    let next = newer.as_ref().map(|m| m.backup.clone());
    let updated = st
        .records
        .update_volume(&v.name, |r| {
            let Some(rs) = r.standby.as_mut() else {
                return Ok(false);
            };
            rs.checked_ms = Some(now_ms());
            rs.error = None;
            if rs.applying.is_none() {
                rs.applying = next.clone();
            }
            if activate && rs.applying.is_none() {
                r.standby = None;
                r.restoring = None;
                return Ok(true);
            }
            Ok(false)
        })
        .await;
    match updated {
        Ok((_, true)) => activated(&st.events, &v.name, "with the newest backup applied"),
        Ok(_) => {}
        Err(e) => tracing::warn!(volume = %v.name, error = %e, "standby not updated"),
    }
    next.is_some()
}

/// Starts (or finds running) the apply of `backup` on every replica's node; when all are
/// done, records it as applied. True while it runs.
async fn apply(st: &AppState, v: &VolumeRecord, s: &Standby, backup: &str) -> bool {
    let (target, credentials, t) = match crate::snapshots::backup_targets::open(st, &s.target).await
    {
        Ok(x) => x,
        Err(e) => {
            failed(st, v, format!("cannot open target {}: {e}", s.target)).await;
            return false;
        }
    };
    let nodes = match st.records.nodes().await {
        Ok(n) => n,
        Err(_) => return true,
    };
    let mut done = 0;
    // Every node that answers gets its job, whichever other is down: the first error is
    // recorded after all were asked.
    let mut first_error = None;
    for r in &v.replicas {
        let Some(node) = nodes.iter().find(|n| n.name == r.node) else {
            first_error.get_or_insert(format!(
                "replica {} is on node {}, not registered",
                r.id, r.node
            ));
            continue;
        };
        let req = StartRestoreJob {
            replica: r.id.clone(),
            backup: backup.to_owned(),
            target: target.name.clone(),
            spec: target.spec.clone(),
            credentials: credentials.clone(),
            bytes_per_sec: st.backups.bytes_per_sec,
            base: s
                .mixed
                .clone()
                .or_else(|| s.applied.as_ref().map(|a| a.backup.clone())),
            base_unknown: s.mixed.is_some(),
        };
        // A job lost with its agent starts again; a failed one too, a poll interval after
        // the failure was recorded (this turn comes no sooner), unless its backup vanished.
        match restores::drive(st, node, &req).await {
            Ok(Turn::Done) => done += 1,
            Ok(Turn::Running) => {}
            Ok(Turn::Failed(_)) if vanished(&t, backup).await => {
                moved_past(st, v, backup).await;
                return true;
            }
            Ok(Turn::Failed(why)) => {
                if let Err(e) = restores::restart(&st.agents, node, &req).await {
                    tracing::debug!(volume = %v.name, error = %e, "apply not started again");
                }
                first_error.get_or_insert(format!("applying {backup} on node {}: {why}", r.node));
            }
            Err(e) => {
                first_error.get_or_insert(format!("applying {backup}: {e}"));
            }
        }
    }
    if let Some(why) = first_error {
        failed(st, v, why).await;
        return false;
    }
    if done < v.replicas.len() {
        return true;
    }
    let taken_ms = match hawser_backup::read_held_manifest(&t, backup).await {
        Ok(m) => m.taken_ms,
        // Gone since every replica applied it: its recovery point is unknown, so the newest
        // backup is applied over it, as over a vanished one.
        Err(hawser_backup::BackupError::NotFound { .. }) => {
            moved_past(st, v, backup).await;
            return true;
        }
        Err(e) => {
            failed(st, v, format!("cannot read backup {backup} again: {e}")).await;
            return false;
        }
    };
    let applied = AppliedBackup {
        backup: backup.to_owned(),
        taken_ms,
        applied_ms: now_ms(),
    };
    let updated = st
        .records
        .update_volume(&v.name, |r| {
            if let Some(rs) = r
                .standby
                .as_mut()
                .filter(|rs| rs.applying.as_deref() == Some(backup))
            {
                rs.applied = Some(applied.clone());
                rs.applying = None;
                rs.mixed = None;
                rs.error = None;
                // Read the target again at once when activating: there may be a newer one.
                if rs.activating {
                    rs.checked_ms = None;
                }
            }
            Ok(())
        })
        .await;
    if let Err(e) = updated {
        tracing::warn!(volume = %v.name, error = %e, "standby apply done, record not updated");
        return true;
    }
    tracing::info!(volume = %v.name, backup, taken_ms, "standby holds a new backup");
    st.events.keep(
        Some(&v.name),
        None,
        false,
        "StandbyApplied",
        &format!(
            "standby volume {} holds backup {backup} of {}/{} (recovery point {})",
            v.name,
            s.target,
            s.source,
            hawser_api::time::rfc3339(taken_ms / 1000)
        ),
    );
    s.activating
}

/// Whether `backup` is gone from the target for good: neither listed nor retired (a prune
/// took it). A retired one still held is not: the apply reads it.
async fn vanished(t: &hawser_backup::Target, backup: &str) -> bool {
    matches!(
        hawser_backup::read_held_manifest(t, backup).await,
        Err(hawser_backup::BackupError::NotFound { .. })
    )
}

/// The backup being applied vanished: the standby stops applying it, remembers that its
/// replicas may hold parts of it (`mixed`), and reads the target again at once for the
/// newest backup, which it applies comparing every block.
async fn moved_past(st: &AppState, v: &VolumeRecord, backup: &str) {
    let updated = st
        .records
        .update_volume(&v.name, |r| {
            let Some(rs) = r.standby.as_mut() else {
                return Ok(false);
            };
            if rs.applying.as_deref() != Some(backup) {
                return Ok(false);
            }
            rs.applying = None;
            rs.mixed = Some(backup.to_owned());
            rs.checked_ms = None;
            rs.error = None;
            Ok(true)
        })
        .await;
    match updated {
        Ok((_, true)) => {
            tracing::warn!(volume = %v.name, backup, "the backup a standby applied vanished");
            st.events.keep(
                Some(&v.name),
                None,
                true,
                "StandbyBackupVanished",
                &format!(
                    "backup {backup} vanished from the target while standby volume {} applied \
                     it; its replicas may hold parts of it, so the newest backup is applied \
                     next, every block compared",
                    v.name
                ),
            );
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(volume = %v.name, error = %e, "standby not updated"),
    }
}

/// Records why a standby could not move on (an event when the reason is new); it tries
/// again a poll interval later.
async fn failed(st: &AppState, v: &VolumeRecord, why: String) {
    let fresh = v
        .standby
        .as_ref()
        .is_none_or(|s| s.error.as_ref() != Some(&why));
    let updated = st
        .records
        .update_volume(&v.name, |r| {
            if let Some(rs) = r.standby.as_mut() {
                rs.error = Some(why.clone());
                rs.checked_ms = Some(now_ms());
            }
            Ok(())
        })
        .await;
    if let Err(e) = updated {
        tracing::warn!(volume = %v.name, error = %e, "standby error not recorded");
    }
    if fresh {
        tracing::warn!(volume = %v.name, error = %why, "standby cannot move on");
        st.events.keep(
            Some(&v.name),
            None,
            true,
            "StandbyFailed",
            &format!("standby volume {}: {why}", v.name),
        );
    }
}
