//! Target specs (`NAME=file:/path`, `NAME=nbd:URI`): parsing, the fio engine arguments each
//! kind needs, and preparing a file target before the run.

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context};

/// Where fio sends its I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSpec {
    /// A regular file or a block device, driven with libaio and O_DIRECT.
    File(PathBuf),
    /// An NBD URI, driven with fio's nbd engine (libnbd), so no kernel NBD device is needed.
    Nbd(String),
}

/// A named target of the comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    pub spec: TargetSpec,
}

impl Target {
    /// Parses `NAME=SPEC`.
    pub fn parse(text: &str) -> anyhow::Result<Target> {
        let (name, spec) = text
            .split_once('=')
            .with_context(|| format!("target {text:?} is not NAME=SPEC"))?;
        ensure!(
            is_valid_name(name),
            "target name {name:?} must be [A-Za-z0-9_.-]+"
        );
        let spec = TargetSpec::parse(spec).with_context(|| format!("parse target {name}"))?;
        Ok(Target {
            name: name.to_owned(),
            spec,
        })
    }
}

/// Names end up in table columns, ratio lines (`a/b`) and `--expect` lines (`a:test>=x`), so
/// they stay free of the separators those use.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

impl TargetSpec {
    /// Parses `file:/path` or `nbd:URI`.
    pub fn parse(spec: &str) -> anyhow::Result<TargetSpec> {
        if let Some(path) = spec.strip_prefix("file:") {
            ensure!(!path.is_empty(), "file: target needs a path");
            return Ok(TargetSpec::File(PathBuf::from(path)));
        }
        if let Some(uri) = spec.strip_prefix("nbd:") {
            // libnbd accepts nbd://, nbds://, nbd+unix://, nbds+unix://, nbd+vsock://.
            let scheme = uri.split_once("://").map(|(s, _)| s);
            ensure!(
                scheme.is_some_and(|s| s.starts_with("nbd")),
                "nbd: target needs an NBD URI such as nbd://host:10809/export or \
                 nbd+unix:///export?socket=/path, got {uri:?}"
            );
            return Ok(TargetSpec::Nbd(uri.to_owned()));
        }
        bail!("target spec {spec:?} must start with file: or nbd:")
    }

    /// `file` or `nbd`, for the report.
    pub fn kind(&self) -> &'static str {
        match self {
            TargetSpec::File(_) => "file",
            TargetSpec::Nbd(_) => "nbd",
        }
    }

    /// The spec as given on the command line.
    pub fn to_spec_string(&self) -> String {
        match self {
            TargetSpec::File(path) => format!("file:{}", path.display()),
            TargetSpec::Nbd(uri) => format!("nbd:{uri}"),
        }
    }

    /// fio arguments selecting the engine and the target.
    pub fn fio_args(&self) -> Vec<String> {
        match self {
            TargetSpec::File(path) => vec![
                "--ioengine=libaio".to_owned(),
                format!(
                    "--filename={}",
                    escape_fio_filename(&path.to_string_lossy())
                ),
            ],
            TargetSpec::Nbd(uri) => vec!["--ioengine=nbd".to_owned(), format!("--uri={uri}")],
        }
    }

    /// Makes a file target ready: a missing (or short) regular file is preallocated to `size`
    /// so the tests measure the target, not the filesystem allocating blocks on first write.
    /// Block devices and NBD URIs are used as they are.
    pub fn prepare(&self, size: u64) -> anyhow::Result<()> {
        let TargetSpec::File(path) = self else {
            return Ok(());
        };
        match fs::metadata(path) {
            Ok(meta) if meta.file_type().is_block_device() => Ok(()),
            Ok(meta) if meta.is_file() && meta.len() >= size => Ok(()),
            Ok(meta) if meta.is_file() => preallocate(path, size),
            Ok(_) => bail!(
                "{} is neither a regular file nor a block device",
                path.display()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => preallocate(path, size),
            Err(e) => Err(e).with_context(|| format!("stat {}", path.display())),
        }
    }
}

fn preallocate(path: &Path, size: u64) -> anyhow::Result<()> {
    let file: File = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("create target file {}", path.display()))?;
    let len = libc::off_t::try_from(size).context("convert size to off_t")?;
    // SAFETY: `file` keeps the descriptor open for the duration of the call, and fallocate
    // only reads its integer arguments.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("preallocate {} to {size} bytes", path.display()));
    }
    Ok(())
}

/// fio splits `--filename` on ':' (several files per job); a literal colon is written `\:`.
fn escape_fio_filename(path: &str) -> String {
    path.replace(':', "\\:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_kinds_and_rejects_junk() -> anyhow::Result<()> {
        let t = Target::parse("local=file:/tmp/a.img")?;
        assert_eq!(t.name, "local");
        assert_eq!(t.spec, TargetSpec::File("/tmp/a.img".into()));
        let t = Target::parse("nbdkit=nbd:nbd+unix:///demo?socket=/run/n.sock")?;
        assert_eq!(
            t.spec,
            TargetSpec::Nbd("nbd+unix:///demo?socket=/run/n.sock".into())
        );
        assert_eq!(
            t.spec.to_spec_string(),
            "nbd:nbd+unix:///demo?socket=/run/n.sock"
        );
        for bad in [
            "noequals",
            "=file:/x",
            "a b=file:/x",
            "a=file:",
            "a=nbd:http://x",
            "a=/x",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad} must be rejected");
        }
        Ok(())
    }

    #[test]
    fn fio_args_pick_the_engine() {
        let file = TargetSpec::File("/tmp/x:y.img".into());
        assert_eq!(
            file.fio_args(),
            ["--ioengine=libaio", "--filename=/tmp/x\\:y.img"]
        );
        let nbd = TargetSpec::Nbd("nbd://127.0.0.1:10809/demo".into());
        assert_eq!(
            nbd.fio_args(),
            ["--ioengine=nbd", "--uri=nbd://127.0.0.1:10809/demo"]
        );
    }

    #[test]
    fn prepare_preallocates_missing_and_short_files() -> anyhow::Result<()> {
        let dir = std::env::temp_dir().join(format!("hawser-bench-target-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let path = dir.join("t.img");
        let spec = TargetSpec::File(path.clone());
        spec.prepare(1 << 20)?;
        let meta = fs::metadata(&path)?;
        assert_eq!(meta.len(), 1 << 20);
        // Preallocated, not sparse: the blocks are reserved up front.
        assert!(std::os::unix::fs::MetadataExt::blocks(&meta) * 512 >= 1 << 20);
        spec.prepare(2 << 20)?;
        assert_eq!(fs::metadata(&path)?.len(), 2 << 20);
        spec.prepare(1 << 20)?; // never shrinks
        assert_eq!(fs::metadata(&path)?.len(), 2 << 20);
        assert!(
            TargetSpec::File(dir.clone()).prepare(1).is_err(),
            "a directory is no target"
        );
        fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
