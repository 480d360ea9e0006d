//! Sizes: a CSI capacity range to a volume size (4 KiB aligned), and what the pools can
//! still take (GetCapacity), per topology segment.

use std::collections::HashMap;

use hawser_api::controller::{Node, NodeState, PoolInfo, ZONE_LABEL};
use tonic::Status;

use crate::names::{TOPOLOGY_NODE_KEY, TOPOLOGY_ZONE_KEY};
use crate::proto::csi::CapacityRange;

/// Volume sizes are multiples of this (the replicas' block size).
pub const ALIGN: u64 = 4096;
/// The size of a volume created with no capacity range.
pub const DEFAULT_SIZE: u64 = 1 << 30;

/// The size for a capacity range: `required_bytes` rounded up to 4 KiB; with no required
/// size, 1 GiB or the limit if smaller. A limit below the required size is a malformed
/// request (INVALID_ARGUMENT); a range with no 4 KiB multiple in it is OUT_OF_RANGE.
pub fn size_for(range: Option<&CapacityRange>) -> Result<u64, Status> {
    let (required, limit) = match range {
        Some(r) => (r.required_bytes, r.limit_bytes),
        None => (0, 0),
    };
    let (required, limit) = match (u64::try_from(required), u64::try_from(limit)) {
        (Ok(r), Ok(l)) => (r, l),
        _ => {
            return Err(Status::invalid_argument(format!(
                "capacity range has a negative size (required_bytes {required}, limit_bytes \
                 {limit})"
            )))
        }
    };
    if limit > 0 && limit < required {
        return Err(Status::invalid_argument(format!(
            "capacity range's limit_bytes {limit} is below its required_bytes {required}"
        )));
    }
    let size = match (required, limit) {
        (0, 0) => DEFAULT_SIZE,
        (0, l) => DEFAULT_SIZE.min(l / ALIGN * ALIGN),
        (r, _) => r.div_ceil(ALIGN).saturating_mul(ALIGN),
    };
    if size == 0 || (limit > 0 && size > limit) {
        return Err(Status::out_of_range(format!(
            "no size in the capacity range (required_bytes {required}, limit_bytes {limit}) \
             is a multiple of {ALIGN} bytes, which Hawser volumes are"
        )));
    }
    Ok(size)
}

/// Whether an existing volume of `size` satisfies a capacity range.
pub fn size_fits(size: u64, range: Option<&CapacityRange>) -> bool {
    let Some(r) = range else { return true };
    let required = u64::try_from(r.required_bytes).unwrap_or(0);
    let limit = u64::try_from(r.limit_bytes).unwrap_or(0);
    size >= required && (limit == 0 || size <= limit)
}

/// What one pool can still take for a new replica: up to the overprovision limit for thin
/// replicas, the free space for thick ones.
fn headroom(p: &PoolInfo, thin: bool) -> u64 {
    if thin {
        p.overprovision_limit().saturating_sub(p.provisioned_bytes)
    } else {
        p.free_bytes
    }
}

/// Free capacity in a topology segment.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    /// Summed over the segment's usable pools.
    pub available: u64,
    /// The largest replica one pool of the segment can take.
    pub maximum_volume: u64,
}

/// GetCapacity for `segment` (empty: the whole cluster): pools of online, non-evacuating
/// nodes in the segment whose kind takes `thin` replicas (and named `pool`, if given).
pub fn capacity(
    nodes: &[Node],
    pools: &[PoolInfo],
    segment: &HashMap<String, String>,
    thin: bool,
    pool: Option<&str>,
) -> Capacity {
    let in_segment = |n: &Node| {
        segment.iter().all(|(k, v)| match k.as_str() {
            TOPOLOGY_NODE_KEY => n.name == *v,
            TOPOLOGY_ZONE_KEY => n.labels.get(ZONE_LABEL) == Some(v),
            _ => false,
        })
    };
    let usable: Vec<&str> = nodes
        .iter()
        .filter(|n| n.state == NodeState::Online && !n.evacuating && in_segment(n))
        .map(|n| n.name.as_str())
        .collect();
    let mut c = Capacity::default();
    for p in pools {
        if !usable.contains(&p.node.as_str())
            || !p.kind.allows(thin)
            || pool.is_some_and(|name| name != p.name)
        {
            continue;
        }
        let h = headroom(p, thin);
        c.available = c.available.saturating_add(h);
        c.maximum_volume = c.maximum_volume.max(h / ALIGN * ALIGN);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_api::controller::PoolKind;

    fn range(required: i64, limit: i64) -> Option<CapacityRange> {
        Some(CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        })
    }

    #[test]
    fn ranges_round_up_to_4k_and_bad_ranges_get_their_codes() {
        let ok = |r: Option<CapacityRange>| size_for(r.as_ref()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ok(None), DEFAULT_SIZE);
        assert_eq!(ok(range(1, 0)), 4096);
        assert_eq!(ok(range(4097, 8192)), 8192);
        assert_eq!(ok(range(0, 10_000)), 8192);
        assert_eq!(ok(range(10 << 30, 0)), 10 << 30);
        let code = |r: Option<CapacityRange>| size_for(r.as_ref()).err().map(|s| s.code());
        assert_eq!(code(range(8192, 4096)), Some(tonic::Code::InvalidArgument));
        assert_eq!(code(range(-1, 0)), Some(tonic::Code::InvalidArgument));
        assert_eq!(code(range(4097, 5000)), Some(tonic::Code::OutOfRange));
        assert_eq!(code(range(0, 100)), Some(tonic::Code::OutOfRange));
        assert!(size_fits(8192, range(4097, 0).as_ref()));
        assert!(!size_fits(8192, range(16384, 0).as_ref()));
        assert!(!size_fits(8192, range(0, 4096).as_ref()));
    }

    fn node(name: &str, zone: &str, state: NodeState) -> Node {
        Node {
            name: name.into(),
            admin_addr: String::new(),
            replica_addr: String::new(),
            nbd_addr: None,
            nbd_socket: None,
            last_seen_ms: 0,
            state,
            labels: [(ZONE_LABEL.to_string(), zone.to_string())].into(),
            evacuating: false,
            cluster: None,
        }
    }

    fn pool(node: &str, name: &str, free: u64, provisioned: u64, kind: PoolKind) -> PoolInfo {
        PoolInfo {
            node: node.into(),
            name: name.into(),
            path: "/p".into(),
            capacity_bytes: 100 << 20,
            free_bytes: free,
            provisioned_bytes: provisioned,
            overprovision_ratio: 2.0,
            replicas: 0,
            kind,
            snapshots: 0,
            snapshot_bytes: 0,
        }
    }

    #[test]
    fn capacity_counts_usable_pools_of_the_segment() {
        let nodes = vec![
            node("n1", "a", NodeState::Online),
            node("n2", "b", NodeState::Online),
            node("n3", "b", NodeState::Offline),
        ];
        let pools = vec![
            pool("n1", "p", 10 << 20, 50 << 20, PoolKind::Any),
            pool("n2", "p", 20 << 20, 0, PoolKind::Thin),
            pool("n3", "p", 90 << 20, 0, PoolKind::Any),
        ];
        let all = HashMap::new();
        // Thin: 200 MiB limit each, minus what is provisioned; n3 is offline.
        assert_eq!(
            capacity(&nodes, &pools, &all, true, None),
            Capacity {
                available: (150 << 20) + (200 << 20),
                maximum_volume: 200 << 20
            }
        );
        // Thick: real free space, and n2 takes thin replicas only.
        assert_eq!(
            capacity(&nodes, &pools, &all, false, None).available,
            10 << 20
        );
        let zone_b = [(TOPOLOGY_ZONE_KEY.to_string(), "b".to_string())].into();
        assert_eq!(
            capacity(&nodes, &pools, &zone_b, true, None).available,
            200 << 20
        );
        let n1 = [(TOPOLOGY_NODE_KEY.to_string(), "n1".to_string())].into();
        assert_eq!(capacity(&nodes, &pools, &n1, true, Some("q")).available, 0);
        let unknown = [("other".to_string(), "x".to_string())].into();
        assert_eq!(capacity(&nodes, &pools, &unknown, true, None).available, 0);
    }
}
