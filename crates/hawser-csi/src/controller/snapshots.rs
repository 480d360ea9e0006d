//! The CSI snapshot RPCs over the controller's `/v1/snapshots`, and the content source of a
//! CreateVolume (a clone of a snapshot or of a volume, `CreateVolume.from`).
//!
//! A CSI snapshot id is the Hawser snapshot's name (`names::snapshot_id_for`), so
//! CreateSnapshot is idempotent by name with nothing stored but the snapshot. The controller
//! takes a snapshot before it answers (the engine paused for the copies' moment; on a pool
//! with reflinks that is milliseconds), so a snapshot returned is ready to use. A volume with
//! snapshots is not deleted (FAILED_PRECONDITION, as the spec allows for snapshots that
//! depend on their volume): delete the VolumeSnapshots first, or clone the volume.
//!
//! A VolumeSnapshotClass with `type: backup` makes backups instead (`snapshot_class.rs`,
//! `snapshot_backups.rs`); every RPC here hands their ids (`backup:...`) over to those.

use hawser_api::controller::{CreateSnapshot, Snapshot, SnapshotState, Volume, VolumeSource};
use tonic::Status;

use crate::api::{is_not_found, status};
use crate::capacity::{self, size_fits};
// The snapshot part of `ControllerService`'s impl, a child module of controller.rs, whose
// CreateVolume calls it for a volume's content source.
use crate::controller::{required, ControllerService};
use crate::names::{is_hawser_name, snapshot_id_for, MAX_CSI_NAME_LEN};
use crate::paging;
use crate::proto::csi::volume_content_source::{self as vcs, Type as SourceType};
use crate::proto::csi::{self as csi, VolumeContentSource};
use crate::snapshot_class::{self, SnapshotKind, BACKUP_ID_PREFIX};

/// A time in ms since the Unix epoch as a protobuf timestamp.
pub fn timestamp(ms: u64) -> prost_types::Timestamp {
    let ms = i64::try_from(ms).unwrap_or(i64::MAX);
    prost_types::Timestamp {
        seconds: ms / 1000,
        nanos: i32::try_from(ms % 1000 * 1_000_000).unwrap_or(0),
    }
}

/// The CSI view of a snapshot.
pub fn csi_snapshot(s: &Snapshot) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: i64::try_from(s.size_bytes).unwrap_or(i64::MAX),
        snapshot_id: s.name.clone(),
        source_volume_id: s.volume.clone(),
        creation_time: Some(timestamp(s.created_ms)),
        ready_to_use: s.state == SnapshotState::Ready,
        ..Default::default()
    }
}

/// The CSI content source a volume was created from, if it is a clone.
pub fn content_source(origin: Option<&VolumeSource>) -> Option<VolumeContentSource> {
    let o = origin?;
    let t = match (&o.snapshot, &o.volume) {
        (Some(s), _) => SourceType::Snapshot(vcs::SnapshotSource {
            snapshot_id: s.clone(),
        }),
        (None, Some(v)) => SourceType::Volume(vcs::VolumeSource {
            volume_id: v.clone(),
        }),
        (None, None) => return None,
    };
    Some(VolumeContentSource { r#type: Some(t) })
}

/// A CreateVolume's content source as a Hawser clone source or a backup, checked to exist.
pub struct Source {
    pub from: Option<VolumeSource>,
    /// `TARGET/BACKUP` (`CreateVolume.from_backup`).
    pub from_backup: Option<String>,
    /// The source's size: the smallest the clone can be (0: not known here; the controller
    /// makes a restored volume at least its backup's size).
    pub size_bytes: u64,
}

impl ControllerService {
    async fn snapshot(&self, id: &str) -> Result<Option<Snapshot>, Status> {
        if !is_hawser_name(id) {
            return Ok(None);
        }
        match self
            .api
            .get::<Snapshot>(format!("/v1/snapshots/{id}"))
            .await
        {
            Ok(s) => Ok(Some(s)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(status(&format!("look up snapshot {id}"), e)),
        }
    }

    async fn source_volume(&self, id: &str) -> Result<Option<Volume>, Status> {
        if !is_hawser_name(id) {
            return Ok(None);
        }
        match self.api.get::<Volume>(format!("/v1/volumes/{id}")).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(status(&format!("look up volume {id}"), e)),
        }
    }

    /// Resolves a CreateVolume's content source: NOT_FOUND when it does not exist, as the
    /// spec asks; a snapshot still being taken is UNAVAILABLE (the CO retries).
    pub async fn source(&self, src: &VolumeContentSource) -> Result<Source, Status> {
        match &src.r#type {
            Some(SourceType::Snapshot(s)) => {
                let id = required("volume_content_source.snapshot.snapshot_id", &s.snapshot_id)?;
                if id.starts_with(BACKUP_ID_PREFIX) {
                    return self.backup_source(id).await;
                }
                let snap = self
                    .snapshot(id)
                    .await?
                    .ok_or_else(|| Status::not_found(format!("snapshot {id} does not exist")))?;
                if snap.state != SnapshotState::Ready {
                    return Err(Status::unavailable(format!(
                        "snapshot {id} is {:?}; a volume can be created from it once it is ready",
                        snap.state
                    )));
                }
                Ok(Source {
                    from: Some(VolumeSource {
                        snapshot: Some(snap.name),
                        volume: None,
                    }),
                    from_backup: None,
                    size_bytes: snap.size_bytes,
                })
            }
            Some(SourceType::Volume(v)) => {
                let id = required("volume_content_source.volume.volume_id", &v.volume_id)?;
                let vol = self
                    .source_volume(id)
                    .await?
                    .ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))?;
                Ok(Source {
                    from: Some(VolumeSource {
                        snapshot: None,
                        volume: Some(vol.name),
                    }),
                    from_backup: None,
                    size_bytes: vol.size_bytes,
                })
            }
            None => Err(Status::invalid_argument(
                "volume_content_source names neither a snapshot nor a volume",
            )),
        }
    }

    pub async fn take_snapshot(
        &self,
        req: &csi::CreateSnapshotRequest,
    ) -> Result<csi::Snapshot, Status> {
        let name = required("name", &req.name)?;
        let volume = required("source_volume_id", &req.source_volume_id)?;
        if name.len() > MAX_CSI_NAME_LEN {
            return Err(Status::invalid_argument(format!(
                "name is {} bytes; the CSI limit is {MAX_CSI_NAME_LEN}",
                name.len()
            )));
        }
        let kind = snapshot_class::parse(&req.parameters).map_err(Status::invalid_argument)?;
        if let SnapshotKind::Backup { target } = kind {
            return self.take_backup(name, volume, &target).await;
        }
        let id = snapshot_id_for(name);
        let _guard = self.inflight.begin(&format!("snapshot {id}"))?;
        if !is_hawser_name(volume) {
            return Err(Status::not_found(format!("volume {volume} does not exist")));
        }
        let body = CreateSnapshot {
            name: id.clone(),
            volume: volume.to_string(),
        };
        self.api
            .post::<_, Snapshot>("/v1/snapshots".into(), body)
            .await
            .map(|s| csi_snapshot(&s))
            .map_err(|e| status(&format!("snapshot volume {volume} as {id} for {name:?}"), e))
    }

    pub async fn drop_snapshot(&self, id: &str) -> Result<(), Status> {
        if id.starts_with(BACKUP_ID_PREFIX) {
            return self.drop_backup(id).await;
        }
        if !is_hawser_name(id) {
            return Ok(());
        }
        let _guard = self.inflight.begin(&format!("snapshot {id}"))?;
        match self.api.delete(format!("/v1/snapshots/{id}")).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(status(&format!("delete snapshot {id}"), e)),
        }
    }

    /// ListSnapshots: one snapshot by id, a volume's, or all; being deleted ones left out, and
    /// backups this driver made listed with them.
    pub async fn list_snapshots_page(
        &self,
        req: &csi::ListSnapshotsRequest,
    ) -> Result<csi::ListSnapshotsResponse, Status> {
        let snaps: Vec<csi::Snapshot> = if !req.snapshot_id.is_empty() {
            self.snapshot_by_id(&req.snapshot_id)
                .await?
                .into_iter()
                .collect()
        } else if !req.source_volume_id.is_empty() {
            let v = &req.source_volume_id;
            if !is_hawser_name(v) {
                Vec::new()
            } else {
                let snaps = match self.api.get(format!("/v1/snapshots?volume={v}")).await {
                    Ok(s) => s,
                    Err(e) if is_not_found(&e) => Vec::new(),
                    Err(e) => return Err(status(&format!("list snapshots of volume {v}"), e)),
                };
                let mut all = listed(snaps, Some(v));
                all.extend(self.backup_snapshots(Some(v)).await?);
                all
            }
        } else {
            let snaps = self
                .api
                .get("/v1/snapshots".into())
                .await
                .map_err(|e| status("list snapshots", e))?;
            let mut all = listed(snaps, None);
            all.extend(self.backup_snapshots(None).await?);
            all
        };
        let (snaps, next_token) = paging::page(
            snaps,
            |s| &s.snapshot_id,
            req.max_entries,
            &req.starting_token,
        )?;
        Ok(csi::ListSnapshotsResponse {
            entries: snaps
                .into_iter()
                .map(|s| csi::list_snapshots_response::Entry { snapshot: Some(s) })
                .collect(),
            next_token,
        })
    }

    /// One snapshot or backup by its CSI id (None: there is none).
    async fn snapshot_by_id(&self, id: &str) -> Result<Option<csi::Snapshot>, Status> {
        if id.starts_with(BACKUP_ID_PREFIX) {
            return self.backup_snapshot(id).await;
        }
        Ok(self.snapshot(id).await?.map(|s| csi_snapshot(&s)))
    }

    pub async fn get_snapshot_by_id(&self, id: &str) -> Result<csi::Snapshot, Status> {
        let id = required("snapshot_id", id)?;
        self.snapshot_by_id(id)
            .await?
            .ok_or_else(|| Status::not_found(format!("snapshot {id} does not exist")))
    }
}

/// Hawser snapshots as CSI lists them: of `volume` if given, not being deleted, and not the
/// ones taken for backups (they are listed as their backups).
fn listed(mut snaps: Vec<Snapshot>, volume: Option<&str>) -> Vec<csi::Snapshot> {
    snaps.retain(|s| {
        s.state != SnapshotState::Deleting
            && volume.is_none_or(|v| s.volume == v)
            && !snapshot_class::is_backup_snapshot_name(&s.name)
    });
    snaps.iter().map(csi_snapshot).collect()
}

/// The size of a clone of a source of `source` bytes for a capacity range: the range's size,
/// but never smaller than the source; OUT_OF_RANGE when the range's limit is below it.
pub fn clone_size(range: Option<&csi::CapacityRange>, source: u64) -> Result<u64, Status> {
    let asked = match range {
        None => source,
        Some(_) => capacity::size_for(range)?,
    };
    let size = asked.max(source);
    if !size_fits(size, range) {
        return Err(Status::out_of_range(format!(
            "the source is {source} bytes, more than the capacity range's limit \
             ({} bytes); a clone is at least as large as its source",
            range.map_or(0, |r| r.limit_bytes)
        )));
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clone_sizes_are_never_below_the_source() {
        const MIB: i64 = 1 << 20;
        let range = |required: i64, limit: i64| csi::CapacityRange {
            required_bytes: required * MIB,
            limit_bytes: limit * MIB,
        };
        let source = 64 << 20;
        assert_eq!(clone_size(None, source).ok(), Some(source));
        assert_eq!(
            clone_size(Some(&range(128, 0)), source).ok(),
            Some(128 << 20)
        );
        assert_eq!(clone_size(Some(&range(32, 0)), source).ok(), Some(source));
        assert_eq!(
            clone_size(Some(&range(32, 48)), source)
                .err()
                .map(|s| s.code()),
            Some(tonic::Code::OutOfRange)
        );
    }

    #[test]
    fn snapshots_and_sources_convert() {
        let s = Snapshot {
            name: "snap-1".into(),
            volume: "pvc-1".into(),
            id: "snap-1-abcdef".into(),
            size_bytes: 4096,
            created_ms: 1_700_000_000_123,
            state: SnapshotState::Ready,
            replicas: vec![],
            pause_micros: None,
            how: None,
        };
        let c = csi_snapshot(&s);
        assert_eq!(
            (c.snapshot_id.as_str(), c.source_volume_id.as_str()),
            ("snap-1", "pvc-1")
        );
        assert!(c.ready_to_use);
        let t = c.creation_time.unwrap_or_default();
        assert_eq!((t.seconds, t.nanos), (1_700_000_000, 123_000_000));
        let src = VolumeSource {
            snapshot: Some("snap-1".into()),
            volume: None,
        };
        assert!(matches!(
            content_source(Some(&src)).and_then(|c| c.r#type),
            Some(SourceType::Snapshot(s)) if s.snapshot_id == "snap-1"
        ));
        assert!(content_source(None).is_none());
    }
}
