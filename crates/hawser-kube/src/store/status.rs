//! What `kubectl` shows of a record: a `status` derived from it at every write, never read
//! back by the store (reads return `spec`).
//!
//! - `HawserVolume`: `replicas` (`node=state,...`), `inSync` (`1/2`), and the conditions
//!   `Degraded` (fewer replicas in sync than the volume has) and `Attached`.
//! - `HawserNode`: `lastHeartbeat` as a timestamp, so its printer column reads "4s".
//!
//! A condition keeps its `lastTransitionTime` while its status stays the same; the previous
//! conditions come from the object as this client last read or wrote it (the controller
//! always reads a record before it compare-and-swaps it).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::time::micro_time;

/// The `status` of a record of kind `kind` whose spec is `spec`.
pub fn derive(
    kind: &str,
    spec: &Value,
    previous: Option<&Value>,
    now: SystemTime,
) -> Option<Value> {
    match kind {
        "HawserVolume" => Some(volume(spec, previous, now)),
        "HawserNode" => {
            let ms = spec.get("last_seen_ms")?.as_u64()?;
            let t = UNIX_EPOCH + Duration::from_millis(ms);
            Some(json!({"lastHeartbeat": rfc3339(t)}))
        }
        _ => None,
    }
}

/// A timestamp without sub-seconds (the `date-time` format of printer columns and
/// conditions).
fn rfc3339(t: SystemTime) -> String {
    let micro = micro_time(t);
    // "2006-01-02T15:04:05.000000Z" -> "2006-01-02T15:04:05Z"
    match micro.split_once('.') {
        Some((secs, _)) => format!("{secs}Z"),
        None => micro,
    }
}

fn volume(spec: &Value, previous: Option<&Value>, now: SystemTime) -> Value {
    let replicas: &[Value] = spec
        .get("replicas")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let str_of = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
    let states: Vec<String> = replicas
        .iter()
        .map(|r| format!("{}={}", str_of(r, "node"), str_of(r, "state")))
        .collect();
    let in_sync = replicas
        .iter()
        .filter(|r| r.get("state").and_then(Value::as_str) == Some("in_sync"))
        .count();
    let wanted = spec
        .get("replica_count")
        .and_then(Value::as_u64)
        .unwrap_or(replicas.len() as u64);
    let lagging: Vec<&String> = states.iter().filter(|s| !s.ends_with("=in_sync")).collect();
    let degraded = (in_sync as u64) < wanted;
    let degraded_cond = condition(
        "Degraded",
        degraded,
        if degraded {
            "ReplicasNotInSync"
        } else {
            "AllReplicasInSync"
        },
        if lagging.is_empty() {
            format!("{in_sync} of {wanted} replicas in sync")
        } else {
            format!(
                "{in_sync} of {wanted} replicas in sync; not in sync: {}",
                lagging
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    );
    let attached = spec.get("state").and_then(Value::as_str) == Some("attached");
    let node = spec
        .get("attached_node")
        .and_then(Value::as_str)
        .unwrap_or("-");
    let epoch = spec.get("epoch").and_then(Value::as_u64).unwrap_or(0);
    let attached_cond = condition(
        "Attached",
        attached,
        if attached {
            "EngineRunning"
        } else {
            "Detached"
        },
        if attached {
            format!("attached on {node}, epoch {epoch}")
        } else {
            "not attached".to_string()
        },
    );
    let conditions: Vec<Value> = [degraded_cond, attached_cond]
        .into_iter()
        .map(|c| with_transition(c, previous, now))
        .collect();
    json!({
        "replicas": states.join(","),
        "inSync": format!("{in_sync}/{wanted}"),
        "conditions": conditions,
    })
}

fn condition(kind: &str, on: bool, reason: &str, message: String) -> Value {
    json!({
        "type": kind,
        "status": if on { "True" } else { "False" },
        "reason": reason,
        "message": message,
    })
}

/// `c` with the `lastTransitionTime` of the previous condition of its type if its status
/// did not change, else now.
fn with_transition(mut c: Value, previous: Option<&Value>, now: SystemTime) -> Value {
    let before = previous
        .and_then(|p| p.get("conditions"))
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|p| p.get("type") == c.get("type")));
    let kept = before
        .filter(|p| p.get("status") == c.get("status"))
        .and_then(|p| p.get("lastTransitionTime"))
        .and_then(Value::as_str)
        .map(str::to_string);
    c["lastTransitionTime"] = kept.unwrap_or_else(|| rfc3339(now)).into();
    c
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn spec(states: &[&str], state: &str) -> Value {
        let replicas: Vec<Value> = states
            .iter()
            .enumerate()
            .map(|(i, s)| json!({"node": format!("n{i}"), "state": s}))
            .collect();
        json!({"replica_count": 2, "state": state, "attached_node": "n0", "epoch": 3, "replicas": replicas})
    }

    #[test]
    fn volume_status_and_transitions() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let t1 = t0 + Duration::from_secs(60);
        let s0 = derive(
            "HawserVolume",
            &spec(&["in_sync", "in_sync"], "attached"),
            None,
            t0,
        )
        .unwrap();
        assert_eq!(s0["replicas"], "n0=in_sync,n1=in_sync");
        assert_eq!(s0["inSync"], "2/2");
        assert_eq!(s0["conditions"][0]["status"], "False");
        assert_eq!(s0["conditions"][1]["message"], "attached on n0, epoch 3");
        // n1 falls behind: Degraded turns True now; Attached keeps its time.
        let s1 = derive(
            "HawserVolume",
            &spec(&["in_sync", "outdated"], "attached"),
            Some(&s0),
            t1,
        )
        .unwrap();
        assert_eq!(s1["conditions"][0]["status"], "True");
        assert_eq!(s1["conditions"][0]["lastTransitionTime"], rfc3339(t1));
        assert!(s1["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .contains("n1=outdated"));
        assert_eq!(s1["conditions"][1]["lastTransitionTime"], rfc3339(t0));
        // Garbage specs give a status, never a panic.
        for bad in [
            json!({}),
            json!({"replicas": 3}),
            json!({"replicas": [1, null]}),
        ] {
            assert!(derive("HawserVolume", &bad, Some(&json!(7)), t0).is_some());
        }
    }

    #[test]
    fn node_heartbeat_is_a_timestamp() {
        let s = derive(
            "HawserNode",
            &json!({"last_seen_ms": 1_000_000_000_500u64}),
            None,
            UNIX_EPOCH,
        );
        assert_eq!(s.unwrap()["lastHeartbeat"], "2001-09-09T01:46:40Z");
        assert!(derive("HawserNode", &json!({}), None, UNIX_EPOCH).is_none());
        assert!(derive("HawserRecord", &json!({}), None, UNIX_EPOCH).is_none());
    }
}
