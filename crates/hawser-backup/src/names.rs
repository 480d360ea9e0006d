//! Where things live on a target, relative to its prefix:
//!
//! ```text
//! hawser-backup.json             the format marker, written by the connection check
//! backups/<backup>.json          one manifest per backup, written after all its blocks
//! blocks/<h0h1>/<sha256>.zst     one block, zstd-compressed, named by its content's hash
//! ```
//!
//! Blocks are shared by every backup on the target that holds the same content, so a clone's
//! backup or a second backup of an unchanged block stores nothing new.

use crate::error::BackupError;

pub const MARKER: &str = "hawser-backup.json";
pub const BACKUPS: &str = "backups";
pub const BLOCKS: &str = "blocks";

/// The object of a manifest.
pub fn manifest(backup: &str) -> String {
    format!("{BACKUPS}/{backup}.json")
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
}
