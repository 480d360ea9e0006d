//! Placement: which pools on which nodes get a new volume's replicas. Pure functions over
//! the nodes' reported pools, so every rule is unit-tested without a cluster.
//!
//! Rules, in order (LINSTOR's autoplace and Longhorn's scheduler work the same way):
//! 1. One replica per node, only online nodes: a node failure must never take two copies.
//! 2. Only pools that match the volume's pool selector, take its kind of replica (thin or
//!    thick) and have room: real free space for thick replicas, the overprovision limit for
//!    thin ones, both after the reservations of creates still in flight.
//! 3. Zones (the nodes' `zone` label): under `strict` spread every replica is in a different
//!    zone and unlabelled nodes are not used; under `preferred` a zone gets a second replica
//!    only when every zone with room has one; `none` ignores zones.
//! 4. The preferred node (data locality) first, when it can take a replica.
//! 5. Then the node whose best pool has the most room, which spreads volumes over the
//!    cluster; equal room goes by node name, so the result is deterministic.
//!
//! When no placement exists the error lists every node that was not usable and why, and
//! under strict spread the zones that were, so the user knows what to change.
//!
//! The rules a create asks for ([`rules`]) and the ids placed replicas get ([`replica_id`],
//! the one random part: a reused volume name never meets an old replica's id) are here too,
//! for create, clone and self-healing alike.

use std::collections::BTreeMap;

use hawser_api::controller::{CreateVolume, PoolInfo, VolumePlacement, ZoneSpread};
use hawser_api::format_size;

/// A node as placement sees it.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub node: String,
    pub online: bool,
    /// The node's `zone` label.
    pub zone: Option<String>,
    pub pools: Vec<PoolInfo>,
}

/// What to place.
#[derive(Clone, Debug)]
pub struct Request {
    pub size_bytes: u64,
    pub thin: bool,
    pub count: usize,
    /// The volume's rules; `zone_spread` already resolved (see [`default_zone_spread`]).
    pub rules: VolumePlacement,
}

/// One chosen replica location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub node: String,
    pub pool: String,
}

/// A successful placement and what a user may want to know about it (logged by the caller):
/// a preferred node that could not be used, zones holding more than one replica under
/// preferred spread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub replicas: Vec<Placement>,
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error(
        "need {need} node{} with room for a {what}, found {}: {}",
        if *need == 1 { "" } else { "s" },
        usable.len(),
        describe(usable, rejected)
    )]
    NotEnoughNodes {
        need: usize,
        /// "10 GiB thick replica", with the pool selector if any.
        what: String,
        /// Nodes that could take a replica, with their best pool's room.
        usable: Vec<String>,
        /// Nodes that could not, with the reason.
        rejected: Vec<String>,
    },
    #[error(
        "need {need} replicas in {need} different zones (zone spread strict), but the nodes \
         with room for a {what} are in {} zone{}: {}{}; add room in another zone, create \
         fewer replicas, or create with zone spread preferred",
        zones.len(),
        if zones.len() == 1 { "" } else { "s" },
        zones.join(", "),
        not_usable(rejected)
    )]
    NotEnoughZones {
        need: usize,
        what: String,
        /// Each zone with room, with its usable nodes: "a (n1, n2)".
        zones: Vec<String>,
        rejected: Vec<String>,
    },
}

fn describe(usable: &[String], rejected: &[String]) -> String {
    let s = if usable.is_empty() {
        "none".to_string()
    } else {
        usable.join(", ")
    };
    s + &not_usable(rejected)
}

fn not_usable(rejected: &[String]) -> String {
    if rejected.is_empty() {
        String::new()
    } else {
        format!("; not usable: {}", rejected.join(", "))
    }
}

/// The spread a volume gets when its create request names none: `strict` as soon as any
/// registered node (online or not) has a zone label, since an operator who labels zones
/// wants them to count and a replica pair in one zone is silently exposed to that zone's
/// loss; `none` in a cluster without zones, where `strict` could place nothing.
pub fn default_zone_spread(candidates: &[Candidate]) -> ZoneSpread {
    if candidates.iter().any(|c| c.zone.is_some()) {
        ZoneSpread::Strict
    } else {
        ZoneSpread::None
    }
}

/// The volume's placement rules as asked, the zone spread resolved against `candidates`.
pub fn rules(req: &CreateVolume, candidates: &[Candidate]) -> VolumePlacement {
    VolumePlacement {
        pool: req.pool.clone(),
        zone_spread: req
            .zone_spread
            .unwrap_or_else(|| default_zone_spread(candidates)),
        prefer_node: req.prefer_node.clone(),
    }
}

/// `{volume}-r{n}-{6 hex}`: readable, and unique even when a volume name is reused while an
/// old replica of the same name may still linger on an unreachable agent.
pub fn replica_id(volume: &str, n: u32) -> String {
    let tag: u32 = rand::random::<u32>() & 0xff_ffff;
    format!("{volume}-r{n}-{tag:06x}")
}

/// Room left in `pool` for new replicas: the overprovision headroom for thin replicas, the
/// free bytes for thick ones.
pub fn headroom(pool: &PoolInfo, thin: bool) -> u64 {
    if thin {
        pool.overprovision_limit()
            .saturating_sub(pool.provisioned_bytes)
    } else {
        pool.free_bytes
    }
}

fn room_text(pool: &PoolInfo, thin: bool) -> String {
    if thin {
        format!(
            "pool {}: {} left of its {} thin limit",
            pool.name,
            format_size(headroom(pool, true)),
            format_size(pool.overprovision_limit())
        )
    } else {
        format!("pool {}: {} free", pool.name, format_size(pool.free_bytes))
    }
}

/// A node that can take a replica, in its best pool.
struct Usable<'a> {
    node: &'a str,
    zone: Option<&'a str>,
    pool: &'a PoolInfo,
    room: u64,
}

/// The node's best pool for the request, or why it has none.
fn assess<'a>(c: &'a Candidate, req: &Request) -> Result<Usable<'a>, String> {
    if !c.online {
        return Err("offline".into());
    }
    if req.rules.zone_spread == ZoneSpread::Strict && c.zone.is_none() {
        return Err("no zone label".into());
    }
    if c.pools.is_empty() {
        return Err("no pools".into());
    }
    let selected: Vec<&PoolInfo> = match &req.rules.pool {
        Some(name) => c.pools.iter().filter(|p| p.name == *name).collect(),
        None => c.pools.iter().collect(),
    };
    if selected.is_empty() {
        let names: Vec<&str> = c.pools.iter().map(|p| p.name.as_str()).collect();
        let wanted = req.rules.pool.as_deref().unwrap_or_default();
        return Err(format!("no pool {wanted} (has {})", names.join(", ")));
    }
    let mut why = Vec::new();
    let mut best: Option<(u64, &PoolInfo)> = None;
    for p in selected {
        let room = headroom(p, req.thin);
        if !p.kind.allows(req.thin) {
            why.push(format!(
                "pool {}: {} replicas only",
                p.name,
                opposite(req.thin)
            ));
        } else if room < req.size_bytes {
            why.push(room_text(p, req.thin));
        } else if best.is_none_or(|(r, b)| room > r || (room == r && p.name < b.name)) {
            best = Some((room, p));
        }
    }
    match best {
        Some((room, pool)) => Ok(Usable {
            node: &c.node,
            zone: c.zone.as_deref(),
            pool,
            room,
        }),
        None => Err(why.join(", ")),
    }
}

fn kind_name(thin: bool) -> &'static str {
    if thin {
        "thin"
    } else {
        "thick"
    }
}

fn opposite(thin: bool) -> &'static str {
    kind_name(!thin)
}

/// Chooses `req.count` pools on as many distinct nodes; see the module doc for the rules.
pub fn place(candidates: &[Candidate], req: &Request) -> Result<Placed, PlacementError> {
    let mut sorted: Vec<&Candidate> = candidates.iter().collect();
    sorted.sort_by(|a, b| a.node.cmp(&b.node));
    let mut usable = Vec::new();
    let mut rejected = Vec::new();
    for c in sorted {
        match assess(c, req) {
            Ok(u) => usable.push(u),
            Err(why) => rejected.push((c.node.as_str(), why)),
        }
    }
    // Most room first; the sort is stable so equal room keeps node-name order.
    usable.sort_by_key(|u| std::cmp::Reverse(u.room));
    let mut notes = Vec::new();
    if let Some(want) = req.rules.prefer_node.as_deref() {
        match usable.iter().position(|u| u.node == want) {
            Some(i) => {
                let u = usable.remove(i);
                usable.insert(0, u);
            }
            None => notes.push(match rejected.iter().find(|(n, _)| *n == want) {
                Some((_, why)) => format!("preferred node {want} not used: {why}"),
                None => format!("preferred node {want} not used: not registered"),
            }),
        }
    }
    let chosen = choose(&usable, req.count, req.rules.zone_spread);
    if chosen.len() < req.count {
        return Err(failure(req, &usable, &rejected));
    }
    if req.rules.zone_spread == ZoneSpread::Preferred {
        notes.extend(shared_zones(&usable, &chosen));
    }
    let replicas = chosen
        .iter()
        .map(|&i| Placement {
            node: usable[i].node.to_string(),
            pool: usable[i].pool.name.clone(),
        })
        .collect();
    Ok(Placed { replicas, notes })
}

/// Indexes into `usable` (already in order of preference) of up to `count` nodes obeying
/// `spread`. Greedy is enough: under strict spread any zone not yet used stays available,
/// so it fails only when there are fewer zones than replicas; under preferred spread
/// filling the emptiest zone first maximises the number of zones used.
fn choose(usable: &[Usable], count: usize, spread: ZoneSpread) -> Vec<usize> {
    let mut chosen: Vec<usize> = Vec::new();
    let mut per_zone: BTreeMap<Option<&str>, usize> = BTreeMap::new();
    while chosen.len() < count {
        let left = (0..usable.len()).filter(|i| !chosen.contains(i));
        let zone_use = |i: &usize| per_zone.get(&usable[*i].zone).copied().unwrap_or(0);
        let next = match spread {
            ZoneSpread::None => left.min(),
            ZoneSpread::Strict => left.filter(|i| zone_use(i) == 0).min(),
            // min_by_key returns the first of equal keys, i.e. the most preferred node.
            ZoneSpread::Preferred => left.min_by_key(zone_use),
        };
        let Some(i) = next else { break };
        *per_zone.entry(usable[i].zone).or_default() += 1;
        chosen.push(i);
    }
    chosen
}

fn failure(req: &Request, usable: &[Usable], rejected: &[(&str, String)]) -> PlacementError {
    let mut what = format!(
        "{} {} replica",
        format_size(req.size_bytes),
        kind_name(req.thin)
    );
    if let Some(pool) = &req.rules.pool {
        what.push_str(&format!(" in pool {pool}"));
    }
    let rejected: Vec<String> = rejected
        .iter()
        .map(|(n, why)| format!("{n} ({why})"))
        .collect();
    if usable.len() < req.count {
        return PlacementError::NotEnoughNodes {
            need: req.count,
            what,
            usable: usable
                .iter()
                .map(|u| match u.zone {
                    Some(z) if req.rules.zone_spread != ZoneSpread::None => {
                        format!("{} (zone {z}, {})", u.node, room_text(u.pool, req.thin))
                    }
                    _ => format!("{} ({})", u.node, room_text(u.pool, req.thin)),
                })
                .collect(),
            rejected,
        };
    }
    // Enough nodes, too few zones: only strict spread can fail this way.
    debug_assert_eq!(req.rules.zone_spread, ZoneSpread::Strict);
    let mut zones: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for u in usable {
        zones.entry(u.zone.unwrap_or("-")).or_default().push(u.node);
    }
    PlacementError::NotEnoughZones {
        need: req.count,
        what,
        zones: zones
            .iter()
            .map(|(z, nodes)| format!("{z} ({})", nodes.join(", ")))
            .collect(),
        rejected,
    }
}

/// Notes for zones that got more than one replica: under preferred spread, a user may want
/// to know that a zone's loss now takes two copies.
fn shared_zones(usable: &[Usable], chosen: &[usize]) -> Vec<String> {
    let mut per_zone: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for &i in chosen {
        if let Some(z) = usable[i].zone {
            per_zone.entry(z).or_default().push(usable[i].node);
        }
    }
    per_zone
        .into_iter()
        .filter(|(_, nodes)| nodes.len() > 1)
        .map(|(z, nodes)| {
            format!(
                "zone {z} holds {} replicas ({})",
                nodes.len(),
                nodes.join(", ")
            )
        })
        .collect()
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
#[path = "placement_tests.rs"]
mod tests;
