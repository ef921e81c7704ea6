"""Refresh the TrainJob CRD that tests/test_kubernetes.py checks k8s/trainjob.yaml against.

    python k8s/crd/refresh.py v2.3.0     # the Kubeflow Trainer release your cluster runs

Downloads the TrainJob CRD (manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml) and the
LICENSE of github.com/kubeflow/trainer at that tag, branch or commit, and writes them beside this
script. The CRD's `description` texts are dropped (documentation only, two thirds of its size);
every field, type, limit and rule stays. Its header names the commit it came from.
`--from FILE --commit SHA` takes a CRD file you already have instead of downloading one.
"""

import argparse
import hashlib
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPOSITORY = "kubeflow/trainer"
CRD = "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml"
HERE = Path(__file__).resolve().parent


def download(url: str, accept: str = "*/*") -> bytes:
    request = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def commit_of(ref: str) -> str:
    """The commit a tag, branch or commit names (GitHub's API)."""
    url = f"https://api.github.com/repos/{REPOSITORY}/commits/{ref}"
    return download(url, accept="application/vnd.github.sha").decode().strip()


def raw(commit: str, path: str) -> bytes:
    return download(f"https://raw.githubusercontent.com/{REPOSITORY}/{commit}/{path}")


def without_descriptions(node: Any) -> Any:
    """The schema without its `description` texts. A field named "description" (a schema,
    not a text) stays."""
    if isinstance(node, dict):
        return {
            key: without_descriptions(value)
            for key, value in node.items()
            if not (key == "description" and isinstance(value, str))
        }
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    return node


def vendored(upstream: bytes, ref: str, commit: str) -> str:
    """The CRD file as kept here: upstream's license header, where it came from, the CRD."""
    text = upstream.decode()
    lines = text.splitlines()
    notice = lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))]
    crd = without_descriptions(yaml.safe_load(text))
    header = [
        *notice,
        "",
        f"# The TrainJob CRD of https://github.com/{REPOSITORY} ({ref}, commit {commit}),",
        f"# {CRD}, sha256 {hashlib.sha256(upstream).hexdigest()}.",
        "# Changed: the `description` texts are removed; nothing else. License: LICENSE here.",
        "# tests/test_kubernetes.py validates k8s/trainjob.yaml against it; refresh.py updates it.",
    ]
    body = yaml.safe_dump(crd, sort_keys=False, width=100)
    return "\n".join(header) + "\n---\n" + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="tag, branch or commit of kubeflow/trainer, e.g. v2.3.0")
    parser.add_argument("--from", dest="source", type=Path, help="a CRD file instead of GitHub's")
    parser.add_argument("--commit", help="with --from: the commit the file is from")
    parser.add_argument("--dest", type=Path, default=HERE, help="folder to write (this one)")
    args = parser.parse_args(argv)
    if args.source and not args.commit:
        parser.error("--from needs --commit: the commit the file came from")
    try:
        if args.source:
            commit, upstream, license_text = args.commit, args.source.read_bytes(), None
        else:
            commit = commit_of(args.ref)
            upstream, license_text = raw(commit, CRD), raw(commit, "LICENSE")
        text = vendored(upstream, args.ref, commit)
    except (OSError, yaml.YAMLError) as err:
        where = args.source or f"{REPOSITORY} at {args.ref}"
        print(f"error: cannot refresh the CRD from {where}: {err}", file=sys.stderr)
        return 1
    (args.dest / Path(CRD).name).write_text(text)
    if license_text is not None:
        (args.dest / "LICENSE").write_bytes(license_text)
    print(f"wrote {args.dest / Path(CRD).name} ({args.ref}, commit {commit})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
