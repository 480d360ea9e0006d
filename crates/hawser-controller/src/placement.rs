//! Placement: which pools on which nodes get a new volume's replicas. Pure functions over
//! the nodes' reported pools, so every rule is unit-tested without a cluster.
//!
//! Rules: one replica per node (a node failure must never take two copies), only online
//! nodes, only pools where [`PoolInfo::fits`]; among those, the node whose best pool has the
//! most headroom first, which spreads volumes over the cluster.

use hawser_api::controller::PoolInfo;
use hawser_api::format_size;

/// A node as placement sees it.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub node: String,
    pub online: bool,
    pub pools: Vec<PoolInfo>,
}

/// One chosen replica location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub node: String,
    pub pool: String,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error(
        "need {need} nodes with room for a {} {} replica, found {}: {}",
        format_size(*size_bytes),
        if *thin { "thin" } else { "thick" },
        usable.len(),
        describe(usable, unusable)
    )]
    InsufficientCapacity {
        need: usize,
        size_bytes: u64,
        thin: bool,
        /// Nodes that could take a replica, with their best pool's headroom.
        usable: Vec<String>,
        /// Nodes that could not, with the reason.
        unusable: Vec<String>,
    },
}

fn describe(usable: &[String], unusable: &[String]) -> String {
    let mut s = if usable.is_empty() {
        "none".to_string()
    } else {
        usable.join(", ")
    };
    if !unusable.is_empty() {
        s.push_str("; not usable: ");
        s.push_str(&unusable.join(", "));
    }
    s
}

/// Room left in `pool` for new replicas: the overprovision headroom for thin replicas, the
/// free bytes for thick ones.
pub fn headroom(pool: &PoolInfo, thin: bool) -> u64 {
    if thin {
        let limit = pool.capacity_bytes as f64 * pool.overprovision_ratio;
        let left = (limit - pool.provisioned_bytes as f64).max(0.0);
        // Float-to-int `as` saturates; `left` is non-negative, so this is a clamp.
        #[allow(clippy::cast_possible_truncation)]
        let left = left as u64;
        left
    } else {
        pool.free_bytes
    }
}

fn room_text(pool: &PoolInfo, thin: bool) -> String {
    let what = if thin { "headroom" } else { "free" };
    format!(
        "pool {}: {} {what}",
        pool.name,
        format_size(headroom(pool, thin))
    )
}

/// Chooses `count` pools on `count` distinct online nodes for replicas of `size_bytes`.
/// Deterministic: ties are broken by node and pool name.
pub fn place(
    candidates: &[Candidate],
    size_bytes: u64,
    thin: bool,
    count: usize,
) -> Result<Vec<Placement>, PlacementError> {
    let mut usable: Vec<(u64, &str, &PoolInfo)> = Vec::new();
    let mut unusable = Vec::new();
    let mut sorted: Vec<&Candidate> = candidates.iter().collect();
    sorted.sort_by(|a, b| a.node.cmp(&b.node));
    for c in sorted {
        if !c.online {
            unusable.push(format!("{} (offline)", c.node));
            continue;
        }
        let best = c
            .pools
            .iter()
            .filter(|p| p.fits(size_bytes, thin))
            .max_by(|a, b| {
                headroom(a, thin)
                    .cmp(&headroom(b, thin))
                    .then(b.name.cmp(&a.name))
            });
        match best {
            Some(p) => usable.push((headroom(p, thin), &c.node, p)),
            None if c.pools.is_empty() => unusable.push(format!("{} (no pools)", c.node)),
            None => {
                let pools: Vec<String> = c.pools.iter().map(|p| room_text(p, thin)).collect();
                unusable.push(format!("{} ({})", c.node, pools.join(", ")));
            }
        }
    }
    if usable.len() < count {
        return Err(PlacementError::InsufficientCapacity {
            need: count,
            size_bytes,
            thin,
            usable: usable
                .iter()
                .map(|(_, n, p)| format!("{n} ({})", room_text(p, thin)))
                .collect(),
            unusable,
        });
    }
    // Most room first; the sort is stable so equal room keeps node-name order.
    usable.sort_by_key(|u| std::cmp::Reverse(u.0));
    Ok(usable
        .into_iter()
        .take(count)
        .map(|(_, node, p)| Placement {
            node: node.to_string(),
            pool: p.name.clone(),
        })
        .collect())
}

/// A replica placed by this controller that its node's reports may not include yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reserved {
    pub node: String,
    pub pool: String,
    pub size_bytes: u64,
    pub thin: bool,
}

/// Adds not-yet-reported replicas to the pools' numbers, so two creates between heartbeats
/// do not both count the same free space.
pub fn apply_reserved(candidates: &mut [Candidate], reserved: &[Reserved]) {
    for r in reserved {
        let pool = candidates
            .iter_mut()
            .filter(|c| c.node == r.node)
            .flat_map(|c| c.pools.iter_mut())
            .find(|p| p.name == r.pool);
        if let Some(p) = pool {
            p.provisioned_bytes = p.provisioned_bytes.saturating_add(r.size_bytes);
            if !r.thin {
                p.free_bytes = p.free_bytes.saturating_sub(r.size_bytes);
            }
            p.replicas = p.replicas.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const GIB: u64 = 1 << 30;

    fn pool(node: &str, name: &str, capacity: u64, free: u64, provisioned: u64) -> PoolInfo {
        PoolInfo {
            node: node.into(),
            name: name.into(),
            path: format!("/pools/{name}"),
            capacity_bytes: capacity,
            free_bytes: free,
            provisioned_bytes: provisioned,
            overprovision_ratio: 2.0,
            replicas: 0,
        }
    }

    fn node(name: &str, free_gib: u64) -> Candidate {
        Candidate {
            node: name.into(),
            online: true,
            pools: vec![pool(name, "default", 100 * GIB, free_gib * GIB, 0)],
        }
    }

    fn nodes_of(p: &[Placement]) -> Vec<&str> {
        p.iter().map(|p| p.node.as_str()).collect()
    }

    #[test]
    fn replicas_go_to_distinct_nodes_with_most_room() {
        let c = vec![
            node("n1", 10),
            node("n2", 50),
            node("n3", 30),
            node("n4", 40),
        ];
        let p = place(&c, GIB, false, 3).unwrap();
        assert_eq!(nodes_of(&p), ["n2", "n4", "n3"]);
        // Never two replicas on one node, even if one node has several pools.
        let mut big = node("n1", 90);
        big.pools.push(pool("n1", "second", 100 * GIB, 90 * GIB, 0));
        let err = place(&[big, node("n2", 10)], GIB, false, 3).unwrap_err();
        assert!(err.to_string().contains("need 3 nodes"), "{err}");
    }

    #[test]
    fn best_pool_of_a_node_is_chosen() {
        let mut c = node("n1", 10);
        c.pools.push(pool("n1", "big", 100 * GIB, 80 * GIB, 0));
        let p = place(&[c], GIB, false, 1).unwrap();
        assert_eq!(
            p,
            [Placement {
                node: "n1".into(),
                pool: "big".into()
            }]
        );
    }

    #[test]
    fn full_pools_are_skipped() {
        let c = vec![node("n1", 5), node("n2", 20), node("n3", 20)];
        let p = place(&c, 10 * GIB, false, 2).unwrap();
        assert_eq!(nodes_of(&p), ["n2", "n3"]);
        assert!(place(&c, 10 * GIB, false, 3).is_err());
    }

    #[test]
    fn offline_nodes_are_skipped() {
        let mut c = vec![node("n1", 90), node("n2", 20), node("n3", 20)];
        c[0].online = false;
        let p = place(&c, GIB, false, 2).unwrap();
        assert_eq!(nodes_of(&p), ["n2", "n3"]);
        let err = place(&c, GIB, false, 3).unwrap_err();
        assert!(err.to_string().contains("n1 (offline)"), "{err}");
    }

    #[test]
    fn thin_counts_overprovisioning_not_free_space() {
        // 100 GiB pool, ratio 2: 200 GiB may be provisioned, whatever is free right now.
        let mut c = node("n1", 1);
        c.pools[0].provisioned_bytes = 150 * GIB;
        assert!(place(&[c.clone()], 50 * GIB, true, 1).is_ok());
        assert!(place(&[c.clone()], 51 * GIB, true, 1).is_err());
        // A thick replica needs real free space.
        assert!(place(&[c], 2 * GIB, false, 1).is_err());
        // Thin prefers the most headroom, not the most free bytes.
        let mut a = node("a", 90);
        a.pools[0].provisioned_bytes = 190 * GIB;
        let b = node("b", 10);
        assert_eq!(nodes_of(&place(&[a, b], GIB, true, 1).unwrap()), ["b"]);
    }

    #[test]
    fn reservations_balance_and_prevent_overbooking() {
        let mut c = vec![node("n1", 20), node("n2", 20), node("n3", 20)];
        // Two thick 15 GiB volumes on 20 GiB nodes: the second must not reuse the space.
        let first = place(&c, 15 * GIB, false, 2).unwrap();
        let reserved: Vec<Reserved> = first
            .iter()
            .map(|p| Reserved {
                node: p.node.clone(),
                pool: p.pool.clone(),
                size_bytes: 15 * GIB,
                thin: false,
            })
            .collect();
        apply_reserved(&mut c, &reserved);
        let err = place(&c, 15 * GIB, false, 2).unwrap_err();
        assert!(err.to_string().contains("found 1"), "{err}");
        // Small volumes now prefer the node that got nothing.
        assert_eq!(nodes_of(&place(&c, GIB, false, 1).unwrap()), ["n3"]);
    }

    #[test]
    fn thin_reservations_count_against_headroom() {
        let mut c = vec![node("n1", 100)];
        apply_reserved(
            &mut c,
            &[Reserved {
                node: "n1".into(),
                pool: "default".into(),
                size_bytes: 150 * GIB,
                thin: true,
            }],
        );
        assert_eq!(
            c[0].pools[0].free_bytes,
            100 * GIB,
            "thin does not consume free space"
        );
        assert!(place(&c, 50 * GIB, true, 1).is_ok());
        assert!(place(&c, 51 * GIB, true, 1).is_err());
    }

    #[test]
    fn error_says_why() {
        let mut c = vec![node("n1", 5), node("n2", 20), node("n3", 20)];
        c[2].online = false;
        c.push(Candidate {
            node: "n4".into(),
            online: true,
            pools: vec![],
        });
        let err = place(&c, 10 * GIB, false, 3).unwrap_err();
        assert_eq!(
            err.to_string(),
            "need 3 nodes with room for a 10 GiB thick replica, found 1: \
             n2 (pool default: 20 GiB free); not usable: n1 (pool default: 5 GiB free), \
             n3 (offline), n4 (no pools)"
        );
    }

    #[test]
    fn equal_room_is_deterministic() {
        let c = vec![node("n3", 10), node("n1", 10), node("n2", 10)];
        assert_eq!(nodes_of(&place(&c, GIB, false, 2).unwrap()), ["n1", "n2"]);
    }
}
