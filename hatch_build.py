"""Wheel build hook: ship the template's version history as a git bundle.

`ddp-new update` needs the template as it was when a project was rendered, on any
machine and offline, so the wheel carries every release tag of this repository in
`generator/_bundled/template.bundle`. A build outside a git checkout (from an sdist)
ships without it: rendering works, updating does not.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class TemplateBundleHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel" or version == "editable":
            return  # an editable install bundles its checkout at run time
        root = Path(self.root)
        if not (root / ".git").exists():
            self.app.display_warning("not a git checkout: the wheel ships no template history")
            return
        self._check_release_tag(root)
        bundle = Path(tempfile.mkdtemp()) / "template.bundle"
        subprocess.run(["git", "bundle", "create", "-q", str(bundle), "HEAD", "--tags"], cwd=root, check=True)
        build_data["force_include"][str(bundle)] = "generator/_bundled/template.bundle"

    def _check_release_tag(self, root: Path) -> None:
        """A release tag on HEAD must name the package version: one version for package and template."""
        tags = subprocess.run(
            ["git", "tag", "--points-at", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.split()
        version = self.metadata.version
        for tag in tags:
            if re.fullmatch(r"v\d+\.\d+\.\d+", tag) and tag != f"v{version}":
                raise RuntimeError(f"HEAD is tagged {tag} but the package version is {version}")
