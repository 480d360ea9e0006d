//! Shared fixtures for engine tests without the control plane: a temporary directory removed
//! on drop, and one node's storage with a replica `vol-<node>` of volume `vol`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hawser_agent::agent::parse_pool;
use hawser_agent::node_storage::NodeStorage;
use hawser_storage::{NewReplica, Pool};

pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh directory under the system's temp dir, named by `label` and the process id.
    pub fn new(label: &str) -> TempDir {
        TempDir(std::env::temp_dir().join(format!("hawser-{label}-{}", std::process::id())))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Node `name`'s storage (one pool under `dir`) holding a thin replica `vol-<name>` of `size`.
pub fn node(dir: &Path, name: &str, size: u64) -> Arc<NodeStorage> {
    let cfg = parse_pool(&format!("default={}", dir.join(name).display())).expect("pool spec");
    let pool = Pool::open(cfg).expect("open pool");
    let s = Arc::new(NodeStorage::new(name.into(), vec![pool]));
    let new = NewReplica {
        id: format!("vol-{name}"),
        volume: "vol".into(),
        size,
        thin: true,
        cluster: None,
    };
    s.create("default", &new).expect("create replica");
    s
}

/// Node `name`'s storage under `dir` opened again as after a reboot of the node: boot id
/// `boot`.
#[allow(dead_code)] // not every test binary reboots a node
pub fn reopen(dir: &Path, name: &str, boot: u64) -> Arc<NodeStorage> {
    let mut cfg = parse_pool(&format!("default={}", dir.join(name).display())).expect("pool spec");
    cfg.boot_id = boot;
    let pool = Pool::open(cfg).expect("open pool");
    Arc::new(NodeStorage::new(name.into(), vec![pool]))
}
