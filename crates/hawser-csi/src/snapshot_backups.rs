//! CSI snapshots that are backups (`type: backup` in the VolumeSnapshotClass;
//! `snapshot_class.rs`), over the controller's `/v1/backups`, and volumes restored from them.
//!
//! 1. CreateSnapshot takes a Hawser snapshot named after the CSI name
//!    (`snapshot_class::backup_snapshot_name`), then backs it up (`CreateBackup.snapshot`).
//!    A retry finds that backup again among the volume's backups to the target by the snapshot
//!    it reads, so it is idempotent by name with nothing stored but the backup.
//! 2. The snapshot is cut when the Hawser snapshot is taken: the answer carries its time and
//!    `ready_to_use` false while the backup runs (the CSI spec's post-cut processing). The
//!    CO asks again (CreateSnapshot, or ListSnapshots by id: external-snapshotter polls that
//!    way once it has the id) until it is ready; then the Hawser snapshot is dropped, so the
//!    volume holds no snapshot for it and can be deleted while its backups stay.
//! 3. A backup that fails after it started is the snapshot's end: its id is already the CO's,
//!    so CreateSnapshot and ListSnapshots by id answer the failure (the VolumeSnapshot shows
//!    it); delete the VolumeSnapshot and take another. One that never started (no node
//!    could run it) was answered as an error, so its id is nobody's: a retry starts anew.
//! 4. DeleteSnapshot drops the Hawser snapshot, then the backup (manifest and record). A
//!    second cluster has no record of the backup and leaves it on the target.
//! 5. CreateVolume from a backup id restores it (`CreateVolume.from_backup`) here, or in a
//!    cluster that was only given the target: the id names the target and the backup.

use hawser_api::backup::{Backup, BackupState, BackupTarget, CreateBackup};
use hawser_api::controller::{CreateSnapshot, Snapshot};
use tonic::Status;

use crate::api::{is_not_found, status};
use crate::controller::snapshots::{timestamp, Source};
use crate::controller::ControllerService;
use crate::names::is_hawser_name;
use crate::proto::csi;
use crate::snapshot_class::{
    backup_ids_fit, backup_snapshot_name, is_backup_snapshot_name, BackupId,
};

/// The CSI view of a backup.
pub fn csi_backup(b: &Backup) -> csi::Snapshot {
    let id = BackupId {
        target: b.target.clone(),
        backup: b.name.clone(),
    };
    csi::Snapshot {
        size_bytes: i64::try_from(b.size_bytes).unwrap_or(i64::MAX),
        snapshot_id: id.encode(),
        source_volume_id: b.volume.clone(),
        creation_time: Some(timestamp(b.taken_ms)),
        ready_to_use: b.state == BackupState::Ready,
        ..Default::default()
    }
}

/// A backup that failed after it started: the CO holds its id, and it will not become ready.
fn failed(b: &Backup) -> Status {
    Status::internal(format!(
        "backup {} of volume {} to target {} failed: {}; delete this VolumeSnapshot and take \
         another",
        b.name,
        b.volume,
        b.target,
        b.error.as_deref().unwrap_or("no reason recorded")
    ))
}

/// Whether the CO was given this backup's id: it was, unless it never started (no node ran
/// it), in which case the CreateBackup call that made it was answered with the error.
fn started(b: &Backup) -> bool {
    b.state != BackupState::Failed || b.node.is_some()
}

impl ControllerService {
    /// CreateSnapshot of `volume` for `csi_name` as a backup to `target`.
    pub async fn take_backup(
        &self,
        csi_name: &str,
        volume: &str,
        target: &str,
    ) -> Result<csi::Snapshot, Status> {
        let snap = backup_snapshot_name(csi_name);
        let _guard = self.inflight.begin(&format!("snapshot {snap}"))?;
        if !is_hawser_name(volume) {
            return Err(Status::not_found(format!("volume {volume} does not exist")));
        }
        if !backup_ids_fit(target, volume) {
            return Err(Status::invalid_argument(format!(
                "the ids of backups of volume {volume} to target {target} would pass CSI's \
                 128 bytes; use a shorter target name"
            )));
        }
        if let Some(b) = self.backup_taken_for(volume, target, &snap).await? {
            return self.settle(b).await;
        }
        self.target_exists(target).await?;
        let what = format!("back up volume {volume} to target {target} for {csi_name:?}");
        let body = CreateSnapshot {
            name: snap.clone(),
            volume: volume.to_string(),
        };
        let _: Snapshot = self
            .api
            .post("/v1/snapshots".into(), body)
            .await
            .map_err(|e| status(&format!("{what}: take snapshot {snap}"), e))?;
        let body = CreateBackup {
            volume: volume.to_string(),
            target: target.to_string(),
            snapshot: Some(snap.clone()),
        };
        match self.api.post::<_, Backup>("/v1/backups".into(), body).await {
            Ok(b) => Ok(csi_backup(&b)),
            Err(e) => {
                // It never started: no id was given, and the next call starts anew. The
                // snapshot goes now, so nothing holds the volume if no call comes.
                self.drop_backup_snapshot(&snap).await;
                Err(status(&what, e))
            }
        }
    }

    /// The backup a previous CreateSnapshot for `snap` started, if any started.
    async fn backup_taken_for(
        &self,
        volume: &str,
        target: &str,
        snap: &str,
    ) -> Result<Option<Backup>, Status> {
        let all: Vec<Backup> = self
            .api
            .get(format!("/v1/backups?volume={volume}&target={target}"))
            .await
            .map_err(|e| status(&format!("list backups of volume {volume}"), e))?;
        Ok(all
            .into_iter()
            .filter(|b| b.snapshot == snap && started(b))
            .max_by_key(|b| (b.created_ms, b.name.clone())))
    }

    async fn target_exists(&self, target: &str) -> Result<(), Status> {
        match self
            .api
            .get::<BackupTarget>(format!("/v1/backup-targets/{target}"))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Err(Status::invalid_argument(format!(
                "backup target {target} (the VolumeSnapshotClass's `target`) is not known to \
                 Hawser: add it with `hawser backup target add`"
            ))),
            Err(e) => Err(status(&format!("look up backup target {target}"), e)),
        }
    }

    /// A backup as a CSI snapshot; once it has ended, its Hawser snapshot is dropped.
    async fn settle(&self, b: Backup) -> Result<csi::Snapshot, Status> {
        if b.state != BackupState::Running && is_backup_snapshot_name(&b.snapshot) {
            self.drop_backup_snapshot(&b.snapshot).await;
        }
        match b.state {
            BackupState::Failed => Err(failed(&b)),
            _ => Ok(csi_backup(&b)),
        }
    }

    /// Drops a snapshot taken for a backup; what fails is logged, and the snapshot dropped
    /// at the next call (or DeleteSnapshot).
    async fn drop_backup_snapshot(&self, snap: &str) {
        match self.api.delete(format!("/v1/snapshots/{snap}")).await {
            Ok(()) => tracing::info!(snapshot = snap, "dropped the snapshot a backup read"),
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                tracing::warn!(snapshot = snap, error = %e, "cannot drop the snapshot a backup read")
            }
        }
    }

    /// The backup an id names, from this cluster's records (None: this cluster has none).
    async fn backup_record(&self, id: &BackupId) -> Result<Option<Backup>, Status> {
        match self
            .api
            .get::<Backup>(format!("/v1/backups/{}", id.backup))
            .await
        {
            Ok(b) if b.target == id.target => Ok(Some(b)),
            Ok(_) => Ok(None),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(status(&format!("look up backup {}", id.backup), e)),
        }
    }

    /// ListSnapshots or GetSnapshot of one backup id. A backup this cluster has no record of
    /// is reported ready when its target is known here: it was made by another cluster
    /// (a VolumeSnapshotContent given its id, as Velero restores make), and the controller
    /// cannot read a manifest for us; CreateVolume from it reads the manifest and answers
    /// NOT_FOUND when it is not there.
    pub async fn backup_snapshot(&self, id: &str) -> Result<Option<csi::Snapshot>, Status> {
        let Some(id) = BackupId::decode(id) else {
            return Ok(None);
        };
        if let Some(b) = self.backup_record(&id).await? {
            let _guard = self.inflight.begin(&format!("snapshot {}", b.snapshot))?;
            return self.settle(b).await.map(Some);
        }
        match self
            .api
            .get::<BackupTarget>(format!("/v1/backup-targets/{}", id.target))
            .await
        {
            Ok(_) => Ok(Some(csi::Snapshot {
                snapshot_id: id.encode(),
                ready_to_use: true,
                ..Default::default()
            })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(status(&format!("look up backup target {}", id.target), e)),
        }
    }

    /// Every backup this driver made (its snapshot is one of ours), for ListSnapshots.
    pub async fn backup_snapshots(
        &self,
        volume: Option<&str>,
    ) -> Result<Vec<csi::Snapshot>, Status> {
        let path = match volume {
            Some(v) => format!("/v1/backups?volume={v}"),
            None => "/v1/backups".to_string(),
        };
        let all: Vec<Backup> = self
            .api
            .get(path)
            .await
            .map_err(|e| status("list backups", e))?;
        Ok(all
            .iter()
            .filter(|b| is_backup_snapshot_name(&b.snapshot) && started(b))
            .map(csi_backup)
            .collect())
    }

    /// DeleteSnapshot of a backup id: its Hawser snapshot, then the backup. Unknown: OK.
    pub async fn drop_backup(&self, id: &str) -> Result<(), Status> {
        let Some(id) = BackupId::decode(id) else {
            return Ok(());
        };
        let Some(b) = self.backup_record(&id).await? else {
            return Ok(());
        };
        let _guard = self.inflight.begin(&format!("snapshot {}", b.snapshot))?;
        if b.state == BackupState::Running {
            return Err(Status::failed_precondition(format!(
                "backup {} is running; it can be deleted when it ends",
                b.name
            )));
        }
        if is_backup_snapshot_name(&b.snapshot) {
            match self
                .api
                .delete(format!("/v1/snapshots/{}", b.snapshot))
                .await
            {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(status(&format!("delete snapshot {}", b.snapshot), e)),
            }
        }
        match self.api.delete(format!("/v1/backups/{}", b.name)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(status(&format!("delete backup {}", b.name), e)),
        }
    }

    /// A CreateVolume's content source that is a backup id: NOT_FOUND unless it is one, and
    /// UNAVAILABLE while it runs here. Its size is the record's; a second cluster has none,
    /// and the controller takes the manifest's (at least).
    pub async fn backup_source(&self, id: &str) -> Result<Source, Status> {
        let not_found = || Status::not_found(format!("snapshot {id} does not exist"));
        let bid = BackupId::decode(id).ok_or_else(not_found)?;
        let size_bytes = match self.backup_record(&bid).await? {
            Some(b) if b.state == BackupState::Ready => b.size_bytes,
            Some(b) if b.state == BackupState::Running => {
                return Err(Status::unavailable(format!(
                    "backup {} is still running; a volume can be created from it once it is \
                     ready",
                    b.name
                )))
            }
            Some(b) => return Err(failed(&b)),
            None => 0,
        };
        Ok(Source {
            from: None,
            from_backup: Some(bid.from_backup()),
            size_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backup(state: BackupState, node: Option<&str>) -> Backup {
        Backup {
            name: "db-20261129-101500".into(),
            volume: "db".into(),
            target: "offsite".into(),
            state,
            snapshot: backup_snapshot_name("snapshot-1"),
            taken_ms: 1_795_860_900_250,
            size_bytes: 32 << 20,
            node: node.map(str::to_string),
            progress: None,
            stats: None,
            error: Some("target offsite: store blocks/…: connection refused".into()),
            created_ms: 1_795_860_900_300,
            finished_ms: None,
        }
    }

    #[test]
    fn a_backup_is_a_snapshot_cut_at_its_snapshot_and_ready_once_on_the_target() {
        let running = csi_backup(&backup(BackupState::Running, Some("n1")));
        assert_eq!(running.snapshot_id, "backup:offsite:db-20261129-101500");
        assert_eq!(running.source_volume_id, "db");
        assert_eq!(running.size_bytes, 32 << 20);
        assert!(!running.ready_to_use);
        let t = running.creation_time.unwrap_or_default();
        assert_eq!((t.seconds, t.nanos), (1_795_860_900, 250_000_000));
        assert!(csi_backup(&backup(BackupState::Ready, Some("n1"))).ready_to_use);
        assert_eq!(
            BackupId::decode(&running.snapshot_id).map(|i| i.from_backup()),
            Some("offsite/db-20261129-101500".to_string())
        );
    }

    #[test]
    fn only_a_backup_that_never_started_is_nobodys_snapshot() {
        assert!(started(&backup(BackupState::Running, Some("n1"))));
        assert!(started(&backup(BackupState::Ready, Some("n1"))));
        assert!(started(&backup(BackupState::Failed, Some("n1"))));
        assert!(!started(&backup(BackupState::Failed, None)));
        let s = failed(&backup(BackupState::Failed, Some("n1")));
        assert_eq!(s.code(), tonic::Code::Internal);
        assert!(
            s.message().contains("connection refused"),
            "{}",
            s.message()
        );
        assert!(s.message().contains("take another"), "{}", s.message());
    }
}
