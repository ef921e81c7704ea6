"""Migration to 0.2.0, run by copier after its merge: carry the user's edits of
configs/default.toml over to configs/example.toml, the name the file has since 0.2.0.

By then copier has deleted configs/default.toml (the new template has no such file) and written
the new configs/example.toml. A default.toml the user never edited needs nothing more: the
update only replaces it. An edited one is merged three ways into example.toml: what the old
version rendered (the base), the user's file and the new example.toml, with copier's conflict
labels; the deletion of default.toml is staged (git's record that the file moved). A user's own
example.toml was merged by copier already and is left alone.

Usage, in the project: python migrate_example_toml.py TEMPLATE_CLONE VERSION_FROM (copier.yml
passes them). It runs in the Python that runs copier, with copier's own dependencies only.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import copier
import yaml

OLD, NEW = "configs/default.toml", "configs/example.toml"


def committed(path: str) -> bytes | None:
    """The file as the project had it before the update (copier refuses a dirty project)."""
    proc = subprocess.run(["git", "show", f"HEAD:{path}"], capture_output=True)
    return proc.stdout if proc.returncode == 0 else None


def main(template: str, version_from: str) -> None:
    mine = committed(OLD)
    if mine is None or committed(NEW) is not None or not Path(NEW).is_file():
        return
    answers = yaml.safe_load(committed(".copier-answers.yml"))
    data = {key: value for key, value in answers.items() if not key.startswith("_")}
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp, "old")
        copier.run_copy(template, old, data=data, vcs_ref=version_from, defaults=True, quiet=True)
        base = old / OLD
        if base.read_bytes() == mine:
            return
        new = Path(tmp, "new.toml")
        new.write_bytes(Path(NEW).read_bytes())
        Path(NEW).write_bytes(mine)
        labels = ["-L", "before updating", "-L", "last update", "-L", "after updating"]
        merge = subprocess.run(["git", "merge-file", *labels, NEW, str(base), str(new)])
        if merge.returncode < 0 or merge.returncode > 127:
            sys.exit(f"git merge-file failed on {NEW}")
    subprocess.run(["git", "rm", "-q", "--cached", "--ignore-unmatch", "--", OLD], check=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
