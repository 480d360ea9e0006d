//! Where things live on a target, relative to its prefix:
//!
//! ```text
//! hawser-backup.json             the format marker, written by the connection check
//! backups/<backup>.json          one manifest per backup, written after all its blocks
//! blocks/<h0h1>/<sha256>.zst     one block, zstd-compressed, named by its content's hash
//! retired/<backup>.json          a deleted backup's manifest, kept while a reader holds it
//! locks/<kind>-<holder>.json     who backs up, prunes or reads now (`locks.rs`)
//! ```
//!
//! Blocks are shared by every backup on the target that holds the same content, so a clone's
//! backup or a second backup of an unchanged block stores nothing new.

use crate::error::BackupError;

pub const MARKER: &str = "hawser-backup.json";
pub const BACKUPS: &str = "backups";
pub const BLOCKS: &str = "blocks";
pub const RETIRED: &str = "retired";

/// The object of a manifest.
pub fn manifest(backup: &str) -> String {
    format!("{BACKUPS}/{backup}.json")
}

/// Where a deleted backup's manifest waits for its last reader (`readers.rs`).
pub fn retired(backup: &str) -> String {
    format!("{RETIRED}/{backup}.json")
}

/// The backup a retired manifest's object name holds, if it is one.
pub fn retired_of(object: &str) -> Option<&str> {
    object
        .strip_prefix(RETIRED)?
        .strip_prefix('/')?
        .strip_suffix(".json")
}

/// The object of a block, by the hex SHA-256 of its uncompressed content.
pub fn block(hash: &str) -> String {
    let fan = hash.get(..2).unwrap_or("00");
    format!("{BLOCKS}/{fan}/{hash}.zst")
}

/// The backup a manifest's object name holds, if it is one.
pub fn backup_of(object: &str) -> Option<&str> {
    object
        .strip_prefix(BACKUPS)?
        .strip_prefix('/')?
        .strip_suffix(".json")
}

/// A backup name: 1-100 characters of `[a-z0-9-]`, not starting with '-', so it is safe as
/// an object name, a path and in a URI.
pub fn validate_backup(name: &str) -> Result<(), BackupError> {
    hawser_api::validate_name_up_to("backup", name, crate::constants::MAX_BACKUP_NAME_BYTES)
        .map_err(|e| BackupError::Invalid { what: e.message })
}

/// The name the controller gives a backup of `volume` taken at `ms`: the volume and the
/// UTC time, `db-20261128-101500`; `n` > 0 tells apart backups of the same second.
pub fn backup_name(volume: &str, ms: u64, n: u32) -> String {
    let (y, m, d, hh, mm, ss) = hawser_api::time::utc(ms / 1000);
    let stamp = format!("{y:04}{m:02}{d:02}-{hh:02}{mm:02}{ss:02}");
    if n == 0 {
        format!("{volume}-{stamp}")
    } else {
        format!("{volume}-{stamp}-{n}")
    }
}

/// Whether `backup` is a name [`backup_name`] gives `volume`, and if so its order among
/// them: (stamp, n). `db-2-20261128-101500` is not one of `db`'s.
pub fn order_of(backup: &str, volume: &str) -> Option<(u64, u32)> {
    let rest = backup.strip_prefix(volume)?.strip_prefix('-')?;
    let (day, rest) = rest.split_at_checked(8)?;
    let rest = rest.strip_prefix('-')?;
    let (time, rest) = rest.split_at_checked(6)?;
    let n = match rest.strip_prefix('-') {
        None if rest.is_empty() => 0,
        Some(n) if !n.is_empty() && !n.starts_with('0') => n.parse().ok()?,
        _ => return None,
    };
    let digits = |s: &str| s.bytes().all(|c| c.is_ascii_digit());
    if !digits(day) || !digits(time) {
        return None;
    }
    Some((format!("{day}{time}").parse().ok()?, n))
}

/// A block hash as manifests write it: 64 lowercase hex digits.
pub fn is_hash(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_roundtrip_and_refuse_bad_ones() {
        assert_eq!(manifest("db-1"), "backups/db-1.json");
        assert_eq!(backup_of("backups/db-1.json"), Some("db-1"));
        assert_eq!(backup_of("blocks/ab/x.zst"), None);
        assert_eq!(backup_of("backupsx/db.json"), None);
        let h = "ab".repeat(32);
        assert!(is_hash(&h));
        assert_eq!(block(&h), format!("blocks/ab/{h}.zst"));
        assert!(!is_hash(&h.to_uppercase()));
        assert!(!is_hash(&h[1..]));
        assert!(validate_backup("db-20261128-101500").is_ok());
        for bad in ["", "-x", "A", "a/b", "a.b", &"a".repeat(101)] {
            assert!(validate_backup(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn backups_of_a_volume_are_told_apart_and_ordered() {
        // 2026-11-28 10:15:00 UTC.
        let ms = 1_795_860_900_000;
        assert_eq!(backup_name("db", ms, 0), "db-20261128-101500");
        assert_eq!(backup_name("db", ms + 999, 2), "db-20261128-101500-2");
        assert_eq!(backup_name("v", 0, 0), "v-19700101-000000");
        assert_eq!(
            order_of("db-20261128-101500", "db"),
            Some((20261128101500, 0))
        );
        assert_eq!(
            order_of("db-20261128-101500-2", "db"),
            Some((20261128101500, 2))
        );
        assert!(order_of("db-20261128-101500-2", "db") > order_of("db-20261128-101500", "db"));
        for not in [
            "db-2-20261128-101500",
            "db-20261128-10150",
            "db-20261128-101500-",
            "db-20261128-101500-02",
            "db-20261128-101500x",
            "db-2026112a-101500",
            "dbx-20261128-101500",
            "db",
            "",
        ] {
            assert_eq!(order_of(not, "db"), None, "{not:?}");
        }
        assert_eq!(
            order_of("db-2-20261128-101500", "db-2").map(|o| o.1),
            Some(0)
        );
    }
}
