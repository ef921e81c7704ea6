"""Wheel build hook: ship the template's version history as a git bundle.

`ddp-new update` needs the template as it was when a project was rendered, on any
machine and offline, so the wheel carries the history of this repository in
`generator/_bundled/template.bundle`, with a tag `vX.Y.Z` for every release recorded in
`releases.toml` (generator/releases.py; the checkout's own tags may be missing). A build
outside a git checkout (from an sdist) ships without it: rendering works, updating does not.
"""

from __future__ import annotations

import sys
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
        sys.path.insert(0, str(root))  # the build environment has the source, not the package
        from generator.releases import build_bundle

        bundle = Path(tempfile.mkdtemp()) / "template.bundle"
        rendered, warnings = build_bundle(root, bundle)
        for warning in warnings:
            self.app.display_warning(warning)
        self.app.display_info(f"template history bundled; the wheel renders {rendered}")
        build_data["force_include"][str(bundle)] = "generator/_bundled/template.bundle"
