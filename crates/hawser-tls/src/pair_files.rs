//! A certificate and its key kept as two files in a directory and replaced in one step
//! (issue 61): the node's identity (`<data-dir>/tls/node.pem`, `node.key`) and the
//! controller's CA (`<data-dir>/ca.pem`, `ca.key`).
//!
//! ## Layout
//!
//! ```text
//! node.pem -> identity/node.pem     made once, never replaced after
//! node.key -> identity/node.key
//! identity -> identity-7            the one link a save replaces
//! identity-7/node.pem               the pair, written whole before the link names it
//! identity-7/node.key               (mode 0600)
//! ```
//!
//! A save writes both files into a new generation directory (`identity-<n+1>`), syncs them
//! and it, renames a new link over `identity` and syncs the directory: one rename replaces
//! both halves. At every instant, so after a crash or a full disk too, `node.pem` and
//! `node.key` name the same generation. Older generations are removed afterwards.
//!
//! Why links and not one combined file: every reader and operator knows the two paths
//! (`CertSlot`, the CSI node plugin and `hawser csi`'s wait for `node.pem`, the CLI and
//! Prometheus given `ca.pem`, operators who copy `ca.pem` and `ca.key` to another
//! controller, the e2e tests). A combined file is replaced by one rename, but the two files
//! derived from it would each need another rename, and their readers would see the torn
//! pair this module exists to remove; or every reader would have to move to the new file.
//! The links keep both paths, open as plain files for every reader (`cp` copies the
//! contents), and cost one rename. The kubelet writes Secret volumes the same way (its
//! `..data` link). They are relative, so the directory works wherever it is mounted (the
//! chart's CSI node plugin mounts the agent's).
//!
//! ## Reading, and the cuts of older builds
//!
//! Builds before this one saved a pair as two renames (key, then certificate), each through
//! a temporary file (`node.new`; the CA's `ca-next.key` and `ca-next.pem` through
//! `ca-next.tmp`). A crash or a full disk between them left a key that is not the
//! certificate's, and the next start refused. [`PairLayout::load`] reads a pair by these
//! rules:
//!
//! 1. Every candidate certificate is tried, newest first, with every candidate key in the
//!    same order; the first pair whose key's public half is the certificate's is the pair.
//!    A key whose certificate was never written is never put beside a certificate it does
//!    not belong to.
//! 2. Newest first means: an older build's leftovers ([`PairLayout::leftovers`] order),
//!    then the known paths when they are plain files, then the current generation (what the
//!    link names). A save removes the first two kinds, so whatever of them is found was
//!    written after the last save: by an older build (a downgrade, or the build before
//!    this one) or by hand (a restore). In this layout alone, the generation is the pair.
//! 3. Nothing at all: there is no pair (`None`; the caller makes one).
//! 4. Files but no matching pair: [`PairError::NoMatchingPair`] names every file and what
//!    it holds, and says what to do ([`PairLayout::remedy`]).
//!
//! [`PairLayout::recover`] then saves what was read in this layout when it was not already
//! (moving an older build's files, dropping the halves of a cut). Readers in another process
//! (the CSI node plugin) only read.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rcgen::PublicKeyData;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivateKeyDer;

use crate::credentials::Credentials;

/// The most times [`PairLayout::load`] reads a directory whose link moved while it read.
const MAX_READS: u32 = 3;

/// Which certificate of the certificate file the key must belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyOf {
    /// The first: a chain's leaf (a node's certificate, then its CA).
    First,
    /// Any: a CA's `ca.pem` holds the CA beside it during a rotation, and `Ca::from_pem`
    /// has always taken the key's certificate from anywhere in it.
    Any,
}

/// Where a pair is kept in its directory.
#[derive(Debug)]
pub struct PairLayout {
    /// The certificate's path, the one readers know (`node.pem`).
    pub cert: &'static str,
    /// The key's path (`node.key`), mode 0600.
    pub key: &'static str,
    /// The link naming the current generation (`identity` -> `identity-<n>`).
    pub link: &'static str,
    /// Files an older build wrote halves through, newest first: tried before the known
    /// paths (rule 2), removed by the next save.
    pub leftovers: &'static [&'static str],
    pub key_of: KeyOf,
    /// What an operator does when no pair matches.
    pub remedy: &'static str,
}

/// The node's identity in `<data-dir>/tls/`, written by the agent, read by the CSI node
/// plugin beside it.
pub const NODE_IDENTITY: PairLayout = PairLayout {
    cert: "node.pem",
    key: "node.key",
    link: "identity",
    leftovers: &["node.new", "node.tmp"],
    key_of: KeyOf::First,
    remedy: "without a certificate and its key the node cannot prove who it is: move this \
             directory away and start the agent with a new join token (`hawser cluster \
             join-token --node NAME`), or with the agent token and the cluster's CA",
};

#[derive(Debug, thiserror::Error)]
pub enum PairError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} holds no certificate with its key (found: {}): {remedy}",
        dir.display(),
        list(found)
    )]
    NoMatchingPair {
        dir: PathBuf,
        found: Vec<Seen>,
        remedy: &'static str,
    },
    #[error("refusing to save in {}: the key is not the certificate's", dir.display())]
    NotAPair { dir: PathBuf },
}

impl PairError {
    /// Whether any certificate was found: a key alone is the first half of a first save cut
    /// short, which leaves nothing to keep.
    pub fn found_a_certificate(&self) -> bool {
        match self {
            PairError::NoMatchingPair { found, .. } => found.iter().any(|s| s.certificate),
            _ => true,
        }
    }
}

/// A file [`PairLayout::load`] looked at, for the error that lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// Its name in the directory.
    pub name: String,
    /// What it holds.
    pub holds: String,
    pub certificate: bool,
}

fn list(found: &[Seen]) -> String {
    let all: Vec<String> = found
        .iter()
        .map(|s| format!("{}: {}", s.name, s.holds))
        .collect();
    all.join("; ")
}

/// The pair as read.
#[derive(Debug)]
pub struct Found {
    pub creds: Credentials,
    /// The files the halves came from, by name in the directory.
    pub cert_from: String,
    pub key_from: String,
    /// Read from the current generation with both links in place and no leftovers:
    /// nothing to save again.
    pub whole: bool,
    /// The other files, which a save in this layout removes.
    pub dropped: Vec<Seen>,
}

/// What one candidate file holds.
enum Held {
    Key { pem: String, spki: Vec<u8> },
    Certs { pem: String, spkis: Vec<Vec<u8>> },
    Other(String),
}

struct Candidate {
    name: String,
    held: Held,
}

impl Candidate {
    fn seen(&self) -> Seen {
        let (holds, certificate) = match &self.held {
            Held::Key { .. } => ("a private key".to_string(), false),
            Held::Certs { spkis, .. } => (format!("{} certificate(s)", spkis.len()), true),
            Held::Other(what) => (what.clone(), false),
        };
        Seen {
            name: self.name.clone(),
            holds,
            certificate,
        }
    }
}

impl PairLayout {
    /// The pair in `dir`, by the rules at the top of this file; `None` if there is nothing.
    pub fn load(&self, dir: &Path) -> Result<Option<Found>, PairError> {
        // A reader in another process can read one half, then the other after two saves
        // (the generation it began in removed): the link moved meanwhile, so it reads again.
        let mut tries = 0;
        loop {
            let before = std::fs::read_link(dir.join(self.link)).ok();
            let read = self.load_once(dir);
            tries += 1;
            let moved = std::fs::read_link(dir.join(self.link)).ok() != before;
            if read.is_ok() || !moved || tries == MAX_READS {
                return read;
            }
        }
    }

    fn load_once(&self, dir: &Path) -> Result<Option<Found>, PairError> {
        let current = self.current(dir);
        // Newest first (rule 2). The known paths come last again for what they are when
        // they are links: the generation's files (read once) or a link to nothing.
        let known = [self.cert, self.key];
        let mut names: Vec<String> = self.leftovers.iter().map(|n| n.to_string()).collect();
        names.extend(
            known
                .iter()
                .filter(|n| is_file(&dir.join(n)))
                .map(|n| n.to_string()),
        );
        if let Some(generation) = &current {
            names.extend(known.iter().map(|n| format!("{generation}/{n}")));
        }
        names.extend(known.iter().map(|n| n.to_string()));
        let candidates = read_candidates(dir, &names);
        if candidates.is_empty() {
            return Ok(None);
        }
        let Some((c, k, chain_pem, key_pem)) = self.pick(&candidates) else {
            return Err(PairError::NoMatchingPair {
                dir: dir.into(),
                found: candidates.iter().map(Candidate::seen).collect(),
                remedy: self.remedy,
            });
        };
        let (cert_from, key_from) = (candidates[c].name.clone(), candidates[k].name.clone());
        let leftovers = candidates
            .iter()
            .any(|x| self.leftovers.contains(&x.name.as_str()));
        let whole = current.is_some_and(|g| {
            cert_from == format!("{g}/{}", self.cert) && key_from == format!("{g}/{}", self.key)
        }) && !leftovers
            && self.links_in_place(dir);
        Ok(Some(Found {
            creds: Credentials {
                chain_pem: chain_pem.into(),
                key_pem: key_pem.into(),
            },
            dropped: (candidates.iter().enumerate())
                .filter(|(i, _)| *i != c && *i != k)
                .map(|(_, x)| x.seen())
                .collect(),
            cert_from,
            key_from,
            whole,
        }))
    }

    /// Replaces the pair in `dir` with `creds` in one rename (the layout at the top of this
    /// file), then removes older generations and an older build's leftovers. Refuses a key
    /// that is not the certificate's.
    pub fn save(&self, dir: &Path, creds: &Credentials) -> Result<(), PairError> {
        let halves = [creds.chain_pem.as_bytes(), creds.key_pem.as_bytes()].map(classify);
        if self.pair(&halves[0], &halves[1]).is_none() {
            return Err(PairError::NotAPair { dir: dir.into() });
        }
        std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        let next = self.generations(dir)?.into_iter().max().unwrap_or(0) + 1;
        let generation = format!("{}-{next}", self.link);
        let at = dir.join(&generation);
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&at)
            .map_err(io("create", &at))?;
        write_new(&at.join(self.cert), &creds.chain_pem, 0o644)?;
        write_new(&at.join(self.key), &creds.key_pem, 0o600)?;
        sync(&at)?;
        // The one step: from here on both paths name the new pair.
        replace_link(dir, self.link, &generation)?;
        for name in [self.cert, self.key] {
            let target = format!("{}/{name}", self.link);
            if std::fs::read_link(dir.join(name)).ok() != Some(PathBuf::from(&target)) {
                replace_link(dir, name, &target)?;
            }
        }
        sync(dir)?;
        self.tidy(dir, &generation);
        Ok(())
    }

    /// [`PairLayout::load`], then [`PairLayout::save`] of what it read if that was not
    /// already whole in this layout: an older build's files are moved, the halves of a
    /// cut dropped.
    pub fn recover(&self, dir: &Path) -> Result<Option<Credentials>, PairError> {
        let Some(found) = self.load(dir)? else {
            return Ok(None);
        };
        if !found.whole {
            if found.dropped.is_empty() && found.cert_from == self.cert {
                tracing::info!(
                    dir = %dir.display(),
                    "keeping {} and {} in the layout that replaces them in one step",
                    self.cert,
                    self.key
                );
            } else {
                tracing::warn!(
                    dir = %dir.display(),
                    certificate = %found.cert_from,
                    key = %found.key_from,
                    dropped = %list(&found.dropped),
                    "found the halves of a cut save: keeping the certificate and the key that \
                     belong together"
                );
            }
            self.save(dir, &found.creds)?;
        }
        Ok(Some(found.creds))
    }

    /// The generation the link names, if it names one.
    fn current(&self, dir: &Path) -> Option<String> {
        let target = std::fs::read_link(dir.join(self.link)).ok()?;
        let name = target.to_str()?;
        self.generation_number(name).map(|_| name.to_string())
    }

    /// `n` for a name `<link>-<n>`.
    fn generation_number(&self, name: &str) -> Option<u64> {
        let digits = name.strip_prefix(self.link)?.strip_prefix('-')?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }

    fn generations(&self, dir: &Path) -> Result<Vec<u64>, PairError> {
        let entries = std::fs::read_dir(dir).map_err(io("list", dir))?;
        Ok(entries
            .filter_map(|e| e.ok()?.file_name().to_str().map(str::to_string))
            .filter_map(|n| self.generation_number(&n))
            .collect())
    }

    /// The first pair (certificate, key) that belongs together, newest first (rule 2).
    /// Their indexes, then the certificate's and the key's PEM.
    fn pick<'a>(&self, candidates: &'a [Candidate]) -> Option<(usize, usize, &'a str, &'a str)> {
        (0..candidates.len())
            .flat_map(|c| (0..candidates.len()).map(move |k| (c, k)))
            .find_map(|(c, k)| {
                let (cert, key) = self.pair(&candidates[c].held, &candidates[k].held)?;
                Some((c, k, cert, key))
            })
    }

    /// The certificate's and the key's PEM if the key is the certificate's.
    fn pair<'a>(&self, cert: &'a Held, key: &'a Held) -> Option<(&'a str, &'a str)> {
        let (Held::Certs { pem: chain, spkis }, Held::Key { pem: key, spki }) = (cert, key) else {
            return None;
        };
        let matches = match self.key_of {
            KeyOf::First => spkis.first() == Some(spki),
            KeyOf::Any => spkis.contains(spki),
        };
        matches.then_some((chain.as_str(), key.as_str()))
    }

    fn links_in_place(&self, dir: &Path) -> bool {
        [self.cert, self.key].iter().all(|name| {
            std::fs::read_link(dir.join(name)).ok() == Some(Path::new(self.link).join(name))
        })
    }

    /// Removes every generation but `keep` and an older build's leftovers. What stays is
    /// harmless to readers (no link names it) and goes with the next save.
    fn tidy(&self, dir: &Path, keep: &str) {
        let old = (self.generations(dir).unwrap_or_default().into_iter())
            .map(|n| format!("{}-{n}", self.link))
            .filter(|name| name != keep);
        for name in old {
            if let Err(e) = std::fs::remove_dir_all(dir.join(&name)) {
                tracing::warn!(
                    dir = %dir.display(), %name, error = %e,
                    "cannot remove an older generation of the pair"
                );
            }
        }
        for name in self.leftovers {
            match std::fs::remove_file(dir.join(name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(
                        dir = %dir.display(), %name, error = %e,
                        "cannot remove an older build's file"
                    );
                }
                _ => {}
            }
        }
    }
}

/// Whether `path` is a plain file (not a link, nor a directory).
fn is_file(path: &Path) -> bool {
    path.symlink_metadata().is_ok_and(|m| m.is_file())
}

/// The candidates that exist, each file once (a link to one read before is skipped).
fn read_candidates(dir: &Path, names: &[String]) -> Vec<Candidate> {
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for name in names {
        let path = dir.join(name);
        let Ok(meta) = path.symlink_metadata() else {
            continue;
        };
        if let Ok(real) = std::fs::canonicalize(&path) {
            if seen.contains(&real) {
                continue;
            }
            seen.push(real);
        }
        let held = match std::fs::read(&path) {
            Ok(bytes) => classify(&bytes),
            Err(e) if meta.file_type().is_symlink() && e.kind() == std::io::ErrorKind::NotFound => {
                let to = std::fs::read_link(&path).unwrap_or_default();
                Held::Other(format!("a link to {}, which is missing", to.display()))
            }
            Err(e) => Held::Other(format!("unreadable ({e})")),
        };
        out.push(Candidate {
            name: name.clone(),
            held,
        });
    }
    out
}

/// What a file's bytes hold. Never panics: any input is a key, certificates or `Other`.
fn classify(bytes: &[u8]) -> Held {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Held::Other("not PEM text".into());
    };
    if text.trim().is_empty() {
        return Held::Other("empty (cut short?)".into());
    }
    if PrivateKeyDer::from_pem_slice(bytes).is_ok() {
        return match rcgen::KeyPair::from_pem(text) {
            Ok(key) => Held::Key {
                pem: text.into(),
                spki: key.subject_public_key_info(),
            },
            Err(_) => Held::Other("a private key this build cannot read".into()),
        };
    }
    let Ok(certs) = crate::pem::certs_from_pem(text) else {
        return Held::Other("neither a key nor a certificate (cut short?)".into());
    };
    let spkis: Option<Vec<Vec<u8>>> = certs
        .iter()
        .map(|c| {
            Some(
                X509Certificate::from_der(c)
                    .ok()?
                    .1
                    .public_key()
                    .raw
                    .to_vec(),
            )
        })
        .collect();
    match spkis {
        Some(spkis) => Held::Certs {
            pem: text.into(),
            spkis,
        },
        None => Held::Other("a malformed certificate".into()),
    }
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> PairError + 'a {
    move |source| PairError::Io {
        op,
        path: path.into(),
        source,
    }
}

fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), PairError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io("create", path))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(io("write", path))
}

/// Points `dir/name` at `target` (relative) by renaming a new link over it.
fn replace_link(dir: &Path, name: &str, target: &str) -> Result<(), PairError> {
    let tmp = dir.join(format!("{name}.link-new"));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).map_err(io("link", &tmp))?;
    let at = dir.join(name);
    std::fs::rename(&tmp, &at).map_err(io("replace", &at))
}

fn sync(dir: &Path) -> Result<(), PairError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("sync", dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Ca, Peer};

    fn pair(ca: &Ca) -> Credentials {
        let (issued, key_pem) = ca
            .issue_with_key(
                &Peer::Node("n1".into()),
                std::time::Duration::from_secs(3600),
            )
            .expect("issue");
        Credentials {
            chain_pem: issued.chain_pem,
            key_pem,
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut all: Vec<String> = std::fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        all.sort();
        all
    }

    #[test]
    fn a_save_replaces_both_halves_through_one_link_and_leaves_one_generation() {
        let ca = Ca::generate("c").expect("ca");
        let dir = tempfile::tempdir().expect("dir");
        let (first, second) = (pair(&ca), pair(&ca));
        NODE_IDENTITY.save(dir.path(), &first).expect("save");
        NODE_IDENTITY.save(dir.path(), &second).expect("save again");
        assert_eq!(
            names(dir.path()),
            ["identity", "identity-2", "node.key", "node.pem"]
        );
        let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).expect(name);
        assert_eq!(read("node.pem"), second.chain_pem);
        assert_eq!(read("node.key"), second.key_pem);
        assert_eq!(
            std::fs::read_link(dir.path().join("node.key")).expect("link"),
            Path::new("identity/node.key")
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("node.key")).expect("key");
        assert_eq!(mode.permissions().mode() & 0o777, 0o600);
        let found = NODE_IDENTITY
            .load(dir.path())
            .expect("load")
            .expect("a pair");
        assert!(found.whole && found.dropped.is_empty(), "{found:?}");
    }

    #[test]
    fn a_pair_an_older_build_wrote_over_the_links_is_newer_than_the_generation() {
        // After a downgrade, the older build renewed: it renamed plain files over both
        // links. The generation they named is older; the next start keeps the plain pair.
        let ca = Ca::generate("c").expect("ca");
        let dir = tempfile::tempdir().expect("dir");
        let (saved, renewed) = (pair(&ca), pair(&ca));
        NODE_IDENTITY.save(dir.path(), &saved).expect("save");
        for (name, text) in [
            ("node.key", &renewed.key_pem),
            ("node.pem", &renewed.chain_pem),
        ] {
            std::fs::write(dir.path().join("plain"), text).expect("write");
            std::fs::rename(dir.path().join("plain"), dir.path().join(name)).expect("rename");
        }
        let found = NODE_IDENTITY.load(dir.path()).expect("load").expect("pair");
        assert_eq!(found.creds.chain_pem, renewed.chain_pem);
        assert!(!found.whole);
        NODE_IDENTITY.recover(dir.path()).expect("recover");
        let again = NODE_IDENTITY.load(dir.path()).expect("load").expect("pair");
        assert!(again.whole && again.creds.chain_pem == renewed.chain_pem);
    }

    #[test]
    fn a_save_refuses_a_key_that_is_not_the_certificates() {
        let ca = Ca::generate("c").expect("ca");
        let dir = tempfile::tempdir().expect("dir");
        let (a, b) = (pair(&ca), pair(&ca));
        let torn = Credentials {
            chain_pem: a.chain_pem,
            key_pem: b.key_pem,
        };
        let e = NODE_IDENTITY.save(dir.path(), &torn).expect_err("refused");
        assert!(matches!(e, PairError::NotAPair { .. }), "{e}");
        assert!(names(dir.path()).is_empty(), "nothing written");
    }

    #[test]
    fn a_reader_never_sees_a_key_beside_another_certificate_while_pairs_are_replaced() {
        let ca = Ca::generate("c").expect("ca");
        let dir = tempfile::tempdir().expect("dir");
        let pairs: Vec<Credentials> = (0..40).map(|_| pair(&ca)).collect();
        NODE_IDENTITY.save(dir.path(), &pairs[0]).expect("save");
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) || reads == 0 {
                    let found = NODE_IDENTITY.load(dir.path()).expect("load").expect("pair");
                    let i = pairs
                        .iter()
                        .position(|p| p.chain_pem == found.creds.chain_pem);
                    let i = i.expect("a certificate that was saved");
                    assert_eq!(found.creds.key_pem, pairs[i].key_pem, "its own key");
                    reads += 1;
                }
                reads
            });
            for p in &pairs[1..] {
                NODE_IDENTITY.save(dir.path(), p).expect("save");
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            assert!(reader.join().expect("reader") > 0);
        });
    }

    #[test]
    fn no_pair_that_belongs_together_is_refused_naming_each_file_and_what_to_do() {
        let ca = Ca::generate("c").expect("ca");
        let dir = tempfile::tempdir().expect("dir");
        let (old, new) = (pair(&ca), pair(&ca));
        std::fs::write(dir.path().join("node.key"), &new.key_pem).expect("key");
        std::fs::write(dir.path().join("node.pem"), &old.chain_pem).expect("cert");
        std::fs::write(dir.path().join("node.new"), &new.chain_pem[..30]).expect("cut");
        let e = NODE_IDENTITY.load(dir.path()).expect_err("no pair");
        let text = e.to_string();
        for want in [
            "node.key: a private key",
            "node.pem: 2 certificate(s)",
            "node.new: neither a key nor a certificate",
            "join-token",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        assert!(e.found_a_certificate());
        std::fs::remove_file(dir.path().join("node.pem")).expect("rm");
        let e = NODE_IDENTITY.load(dir.path()).expect_err("a key alone");
        assert!(!e.found_a_certificate(), "{e}");
    }

    #[test]
    fn garbage_in_every_file_is_described_never_a_panic() {
        let dir = tempfile::tempdir().expect("dir");
        let inputs: [&[u8]; 5] = [
            b"",
            b"\xff\xfe",
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
            b"-----BEGIN CERTIFICATE-----\nMIIB",
        ];
        for input in inputs {
            std::fs::write(dir.path().join("node.pem"), input).expect("cert");
            std::fs::write(dir.path().join("node.key"), input).expect("key");
            assert!(NODE_IDENTITY.load(dir.path()).is_err());
        }
        std::fs::remove_file(dir.path().join("node.pem")).expect("rm");
        std::os::unix::fs::symlink("identity/node.pem", dir.path().join("node.pem")).expect("ln");
        let e = NODE_IDENTITY.load(dir.path()).expect_err("dangling");
        assert!(e.to_string().contains("which is missing"), "{e}");
    }
}
