//! How a store key and value become a custom resource, and back.
//!
//! Each kind of record has its own CRD, chosen by the key's first segment (`volumes/x` is the
//! `HawserVolume` named `x`); keys of any other shape are `HawserRecord`s. The object's name is
//! the rest of the key when that is a valid Kubernetes name, otherwise `h-` and 40 hex digits
//! of its SHA-256; the key itself is always kept in the `hawser.dev/key` annotation, which is
//! what reads return and check.
//!
//! A value that is a JSON object (every controller record) is stored as the resource's
//! `spec`, so `kubectl get -o yaml` and the printer columns show it, unless it holds an
//! integer beyond the API server's 64-bit signed range. It reads back as equal JSON, not the
//! same bytes: keys sorted (the API server keeps objects as maps) and an integral float such
//! as `1.0` written `1`, which deserializes to the same `f64`. Any other value is kept byte
//! for byte: UTF-8 text in `text`, anything else base64 in `data`.

use base64::Engine as _;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

/// API group and version of every Hawser CRD.
pub const GROUP: &str = "hawser.dev";
pub const VERSION: &str = "v1alpha1";
/// The annotation holding an object's store key.
pub const KEY_ANNOTATION: &str = "hawser.dev/key";
/// The label naming the store lease an object was written under.
pub const LEASE_LABEL: &str = "hawser.dev/lease";
/// The label on every object and Lease the store writes.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "hawser");

/// A kind of record and the key prefix it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    /// Keys starting with this (empty for the catch-all kind).
    pub prefix: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
}

/// Every kind; the last, with an empty prefix, takes the keys no other kind does.
pub const KINDS: [Kind; 4] = [
    Kind {
        prefix: "volumes/",
        plural: "hawservolumes",
        kind: "HawserVolume",
    },
    Kind {
        prefix: "nodes/",
        plural: "hawsernodes",
        kind: "HawserNode",
    },
    Kind {
        prefix: "node-settings/",
        plural: "hawsernodesettings",
        kind: "HawserNodeSetting",
    },
    Kind {
        prefix: "",
        plural: "hawserrecords",
        kind: "HawserRecord",
    },
];

fn records() -> &'static Kind {
    &KINDS[KINDS.len() - 1]
}

/// The kind a key is stored as, and the object name.
pub fn locate(key: &str) -> (&'static Kind, String) {
    for k in &KINDS[..KINDS.len() - 1] {
        if let Some(rest) = key.strip_prefix(k.prefix) {
            return (k, object_name(rest));
        }
    }
    (records(), object_name(key))
}

/// The kinds that may hold keys starting with `prefix`.
pub fn kinds_for_prefix(prefix: &str) -> Vec<&'static Kind> {
    let typed = &KINDS[..KINDS.len() - 1];
    let mut out: Vec<&'static Kind> = typed
        .iter()
        .filter(|k| k.prefix.starts_with(prefix) || prefix.starts_with(k.prefix))
        .collect();
    if !typed.iter().any(|k| prefix.starts_with(k.prefix)) {
        out.push(records());
    }
    out
}

/// `rest` if it is a valid object name (RFC 1123 subdomain) not of the hashed form, else
/// the hashed form.
pub fn object_name(rest: &str) -> String {
    if is_subdomain(rest) && !is_hashed(rest) {
        return rest.to_string();
    }
    let digest = Sha256::digest(rest.as_bytes());
    let hex: String = digest.iter().take(20).map(|b| format!("{b:02x}")).collect();
    format!("h-{hex}")
}

fn is_hashed(name: &str) -> bool {
    name.len() == 42
        && name.starts_with("h-")
        && name[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A lowercase RFC 1123 subdomain of at most 253 characters.
fn is_subdomain(s: &str) -> bool {
    let ok_char = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            match (b.first(), b.last()) {
                (Some(&f), Some(&l)) => {
                    ok_char(f) && ok_char(l) && b.iter().all(|&c| ok_char(c) || c == b'-')
                }
                _ => false,
            }
        })
}

/// `/apis/hawser.dev/v1alpha1/namespaces/NS/PLURAL[/NAME]`.
pub fn path(namespace: &str, kind: &Kind, name: Option<&str>) -> String {
    let base = format!(
        "/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{}",
        kind.plural
    );
    match name {
        Some(n) => format!("{base}/{n}"),
        None => base,
    }
}

/// The body of a create or update of `key`. `previous_status` is the `status` of the object
/// this one replaces, when known (see [`super::status`]).
pub fn encode(
    namespace: &str,
    key: &str,
    value: &[u8],
    lease_label: Option<&str>,
    resource_version: Option<u64>,
    previous_status: Option<&Value>,
) -> Value {
    let (kind, name) = locate(key);
    let mut labels = Map::new();
    labels.insert(MANAGED_BY.0.into(), MANAGED_BY.1.into());
    if let Some(l) = lease_label {
        labels.insert(LEASE_LABEL.into(), l.into());
    }
    let mut meta = json!({
        "name": name,
        "namespace": namespace,
        "annotations": {KEY_ANNOTATION: key},
        "labels": labels,
    });
    if let Some(rv) = resource_version {
        meta["resourceVersion"] = rv.to_string().into();
    }
    let mut obj = json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": kind.kind,
        "metadata": meta,
    });
    match structured(value) {
        Some(spec) => {
            let now = std::time::SystemTime::now();
            if let Some(st) = super::status::derive(kind.kind, &spec, previous_status, now) {
                obj["status"] = st;
            }
            obj["spec"] = spec;
        }
        None => match std::str::from_utf8(value) {
            Ok(text) => obj["text"] = text.into(),
            Err(_) => {
                obj["data"] = base64::engine::general_purpose::STANDARD
                    .encode(value)
                    .into()
            }
        },
    }
    obj
}

/// `value` as a JSON object the API server keeps (integers fit in an i64), or `None`.
fn structured(value: &[u8]) -> Option<Value> {
    fn exact(v: &Value) -> bool {
        match v {
            Value::Number(n) => n.is_i64() || n.is_f64(),
            Value::Array(a) => a.iter().all(exact),
            Value::Object(o) => o.values().all(exact),
            Value::Null | Value::Bool(_) | Value::String(_) => true,
        }
    }
    let v: Value = serde_json::from_slice(value).ok()?;
    (v.is_object() && exact(&v)).then_some(v)
}

/// Why an object in our resource is not a stored entry (made by hand, or by another program).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadObject {
    #[error("object without metadata")]
    NoMetadata,
    #[error("object {name} has no {} annotation", KEY_ANNOTATION)]
    NoKey { name: String },
    #[error("object {name} has no resourceVersion")]
    NoVersion { name: String },
    #[error("object {name}: {why}")]
    Spec { name: String, why: String },
    #[error("object {name}: data is not base64: {why}")]
    Data { name: String, why: String },
    #[error("object {name} has no spec, text or data")]
    NoValue { name: String },
}

/// A stored object as `(key, value, resource version)`.
pub fn decode(obj: &Value) -> Result<(String, Vec<u8>, u64), BadObject> {
    let meta = obj.get("metadata").ok_or(BadObject::NoMetadata)?;
    let name = || {
        meta.get("name")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_owned()
    };
    let key = meta
        .get("annotations")
        .and_then(|a| a.get(KEY_ANNOTATION))
        .and_then(Value::as_str)
        .ok_or_else(|| BadObject::NoKey { name: name() })?;
    let version = resource_version(obj).ok_or_else(|| BadObject::NoVersion { name: name() })?;
    let value = if let Some(spec) = obj.get("spec") {
        serde_json::to_vec(spec).map_err(|e| BadObject::Spec {
            name: name(),
            why: e.to_string(),
        })?
    } else if let Some(t) = obj.get("text").and_then(Value::as_str) {
        t.as_bytes().to_vec()
    } else if let Some(d) = obj.get("data").and_then(Value::as_str) {
        base64::engine::general_purpose::STANDARD
            .decode(d)
            .map_err(|e| BadObject::Data {
                name: name(),
                why: e.to_string(),
            })?
    } else {
        return Err(BadObject::NoValue { name: name() });
    };
    Ok((key.to_string(), value, version))
}

/// `metadata.resourceVersion` as a number (the API server's are etcd revisions, > 0).
pub fn resource_version(obj: &Value) -> Option<u64> {
    obj.get("metadata")?
        .get("resourceVersion")?
        .as_str()?
        .parse::<u64>()
        .ok()
        .filter(|&v| v > 0)
}

/// The lease label of an object, if any.
pub fn lease_of(obj: &Value) -> Option<&str> {
    obj.get("metadata")?
        .get("labels")?
        .get(LEASE_LABEL)?
        .as_str()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn keys_map_to_kinds_and_names() {
        let (k, n) = locate("volumes/pvc-1");
        assert_eq!((k.plural, n.as_str()), ("hawservolumes", "pvc-1"));
        assert_eq!(locate("nodes/n1.example").1, "n1.example");
        assert_eq!(locate("node-settings/a").0.plural, "hawsernodesettings");
        assert_eq!(locate("leader").0.plural, "hawserrecords");
        assert_eq!(locate("leader").1, "leader");
        // Not valid names: hashed, deterministically, and distinct.
        for key in [
            "auth/tokens",
            "volumes/A",
            "volumes/a/x",
            "volumes/",
            "k_1",
            "-a",
            "a-",
        ] {
            let n = locate(key).1;
            assert!(is_hashed(&n), "{key} -> {n}");
            assert_eq!(n, locate(key).1);
        }
        assert_ne!(locate("volumes/a/x").1, locate("volumes/a/y").1);
        // A name that looks hashed is hashed itself, so it cannot collide with one.
        let h = locate("a/b").1;
        assert_ne!(locate(&h).1, h);
        assert!(is_subdomain(&"a".repeat(253)) && !is_subdomain(&"a".repeat(254)));
        assert!(!is_subdomain("a..b") && !is_subdomain("a.-b"));
    }

    #[test]
    fn prefixes_select_kinds() {
        let plurals =
            |p: &str| -> Vec<&str> { kinds_for_prefix(p).iter().map(|k| k.plural).collect() };
        assert_eq!(plurals("volumes/"), ["hawservolumes"]);
        assert_eq!(plurals("volumes/a"), ["hawservolumes"]);
        assert_eq!(plurals("volumes"), ["hawservolumes", "hawserrecords"]);
        assert_eq!(
            plurals("node"),
            ["hawsernodes", "hawsernodesettings", "hawserrecords"]
        );
        assert_eq!(plurals("").len(), 4);
        assert_eq!(plurals("controllers/"), ["hawserrecords"]);
    }

    #[test]
    fn values_round_trip() {
        let cases: [&[u8]; 6] = [
            br#"{"b":1,"a":{"x":[1,-2,null,"s",true]}}"#,
            b"1",
            b"http://10.0.0.1:9400",
            b"",
            &[0, 159, 255],
            br#"{"big":18446744073709551615}"#,
        ];
        for v in cases {
            let obj = encode("ns", "volumes/a", v, Some("l1"), Some(7), None);
            let text = serde_json::to_vec(&obj).unwrap();
            let back: Value = serde_json::from_slice(&text).unwrap();
            let (key, value, version) = decode(&back).unwrap();
            assert_eq!((key.as_str(), version), ("volumes/a", 7));
            let same_json = serde_json::from_slice::<Value>(&value).ok()
                == serde_json::from_slice::<Value>(v).ok();
            assert!(value == v || same_json, "{v:?}");
            assert_eq!(lease_of(&back), Some("l1"));
        }
        // Where each goes.
        assert!(encode("ns", "k", br#"{"a":1}"#, None, None, None)
            .get("spec")
            .is_some());
        assert!(encode("ns", "k", br#"{"a":1.5}"#, None, None, None)
            .get("spec")
            .is_some());
        assert!(encode(
            "ns",
            "k",
            br#"{"a":[9223372036854775808]}"#,
            None,
            None,
            None
        )
        .get("text")
        .is_some());
        assert!(encode("ns", "k", &[0xff], None, None, None)
            .get("data")
            .is_some());
    }

    #[test]
    fn bad_objects_are_errors() {
        let name = || "?".to_owned();
        for (bad, why) in [
            (json!({}), BadObject::NoMetadata),
            (
                json!({"metadata": {"name": "a"}}),
                BadObject::NoKey { name: "a".into() },
            ),
            (
                json!({"metadata": {"annotations": {KEY_ANNOTATION: "k"}, "resourceVersion": "x"}, "text": ""}),
                BadObject::NoVersion { name: name() },
            ),
            (
                json!({"metadata": {"annotations": {KEY_ANNOTATION: "k"}, "resourceVersion": "3"}}),
                BadObject::NoValue { name: name() },
            ),
        ] {
            assert_eq!(decode(&bad), Err(why), "{bad}");
        }
        let not_base64 = json!({"metadata": {"annotations": {KEY_ANNOTATION: "k"}, "resourceVersion": "3"}, "data": "!"});
        let err = decode(&not_base64).unwrap_err();
        assert!(matches!(err, BadObject::Data { .. }), "{err}");
        assert!(err.to_string().contains("not base64"), "{err}");
    }
}
