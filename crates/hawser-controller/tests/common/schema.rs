//! A checker for the subset of JSON Schema that `docs/openapi.json` uses: `$ref` (local),
//! `type` (one or a list), `enum`, `properties`, `required`, `additionalProperties`
//! (boolean or schema), `items`, `oneOf`, `minimum`. Anything else in the document is an
//! error, so the document cannot silently use a keyword this checker ignores.

use serde_json::Value;

/// Keywords the checker understands (or that only document).
const KNOWN: &[&str] = &[
    "$ref",
    "type",
    "enum",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "oneOf",
    "minimum",
    "description",
];

/// Validates `value` against `schema`; returns every violation, each with its JSON path.
pub fn validate(doc: &Value, schema: &Value, value: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    check(doc, schema, value, "$", &mut errors);
    errors
}

fn check(doc: &Value, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    let Some(s) = schema.as_object() else {
        errors.push(format!("{at}: schema is not an object: {schema}"));
        return;
    };
    for k in s.keys() {
        if !KNOWN.contains(&k.as_str()) {
            errors.push(format!(
                "{at}: schema keyword {k:?} is not supported by the checker"
            ));
        }
    }
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        match resolve(doc, r) {
            Some(target) => check(doc, target, value, at, errors),
            None => errors.push(format!("{at}: unresolvable $ref {r}")),
        }
    }
    if let Some(t) = s.get("type") {
        let types: Vec<&str> = match t {
            Value::String(one) => vec![one.as_str()],
            Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if !types.iter().any(|t| has_type(value, t)) {
            errors.push(format!("{at}: expected type {t}, got {value}"));
            return;
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        if !e.contains(value) {
            errors.push(format!(
                "{at}: {value} is not one of {}",
                Value::from(e.clone())
            ));
        }
    }
    if let (Some(min), Some(n)) = (s.get("minimum").and_then(Value::as_f64), value.as_f64()) {
        if n < min {
            errors.push(format!("{at}: {n} is below the minimum {min}"));
        }
    }
    if let Some(options) = s.get("oneOf").and_then(Value::as_array) {
        let matching = options
            .iter()
            .filter(|o| validate(doc, o, value).is_empty())
            .count();
        if matching != 1 {
            errors.push(format!(
                "{at}: {matching} of the oneOf schemas match {value}"
            ));
        }
    }
    check_object(doc, s, value, at, errors);
    if let (Some(items), Some(arr)) = (s.get("items"), value.as_array()) {
        for (i, v) in arr.iter().enumerate() {
            check(doc, items, v, &format!("{at}[{i}]"), errors);
        }
    }
}

fn check_object(
    doc: &Value,
    s: &serde_json::Map<String, Value>,
    value: &Value,
    at: &str,
    errors: &mut Vec<String>,
) {
    let Some(obj) = value.as_object() else {
        return;
    };
    let props = s.get("properties").and_then(Value::as_object);
    for r in s
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let r = r.as_str().unwrap_or_default();
        if !obj.contains_key(r) {
            errors.push(format!("{at}: required property {r:?} is missing"));
        }
    }
    for (k, v) in obj {
        let sub = format!("{at}.{k}");
        match (props.and_then(|p| p.get(k)), s.get("additionalProperties")) {
            (Some(p), _) => check(doc, p, v, &sub, errors),
            (None, Some(Value::Bool(false))) => {
                errors.push(format!("{sub}: property not in the document"))
            }
            (None, Some(extra @ Value::Object(_))) => check(doc, extra, v, &sub, errors),
            (None, _) => {}
        }
    }
}

fn has_type(v: &Value, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        _ => false,
    }
}

/// A local reference `#/a/b`.
pub fn resolve<'a>(doc: &'a Value, r: &str) -> Option<&'a Value> {
    doc.pointer(r.strip_prefix('#')?)
}
