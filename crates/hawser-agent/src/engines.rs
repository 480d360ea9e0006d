//! The volume engines running on this node, which are also its NBD exports.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hawser_api::agent::EngineStatus;

use crate::block::{BlockDevice, ExportRegistry};
use crate::volume_engine::VolumeEngine;

#[derive(Default)]
pub struct Engines {
    map: Mutex<HashMap<String, Arc<VolumeEngine>>>,
}

impl Engines {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<VolumeEngine>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, volume: &str) -> Option<Arc<VolumeEngine>> {
        self.lock().get(volume).cloned()
    }

    /// Install an engine; returns the one it replaces (to be stopped by the caller).
    pub fn insert(&self, volume: &str, e: Arc<VolumeEngine>) -> Option<Arc<VolumeEngine>> {
        self.lock().insert(volume.to_owned(), e)
    }

    pub fn remove(&self, volume: &str) -> Option<Arc<VolumeEngine>> {
        self.lock().remove(volume)
    }

    pub fn all(&self) -> Vec<Arc<VolumeEngine>> {
        self.lock().values().cloned().collect()
    }

    pub fn statuses(&self) -> Vec<EngineStatus> {
        let mut v: Vec<EngineStatus> = self.all().iter().map(|e| e.status()).collect();
        v.sort_by(|a, b| a.volume.cmp(&b.volume));
        v
    }
}

impl ExportRegistry for Engines {
    fn lookup(&self, name: &str) -> Option<Arc<dyn BlockDevice>> {
        self.get(name)
            .filter(|e| !e.is_fenced())
            .map(|e| e as Arc<dyn BlockDevice>)
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.lock().keys().cloned().collect();
        names.sort();
        names
    }
}
