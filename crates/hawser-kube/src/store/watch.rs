//! Watches: one API server watch per kind the prefix can hold, from the revision asked for,
//! filtered to the prefix and fed into one channel.
//!
//! A watch ends after the server's `timeoutSeconds` or when the server drops it; as the
//! [`Watch`] contract says, the caller then re-reads and watches again. `410 Gone` (the API
//! server's watch cache no longer has the revision asked for) is [`StoreError::Compacted`].

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

use super::objects;
use super::Inner;
use crate::api::{ApiError, RawEvent, WatchStream};
use hawser_store::{Result, StoreError, Versioned, Watch, WatchEvent};

/// Events a watcher may fall behind by before its stream blocks.
const BACKLOG: usize = 4096;
/// The server ends a watch after this long; the caller watches again.
const WATCH_SECONDS: u32 = 600;

pub async fn start(s: &Arc<Inner>, prefix: &str, after: u64) -> Result<Watch> {
    let (tx, rx) = mpsc::channel(BACKLOG);
    let mut streams = Vec::new();
    // Open every stream before returning, so a change made after `watch` returns is seen.
    for kind in objects::kinds_for_prefix(prefix) {
        let path = format!(
            "{}?watch=1&resourceVersion={}&allowWatchBookmarks=false&timeoutSeconds={WATCH_SECONDS}",
            objects::path(&s.namespace, kind, None),
            // "0" would mean "any state, replayed as adds"; 1 asks for all history, which
            // the server no longer has (410, Compacted).
            after.max(1),
        );
        let stream = match s.api.watch(&path).await {
            Ok(st) => st,
            Err(ApiError::Gone(_)) => {
                return Err(StoreError::Compacted {
                    prefix: prefix.into(),
                    after,
                    oldest: 0,
                })
            }
            Err(e) => return Err(s.unavailable("watch", prefix, e)),
        };
        streams.push(stream);
    }
    let feeders: Vec<_> = streams
        .into_iter()
        .map(|st| {
            let f = Feeder {
                name: s.name.clone(),
                prefix: prefix.to_string(),
                after,
                tx: tx.clone(),
            };
            tokio::spawn(f.run(st))
        })
        .collect();
    drop(tx);
    // One handle that stops every feeder when the Watch is dropped.
    let guard = tokio::spawn(async move {
        let _abort_all = AbortAll(feeders.iter().map(|f| f.abort_handle()).collect());
        for f in feeders {
            let _ = f.await;
        }
    });
    Ok(Watch::new(rx, Some(guard.abort_handle())))
}

struct AbortAll(Vec<tokio::task::AbortHandle>);

impl Drop for AbortAll {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

struct Feeder {
    name: String,
    prefix: String,
    after: u64,
    tx: mpsc::Sender<Result<WatchEvent>>,
}

impl Feeder {
    async fn run(self, mut stream: WatchStream) {
        loop {
            let ev = match stream.next().await {
                Ok(Some(ev)) => ev,
                Ok(None) => return,
                Err(e) => {
                    let _ = self.tx.send(Err(self.error(e.to_string()))).await;
                    return;
                }
            };
            let out = match ev {
                RawEvent::Bookmark => continue,
                RawEvent::Error(410, msg) => {
                    let _ = msg;
                    Err(StoreError::Compacted {
                        prefix: self.prefix.clone(),
                        after: self.after,
                        oldest: 0,
                    })
                }
                RawEvent::Error(code, msg) => Err(self.error(format!("HTTP {code}: {msg}"))),
                RawEvent::Added(o) | RawEvent::Modified(o) => self.put(&o),
                RawEvent::Deleted(o) => self.delete(&o),
            };
            let end = out.is_err();
            match out {
                Ok(Some(ev)) => {
                    if self.tx.send(Ok(ev)).await.is_err() {
                        return;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    let _ = self.tx.send(Err(e)).await;
                }
            }
            if end {
                return;
            }
        }
    }

    fn error(&self, reason: String) -> StoreError {
        StoreError::Unavailable {
            endpoint: self.name.clone(),
            op: "watch",
            key: self.prefix.clone(),
            reason,
        }
    }

    /// The event, or `None` if its key is outside the prefix.
    fn put(&self, obj: &Value) -> Result<Option<WatchEvent>> {
        let (key, value, version) = objects::decode(obj).map_err(|e| self.error(e.to_string()))?;
        Ok(key.starts_with(&self.prefix).then_some(WatchEvent::Put {
            key,
            value: Versioned { value, version },
        }))
    }

    fn delete(&self, obj: &Value) -> Result<Option<WatchEvent>> {
        // The deleted object carries the revision of its deletion.
        let (key, _, revision) = objects::decode(obj).map_err(|e| self.error(e.to_string()))?;
        Ok(key
            .starts_with(&self.prefix)
            .then_some(WatchEvent::Delete { key, revision }))
    }
}
