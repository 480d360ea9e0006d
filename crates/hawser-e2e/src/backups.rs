//! A backup read back outside any cluster, as an administrator holding only the target
//! would: the tests compare what a restore wrote with this.

use std::path::Path;
use std::sync::Arc;

use hawser_backup::{Dest, Manifest, Progress, Target};

/// Restores `backup` from `target` into a new blank file `out` of `size` bytes (every block
/// checked against its hash); returns its manifest.
pub fn restore_to_file(target: &Target, backup: &str, out: &Path, size: u64) -> Manifest {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let m = rt
        .block_on(hawser_backup::read_manifest(target, backup))
        .unwrap_or_else(|e| panic!("the manifest of {backup}: {e}"));
    std::fs::File::create(out)
        .and_then(|f| f.set_len(size))
        .expect("blank file");
    rt.block_on(hawser_backup::restore(
        target,
        &m,
        Dest::Blank(out),
        Arc::new(Progress::new(0)),
        0,
    ))
    .unwrap_or_else(|e| panic!("restore {backup} into a file: {e}"));
    m
}
