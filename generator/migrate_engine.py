"""Migration to 0.9.0, run by copier after its merge: carry the owner's edits of the machinery
files that 0.9.0 moved from the package's top into engine/ (and the tools into tools/).

By then copier has written the new files and deleted the old ones (the new template has none of
them at the top). An old file the owner never edited needs nothing more. An edited one is merged
three ways into its new path: what the old version rendered (the base), the owner's file and the
new file, with copier's conflict labels; the old path's deletion is staged (git's record that the
file moved) and one line names the move. A conflict stays as <<<<<<< markers in the new file,
which `ddp-new update` reports. A new path the project already had, or one its answers no longer
render, is left alone: the update then keeps the old file and reports it.

Usage, in the project: python migrate_engine.py TEMPLATE_CLONE VERSION_FROM (copier.yml passes
them). It runs in the Python that runs copier, with copier's own dependencies only.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import copier
import yaml

ENGINE = (
    "best.py checkpoint.py config.py dist.py files.py keyed.py loading.py lock.py metrics.py"
    " nonfinite.py optim.py options.py parallel.py preemption.py rendezvous.py resume.py state.py"
    " verify.py comm_hooks.py fsdp.py profiling.py launch.py tracking.py datafiles.py images.py"
    " syncbn.py sources.py token_cache.py tokenizer.py corpus.txt"
).split()
TOOLS = ["check_sync.py", "doctor.py", "doctor_checks.py", "plot.py"]
MOVED = {name: f"engine/{name}" for name in ENGINE} | {name: f"tools/{name}" for name in TOOLS}
LABELS = ["-L", "before updating", "-L", "last update", "-L", "after updating"]


def committed(path: str) -> bytes | None:
    """The file as the project had it before the update (copier refuses a dirty project)."""
    proc = subprocess.run(["git", "show", f"HEAD:{path}"], capture_output=True)
    return proc.stdout if proc.returncode == 0 else None


def edited_moves(package: str) -> list[tuple[str, str, bytes]]:
    """(old path, new path, the owner's file) of each moved file the project had committed."""
    found = []
    for name, new in MOVED.items():
        old, new = f"src/{package}/{name}", f"src/{package}/{new}"
        mine = committed(old)
        if mine is not None and committed(new) is None and Path(new).is_file():
            found.append((old, new, mine))
    return found


def carry(old: str, new: str, mine: bytes, base: Path) -> None:
    """Merge the owner's edits of `old` into `new` (base: the old version's render of it)."""
    theirs = base.with_name(base.name + ".new")
    theirs.write_bytes(Path(new).read_bytes())
    Path(new).write_bytes(mine)
    merge = subprocess.run(["git", "merge-file", *LABELS, new, str(base), str(theirs)])
    if merge.returncode < 0 or merge.returncode > 127:
        sys.exit(f"git merge-file failed on {new}")
    subprocess.run(["git", "rm", "-q", "--cached", "--ignore-unmatch", "--", old], check=True)
    if merge.returncode:
        print(f"  moved    {old} -> {new}: your edits conflict there; edit its <<<<<<< markers")
    else:
        print(f"  moved    {old} -> {new}: your edits carried over")


def main(template: str, version_from: str) -> None:
    answers = yaml.safe_load(committed(".copier-answers.yml"))
    moves = edited_moves(answers["package_name"])
    if not moves:
        return
    data = {key: value for key, value in answers.items() if not key.startswith("_")}
    with tempfile.TemporaryDirectory() as tmp:
        rendered = Path(tmp, "old")
        copier.run_copy(template, rendered, data=data, vcs_ref=version_from, defaults=True, quiet=True)
        for old, new, mine in moves:
            base = rendered / old
            if base.is_file() and base.read_bytes() != mine:
                carry(old, new, mine, base)


if __name__ == "__main__":
    main(*sys.argv[1:])
