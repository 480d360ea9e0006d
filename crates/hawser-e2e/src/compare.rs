//! Byte-for-byte comparison of replica data files.

use std::io::Read;
use std::path::Path;

/// Compare two files over `len` bytes, chunk by chunk; panics at the first difference.
pub fn assert_same_contents(a: &Path, b: &Path, len: u64) {
    let (mut fa, mut fb) = (
        std::fs::File::open(a).expect("open a"),
        std::fs::File::open(b).expect("open b"),
    );
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut at = 0u64;
    while at < len {
        let n = usize::try_from((len - at).min(1 << 20)).expect("chunk fits usize");
        fa.read_exact(&mut ba[..n]).expect("read a");
        fb.read_exact(&mut bb[..n]).expect("read b");
        if ba[..n] != bb[..n] {
            let i = ba[..n]
                .iter()
                .zip(&bb[..n])
                .position(|(x, y)| x != y)
                .unwrap_or(0);
            panic!(
                "replicas differ at byte {}: {} vs {}",
                at + i as u64,
                a.display(),
                b.display()
            );
        }
        at += n as u64;
    }
}

/// Panics unless the file at `path` is exactly `want`, naming the first differing byte.
pub fn assert_file_is(path: &Path, want: &[u8], what: &str) {
    let got = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert_eq!(got.len(), want.len(), "{what}: {} size", path.display());
    if let Some(at) = got.iter().zip(want).position(|(g, w)| g != w) {
        let wrong = got
            .chunks(4096)
            .zip(want.chunks(4096))
            .filter(|(g, w)| g != w)
            .count();
        panic!(
            "{what}: {} differs from the expected content at byte {at} ({:#x}): {:#04x}, not \
             {:#04x}; {wrong} 4 KiB blocks differ",
            path.display(),
            at,
            got[at],
            want[at]
        );
    }
}

/// The SHA-256 of the first `len` bytes of the file at `path` (a replica's data file, a
/// backup restored into a file), as hex: a short name for a volume's content, for tests
/// that keep what each backup or volume should hold.
pub fn sha256_of(path: &Path, len: u64) -> String {
    use sha2::Digest;
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let n = usize::try_from(len).expect("a length that fits usize");
    assert!(
        data.len() >= n,
        "{} has {} bytes, fewer than {len}",
        path.display(),
        data.len()
    );
    format!("{:x}", sha2::Sha256::digest(&data[..n]))
}

/// The SHA-256 of `data`, as hex (as [`sha256_of`] gives it for a file).
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(data))
}
