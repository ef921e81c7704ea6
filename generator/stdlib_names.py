"""Write the standard library's module names into copier.yml's package_name validator.

    python -m generator.stdlib_names        # rewrite the list in copier.yml (maintainers)

copier.yml cannot import anything, so the names a package must not take are written out in it,
between two markers. They come from `sys.stdlib_module_names` of the Python that runs this,
joined with the names already there, so that running it on a newer Python keeps the modules an
older one still has (3.11's `imp`, say). tests/test_render.py checks that the list holds every
name of the Python that runs the tests. Other names the project imports (torch, numpy, ...) are
refused by `ddp-new` at render time: whatever the environment can import.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

COPIER_YML = Path(__file__).resolve().parents[1] / "copier.yml"
BEGIN = "{# the standard library: python -m generator.stdlib_names #}"
END = "{# end of the standard library #}"
INDENT = " " * 6
WIDTH = 170


def stdlib_names() -> list[str]:
    """The standard library's public modules that a package name could take."""
    return sorted(name for name in sys.stdlib_module_names if re.fullmatch(r"[a-z][a-z0-9_]*", name))


def listed_names(text: str) -> list[str]:
    """The names between the markers of copier.yml's text."""
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    return re.findall(r"[a-z][a-z0-9_]*", block.partition("'")[2].rpartition("'")[0])


def rewrite(text: str) -> str:
    """copier.yml's text with the list between the markers brought up to date."""
    names = sorted(set(stdlib_names()) | set(listed_names(text)))
    body = textwrap.fill("'" + " ".join(names) + "'", WIDTH, initial_indent=INDENT, subsequent_indent=INDENT)
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return f"{head}{BEGIN}{{% set stdlib =\n{body}.split() %}}{END}{tail}"


def main() -> None:
    text = COPIER_YML.read_text(encoding="utf-8")
    new = rewrite(text)
    if new != text:
        COPIER_YML.write_text(new, encoding="utf-8")
    print(f"{COPIER_YML}: {len(listed_names(new))} standard library names")


if __name__ == "__main__":
    main()
