//! Placement rules, one test per rule, on hand-built candidates.
#![allow(clippy::unwrap_used)]

use super::*;
use hawser_api::controller::PoolKind;

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
        kind: PoolKind::Any,
        snapshots: 0,
        snapshot_bytes: 0,
    }
}

/// An online node with one 100 GiB pool `default` with `free_gib` free.
fn node(name: &str, free_gib: u64) -> Candidate {
    Candidate {
        node: name.into(),
        online: true,
        zone: None,
        pools: vec![pool(name, "default", 100 * GIB, free_gib * GIB, 0)],
    }
}

fn zoned(name: &str, zone: &str, free_gib: u64) -> Candidate {
    Candidate {
        zone: Some(zone.into()),
        ..node(name, free_gib)
    }
}

fn req(size_bytes: u64, thin: bool, count: usize) -> Request {
    Request {
        size_bytes,
        thin,
        count,
        rules: VolumePlacement::default(),
    }
}

fn spread(count: usize, zone_spread: ZoneSpread) -> Request {
    let mut r = req(GIB, false, count);
    r.rules.zone_spread = zone_spread;
    r
}

fn nodes_of(p: &Placed) -> Vec<&str> {
    p.replicas.iter().map(|p| p.node.as_str()).collect()
}

fn placed(c: &[Candidate], r: &Request) -> Vec<String> {
    let p = place(c, r).unwrap();
    nodes_of(&p).into_iter().map(String::from).collect()
}

fn error(c: &[Candidate], r: &Request) -> String {
    place(c, r).unwrap_err().to_string()
}

#[test]
fn replicas_go_to_distinct_nodes_with_most_room() {
    let c = vec![
        node("n1", 10),
        node("n2", 50),
        node("n3", 30),
        node("n4", 40),
    ];
    assert_eq!(placed(&c, &req(GIB, false, 3)), ["n2", "n4", "n3"]);
    // Never two replicas on one node, even if one node has several pools.
    let mut big = node("n1", 90);
    big.pools.push(pool("n1", "second", 100 * GIB, 90 * GIB, 0));
    let err = error(&[big, node("n2", 10)], &req(GIB, false, 3));
    assert!(err.contains("need 3 nodes"), "{err}");
}

#[test]
fn best_pool_of_a_node_is_chosen() {
    let mut c = node("n1", 10);
    c.pools.push(pool("n1", "big", 100 * GIB, 80 * GIB, 0));
    let p = place(&[c], &req(GIB, false, 1)).unwrap();
    assert_eq!(
        p.replicas,
        [Placement {
            node: "n1".into(),
            pool: "big".into()
        }]
    );
}

#[test]
fn full_pools_are_skipped() {
    let c = vec![node("n1", 5), node("n2", 20), node("n3", 20)];
    assert_eq!(placed(&c, &req(10 * GIB, false, 2)), ["n2", "n3"]);
    let err = error(&c, &req(10 * GIB, false, 3));
    assert!(err.contains("n1 (pool default: 5 GiB free)"), "{err}");
}

#[test]
fn offline_nodes_are_skipped() {
    let mut c = vec![node("n1", 90), node("n2", 20), node("n3", 20)];
    c[0].online = false;
    assert_eq!(placed(&c, &req(GIB, false, 2)), ["n2", "n3"]);
    let err = error(&c, &req(GIB, false, 3));
    assert!(err.contains("n1 (offline)"), "{err}");
}

#[test]
fn thin_counts_overprovisioning_not_free_space() {
    // 100 GiB pool, ratio 2: 200 GiB may be provisioned, whatever is free right now.
    let mut c = node("n1", 1);
    c.pools[0].provisioned_bytes = 150 * GIB;
    assert!(place(std::slice::from_ref(&c), &req(50 * GIB, true, 1)).is_ok());
    assert_eq!(
        error(std::slice::from_ref(&c), &req(51 * GIB, true, 1)),
        "need 1 node with room for a 51 GiB thin replica, found 0: none; not usable: \
         n1 (pool default: 50 GiB left of its 200 GiB thin limit)"
    );
    // A thick replica needs real free space.
    assert!(place(&[c], &req(2 * GIB, false, 1)).is_err());
    // Thin prefers the most headroom, not the most free bytes.
    let mut a = node("a", 90);
    a.pools[0].provisioned_bytes = 190 * GIB;
    let b = node("b", 10);
    assert_eq!(placed(&[a, b], &req(GIB, true, 1)), ["b"]);
}

#[test]
fn thick_replicas_count_against_the_thin_limit_too() {
    // Provisioned counts every replica: a pool full of thick replicas has no thin room left
    // at ratio 1, even with free space on its filesystem.
    let mut c = node("n1", 50);
    c.pools[0].overprovision_ratio = 1.0;
    c.pools[0].provisioned_bytes = 100 * GIB;
    assert!(place(std::slice::from_ref(&c), &req(GIB, true, 1)).is_err());
    assert!(place(&[c], &req(GIB, false, 1)).is_ok());
}

#[test]
fn reservations_balance_and_prevent_overbooking() {
    let mut c = vec![node("n1", 20), node("n2", 20), node("n3", 20)];
    // Two thick 15 GiB volumes on 20 GiB nodes: the second must not reuse the space.
    let first = place(&c, &req(15 * GIB, false, 2)).unwrap();
    let reserved: Vec<Reserved> = first
        .replicas
        .iter()
        .map(|p| Reserved {
            node: p.node.clone(),
            pool: p.pool.clone(),
            size_bytes: 15 * GIB,
            thin: false,
        })
        .collect();
    apply_reserved(&mut c, &reserved);
    let err = error(&c, &req(15 * GIB, false, 2));
    assert!(err.contains("found 1"), "{err}");
    // Small volumes now prefer the node that got nothing.
    assert_eq!(placed(&c, &req(GIB, false, 1)), ["n3"]);
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
    assert!(place(&c, &req(50 * GIB, true, 1)).is_ok());
    assert!(place(&c, &req(51 * GIB, true, 1)).is_err());
}

/// Repeated creates, each reserving what it placed: replicas end up evenly spread, and the
/// same inputs always give the same placement.
#[test]
fn repeated_creates_balance_by_room() {
    for thin in [true, false] {
        let mut c = vec![node("n1", 100), node("n2", 100), node("n3", 100)];
        let mut count: BTreeMap<String, usize> = BTreeMap::new();
        for _ in 0..6 {
            let p = place(&c, &req(10 * GIB, thin, 2)).unwrap();
            assert_eq!(p, place(&c, &req(10 * GIB, thin, 2)).unwrap());
            let reserved: Vec<Reserved> = p
                .replicas
                .iter()
                .map(|p| Reserved {
                    node: p.node.clone(),
                    pool: p.pool.clone(),
                    size_bytes: 10 * GIB,
                    thin,
                })
                .collect();
            apply_reserved(&mut c, &reserved);
            for r in p.replicas {
                *count.entry(r.node).or_default() += 1;
            }
        }
        let expect: BTreeMap<String, usize> =
            [("n1".into(), 4), ("n2".into(), 4), ("n3".into(), 4)].into();
        assert_eq!(count, expect, "thin={thin}");
    }
}

#[test]
fn error_says_why() {
    let mut c = vec![node("n1", 5), node("n2", 20), node("n3", 20)];
    c[2].online = false;
    c.push(Candidate {
        node: "n4".into(),
        online: true,
        zone: None,
        pools: vec![],
    });
    assert_eq!(
        error(&c, &req(10 * GIB, false, 3)),
        "need 3 nodes with room for a 10 GiB thick replica, found 1: \
         n2 (pool default: 20 GiB free); not usable: n1 (pool default: 5 GiB free), \
         n3 (offline), n4 (no pools)"
    );
}

#[test]
fn equal_room_is_deterministic() {
    let c = vec![node("n3", 10), node("n1", 10), node("n2", 10)];
    assert_eq!(placed(&c, &req(GIB, false, 2)), ["n1", "n2"]);
}

#[test]
fn strict_spread_uses_one_node_per_zone() {
    // Zone a has the two roomiest nodes; strict spread still takes only one of them.
    let c = vec![
        zoned("n1", "a", 90),
        zoned("n2", "a", 80),
        zoned("n3", "b", 30),
        zoned("n4", "c", 20),
        zoned("n5", "c", 40),
    ];
    assert_eq!(
        placed(&c, &spread(3, ZoneSpread::Strict)),
        ["n1", "n5", "n3"]
    );
    // Without spread, room alone decides.
    assert_eq!(placed(&c, &spread(3, ZoneSpread::None)), ["n1", "n2", "n5"]);
}

#[test]
fn strict_spread_with_too_few_zones_says_which_zones_exist() {
    // Acceptance f: 2 zones, 3 replicas.
    let c = vec![
        zoned("n1", "a", 50),
        zoned("n2", "a", 50),
        zoned("n3", "b", 50),
        zoned("n4", "c", 0),
        node("n5", 50),
    ];
    assert_eq!(
        error(&c, &spread(3, ZoneSpread::Strict)),
        "need 3 replicas in 3 different zones (zone spread strict), but the nodes with room \
         for a 1 GiB thick replica are in 2 zones: a (n1, n2), b (n3); not usable: \
         n4 (pool default: 0 B free), n5 (no zone label); add room in another zone, create \
         fewer replicas, or create with zone spread preferred"
    );
    assert_eq!(placed(&c, &spread(2, ZoneSpread::Strict)), ["n1", "n3"]);
}

#[test]
fn strict_spread_without_enough_nodes_lists_nodes() {
    let mut c = vec![zoned("n1", "a", 50), zoned("n2", "b", 50)];
    c[1].online = false;
    assert_eq!(
        error(&c, &spread(2, ZoneSpread::Strict)),
        "need 2 nodes with room for a 1 GiB thick replica, found 1: \
         n1 (zone a, pool default: 50 GiB free); not usable: n2 (offline)"
    );
}

#[test]
fn preferred_spread_fills_every_zone_before_doubling_up() {
    // Acceptance f: 2 zones, 3 replicas under preferred spread.
    let c = vec![
        zoned("n1", "a", 90),
        zoned("n2", "a", 80),
        zoned("n3", "a", 70),
        zoned("n4", "b", 10),
    ];
    let p = place(&c, &spread(3, ZoneSpread::Preferred)).unwrap();
    assert_eq!(nodes_of(&p), ["n1", "n4", "n2"]);
    assert_eq!(p.notes, ["zone a holds 2 replicas (n1, n2)"]);
    // Unlabelled nodes count as one zone of their own.
    let c = vec![zoned("n1", "a", 90), zoned("n2", "a", 80), node("n3", 10)];
    let p = place(&c, &spread(2, ZoneSpread::Preferred)).unwrap();
    assert_eq!((nodes_of(&p), p.notes.len()), (vec!["n1", "n3"], 0));
}

#[test]
fn default_spread_is_strict_once_any_node_has_a_zone() {
    let mut c = vec![node("n1", 10), node("n2", 10)];
    assert_eq!(default_zone_spread(&c), ZoneSpread::None);
    c[1].online = false;
    c[1].zone = Some("a".into());
    assert_eq!(default_zone_spread(&c), ZoneSpread::Strict);
}

#[test]
fn preferred_node_gets_a_replica_when_it_can() {
    let c = vec![node("n1", 90), node("n2", 80), node("n3", 10)];
    let mut r = req(GIB, false, 2);
    r.rules.prefer_node = Some("n3".into());
    let p = place(&c, &r).unwrap();
    assert_eq!((nodes_of(&p), p.notes.len()), (vec!["n3", "n1"], 0));
    // It cannot: the others are used, and the caller hears why.
    let full = vec![node("n1", 90), node("n2", 80), node("n3", 0)];
    let p = place(&full, &r).unwrap();
    assert_eq!(nodes_of(&p), ["n1", "n2"]);
    assert_eq!(
        p.notes,
        ["preferred node n3 not used: pool default: 0 B free"]
    );
    r.rules.prefer_node = Some("n9".into());
    let p = place(&c, &r).unwrap();
    assert_eq!(p.notes, ["preferred node n9 not used: not registered"]);
}

#[test]
fn preferred_node_under_strict_spread_takes_its_zone() {
    let c = vec![
        zoned("n1", "a", 90),
        zoned("n2", "b", 80),
        zoned("n3", "b", 10),
    ];
    let mut r = spread(2, ZoneSpread::Strict);
    r.rules.prefer_node = Some("n3".into());
    assert_eq!(placed(&c, &r), ["n3", "n1"]);
}

#[test]
fn pool_selector_limits_pools() {
    let mut n1 = node("n1", 90);
    n1.pools.push(pool("n1", "ssd", 10 * GIB, 5 * GIB, 0));
    let mut n2 = node("n2", 90);
    n2.pools.push(pool("n2", "ssd", 10 * GIB, 8 * GIB, 0));
    let n3 = node("n3", 90);
    let c = vec![n1, n2, n3];
    let mut r = req(GIB, false, 2);
    r.rules.pool = Some("ssd".into());
    let p = place(&c, &r).unwrap();
    assert_eq!(nodes_of(&p), ["n2", "n1"]);
    assert!(p.replicas.iter().all(|p| p.pool == "ssd"));
    r.count = 3;
    assert_eq!(
        error(&c, &r),
        "need 3 nodes with room for a 1 GiB thick replica in pool ssd, found 2: \
         n2 (pool ssd: 8 GiB free), n1 (pool ssd: 5 GiB free); \
         not usable: n3 (no pool ssd (has default))"
    );
}

#[test]
fn pool_kind_is_respected() {
    let mut c = node("n1", 90);
    c.pools[0].kind = PoolKind::Thin;
    c.pools.push(pool("n1", "small", 10 * GIB, 10 * GIB, 0));
    // The thin-only pool has more room, but a thick replica goes to the other one.
    let p = place(std::slice::from_ref(&c), &req(GIB, false, 1)).unwrap();
    assert_eq!(p.replicas[0].pool, "small");
    let p = place(std::slice::from_ref(&c), &req(GIB, true, 1)).unwrap();
    assert_eq!(p.replicas[0].pool, "default");
    c.pools.pop();
    assert_eq!(
        error(&[c], &req(GIB, false, 1)),
        "need 1 node with room for a 1 GiB thick replica, found 0: none; not usable: \
         n1 (pool default: thin replicas only)"
    );
}
