"""Where the bundled template comes from, so that projects can be updated later.

The template's version history ships inside the wheel as a git bundle,
`_bundled/template.bundle`, with a tag `vX.Y.Z` per release (releases.py: the tags are made
from `releases.toml`, not taken from the checkout, which may have none). Projects record a
path that is the same on every machine, `~/.local/share/ddp-new/template.bundle`: a
symbolic link that ddp-new points at the bundle of the installed package each time it runs.
So:

- plain `copier update` works offline on the machine that rendered the project, and keeps
  working after `pip install -U ddp-new` (the link's target is replaced in place);
- `ddp-new update` works on any machine, a teammate's fresh one included: it creates the
  link first, and the bundle holds the old version copier needs to compute the diff.

In a source checkout (an editable install) the bundle is made from the checkout's
committed history on each run, the same way, so a render never records a commit that does
not exist.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from generator import __version__
from generator.errors import EXIT_FAILED, GeneratorError
from generator.git import git
from generator.questions import PACKAGE_DIR

LINK = "~/.local/share/ddp-new/template.bundle"  # recorded as _src_path in every project
VERSION_TAG = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")


def link_path() -> Path:
    return Path(LINK).expanduser()


def packaged_bundle() -> Path | None:
    """The bundle to render from: the wheel's, a test's (DDP_NEW_BUNDLE), or one made from the checkout."""
    override = os.environ.get("DDP_NEW_BUNDLE")
    if override:
        return Path(override).resolve()
    shipped = PACKAGE_DIR / "_bundled" / "template.bundle"
    if shipped.is_file():
        return shipped
    checkout = PACKAGE_DIR.parent
    if (checkout / ".git").exists() and (checkout / "copier.yml").is_file():
        from generator.releases import build_bundle

        out = link_path().parent / "dev" / "template.bundle"
        try:
            build_bundle(checkout, out)
        except OSError as error:
            raise _home_error(error) from None
        return out
    return None  # a wheel built without git history: renders work, updates do not


def _home_error(error: OSError) -> GeneratorError:
    return GeneratorError(
        f"cannot write {link_path().parent}: {error.strerror}. ddp-new keeps the link to its"
        " template history there; make it writable (or set HOME to a writable directory)",
        exit_code=EXIT_FAILED,
    )


def point_link_at(bundle: Path) -> str:
    """Make LINK lead to `bundle` (atomically) and return LINK, the path to record."""
    try:
        return _point_link_at(bundle)
    except OSError as error:
        raise _home_error(error) from None


def _point_link_at(bundle: Path) -> str:
    link = link_path()
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() and link.resolve() == bundle.resolve():
        return LINK
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        tmp.symlink_to(bundle.resolve())
    except OSError:  # no symbolic links here (some Windows setups): keep a copy instead
        tmp.write_bytes(bundle.read_bytes())
    os.replace(tmp, link)
    return LINK


def version_tags(bundle: Path) -> tuple[list[str], bool]:
    """Release tags `vX.Y.Z` in the bundle, oldest first, and whether it also holds a HEAD."""
    heads = git(tempfile.gettempdir(), "bundle", "list-heads", str(bundle)).split()
    tags = [ref.removeprefix("refs/tags/") for ref in heads if ref.startswith("refs/tags/")]
    releases = [tag for tag in tags if VERSION_TAG.match(tag)]
    releases.sort(key=lambda tag: tuple(int(n) for n in VERSION_TAG.match(tag).groups()))
    return releases, "HEAD" in heads


def pick_ref(bundle: Path) -> str:
    """The template version this ddp-new renders: the bundle's HEAD, which the build set to the
    newest release when the template is unchanged since (releases.build_bundle); a bundle
    without HEAD: this ddp-new's own release, else the newest release in it."""
    releases, has_head = version_tags(bundle)
    if has_head or not releases:
        return "HEAD"
    if f"v{__version__}" in releases:
        return f"v{__version__}"
    return releases[-1]


def bundled_source() -> tuple[str, str | None]:
    """(src, vcs_ref) to render the bundled template: its newest release, else its HEAD."""
    bundle = packaged_bundle()
    if bundle is None:
        from generator.questions import bundled_template

        return str(bundled_template()), None
    return point_link_at(bundle), pick_ref(bundle)
