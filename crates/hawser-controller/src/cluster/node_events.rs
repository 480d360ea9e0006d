//! Nodes' comings and goings as cluster events (`NodeSilent`, `NodeBack`, `NodeJoined`), seen
//! by the leader as it looks at the nodes' heartbeats; `events.rs` keeps and posts them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::state::AppState;
use crate::store::leader::Role;

/// Nodes' comings and goings as events: a node that stops heartbeating for longer than the
/// controller's node timeout (`NodeSilent`), and one that heartbeats again (`NodeBack`).
/// Looked at by the leader every [`NODE_WATCH_EVERY`]; what it saw first is not an event.
pub async fn watch_nodes(st: Arc<AppState>) {
    let mut tick = tokio::time::interval(NODE_WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen: Option<HashMap<String, bool>> = None;
    loop {
        tick.tick().await;
        if matches!(st.leadership.role(), Role::Follower { .. }) {
            seen = None;
            continue;
        }
        let Ok(nodes) = st.records.nodes().await else {
            continue;
        };
        let now: HashMap<String, bool> = nodes
            .iter()
            .map(|n| (n.name.clone(), st.is_online(n)))
            .collect();
        if let Some(before) = &seen {
            for (node, ev) in node_changes(before, &now) {
                tracing::info!(%node, reason = ev.0, "{}", ev.2);
                st.events.keep(None, Some(&node), ev.1, ev.0, &ev.2);
            }
        }
        seen = Some(now);
    }
}

/// How often the leader looks for nodes gone silent or back.
pub const NODE_WATCH_EVERY: Duration = Duration::from_secs(1);

/// The events between two looks at the nodes: (node, (reason, warning, message)).
fn node_changes(
    before: &HashMap<String, bool>,
    now: &HashMap<String, bool>,
) -> Vec<(String, (&'static str, bool, String))> {
    let mut out: Vec<_> = now
        .iter()
        .filter_map(|(node, &online)| match (before.get(node), online) {
            (Some(true), false) => Some((
                node.clone(),
                (
                    "NodeSilent",
                    true,
                    format!("node {node} stopped heartbeating"),
                ),
            )),
            (Some(false), true) => Some((
                node.clone(),
                ("NodeBack", false, format!("node {node} heartbeats again")),
            )),
            (None, true) => Some((
                node.clone(),
                ("NodeJoined", false, format!("node {node} registered")),
            )),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_changes_are_transitions_only() {
        let m = |v: &[(&str, bool)]| -> HashMap<String, bool> {
            v.iter().map(|(n, o)| (n.to_string(), *o)).collect()
        };
        let before = m(&[("a", true), ("b", false), ("c", true)]);
        let now = m(&[
            ("a", false),
            ("b", true),
            ("c", true),
            ("d", true),
            ("e", false),
        ]);
        let got: Vec<(String, &str)> = node_changes(&before, &now)
            .into_iter()
            .map(|(n, (r, _, _))| (n, r))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".to_string(), "NodeSilent"),
                ("b".to_string(), "NodeBack"),
                ("d".to_string(), "NodeJoined"),
            ]
        );
        assert!(node_changes(&now, &now).is_empty());
    }
}
