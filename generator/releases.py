"""The template's version history, with its releases named, built without relying on git tags.

`ddp-new update` and plain `copier update` need the template as it was at the project's
version, and copier names versions by git tags: without them it records a bare commit hash,
prints versions such as 0.0.0.post70.dev0+e9ba9d6, and runs no migration. Tags do not travel
with every copy of a repository, so the releases are recorded in `releases.toml` instead, and
every history ddp-new builds (the wheel's bundle, or an editable checkout's) gets a tag
`vX.Y.Z` per recorded release. Only the standard library is used: the wheel build imports
this module too.
"""

from __future__ import annotations

import os
import re
import tempfile
import tomllib
from pathlib import Path

from generator.errors import EXIT_FAILED, GeneratorError
from generator.git import git

RECORD = "releases.toml"
VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
HASH = re.compile(r"^[0-9a-f]{40}$")
BETWEEN = re.compile(r"^(v\d+\.\d+\.\d+)-(\d+)-(g[0-9a-f]+)$")  # git describe: N commits after a release
TEMPLATE_PATHS = ("copier.yml", "template")  # what a render reads: equal trees render equally


def read_record(repo: Path) -> dict[str, str]:
    """The recorded releases, {version: full commit hash}, oldest first."""
    path = repo / RECORD
    if not path.is_file():
        return {}
    try:
        releases = tomllib.loads(path.read_text(encoding="utf-8")).get("releases", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise GeneratorError(f"{path}: {error}", exit_code=EXIT_FAILED) from None
    for version, commit in releases.items():
        if not VERSION.match(version) or not isinstance(commit, str) or not HASH.match(commit):
            raise GeneratorError(
                f"{path}: {version!r} = {commit!r} is not X.Y.Z = <40-digit commit hash>",
                exit_code=EXIT_FAILED,
            )
    return dict(sorted(releases.items(), key=lambda item: _key(item[0])))


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in VERSION.match(version).groups())


def release_tags(repo: Path) -> dict[str, str]:
    """{tag: commit} for the bundle: the record, plus any real vX.Y.Z tag, which must agree with it."""
    tags = {f"v{version}": commit for version, commit in read_record(repo).items()}
    for tag in git(repo, "tag", "--list", "v*").split():
        if not VERSION.match(tag[1:]):
            continue
        commit = git(repo, "rev-parse", f"{tag}^{{commit}}").strip()
        if tags.setdefault(tag, commit) != commit:
            raise GeneratorError(
                f"tag {tag} points at {commit[:12]} but {RECORD} records {tags[tag][:12]};"
                " correct one of them",
                exit_code=EXIT_FAILED,
            )
    return tags


def build_bundle(repo: Path, out: Path) -> tuple[str, list[str]]:
    """Write `repo`'s history as a git bundle with a tag per release; returns (version, warnings).

    The bundle's HEAD is what ddp-new renders: the newest release when the template at HEAD
    is identical to it (so projects record `_commit: vX.Y.Z`), else HEAD itself, a build
    between releases, N commits after release X.Y.Z. That HEAD gets the tag
    `vX.Y.Z.postN+git-gHASH`: plain copier updates to the newest version among the tags, and
    this one sorts above X.Y.Z and every earlier build (PEP 440), so `copier update` and
    `copier check-update` go where `ddp-new update` goes, never "downgrading" to X.Y.Z. A
    project records the tag as its `_commit`; later histories lack the tag but still resolve
    the name, by git's rule for names that end in `-g<hash>`.
    """
    tags = release_tags(repo)
    warnings = []
    with tempfile.TemporaryDirectory(prefix="ddp-new-history.") as tmp:
        git(tmp, "init", "-q", "--bare")
        git(tmp, "fetch", "-q", "--no-tags", str(repo.resolve()), "HEAD:refs/heads/main")
        head = git(tmp, "rev-parse", "refs/heads/main").strip()
        for tag, commit in tags.items():
            # Only HEAD's history was fetched: a release off it (or a shallow clone) is missing.
            if git(tmp, "cat-file", "-t", commit, check=False).strip() != "commit":
                warnings.append(f"{tag}: commit {commit[:12]} is not in HEAD's history; left out")
                continue
            git(tmp, "tag", tag, commit)
        render = _commit_to_render(tmp, head, tags)
        git(tmp, "update-ref", "refs/heads/main", render)
        git(tmp, "symbolic-ref", "HEAD", "refs/heads/main")
        version = git(tmp, "describe", "--tags", "--always", "--abbrev=12", "HEAD").strip()
        if between := BETWEEN.match(version):
            version = "{}.post{}+git-{}".format(*between.groups())
            git(tmp, "tag", version, "HEAD")
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        git(tmp, "bundle", "create", "-q", str(partial.resolve()), "HEAD", "--tags")
        os.replace(partial, out)
    return version, warnings


def _commit_to_render(repo: str, head: str, tags: dict[str, str]) -> str:
    """The newest release's commit if HEAD's template is the same as its, else HEAD."""
    present = [tag for tag in tags if git(repo, "tag", "--list", tag).strip()]
    if not present:
        return head
    newest = max(present, key=lambda tag: _key(tag[1:]))
    if all(_tree(repo, head, path) == _tree(repo, tags[newest], path) for path in TEMPLATE_PATHS):
        return tags[newest]
    return head


def _tree(repo: str, commit: str, path: str) -> str:
    return git(repo, "rev-parse", "-q", "--verify", f"{commit}:{path}", check=False).strip()


def tag_checkout(repo: Path) -> list[str]:
    """Create the missing release tags in a checkout (for plain `copier copy <this checkout>`)."""
    existing = set(git(repo, "tag", "--list", "v*").split())
    created = []
    for tag, commit in release_tags(repo).items():
        if tag not in existing and git(repo, "cat-file", "-t", commit, check=False).strip() == "commit":
            git(repo, "tag", tag, commit)
            created.append(tag)
    return created


if __name__ == "__main__":  # python -m generator.releases: tag this checkout's releases
    import sys

    try:
        made = tag_checkout(Path(__file__).resolve().parents[1])
    except GeneratorError as error:
        sys.exit(f"error: {error}")
    print(f"created tags: {', '.join(made)}" if made else "every recorded release is tagged already")
