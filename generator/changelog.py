"""What an update brings, from CHANGELOG.md: the entries between the project's version and the new one.

CHANGELOG.md ships with ddp-new (beside copier.yml, in the wheel and in a checkout). Each entry
starts with a line `## X.Y.Z (date)`, or `## Unreleased` for what a build between releases
(`vX.Y.Z.postN+git-gHASH`) carries beyond X.Y.Z.
"""

from __future__ import annotations

import re
from pathlib import Path

HEADING = re.compile(r"^## (Unreleased|\d+\.\d+\.\d+)\b.*$", re.MULTILINE)
VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(.*)$")


def _version(text: str) -> tuple[tuple[int, int, int], bool] | None:
    """(X, Y, Z) and whether `text` is a build past that release; None for a bare commit hash."""
    found = VERSION.match(text)
    if found is None:
        return None
    return (int(found[1]), int(found[2]), int(found[3])), bool(found[4])


def entries(text: str) -> list[tuple[str, str]]:
    """(version or "Unreleased", the entry's text with its heading) in the file's order."""
    heads = list(HEADING.finditer(text))
    ends = [h.start() for h in heads[1:]] + [len(text)]
    return [(h[1], text[h.start() : end].strip()) for h, end in zip(heads, ends, strict=True)]


def between(text: str, old: str, new: str) -> list[str]:
    """The entries an update from version `old` to `new` brings, newest first; [] if either
    version is a bare commit hash (nothing to compare)."""
    was, now = _version(old), _version(new)
    if was is None or now is None:
        return []
    picked = []
    for version, entry in entries(text):
        if version == "Unreleased":
            if now[1]:  # a build past the newest release
                picked.append(entry)
            continue
        release = _version(version)
        if release is not None and was[0] < release[0] <= now[0]:
            picked.append(entry)
    return picked


def notes(template_root: Path, old: str, new: str) -> str:
    """The text `ddp-new update` prints after updating: the entries, or "" if there are none."""
    path = template_root / "CHANGELOG.md"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return ""
    picked = between(text, old, new)
    if not picked:
        return ""
    return f"What changed (from {path.name}; read the steps for code you wrote):\n\n" + "\n\n".join(picked)
