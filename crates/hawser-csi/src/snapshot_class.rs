//! What a VolumeSnapshotClass asks for, and the CSI snapshot ids of backups: pure checks, no
//! I/O (the RPCs are in `snapshots.rs` and `snapshot_backups.rs`).
//!
//! A class with no parameters, or `type: snapshot`, makes Hawser snapshots: in the cluster,
//! taken in milliseconds, gone with the cluster. `type: backup` with `target: NAME` makes
//! backups to that target (docs/backup.md), as Longhorn's `type: bak` does, so a tool that
//! only knows VolumeSnapshots (Velero) gets off-cluster copies without a data mover of its own.
//!
//! A backup's CSI snapshot id is `backup:<target>:<backup>`. It names everything a restore
//! needs, so a second cluster given only the target can create a volume from it. Hawser
//! names never hold ':', so a plain snapshot's id (a Hawser name) is never read as one.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use crate::names::MAX_CSI_NAME_LEN;

/// Parameters the CO adds to every request (external-snapshotter's `--extra-create-metadata`
/// and secret references); they say nothing about the snapshot.
pub const CO_PREFIX: &str = "csi.storage.k8s.io/";
/// `snapshot` (the default) or `backup`.
pub const PARAM_TYPE: &str = "type";
/// The backup target, for `type: backup` (`hawser backup target list`).
pub const PARAM_TARGET: &str = "target";
/// How a backup's snapshot id starts.
pub const BACKUP_ID_PREFIX: &str = "backup:";
/// How the Hawser snapshot a backup reads is named: `csi-backup-` and 40 hex digits of the
/// CSI name's SHA-256. It is dropped when the backup ends; the prefix says which snapshots
/// the driver may drop with their backup (never one a person named).
const BACKUP_SNAPSHOT_PREFIX: &str = "csi-backup-";
/// What the controller adds to a volume's name to name a backup of it, at most:
/// `-YYYYMMDD-HHMMSS-N` (`hawser_backup::names::backup_name`).
const BACKUP_NAME_SUFFIX_MAX: usize = 18;

/// What a CreateSnapshot makes, from its class's parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotKind {
    /// A Hawser snapshot (docs/snapshots.md).
    Snapshot,
    /// A backup to this target (docs/backup.md).
    Backup { target: String },
}

/// Reads a VolumeSnapshotClass's parameters; the message says what is wrong in it.
pub fn parse(p: &HashMap<String, String>) -> Result<SnapshotKind, String> {
    let mut unknown: Vec<&str> = p
        .keys()
        .map(String::as_str)
        .filter(|k| !k.starts_with(CO_PREFIX) && *k != PARAM_TYPE && *k != PARAM_TARGET)
        .collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        return Err(format!(
            "unknown snapshot parameter(s) {unknown:?}: Hawser takes `{PARAM_TYPE}` (snapshot \
             or backup) and, for backups, `{PARAM_TARGET}` (check the VolumeSnapshotClass)"
        ));
    }
    let target = p.get(PARAM_TARGET);
    match (p.get(PARAM_TYPE).map(String::as_str), target) {
        (None | Some("snapshot"), None) => Ok(SnapshotKind::Snapshot),
        (None | Some("snapshot"), Some(_)) => Err(format!(
            "parameter `{PARAM_TARGET}` is for `{PARAM_TYPE}: backup`; a Hawser snapshot stays \
             in the cluster"
        )),
        (Some("backup"), None) => Err(format!(
            "`{PARAM_TYPE}: backup` needs `{PARAM_TARGET}`: the name of a backup target \
             (hawser backup target list)"
        )),
        (Some("backup"), Some(t)) => {
            hawser_api::validate_name("backup target", t).map_err(|e| e.message)?;
            Ok(SnapshotKind::Backup { target: t.clone() })
        }
        (Some(other), _) => Err(format!(
            "snapshot parameter `{PARAM_TYPE}` is {other:?}: use snapshot (in the cluster) or \
             backup (to a backup target)"
        )),
    }
}

/// A backup as a CSI snapshot id names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupId {
    pub target: String,
    pub backup: String,
}

impl BackupId {
    /// `backup:<target>:<backup>`.
    pub fn encode(&self) -> String {
        format!("{BACKUP_ID_PREFIX}{}:{}", self.target, self.backup)
    }

    /// The backup an id names; None when it is not a backup id this driver could have given
    /// (any string: the CO passes ids through from users' objects).
    pub fn decode(id: &str) -> Option<BackupId> {
        if id.len() > MAX_CSI_NAME_LEN {
            return None;
        }
        let (target, backup) = id.strip_prefix(BACKUP_ID_PREFIX)?.split_once(':')?;
        hawser_api::validate_name("backup target", target).ok()?;
        hawser_api::validate_name_up_to("backup", backup, MAX_CSI_NAME_LEN).ok()?;
        Some(BackupId {
            target: target.to_string(),
            backup: backup.to_string(),
        })
    }

    /// As `CreateVolume.from_backup` takes it: `TARGET/BACKUP`.
    pub fn from_backup(&self) -> String {
        format!("{}/{}", self.target, self.backup)
    }
}

/// Whether every backup of `volume` to `target` has an id within CSI's 128 bytes: the
/// controller names a backup after its volume, so a long volume name and a long target name
/// together may not fit.
pub fn backup_ids_fit(target: &str, volume: &str) -> bool {
    BACKUP_ID_PREFIX.len() + target.len() + 1 + volume.len() + BACKUP_NAME_SUFFIX_MAX
        <= MAX_CSI_NAME_LEN
}

/// The Hawser snapshot a backup for the CSI snapshot `csi_name` reads. A pure function of the
/// name, so a retried CreateSnapshot finds the backup it started (by the snapshot it reads).
pub fn backup_snapshot_name(csi_name: &str) -> String {
    let digest = Sha256::digest(csi_name.as_bytes());
    let hex: String = digest.iter().take(20).map(|b| format!("{b:02x}")).collect();
    format!("{BACKUP_SNAPSHOT_PREFIX}{hex}")
}

/// Whether a snapshot was taken by this driver for a backup (and may go with it).
pub fn is_backup_snapshot_name(name: &str) -> bool {
    name.strip_prefix(BACKUP_SNAPSHOT_PREFIX)
        .is_some_and(|h| h.len() == 40 && h.bytes().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn no_parameters_or_type_snapshot_make_snapshots() {
        assert_eq!(parse(&params(&[])), Ok(SnapshotKind::Snapshot));
        assert_eq!(
            parse(&params(&[("type", "snapshot")])),
            Ok(SnapshotKind::Snapshot)
        );
        let co = params(&[
            ("csi.storage.k8s.io/volumesnapshot/name", "x"),
            ("csi.storage.k8s.io/volumesnapshotcontent/name", "y"),
        ]);
        assert_eq!(parse(&co), Ok(SnapshotKind::Snapshot));
    }

    #[test]
    fn type_backup_with_a_target_makes_backups() {
        let p = params(&[
            ("type", "backup"),
            ("target", "offsite"),
            ("csi.storage.k8s.io/volumesnapshot/namespace", "ns"),
        ]);
        assert_eq!(
            parse(&p),
            Ok(SnapshotKind::Backup {
                target: "offsite".into()
            })
        );
    }

    #[test]
    fn a_mistaken_class_is_refused_saying_what_is_wrong() {
        for (p, says) in [
            (params(&[("pool", "fast")]), "\"pool\""),
            (params(&[("type", "backup")]), "needs `target`"),
            (params(&[("type", "bak"), ("target", "t")]), "\"bak\""),
            (params(&[("type", "")]), "use snapshot"),
            (params(&[("target", "t")]), "is for `type: backup`"),
            (
                params(&[("type", "backup"), ("target", "Off_Site")]),
                "Off_Site",
            ),
            (params(&[("type", "backup"), ("target", "")]), "invalid"),
        ] {
            let e = parse(&p).expect_err("refused");
            assert!(e.contains(says), "{p:?}: {e}");
        }
    }

    #[test]
    fn backup_ids_round_trip_and_fit() {
        let id = BackupId {
            target: "offsite".into(),
            backup: "pvc-0a1b-20261129-101500".into(),
        };
        assert_eq!(id.encode(), "backup:offsite:pvc-0a1b-20261129-101500");
        assert_eq!(BackupId::decode(&id.encode()), Some(id.clone()));
        assert_eq!(id.from_backup(), "offsite/pvc-0a1b-20261129-101500");
        // Kubernetes' names: `pvc-<uuid>` backed up to a 61-character target still fits.
        let pvc = "pvc-2f0b3c5e-8a8e-4c3a-9a55-0c1f6a1d2e3f";
        assert!(backup_ids_fit(&"t".repeat(61), pvc));
        assert!(!backup_ids_fit(&"t".repeat(63), &"v".repeat(63)));
        let longest = BackupId {
            target: "t".repeat(61),
            backup: format!("{pvc}-20261129-101500-9"),
        };
        assert!(longest.encode().len() <= MAX_CSI_NAME_LEN);
        assert_eq!(BackupId::decode(&longest.encode()), Some(longest));
    }

    #[test]
    fn garbage_ids_are_not_backups_and_never_panic() {
        for id in [
            "",
            "backup:",
            "backup::",
            "backup:t",
            "backup:t:",
            "backup::b",
            "backup:T:b",
            "backup:t:b:c",
            "backup:t:-b",
            "backup:t/x:b",
            "Backup:t:b",
            "snapshot-1",
            "backup:t:b\u{0}",
            "backup:t:é",
            "backup:\u{10ffff}:b",
        ] {
            assert_eq!(BackupId::decode(id), None, "{id:?}");
        }
        assert_eq!(
            BackupId::decode(&format!("backup:t:{}", "b".repeat(130))),
            None
        );
        // Every prefix and every single-byte change of a good id decodes or not, no panic.
        let good = "backup:offsite:db-20261129-101500".as_bytes().to_vec();
        for cut in 0..good.len() {
            let _ = BackupId::decode(&String::from_utf8_lossy(&good[..cut]));
        }
        for i in 0..good.len() {
            for b in [0u8, b':', b'/', b'A', 0xff] {
                let mut bad = good.clone();
                bad[i] = b;
                let _ = BackupId::decode(&String::from_utf8_lossy(&bad));
            }
        }
    }

    #[test]
    fn backup_snapshots_are_named_from_the_csi_name_and_told_apart() {
        let a = backup_snapshot_name("snapshot-4f0c");
        assert_eq!(a, backup_snapshot_name("snapshot-4f0c"));
        assert_ne!(a, backup_snapshot_name("snapshot-4f0d"));
        assert!(hawser_api::validate_name("snapshot", &a).is_ok(), "{a}");
        assert!(is_backup_snapshot_name(&a));
        for other in ["snapshot-4f0c", "csi-backup-", "csi-backup-xyz", "db-snap"] {
            assert!(!is_backup_snapshot_name(other), "{other}");
        }
    }
}
