//! CSI snapshots as backups (issue 43 item 5), through the real binary's CSI server over its
//! gRPC socket and a real S3 server (SeaweedFS): a VolumeSnapshotClass's `type: backup` and
//! `target` make CreateSnapshot a backup of the volume at the cut, idempotent by name and
//! ready once on the target, its Hawser snapshot then dropped so the volume can be deleted;
//! CreateVolume from its id restores it here, and in a second cluster given only the target;
//! a mistaken class, an unknown target and an unknown backup get the spec's codes;
//! DeleteSnapshot deletes the backup and is idempotent.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use hawser_csi::proto::csi::controller_client::ControllerClient;
use hawser_csi::proto::csi::volume_content_source::{SnapshotSource, Type as SourceType};
use hawser_csi::proto::csi::*;
use hawser_csi::snapshot_class::backup_snapshot_name;
use hawser_e2e::cluster::Cluster;
use hawser_e2e::run::qemu_io;
use hawser_e2e::{CsiOptions, CsiProc, S3Server, TempDir};
use tonic::transport::Channel;
use tonic::Code;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 32 * MIB;
const CSI_NAME: &str = "snapshot-6b1d2c8e-51c4-4a3e-9d0f-2a7b1c9e0f11";
/// The pattern written before the cut: (offset in MiB, byte).
const BEFORE: &[(u64, u8)] = &[(0, 0x11), (1, 0x12), (5, 0x13), (30, 0x14)];

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn controller_csi(c: &Cluster, dir: &Path) -> CsiProc {
    let opts = CsiOptions {
        mode: "controller",
        ..Default::default()
    };
    CsiProc::start_with(c, "n1", dir, opts)
}

fn class(kv: &[(&str, &str)]) -> HashMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn backup_class() -> HashMap<String, String> {
    class(&[
        ("type", "backup"),
        ("target", "offsite"),
        ("csi.storage.k8s.io/volumesnapshot/name", "db-backup"),
        ("csi.storage.k8s.io/volumesnapshot/namespace", "default"),
    ])
}

async fn create_snapshot(
    ctl: &mut ControllerClient<Channel>,
    name: &str,
    parameters: HashMap<String, String>,
) -> Result<Snapshot, tonic::Status> {
    let req = CreateSnapshotRequest {
        source_volume_id: "db".into(),
        name: name.into(),
        parameters,
        ..Default::default()
    };
    let s = ctl.create_snapshot(req).await?.into_inner().snapshot;
    Ok(s.expect("a snapshot in the answer"))
}

async fn create_volume(
    ctl: &mut ControllerClient<Channel>,
    name: &str,
    snapshot_id: &str,
) -> Result<Volume, tonic::Status> {
    let req = CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![block_cap()],
        // One node per cluster here.
        parameters: class(&[("replicas", "1")]),
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(SourceType::Snapshot(SnapshotSource {
                snapshot_id: snapshot_id.into(),
            })),
        }),
        ..Default::default()
    };
    let v = ctl.create_volume(req).await?.into_inner().volume;
    Ok(v.expect("a volume in the answer"))
}

fn block_cap() -> VolumeCapability {
    use volume_capability::access_mode::Mode;
    use volume_capability::{AccessMode, AccessType, BlockVolume};
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter.into(),
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

/// Waits for a restored volume, attaches it on n1 and reads the pattern written before the
/// cut (and none of what came after).
fn reads_the_cut(c: &Cluster, volume: &str) {
    hawser_e2e::wait_until(
        &format!("{volume} to be restored"),
        Duration::from_secs(120),
        || c.volume(volume).restoring.is_none(),
    );
    let v = c.volume(volume);
    assert_eq!(v.size_bytes, SIZE, "{v:?}");
    c.cli_ok(&["volume", "attach", volume, "--node", "n1"]);
    let uri = c.volume(volume).nbd_unix_uri.expect("an NBD URI");
    let mut reads: Vec<String> = BEFORE
        .iter()
        .map(|(mib, p)| format!("read -P {p:#x} {mib}M 1M"))
        .collect();
    reads.push("read -P 0 10M 1M".into());
    let reads: Vec<&str> = reads.iter().map(String::as_str).collect();
    let io = qemu_io(&uri, &reads);
    assert!(!io.contains("verification failed"), "{volume}: {io}");
    c.cli_ok(&["volume", "detach", volume]);
}

#[test]
fn a_backup_class_snapshot_is_a_backup_that_restores_here_and_in_another_cluster() {
    let dir = TempDir::new("csi-backup");
    let s3 = S3Server::start(dir.path(), "backups");
    let target = s3.target("offsite", "site-a", 120);
    let a = Cluster::start("csibackup-a", 1);
    s3.add_to(&a, "offsite", "site-a");
    let uri = a.attached_volume("db", "32MiB", 1, "n1");
    let mut writes: Vec<String> = BEFORE
        .iter()
        .map(|(mib, p)| format!("write -P {p:#x} {mib}M 1M"))
        .collect();
    writes.push("flush".into());
    let writes: Vec<&str> = writes.iter().map(String::as_str).collect();
    qemu_io(&uri, &writes);
    let csi_a = controller_csi(&a, &dir.path().join("csi-a"));
    let rt = runtime();

    // A mistaken class is refused, and takes nothing.
    rt.block_on(async {
        let mut ctl = csi_a.controller().await;
        for (params, says) in [
            (class(&[("type", "backup")]), "needs `target`"),
            (class(&[("type", "bak"), ("target", "offsite")]), "\"bak\""),
            (class(&[("target", "offsite")]), "type: backup"),
            (class(&[("pool", "fast")]), "\"pool\""),
            (
                class(&[("type", "backup"), ("target", "nowhere")]),
                "hawser backup target add",
            ),
        ] {
            let e = create_snapshot(&mut ctl, "snapshot-bad", params)
                .await
                .expect_err("a bad class");
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            assert!(e.message().contains(says), "{says}: {e:?}");
        }
    });
    a.cli_fails(
        &["snapshot", "show", &backup_snapshot_name("snapshot-bad")],
        "",
    );
    let listed = a.cli_ok(&["backup", "list"]);
    assert!(
        !listed.contains("db-"),
        "a bad class made a backup: {listed}"
    );

    // The backup: cut at once (ready later), the same one on every retry.
    let first = rt
        .block_on(async {
            let mut ctl = csi_a.controller().await;
            create_snapshot(&mut ctl, CSI_NAME, backup_class()).await
        })
        .expect("CreateSnapshot");
    let id = first.snapshot_id.clone();
    assert!(id.starts_with("backup:offsite:db-"), "{first:?}");
    assert_eq!(first.source_volume_id, "db");
    assert_eq!(u64::try_from(first.size_bytes).ok(), Some(SIZE));
    assert!(first.creation_time.is_some(), "{first:?}");
    // Written after the cut: not in the backup.
    qemu_io(
        &uri,
        &["write -P 0x99 0 1M", "write -P 0x98 10M 1M", "flush"],
    );
    let mut ready = first.ready_to_use;
    hawser_e2e::wait_until("the backup to be ready", Duration::from_secs(120), || {
        if ready {
            return true;
        }
        let again = rt
            .block_on(async {
                let mut ctl = csi_a.controller().await;
                create_snapshot(&mut ctl, CSI_NAME, backup_class()).await
            })
            .expect("CreateSnapshot again");
        assert_eq!(again.snapshot_id, id, "a retry started another backup");
        assert_eq!(again.creation_time, first.creation_time);
        ready = again.ready_to_use;
        ready
    });
    let backup = id.rsplit(':').next().expect("a backup name").to_string();
    let shown = a.cli_ok(&["backup", "show", &backup]);
    assert!(shown.contains("ready"), "{shown}");
    assert_eq!(
        a.cli_ok(&["backup", "list", "--volume", "db"])
            .matches("db-")
            .count(),
        1,
        "one backup for every call"
    );
    // Its Hawser snapshot is gone: nothing holds the volume.
    a.cli_fails(&["snapshot", "show", &backup_snapshot_name(CSI_NAME)], "");
    // The target holds the volume as it was at the cut.
    let img = dir.path().join("restored.img");
    hawser_e2e::backups::restore_to_file(&target, &backup, &img, SIZE);
    let bytes = std::fs::read(&img).expect("read the restored image");
    for (mib, p) in BEFORE {
        let at = usize::try_from(mib * MIB).expect("offset");
        assert!(
            bytes[at..at + (1 << 20)].iter().all(|b| b == p),
            "{mib} MiB"
        );
    }
    assert!(bytes[10 << 20..11 << 20].iter().all(|b| *b == 0), "10 MiB");

    // ListSnapshots (external-snapshotter polls it by id) and GetSnapshot see it.
    rt.block_on(async {
        let mut ctl = csi_a.controller().await;
        let by_id = ListSnapshotsRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        };
        let l = ctl.list_snapshots(by_id).await.expect("list").into_inner();
        let s = l.entries[0].snapshot.as_ref().expect("an entry");
        assert!(
            l.entries.len() == 1 && s.snapshot_id == id && s.ready_to_use,
            "{l:?}"
        );
        let of_db = ListSnapshotsRequest {
            source_volume_id: "db".into(),
            ..Default::default()
        };
        let l = ctl.list_snapshots(of_db).await.expect("list").into_inner();
        let ids: Vec<&str> = l
            .entries
            .iter()
            .filter_map(|e| e.snapshot.as_ref().map(|s| s.snapshot_id.as_str()))
            .collect();
        assert_eq!(ids, [id.as_str()]);
        let got = ctl
            .get_snapshot(GetSnapshotRequest {
                snapshot_id: id.clone(),
                ..Default::default()
            })
            .await
            .expect("GetSnapshot")
            .into_inner();
        assert_eq!(got.snapshot.map(|s| s.snapshot_id), Some(id.clone()));
    });

    // A PVC from it, in this cluster: the data at the cut.
    rt.block_on(async {
        let mut ctl = csi_a.controller().await;
        let v = create_volume(&mut ctl, "pvc-restored-a", &id)
            .await
            .expect("CreateVolume from the backup");
        assert_eq!(v.volume_id, "pvc-restored-a");
        assert!(v.content_source.is_some(), "{v:?}");
        let again = create_volume(&mut ctl, "pvc-restored-a", &id).await;
        assert_eq!(
            again.map(|v| v.volume_id).ok().as_deref(),
            Some("pvc-restored-a")
        );
        for missing in [
            "backup:offsite:db-20000101-000000".to_string(),
            "backup:elsewhere:x".to_string(),
            "backup:x".to_string(),
        ] {
            let e = create_volume(&mut ctl, "pvc-none", &missing)
                .await
                .expect_err("no such backup");
            assert_eq!(e.code(), Code::NotFound, "{missing}: {e:?}");
        }
    });
    reads_the_cut(&a, "pvc-restored-a");

    // A second cluster, given only the target.
    let b = Cluster::start("csibackup-b", 1);
    s3.add_to(&b, "offsite", "site-a");
    let csi_b = controller_csi(&b, &dir.path().join("csi-b"));
    rt.block_on(async {
        let mut ctl = csi_b.controller().await;
        let by_id = ListSnapshotsRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        };
        let l = ctl.list_snapshots(by_id).await.expect("list").into_inner();
        assert!(
            l.entries.len() == 1
                && l.entries[0]
                    .snapshot
                    .as_ref()
                    .is_some_and(|s| s.ready_to_use),
            "{l:?}"
        );
        let v = create_volume(&mut ctl, "pvc-restored-b", &id)
            .await
            .expect("CreateVolume from the backup in cluster b");
        assert!(v.content_source.is_some(), "{v:?}");
        // Cluster b has no record of the backup: deleting its VolumeSnapshot leaves it.
        ctl.delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        })
        .await
        .expect("DeleteSnapshot in cluster b");
    });
    reads_the_cut(&b, "pvc-restored-b");
    drop(csi_b);
    drop(b);

    // DeleteSnapshot deletes the backup, then is idempotent; the volume can be deleted.
    rt.block_on(async {
        let mut ctl = csi_a.controller().await;
        for _ in 0..2 {
            ctl.delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: id.clone(),
                ..Default::default()
            })
            .await
            .expect("DeleteSnapshot");
        }
        let by_id = ListSnapshotsRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        };
        let l = ctl.list_snapshots(by_id).await.expect("list").into_inner();
        // The target is known here, so an id without a record reads as another cluster's.
        assert!(
            l.entries
                .iter()
                .all(|e| e.snapshot.as_ref().is_some_and(|s| s.size_bytes == 0)),
            "{l:?}"
        );
    });
    a.cli_fails(&["backup", "show", &backup], "not found");
    a.cli_ok(&["volume", "detach", "db"]);
    a.cli_ok(&["volume", "delete", "db"]);
    drop(csi_a);
    drop(a);
    drop(s3);
}

/// A StorageClass's `backupTarget`, `backupCron` and `backupRetain` (issue 43 item 4): a
/// mistaken schedule fails CreateVolume with INVALID_ARGUMENT and creates no volume; a good
/// one creates the volume with that schedule, which then makes backups on its own.
#[test]
fn a_storage_class_schedule_backs_up_its_volumes() {
    let dir = TempDir::new("csi-backup-class");
    let s3 = S3Server::start(dir.path(), "backups");
    let c = Cluster::start("csibackup-sc", 1);
    s3.add_to(&c, "offsite", "site-sc");
    let csi = controller_csi(&c, &dir.path().join("csi"));
    let rt = runtime();
    let schedule = |target: &str, cron: &str| {
        class(&[
            ("replicas", "1"),
            ("backupTarget", target),
            ("backupCron", cron),
            ("backupRetain", "2"),
        ])
    };
    let create = |ctl: &mut ControllerClient<Channel>, parameters| {
        let req = CreateVolumeRequest {
            name: "pvc-scheduled".into(),
            volume_capabilities: vec![block_cap()],
            capacity_range: Some(CapacityRange {
                required_bytes: 32 << 20,
                limit_bytes: 0,
            }),
            parameters,
            ..Default::default()
        };
        let mut ctl = ctl.clone();
        async move { ctl.create_volume(req).await }
    };
    rt.block_on(async {
        let mut ctl = csi.controller().await;
        for (params, says) in [
            (schedule("offsite", "every hour"), "every hour"),
            (schedule("nowhere", "0 * * * *"), "\"nowhere\""),
            (
                class(&[("backupTarget", "offsite"), ("backupCron", "0 * * * *")]),
                "backupRetain",
            ),
        ] {
            let e = create(&mut ctl, params).await.expect_err("a bad schedule");
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            assert!(e.message().contains(says), "{says}: {e:?}");
        }
    });
    assert!(c.volumes().is_empty(), "{:?}", c.volumes());

    rt.block_on(async {
        let mut ctl = csi.controller().await;
        create(&mut ctl, schedule("offsite", "*/2 * * * * *"))
            .await
            .expect("CreateVolume with a schedule");
    });
    let v = c.volume("pvc-scheduled");
    let s: Vec<(&str, &str, u32)> = v
        .backup_schedules
        .iter()
        .map(|s| (s.target.as_str(), s.cron.as_str(), s.retain))
        .collect();
    assert_eq!(s, [("offsite", "*/2 * * * * *", 2)], "{v:?}");
    hawser_e2e::wait_until(
        "a backup made by the StorageClass's schedule",
        Duration::from_secs(60),
        || {
            let list = c.cli_ok(&["backup", "list", "--volume", "pvc-scheduled", "-o", "json"]);
            let all: Vec<hawser_api::backup::Backup> =
                serde_json::from_str(&list).expect("backup list");
            all.iter()
                .any(|b| b.state == hawser_api::backup::BackupState::Ready)
        },
    );
    c.cli_ok(&[
        "backup",
        "unschedule",
        "pvc-scheduled",
        "--target",
        "offsite",
    ]);
    drop(csi);
    drop(c);
    drop(s3);
}
