//! `cluster recover` meets replicas of two volumes that had the same name: one was deleted
//! while a node holding its replica was away (the replica stayed behind, an orphan), and
//! another was created under the name. Their replicas carry different uids (`hawser_api::uid`),
//! and mixing them in one record would hand an engine two volumes' blocks as one. So the
//! replicas found under a name are split by uid, and only the newest volume's become the
//! record (the uid whose replicas reached the highest epoch, then the newest journal); the
//! others are left as orphans, each with a line in the report.

use hawser_api::agent::ReplicaInventory;

/// A replica found, with its node.
type Found = (String, ReplicaInventory);

/// How new a replica's volume is: its epoch, then its journal's.
fn newness(f: &Found) -> (u64, u64, u64) {
    let j = f.1.journal.as_ref().map_or((0, 0), |j| (j.epoch, j.seq));
    (f.1.status.epoch, j.0, j.1)
}

/// Of the replicas `reps` found under the name `name`, those of one volume and its uid;
/// `None` (with why in `skipped`) when two volumes are equally new.
pub(super) fn newest_volume<'a>(
    name: &str,
    reps: Vec<&'a Found>,
    skipped: &mut Vec<String>,
) -> Option<(Option<String>, Vec<&'a Found>)> {
    let mut by_uid: Vec<(Option<String>, Vec<&'a Found>)> = Vec::new();
    for f in reps {
        let uid = f.1.status.volume_uid.clone();
        match by_uid.iter_mut().find(|(u, _)| *u == uid) {
            Some((_, v)) => v.push(f),
            None => by_uid.push((uid, vec![f])),
        }
    }
    if by_uid.len() == 1 {
        return by_uid.pop();
    }
    let best = |v: &Vec<&Found>| v.iter().map(|f| newness(f)).max().unwrap_or_default();
    by_uid.sort_by_key(|(_, v)| std::cmp::Reverse(best(v)));
    if best(&by_uid[0].1) == best(&by_uid[1].1) {
        skipped.push(format!(
            "volume {name}: its replicas belong to {} volumes of that name (uids {:?}), none \
             newer than the others; left alone",
            by_uid.len(),
            by_uid.iter().map(|(u, _)| u).collect::<Vec<_>>()
        ));
        return None;
    }
    let kept = by_uid.remove(0);
    for (uid, v) in by_uid {
        for f in v {
            skipped.push(format!(
                "replica {} on {}: of an older volume named {name} (uid {}), not the newest \
                 (uid {}); left as an orphan",
                f.1.status.replica_id,
                f.0,
                uid.as_deref().unwrap_or("none"),
                kept.0.as_deref().unwrap_or("none"),
            ));
        }
    }
    Some(kept)
}
