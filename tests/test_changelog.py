"""CHANGELOG.md: one entry per release, and what `ddp-new update` prints of it."""

from __future__ import annotations

from conftest import REPO

from generator.changelog import between, entries
from generator.releases import read_record

TEXT = """# Changelog

## Unreleased

- next

## 0.3.0 (2026-11-29)

- third

## 0.2.0 (2026-11-29)

- second

## 0.1.0 (2026-11-29)

- first
"""


def test_every_release_has_one_entry_newest_first() -> None:
    found = [version for version, _ in entries((REPO / "CHANGELOG.md").read_text())]
    assert found == ["Unreleased", *reversed(read_record(REPO))]


def test_an_update_gets_the_entries_after_its_version() -> None:
    assert [e.splitlines()[0] for e in between(TEXT, "v0.1.0", "v0.3.0")] == [
        "## 0.3.0 (2026-11-29)",
        "## 0.2.0 (2026-11-29)",
    ]
    assert between(TEXT, "v0.3.0", "v0.3.0") == []
    past = between(TEXT, "v0.2.0", "v0.3.0.post4+git-gabcdef012345")  # a build between releases
    assert [e.splitlines()[0] for e in past] == ["## Unreleased", "## 0.3.0 (2026-11-29)"]
    assert between(TEXT, "1f2e3d4c", "v0.3.0") == []  # a hash: nothing to compare with
