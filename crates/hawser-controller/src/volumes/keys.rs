//! Encrypted volumes' data keys, wrapped (issue 21, encryption at rest).
//!
//! Each encrypted volume has a 64-byte data key (XTS-AES-256, `hawser-agent`
//! `volume_crypt.rs`), made from the OS CSPRNG when the volume is created. The volume record
//! keeps it only wrapped: AES-256-GCM under the cluster's key-encryption key (KEK), with the
//! volume's name and the KEK's id as associated data, so a wrapped key moved to another
//! record, or opened with another KEK, fails its tag instead of yielding a wrong key. The
//! engine's node gets the unwrapped key in its start request, over TLS, and keeps it in memory.
//!
//! KEKs are files in the controller's data directory (`volume-keys/kek-<n>.key`, 32 bytes,
//! mode 0600), like the CA: not in the store, so a store backup alone opens no volume.
//! Controllers that share a store are given the same files. On Kubernetes (the CA in a
//! Secret, `--ca-secret`), where a controller pod's data directory does not outlive it, the
//! KEKs live in a Secret beside the CA's and the files are only its copy (`shared.rs`).
//! Rotation makes `kek-<n+1>` and re-wraps every data key under it; data is never
//! re-encrypted, and an old KEK can go once no record names it.

mod shared;

use shared::Goal;
pub use shared::KekSecret;

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

/// A volume data key's length (two AES-256 keys).
pub const DATA_KEY_BYTES: usize = 64;
const KEK_BYTES: usize = 32;
const DIR: &str = "volume-keys";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("volume key file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("volume key file {path} holds {len} bytes, not {KEK_BYTES}")]
    BadKek { path: PathBuf, len: usize },
    #[error(
        "volume {volume}'s data key is wrapped with key-encryption key {kek}, which this \
         controller does not have ({dir}): give it the same volume-keys files as the others"
    )]
    MissingKek {
        volume: String,
        kek: u32,
        dir: PathBuf,
    },
    #[error(
        "volume {volume}'s data key does not open with key-encryption key {kek}: the key file \
         is not the one it was wrapped with, or the record was altered"
    )]
    WrongKek { volume: String, kek: u32 },
    #[error(
        "volume {volume}'s data key opens but does not match the key check in its record: \
         the record was altered"
    )]
    CheckMismatch { volume: String },
    #[error("the OS random source failed")]
    Random,
    #[error("the key-encryption keys in Secret {secret}: {message}")]
    Secret { secret: String, message: String },
    #[error(
        "key-encryption key {kek} in {path} is not the one in Secret {secret}: one of them was \
         replaced; data keys wrapped with the other do not open"
    )]
    Conflict {
        kek: u32,
        path: PathBuf,
        secret: String,
    },
}

/// A data key as a volume record keeps it, and as its replicas keep a copy.
pub use hawser_api::WrappedKey;

/// The KEKs in a controller's data directory, a copy of a Secret's when `shared`.
pub struct Keks {
    dir: PathBuf,
    shared: Option<KekSecret>,
}

impl Keks {
    pub fn new(data_dir: &Path) -> Keks {
        Keks {
            dir: data_dir.join(DIR),
            shared: None,
        }
    }

    /// KEKs kept in `secret`, copied into `data_dir` as they are needed.
    pub fn with_secret(data_dir: &Path, secret: KekSecret) -> Keks {
        Keks {
            dir: data_dir.join(DIR),
            shared: Some(secret),
        }
    }

    /// The current KEK's id, made if there is none (in the Secret first, when shared). Call
    /// before wrapping a new key.
    pub async fn ready(&self) -> Result<u32, KeyError> {
        match &self.shared {
            Some(s) => self.made(s, Goal::Ready).await,
            None => self.current(),
        }
    }

    /// When shared: copies the Secret's KEKs here and puts back into it any only here (a
    /// controller's start). Makes none.
    pub async fn sync(&self) -> Result<(), KeyError> {
        match &self.shared {
            Some(s) => s.change(self, Goal::Sync).await.map(|_| ()),
            None => Ok(()),
        }
    }

    async fn made(&self, s: &KekSecret, goal: Goal) -> Result<u32, KeyError> {
        s.change(self, goal)
            .await?
            .ok_or_else(|| s.error("no key-encryption key after making one"))
    }

    /// Makes the next KEK (a rotation); returns its id.
    pub async fn rotate(&self) -> Result<u32, KeyError> {
        match &self.shared {
            Some(s) => self.made(s, Goal::Rotate).await,
            None => self.rotate_local(),
        }
    }

    /// Makes sure KEK `kek` is here if it exists at all (copied from the Secret, when shared
    /// and not copied yet). Call before unwrapping with it.
    pub async fn fetch(&self, kek: u32) -> Result<(), KeyError> {
        match &self.shared {
            Some(s) if !self.path(kek).exists() => s.fetch(self).await,
            _ => Ok(()),
        }
    }

    fn path(&self, id: u32) -> PathBuf {
        self.dir.join(format!("kek-{id}.key"))
    }

    /// The ids of the KEKs present, ascending.
    pub fn ids(&self) -> Result<Vec<u32>, KeyError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(KeyError::Io {
                    path: self.dir.clone(),
                    source,
                })
            }
        };
        let mut ids: Vec<u32> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_prefix("kek-")?
                    .strip_suffix(".key")?
                    .parse()
                    .ok()
            })
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// The newest KEK's id, made (id 1) if there is none and the KEKs are not shared (a
    /// shared one is made by [`Keks::ready`]).
    pub fn current(&self) -> Result<u32, KeyError> {
        match (self.ids()?.last(), &self.shared) {
            (Some(id), _) => Ok(*id),
            (None, None) => self.make(1),
            (None, Some(s)) => Err(s.error("no key-encryption key copied here yet")),
        }
    }

    /// Makes the next KEK file; returns its id.
    fn rotate_local(&self) -> Result<u32, KeyError> {
        let next = self.ids()?.last().map_or(1, |id| id + 1);
        self.make(next)
    }

    fn make(&self, id: u32) -> Result<u32, KeyError> {
        let key = new_kek()?;
        // Two controllers racing to make the same KEK never overwrite one that may already
        // wrap a data key; the loser reads the winner's.
        self.store(id, &key)?;
        Ok(id)
    }

    /// Writes KEK `id` unless a file of it exists (create_new, 0600, synced); `false` if one
    /// did (whatever it holds).
    fn store(&self, id: u32, key: &[u8]) -> Result<bool, KeyError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| KeyError::Io { path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let path = self.path(id);
        let made = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path);
        match made {
            Ok(mut f) => {
                f.write_all(key)
                    .and_then(|_| f.sync_all())
                    .map_err(io(&path))?;
                std::fs::File::open(&self.dir)
                    .and_then(|d| d.sync_all())
                    .map_err(io(&self.dir))?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io(&path)(e)),
        }
    }

    fn key(&self, id: u32, volume: &str) -> Result<LessSafeKey, KeyError> {
        let path = self.path(id);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(KeyError::MissingKek {
                    volume: volume.into(),
                    kek: id,
                    dir: self.dir.clone(),
                })
            }
            Err(source) => return Err(KeyError::Io { path, source }),
        };
        let unbound = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| KeyError::BadKek {
            path,
            len: bytes.len(),
        })?;
        Ok(LessSafeKey::new(unbound))
    }

    /// A new data key for `volume`, and its wrapping under the current KEK.
    pub fn new_data_key(&self, volume: &str) -> Result<(Vec<u8>, WrappedKey), KeyError> {
        let mut key = vec![0u8; DATA_KEY_BYTES];
        let rng = SystemRandom::new();
        // XTS needs two different halves; equal ones from a working CSPRNG never happen, but
        // a key the engine would refuse must not be recorded.
        while key[..DATA_KEY_BYTES / 2] == key[DATA_KEY_BYTES / 2..] {
            rng.fill(&mut key).map_err(|_| KeyError::Random)?;
        }
        let wrapped = self.wrap(volume, &key)?;
        Ok((key, wrapped))
    }

    /// Wraps `key` for `volume` under the current KEK.
    pub fn wrap(&self, volume: &str, key: &[u8]) -> Result<WrappedKey, KeyError> {
        use base64::Engine as _;
        let kek = self.current()?;
        let sealing = self.key(kek, volume)?;
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| KeyError::Random)?;
        let mut sealed = key.to_vec();
        sealing
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(volume, kek)),
                &mut sealed,
            )
            .map_err(|_| KeyError::Random)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(WrappedKey {
            kek,
            wrapped: base64::engine::general_purpose::STANDARD.encode(out),
            check: hawser_api::KeyCheck::of(key),
        })
    }

    /// `volume`'s data key, from its wrapping.
    pub fn unwrap(&self, volume: &str, w: &WrappedKey) -> Result<Vec<u8>, KeyError> {
        use base64::Engine as _;
        let wrong = || KeyError::WrongKek {
            volume: volume.into(),
            kek: w.kek,
        };
        let opening = self.key(w.kek, volume)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&w.wrapped)
            .map_err(|_| wrong())?;
        if bytes.len() < NONCE_LEN {
            return Err(wrong());
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| wrong())?;
        let mut sealed = sealed.to_vec();
        let key = opening
            .open_in_place(nonce, Aad::from(aad(volume, w.kek)), &mut sealed)
            .map_err(|_| wrong())?;
        if key.len() != DATA_KEY_BYTES {
            return Err(wrong());
        }
        if hawser_api::KeyCheck::of(key) != w.check {
            // The tag held, so the record's key check was altered, or written by a bug:
            // refuse rather than let replicas refuse an engine one by one.
            return Err(KeyError::CheckMismatch {
                volume: volume.into(),
            });
        }
        Ok(key.to_vec())
    }

    /// `w` re-wrapped under the current KEK (a rotation; the data key stays).
    pub fn rewrap(&self, volume: &str, w: &WrappedKey) -> Result<WrappedKey, KeyError> {
        let key = self.unwrap(volume, w)?;
        self.wrap(volume, &key)
    }
}

/// A new random KEK.
fn new_kek() -> Result<[u8; KEK_BYTES], KeyError> {
    let mut key = [0u8; KEK_BYTES];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| KeyError::Random)?;
    Ok(key)
}

/// What a wrapping is bound to: the volume and the KEK.
fn aad(volume: &str, kek: u32) -> Vec<u8> {
    let mut a = b"hawser volume data key v1\0".to_vec();
    a.extend_from_slice(&kek.to_le_bytes());
    a.extend_from_slice(volume.as_bytes());
    a
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_data_key_unwraps_for_its_volume_and_survives_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let keks = Keks::new(dir.path());
        let (key, w) = keks.new_data_key("v").unwrap();
        assert_eq!(w.kek, 1);
        assert_eq!(key.len(), DATA_KEY_BYTES);
        assert_eq!(keks.unwrap("v", &w).unwrap(), key);
        // Another volume's record, or an altered one, does not open.
        assert!(matches!(
            keks.unwrap("other", &w),
            Err(KeyError::WrongKek { .. })
        ));
        let mut bad = w.clone();
        bad.wrapped.replace_range(20..24, "AAAA");
        assert!(matches!(
            keks.unwrap("v", &bad),
            Err(KeyError::WrongKek { .. })
        ));
        // Rotation: a new KEK, the same data key; the old wrapping still opens until its KEK
        // goes, then says which KEK is missing.
        assert_eq!(keks.rotate_local().unwrap(), 2);
        let w2 = keks.rewrap("v", &w).unwrap();
        assert_eq!(w2.kek, 2);
        assert_eq!(w2.check, w.check, "the replicas' key check stays");
        assert_eq!(w.check, hawser_api::KeyCheck::of(&key));
        assert_eq!(keks.unwrap("v", &w2).unwrap(), key);
        assert_eq!(keks.unwrap("v", &w).unwrap(), key);
        std::fs::remove_file(dir.path().join("volume-keys/kek-1.key")).unwrap();
        let e = keks.unwrap("v", &w).unwrap_err().to_string();
        assert!(e.contains("does not have"), "{e}");
        assert_eq!(keks.unwrap("v", &w2).unwrap(), key);
    }

    #[test]
    fn a_replaced_key_file_fails_clearly_and_key_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let keks = Keks::new(dir.path());
        let (_, w) = keks.new_data_key("v").unwrap();
        let path = dir.path().join("volume-keys/kek-1.key");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let original = std::fs::read(&path).unwrap();
        std::fs::write(&path, [9u8; 32]).unwrap();
        let e = keks.unwrap("v", &w).unwrap_err().to_string();
        assert!(e.contains("does not open with key-encryption key 1"), "{e}");
        std::fs::write(&path, [9u8; 5]).unwrap();
        assert!(matches!(
            keks.unwrap("v", &w),
            Err(KeyError::BadKek { len: 5, .. })
        ));
        // A record whose key check was altered is refused though its key opens.
        std::fs::write(&path, &original).unwrap();
        let altered = WrappedKey {
            check: hawser_api::KeyCheck([0; 16]),
            ..w.clone()
        };
        assert!(matches!(
            keks.unwrap("v", &altered),
            Err(KeyError::CheckMismatch { .. })
        ));
        // Garbage in a record is a wrong key, never a panic.
        let junk = WrappedKey {
            kek: 1,
            wrapped: "!!".into(),
            check: w.check,
        };
        std::fs::write(&path, [9u8; 32]).unwrap();
        assert!(keks.unwrap("v", &junk).is_err());
    }
}
