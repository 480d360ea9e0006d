//! The nodes a controller refused because their replicas name another cluster (`cluster`):
//! what `hawser cluster show` lists and `hawser cluster recover` adopts.

use std::collections::BTreeMap;
use std::sync::Mutex;

use hawser_api::controller::WaitingNode;

/// Nodes refused because their replicas name another cluster, by node name. In memory: a
/// refused agent asks again every heartbeat.
#[derive(Default)]
pub struct Waiting(Mutex<BTreeMap<String, WaitingNode>>);

impl Waiting {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, WaitingNode>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn add(&self, w: WaitingNode) {
        let mut map = self.map();
        if !map.contains_key(&w.node) {
            tracing::error!(
                node = %w.node, node_cluster = %w.cluster_id,
                "refused a node of another cluster; nothing of it is touched. If this \
                 controller's store was wiped or restored, run `hawser cluster recover`"
            );
        }
        map.insert(w.node.clone(), w);
    }

    pub fn remove(&self, node: &str) {
        self.map().remove(node);
    }

    pub fn list(&self) -> Vec<WaitingNode> {
        self.map().values().cloned().collect()
    }

    pub(crate) fn clear(&self) {
        self.map().clear();
    }
}
