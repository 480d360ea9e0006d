//! A backup target: an S3-compatible object store or a directory (a local disk, an NFS mount),
//! behind one small interface. What a cluster stores about a target is its [`TargetSpec`]; its
//! S3 credentials are never in it, only given to [`Target::open`] when a backup runs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload};

use crate::constants::*;
use crate::error::{is_out_of_space, BackupError};
use crate::health::{Health, WatchConnector};
use crate::progress::Progress;

pub use hawser_api::backup::TargetSpec;

/// An S3 access key.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "S3Credentials({}, <secret>)", self.access_key_id)
    }
}

impl S3Credentials {
    /// The key as the API carries it; None if its secret is not base64 or not UTF-8.
    pub fn from_api(key: &hawser_api::backup::S3Key) -> Option<S3Credentials> {
        let secret = String::from_utf8(key.secret_access_key.bytes()?).ok()?;
        Some(S3Credentials {
            access_key_id: key.access_key_id.clone(),
            secret_access_key: secret,
        })
    }

    pub fn to_api(&self) -> hawser_api::backup::S3Key {
        hawser_api::backup::S3Key {
            access_key_id: self.access_key_id.clone(),
            secret_access_key: hawser_api::Secret::new(self.secret_access_key.as_bytes()),
        }
    }

    /// Reads a credentials file: `key = value` lines with `access_key_id` and
    /// `secret_access_key` (or AWS's `aws_access_key_id`, `aws_secret_access_key`, so an
    /// `~/.aws/credentials` file with one profile works); `#` comments and `[section]`
    /// lines are skipped.
    pub fn parse(text: &str) -> Result<S3Credentials, BackupError> {
        let (mut id, mut secret) = (None, None);
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') || line.starts_with('[') {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                return Err(BackupError::Invalid {
                    what: format!("credentials: a line is not `key = value`: {:.20}...", line),
                });
            };
            match k.trim().trim_start_matches("aws_") {
                "access_key_id" => id = Some(v.trim().to_owned()),
                "secret_access_key" => secret = Some(v.trim().to_owned()),
                _ => {}
            }
        }
        match (id, secret) {
            (Some(a), Some(s)) if !a.is_empty() && !s.is_empty() => Ok(S3Credentials {
                access_key_id: a,
                secret_access_key: s,
            }),
            _ => Err(BackupError::Invalid {
                what: "credentials: need access_key_id and secret_access_key".into(),
            }),
        }
    }
}

/// An object as a listing gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Relative to the target.
    pub name: String,
    pub size: u64,
    /// When the target last wrote it, by the target's clock (S3's Last-Modified, a file's
    /// mtime), in ms since the Unix epoch.
    pub modified_ms: u64,
}

fn millis(m: &object_store::ObjectMeta) -> u64 {
    u64::try_from(m.last_modified.timestamp_millis()).unwrap_or(0)
}

/// An open target.
#[derive(Clone)]
pub struct Target {
    name: String,
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    /// A directory target: made durable with syncfs at the two points a backup needs it.
    dir: Option<PathBuf>,
    /// What an S3 target answered (retries, the last error answer); a directory's stays empty.
    health: Arc<Health>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Target({})", self.name)
    }
}

impl Target {
    /// Opens `spec` under the name `name` (used in every error). S3 needs credentials.
    pub fn open(
        name: &str,
        spec: &TargetSpec,
        credentials: Option<&S3Credentials>,
    ) -> Result<Target, BackupError> {
        Self::open_with(name, spec, credentials, RETRY_TIMEOUT_SECS)
    }

    /// [`Target::open`], with each request retried for `retry_secs` (at most
    /// `MAX_RETRY_TIMEOUT_SECS`) before it fails.
    pub fn open_with(
        name: &str,
        spec: &TargetSpec,
        credentials: Option<&S3Credentials>,
        retry_secs: u64,
    ) -> Result<Target, BackupError> {
        let health = Arc::new(Health::default());
        let bad = |why: String| BackupError::BadTarget {
            target: name.to_owned(),
            why,
        };
        match spec {
            TargetSpec::S3 {
                endpoint,
                bucket,
                prefix,
                region,
            } => {
                let url = endpoint.trim_end_matches('/');
                let http = url.starts_with("http://");
                if !http && !url.starts_with("https://") {
                    return Err(bad(format!("endpoint {endpoint:?} is not an http(s) URL")));
                }
                let creds = credentials.ok_or_else(|| bad("S3 needs credentials".into()))?;
                let retry = object_store::RetryConfig {
                    backoff: object_store::BackoffConfig {
                        init_backoff: Duration::from_millis(RETRY_FIRST_MS),
                        max_backoff: Duration::from_millis(RETRY_MAX_BACKOFF_MS),
                        base: 2.0,
                    },
                    max_retries: MAX_RETRIES,
                    retry_timeout: Duration::from_secs(retry_secs.min(MAX_RETRY_TIMEOUT_SECS)),
                };
                let client = object_store::ClientOptions::new()
                    .with_allow_http(http)
                    .with_timeout(Duration::from_secs(REQUEST_TIMEOUT_SECS))
                    .with_connect_timeout(Duration::from_secs(10));
                let store = object_store::aws::AmazonS3Builder::new()
                    .with_endpoint(url)
                    .with_bucket_name(bucket)
                    .with_region(region.as_deref().unwrap_or("us-east-1"))
                    .with_access_key_id(&creds.access_key_id)
                    .with_secret_access_key(&creds.secret_access_key)
                    .with_virtual_hosted_style_request(false)
                    .with_retry(retry)
                    .with_client_options(client)
                    .with_http_connector(WatchConnector(health.clone()))
                    .build()
                    .map_err(|e| bad(e.to_string()))?;
                let prefix = ObjectPath::parse(prefix.trim_matches('/'))
                    .map_err(|e| bad(format!("prefix {prefix:?}: {e}")))?;
                Ok(Target {
                    name: name.to_owned(),
                    store: Arc::new(store),
                    prefix,
                    dir: None,
                    health,
                })
            }
            TargetSpec::Dir { path } => {
                let dir = PathBuf::from(path);
                if !dir.is_absolute() {
                    return Err(bad(format!("{path:?} is not an absolute path")));
                }
                if !dir.is_dir() {
                    return Err(bad(format!("{path} is not a directory on this node")));
                }
                let store = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| bad(e.to_string()))?;
                Ok(Target {
                    name: name.to_owned(),
                    store: Arc::new(store),
                    prefix: ObjectPath::default(),
                    dir: Some(dir),
                    health,
                })
            }
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn path(&self, rel: &str) -> ObjectPath {
        let mut p = self.prefix.clone();
        for part in rel.split('/') {
            p = p.child(part);
        }
        p
    }

    /// Requests retried so far (an S3 target's; a directory is not retried).
    pub fn retries(&self) -> u64 {
        self.health.retries()
    }

    /// Shows this target's retries in `progress` as they happen.
    pub fn report_to(&self, progress: &Arc<Progress>) {
        self.health.report_to(progress);
    }

    /// The error for a failed request: a full target and a throttling one said as such
    /// (what an operator acts on differs), anything else with the store's own words.
    fn err(&self, what: String, source: object_store::Error) -> BackupError {
        let target = self.name.clone();
        if is_out_of_space(&source) {
            return BackupError::Full {
                target,
                what,
                source: Box::new(source),
            };
        }
        // Only an error after retries can come from throttling: a 404 or 403 is the store's
        // answer to this request, whatever it said to others before.
        let retried = !matches!(
            source,
            object_store::Error::NotFound { .. }
                | object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }
        );
        match self.health.last_error() {
            Some(answer) if retried && answer.is_throttling() => BackupError::Throttled {
                target,
                what,
                answer: answer.describe(),
                answers: self.health.retries(),
                source: Box::new(source),
            },
            _ => BackupError::Target {
                target,
                what,
                source,
            },
        }
    }

    /// Stores `bytes` at `rel`, replacing what is there.
    pub async fn put(&self, rel: &str, bytes: Bytes) -> Result<(), BackupError> {
        self.store
            .put(&self.path(rel), PutPayload::from_bytes(bytes))
            .await
            .map(|_| ())
            .map_err(|e| self.err(format!("store {rel}"), e))
    }

    /// The object at `rel`, or None if there is none; refused past `limit` bytes.
    pub async fn get(&self, rel: &str, limit: u64) -> Result<Option<Bytes>, BackupError> {
        let got = match self.store.get(&self.path(rel)).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.err(format!("read {rel}"), e)),
        };
        if got.meta.size > limit {
            return Err(BackupError::BadTarget {
                target: self.name.clone(),
                why: format!("{rel} is {} bytes, more than {limit}", got.meta.size),
            });
        }
        got.bytes()
            .await
            .map(Some)
            .map_err(|e| self.err(format!("read {rel}"), e))
    }

    /// The size of the object at `rel`, or None if there is none.
    pub async fn size(&self, rel: &str) -> Result<Option<u64>, BackupError> {
        match self.store.head(&self.path(rel)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(format!("look up {rel}"), e)),
        }
    }

    pub async fn delete(&self, rel: &str) -> Result<(), BackupError> {
        match self.store.delete(&self.path(rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err(format!("delete {rel}"), e)),
        }
    }

    /// Every object under `rel` (recursively), as names relative to the target.
    pub async fn list(&self, rel: &str) -> Result<Vec<String>, BackupError> {
        Ok(self
            .list_listed(rel)
            .await?
            .into_iter()
            .map(|o| o.name)
            .collect())
    }

    /// Every object under `rel` (recursively), with its size and the time the target gave
    /// it, sorted by name.
    pub async fn list_listed(&self, rel: &str) -> Result<Vec<Listed>, BackupError> {
        let under = self.path(rel);
        let metas: Vec<_> = self
            .store
            .list(Some(&under))
            .try_collect()
            .await
            .map_err(|e| self.err(format!("list {rel}"), e))?;
        let skip = self.prefix.parts().count();
        let mut out: Vec<Listed> = metas
            .into_iter()
            .map(|m| {
                let parts: Vec<String> = m
                    .location
                    .parts()
                    .skip(skip)
                    .map(|p| p.as_ref().to_owned())
                    .collect();
                Listed {
                    name: parts.join("/"),
                    size: m.size,
                    modified_ms: millis(&m),
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The time the target gave the object at `rel` when it was last written (its clock, not
    /// ours), or None if there is none.
    pub async fn modified_ms(&self, rel: &str) -> Result<Option<u64>, BackupError> {
        match self.store.head(&self.path(rel)).await {
            Ok(meta) => Ok(Some(millis(&meta))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(format!("look up {rel}"), e)),
        }
    }

    /// Makes everything stored so far durable. S3 acknowledges a PUT once it is durable; a
    /// directory's files are synced with syncfs, so a manifest is never durable before the
    /// blocks it names.
    pub async fn barrier(&self) -> Result<(), BackupError> {
        let Some(dir) = self.dir.clone() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || {
            let f = std::fs::File::open(&dir).map_err(|e| BackupError::io("open", &dir, e))?;
            use std::os::fd::AsRawFd;
            // SAFETY: syncfs takes a file descriptor that `f` owns for the whole call.
            if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
                return Err(BackupError::io(
                    "syncfs",
                    &dir,
                    std::io::Error::last_os_error(),
                ));
            }
            Ok(())
        })
        .await
        .map_err(|e| BackupError::Invalid {
            what: format!("syncfs task: {e}"),
        })?
    }

    /// The connection check of `hawser backup target add`: writes a probe object, reads it
    /// back, deletes it, and leaves the format marker. Fails with what the target said.
    pub async fn check(&self) -> Result<(), BackupError> {
        let probe = format!("hawser-check-{}", std::process::id());
        let body = Bytes::from(format!("hawser backup target check {probe}\n"));
        self.put(&probe, body.clone()).await?;
        let back = self.get(&probe, 4096).await?;
        self.delete(&probe).await?;
        if back.as_ref() != Some(&body) {
            return Err(BackupError::BadTarget {
                target: self.name.clone(),
                why: "an object written was not read back the same".into(),
            });
        }
        let marker = format!("{{\"format\": {}}}\n", crate::manifest::FORMAT);
        self.put(crate::names::MARKER, Bytes::from(marker)).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn credentials_files_in_either_spelling() {
        let aws = "[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n";
        let c = S3Credentials::parse(aws).unwrap();
        assert_eq!(
            (c.access_key_id.as_str(), c.secret_access_key.as_str()),
            ("AK", "SK")
        );
        let plain = "# hawser\naccess_key_id=AK\nsecret_access_key=SK";
        assert_eq!(S3Credentials::parse(plain).unwrap(), c);
        assert!(!format!("{c:?}").contains("SK"));
        for bad in [
            "",
            "access_key_id=AK",
            "junk",
            "access_key_id=\nsecret_access_key=x",
        ] {
            assert!(S3Credentials::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bad_specs_say_why() {
        let s3 = |endpoint: &str| TargetSpec::S3 {
            endpoint: endpoint.into(),
            bucket: "b".into(),
            prefix: String::new(),
            region: None,
        };
        let creds = S3Credentials {
            access_key_id: "a".into(),
            secret_access_key: "s".into(),
        };
        let e = Target::open("t", &s3("ftp://x"), Some(&creds))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an http(s) URL"), "{e}");
        let e = Target::open("t", &s3("http://x"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs credentials"), "{e}");
        let dir = |p: &str| TargetSpec::Dir { path: p.into() };
        let e = Target::open("t", &dir("rel"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an absolute path"), "{e}");
        let e = Target::open("t", &dir("/no/such/dir"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a directory"), "{e}");
    }
}
