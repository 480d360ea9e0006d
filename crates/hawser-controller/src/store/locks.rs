//! Per-volume async mutexes: one operation (create, attach, detach, delete) per volume at a
//! time. Compare-and-swap on the record already keeps the state consistent; the lock keeps
//! two operations from both calling agents for the same volume at once.
//!
//! Outdate deliberately does not take it: an engine may report a lost replica while a detach
//! is waiting for that very engine to flush, and waiting here would deadlock the two.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

#[derive(Default)]
pub struct KeyedLocks {
    map: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl KeyedLocks {
    pub async fn lock(&self, key: &str) -> OwnedMutexGuard<()> {
        let m = {
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            // An entry only the map refers to is neither held nor awaited: drop it so the
            // map does not grow with every volume name ever used.
            map.retain(|_, m| Arc::strong_count(m) > 1);
            map.entry(key.to_string()).or_default().clone()
        };
        m.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn same_key_excludes_other_keys_do_not() {
        let locks = KeyedLocks::default();
        let a = locks.lock("a").await;
        let _b = locks.lock("b").await;
        let m = locks.map.lock().unwrap_or_else(|e| e.into_inner())["a"].clone();
        assert!(m.try_lock().is_err(), "a is held");
        drop(a);
        assert!(m.try_lock().is_ok());
    }
}
