"""Validate Kubernetes manifests with kubernetes-validate, offline.

    validate.py FILE...

Every YAML document of every FILE is checked against the schemas the
package bundles, strictly (a field the API does not have is an error, as
`kubectl apply --validate=strict` makes it), for every Kubernetes release
the package has schemas for. Prints one JSON object: {"versions": [...],
"documents": [{"file", "index", "kind", "doc", "errors": {VERSION: MESSAGE
or null}}]}, the documents as parsed, so the caller can check the rules
that tie fields together. Exit 0 whatever the verdicts; 2 on a file that
is not YAML.
"""

import json
import sys

import kubernetes_validate
import yaml
from kubernetes_validate import utils
from packaging.version import Version


def main() -> int:
    # One schema folder per release, and a strict one beside it: each
    # release once.
    versions = sorted(set(utils.all_versions()), key=Version)
    out = {"versions": versions, "documents": []}
    for path in sys.argv[1:]:
        try:
            with open(path) as f:
                docs = [d for d in yaml.safe_load_all(f) if d is not None]
        except yaml.YAMLError as e:
            print(f"{path}: not YAML: {e}", file=sys.stderr)
            return 2
        for index, doc in enumerate(docs):
            errors = {}
            for version in versions:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                    errors[version] = None
                except kubernetes_validate.ValidationError as e:
                    where = ".".join(str(p) for p in e.path)
                    errors[version] = f"{where}: {e.message}"
                except (kubernetes_validate.SchemaNotFoundError, KeyError, TypeError) as e:
                    errors[version] = f"no schema: {getattr(e, 'message', e)}"
            out["documents"].append({"file": path, "index": index,
                                     "kind": doc.get("kind") if isinstance(doc, dict) else None,
                                     "doc": doc, "errors": errors})
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
