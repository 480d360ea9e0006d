#!/usr/bin/env python3
"""Splits a kube-apiserver's OpenAPI v2 document (/openapi/v2) into one JSON schema per kind,
in kubeconform's layout (`<kind><-group-prefix>-<version>.json`, lower case), each holding
the definitions it needs. Strict: an object with declared properties allows no others, so
`kubeconform -strict` catches a misspelt field in a chart.

usage: openapi2schemas.py OPENAPI.json OUT_DIR
"""
import copy
import json
import os
import sys

QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


def convert(node):
    """Swagger 2 quirks to JSON schema: int-or-string, quantities, strictness."""
    if isinstance(node, list):
        return [convert(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: convert(v) for k, v in node.items()}
    if out.get("format") == "int-or-string" or out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.pop("format", None)
        out["oneOf"] = [{"type": "string"}, {"type": "integer"}]
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def refs(node, found):
    if isinstance(node, dict):
        r = node.get("$ref")
        if isinstance(r, str) and r.startswith("#/definitions/"):
            found.add(r[len("#/definitions/"):])
        for v in node.values():
            refs(v, found)
    elif isinstance(node, list):
        for v in node:
            refs(v, found)


def closure(name, defs):
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n in seen or n not in defs:
            continue
        seen.add(n)
        found = set()
        refs(defs[n], found)
        todo.extend(found - seen)
    return seen


def main():
    src, out_dir = sys.argv[1], sys.argv[2]
    with open(src) as f:
        doc = json.load(f)
    defs = {k: convert(v) for k, v in doc["definitions"].items()}
    if QUANTITY in defs:
        defs[QUANTITY] = {"oneOf": [{"type": "string"}, {"type": "number"}]}
    os.makedirs(out_dir, exist_ok=True)
    written = 0
    for name, schema in defs.items():
        for gvk in doc["definitions"][name].get("x-kubernetes-group-version-kind", []):
            group, kind, version = gvk.get("group", ""), gvk["kind"], gvk["version"]
            suffix = f"-{version}" if not group else f"-{group.split('.')[0]}-{version}"
            body = copy.deepcopy(schema)
            body["definitions"] = {n: defs[n] for n in closure(name, defs)}
            body["$schema"] = "http://json-schema.org/draft-07/schema#"
            path = os.path.join(out_dir, f"{kind.lower()}{suffix}.json")
            with open(path, "w") as f:
                json.dump(body, f)
            written += 1
    print(f"{written} schemas in {out_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
