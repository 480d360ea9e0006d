//! The KEKs of controllers that share no disk (Kubernetes, where a controller pod's data
//! directory goes with the pod): one Secret holds them all, an item `kek-<n>` per key (its 32
//! bytes in base64), and each controller's `volume-keys` files are a copy of it.
//!
//! The Secret is the truth and only grows by compare-and-swap on its resourceVersion: a KEK is
//! copied to the files after the Secret holds it, never made in the files alone. A KEK found
//! in the files but not in the Secret (a controller that ran with files before, or a Secret
//! deleted by mistake while a controller still holds copies) is put back into the Secret at
//! the next start, rotation or first key; one that differs between the two stops everything
//! with an error naming both, since data keys wrapped with the other would no longer open.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use base64::Engine as _;

use super::{new_kek, Keks, KeyError, KEK_BYTES};
use crate::ha::kube::Kube;

/// Compare-and-swap attempts before giving up on a Secret others keep changing.
const ATTEMPTS: usize = 8;

/// Where the KEKs live: Secret `namespace/name`.
pub struct KekSecret {
    pub kube: Arc<Kube>,
    pub namespace: String,
    pub name: String,
}

/// What a change of the Secret is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Goal {
    /// Put back the KEKs only the files hold.
    Sync,
    /// That and, if there is no KEK at all, make the first.
    Ready,
    /// That and make the next KEK.
    Rotate,
}

/// The Secret as read: its items, the KEK ids among them, and its resourceVersion (`None`:
/// there is no Secret).
struct Pulled {
    data: HashMap<String, String>,
    ids: BTreeSet<u32>,
    version: Option<String>,
}

fn item(id: u32) -> String {
    format!("kek-{id}")
}

impl KekSecret {
    fn shown(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub(super) fn error(&self, message: impl Into<String>) -> KeyError {
        KeyError::Secret {
            secret: self.shown(),
            message: message.into(),
        }
    }

    /// Copies the Secret's KEKs into `keks`' files, refusing one that differs from its file.
    async fn pull(&self, keks: &Keks) -> Result<Pulled, KeyError> {
        let got = self
            .kube
            .secret_versioned(&self.namespace, &self.name)
            .await
            .map_err(|e| self.error(e.to_string()))?;
        let Some((data, version)) = got else {
            return Ok(Pulled {
                data: HashMap::new(),
                ids: BTreeSet::new(),
                version: None,
            });
        };
        let mut ids = BTreeSet::new();
        for (name, value) in &data {
            let Some(id) = name
                .strip_prefix("kek-")
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let key = base64::engine::general_purpose::STANDARD
                .decode(value.trim())
                .ok()
                .filter(|k| k.len() == KEK_BYTES)
                .ok_or_else(|| self.error(format!("{name} is not {KEK_BYTES} bytes of base64")))?;
            self.keep(keks, id, &key)?;
            ids.insert(id);
        }
        Ok(Pulled {
            data,
            ids,
            version: Some(version),
        })
    }

    /// Writes KEK `id` to its file, or checks the file there holds it.
    fn keep(&self, keks: &Keks, id: u32, key: &[u8]) -> Result<(), KeyError> {
        if keks.store(id, key)? {
            return Ok(());
        }
        let path = keks.path(id);
        let held = std::fs::read(&path).map_err(|source| KeyError::Io {
            path: path.clone(),
            source,
        })?;
        if held != key {
            return Err(KeyError::Conflict {
                kek: id,
                path,
                secret: self.shown(),
            });
        }
        Ok(())
    }

    /// Copies the Secret in (see [`Keks::fetch`]).
    pub(super) async fn fetch(&self, keks: &Keks) -> Result<(), KeyError> {
        self.pull(keks).await.map(|_| ())
    }

    /// Brings the Secret and the files to hold the same KEKs and does `goal`; returns the
    /// newest KEK's id (`None`: there is none, after a `Sync`).
    pub(super) async fn change(&self, keks: &Keks, goal: Goal) -> Result<Option<u32>, KeyError> {
        for _ in 0..ATTEMPTS {
            let pulled = self.pull(keks).await?;
            let local: BTreeSet<u32> = keks.ids()?.into_iter().collect();
            let only_here: Vec<u32> = local.difference(&pulled.ids).copied().collect();
            let newest = local.last().copied();
            let next = match goal {
                Goal::Sync => None,
                Goal::Ready if newest.is_some() => None,
                Goal::Ready | Goal::Rotate => Some(newest.map_or(1, |id| id + 1)),
            };
            if only_here.is_empty() && next.is_none() {
                return Ok(newest);
            }
            let mut data = pulled.data.clone();
            for id in &only_here {
                let path = keks.path(*id);
                let key = std::fs::read(&path).map_err(|source| KeyError::Io { path, source })?;
                data.insert(
                    item(*id),
                    base64::engine::general_purpose::STANDARD.encode(key),
                );
                tracing::warn!(kek = id, secret = %self.shown(), "a key-encryption key was only in this controller's files; putting it back into the Secret");
            }
            let made = match next {
                Some(id) => {
                    let key = new_kek()?;
                    data.insert(
                        item(id),
                        base64::engine::general_purpose::STANDARD.encode(key),
                    );
                    Some((id, key))
                }
                None => None,
            };
            let items: Vec<(&str, &str)> =
                data.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let written = match &pulled.version {
                None => {
                    self.kube
                        .create_secret(&self.namespace, &self.name, &items)
                        .await
                }
                Some(v) => {
                    self.kube
                        .replace_secret(&self.namespace, &self.name, &items, v)
                        .await
                }
            }
            .map_err(|e| self.error(e.to_string()))?;
            if !written {
                continue; // another controller changed it first: read theirs and go again
            }
            return match made {
                Some((id, key)) => {
                    self.keep(keks, id, &key)?;
                    tracing::info!(kek = id, secret = %self.shown(), "made a key-encryption key");
                    Ok(Some(id))
                }
                None => Ok(newest),
            };
        }
        Err(self.error(format!(
            "it changed under each of {ATTEMPTS} attempts to update it; retry"
        )))
    }
}
