"""Measured, not promised: the reader's four questions (reader_paths.toml) on the default render,
and the house's rules in every task's render: the engine imports nothing from the package top,
no machinery template asks which task it is, no file over 250 lines, no import cycle.

`pytest -s tests/test_reader_paths.py` prints the figures (lines per question, files, src lines).
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, render

PATHS = tomllib.loads((REPO / "tests" / "reader_paths.toml").read_text())
MAX_LINES, MAX_FILES = 1000, 15  # the four paths together (issue 41)
MAX_FILE_LINES = 250

ALL_FEATURES = ["fsdp", "comm_hooks", "tools", "profiler"]
ALL_LAUNCHERS = ["local", "multinode", "slurm", "kubernetes"]
EVERYTHING = dict(features=ALL_FEATURES, launchers=ALL_LAUNCHERS, logger="mlflow")
RENDERS = {
    "default": {},
    "classifier": dict(task="classifier", **EVERYTHING),
    "image": dict(task="image", **EVERYTHING),
    "lm": dict(task="lm", **EVERYTHING),
}

# Files over MAX_FILE_LINES, by path under src/PKG/, and why they stay whole (split only to fit a
# number, a file would send its reader back and forth between two halves of one mechanism).
KNOWN_LONG: dict[str, str] = {}

MACHINERY_TEMPLATES = [
    *sorted((REPO / "template" / "src" / "{{package_name}}" / "engine").rglob("*")),
    *sorted((REPO / "template" / "src" / "{{package_name}}").glob("train.py*")),
    *sorted((REPO / "template" / "src" / "{{package_name}}").glob("step.py*")),
]
TASK_CONDITION = re.compile(r"\{%-?\s*(?:el)?if\b(?:(?!%\}).)*\btask\b", re.DOTALL)


@pytest.fixture(scope="module")
def rendered(template_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The package directory (src/PKG) of a render in RENDERS, rendered once per module."""
    cache: dict[str, Path] = {}

    def package(name: str) -> Path:
        if name not in cache:
            dest = render(template_dir, tmp_path_factory.mktemp(name) / "proj", **RENDERS[name])
            (found,) = [p for p in (dest / "src").iterdir() if (p / "__init__.py").exists()]
            cache[name] = found
        return cache[name]

    return package


def sources(package: Path) -> dict[str, Path]:
    """The package's Python files by path under src/PKG/ (engine/loop.py)."""
    return {p.relative_to(package).as_posix(): p for p in sorted(package.rglob("*.py"))}


def lines_of(package: Path, entry: str) -> tuple[str, set[int]]:
    """The file of a reader_paths.toml entry and the line numbers it covers; fails when gone."""
    file, _, name = entry.partition(":")
    path = package / file
    assert path.is_file(), f"reader_paths.toml: {entry}: no file {file} in the default render"
    text = path.read_text()
    if not name:
        return file, set(range(1, len(text.splitlines()) + 1))
    body: list[ast.stmt] = ast.parse(text).body
    node: ast.stmt | None = None
    for part in name.split("."):
        node = next((n for n in body if part in defined_names(n)), None)
        assert node is not None, f"reader_paths.toml: {entry}: no {part} in {file}"
        body = getattr(node, "body", [])
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return file, set(range(first, node.end_lineno + 1))


def defined_names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def measure(package: Path, entries: list[str]) -> tuple[int, int]:
    """Lines and files of a path, each line counted once however many entries cover it."""
    covered: dict[str, set[int]] = {}
    for entry in entries:
        file, lines = lines_of(package, entry)
        covered.setdefault(file, set()).update(lines)
    return sum(len(lines) for lines in covered.values()), len(covered)


def test_the_reader_paths_fit_the_targets(rendered: Callable[[str], Path]) -> None:
    package = rendered("default")
    everything: list[str] = []
    print()
    for key, question in PATHS.items():
        lines, files = measure(package, question["path"])
        everything += question["path"]
        print(f"reader path ({key}) {question['question']}: {lines} lines in {files} files")
    lines, files = measure(package, everything)
    total = sum(len(p.read_text().splitlines()) for p in sources(package).values())
    print(f"reader paths together: {lines} lines in {files} files (src/ of the default: {total})")
    assert lines <= MAX_LINES and files <= MAX_FILES, (
        f"the four reader paths take {lines} lines in {files} files; the target is at most"
        f" {MAX_LINES} lines in {MAX_FILES} files (tests/reader_paths.toml)"
    )


def test_every_path_entry_is_a_file_or_a_definition(rendered: Callable[[str], Path]) -> None:
    """The check itself: a name that is gone fails, so the list cannot silently go stale."""
    package = rendered("default")
    with pytest.raises(AssertionError, match="no no_such_function in step.py"):
        lines_of(package, "step.py:no_such_function")
    with pytest.raises(AssertionError, match="no missing in engine/parallel.py"):
        lines_of(package, "engine/parallel.py:wrap.missing")
    assert lines_of(package, "engine/paths.py:CHECKPOINT_NAME")[1]  # a constant counts too


@pytest.fixture(scope="module", params=list(RENDERS))
def package(request: pytest.FixtureRequest, rendered: Callable[[str], Path]) -> Path:
    return rendered(request.param)


def module_name(relative: str) -> str:
    """engine/loop.py -> engine.loop; engine/__init__.py -> engine; __init__.py -> ''."""
    parts = relative.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree: ast.Module, everywhere: bool) -> list[ast.Import | ast.ImportFrom]:
    """The module's imports: all of them, or those that run when it is imported (not those in a
    function, nor under `if TYPE_CHECKING:`)."""
    if everywhere:
        return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody
            todo += [s for handler in node.handlers for s in handler.body]
    return found


def targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, top: str) -> list[str]:
    """The package's modules an import names, relative to the package ('' = its __init__)."""
    if isinstance(node, ast.Import):
        named = [a.name for a in node.names]
    elif node.level == 0:
        named = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
    else:
        here = module.split(".") if module else []
        base = here if is_package else here[:-1]
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        root = ".".join([top, *base, *([node.module] if node.module else [])])
        named = [root] + [f"{root}.{a.name}" for a in node.names]
    return [n.removeprefix(top).removeprefix(".") for n in named if n == top or n.startswith(f"{top}.")]


def test_the_engine_imports_nothing_from_the_top(package: Path) -> None:
    wrong = []
    for relative, path in sources(package).items():
        if relative.startswith("engine/"):
            wrong += [f"{relative}:{line}" for line in top_imports(relative, path.read_text(), package.name)]
    assert not wrong, "engine/ imports from the package top:\n" + "\n".join(wrong)


def top_imports(relative: str, text: str, top: str) -> list[str]:
    """The imports of engine file `relative` that reach above engine/, as 'LINE: import'."""
    found = []
    for node in imports(ast.parse(text), everywhere=True):
        above = isinstance(node, ast.ImportFrom) and node.level >= 2
        named = targets(node, module_name(relative), relative.endswith("__init__.py"), top)
        if above or any(n != "engine" and not n.startswith("engine.") for n in named):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_import_check_sees_the_top_however_it_is_named() -> None:
    text = (
        "from . import dist\nfrom .config import RunConfig\nfrom pkg.engine import paths\n"
        "import torch\nfrom .. import task\nfrom ..model import build_model\n"
        "def late():\n    import pkg.data\n    from pkg import train\n"
    )
    assert top_imports("engine/verify.py", text, "pkg") == [
        "5: from .. import task",
        "6: from ..model import build_model",
        "8: import pkg.data",
        "9: from pkg import train",
    ]


def test_no_machinery_template_asks_for_the_task() -> None:
    """engine/ and the loop (train.py, step.py) are the same for every task; a task-only engine
    file may exist for its task (its name's condition), but not branch on it inside."""
    found = []
    for path in MACHINERY_TEMPLATES:
        if path.is_file() and path.suffix in (".py", ".jinja"):
            for match in TASK_CONDITION.finditer(path.read_text()):
                found.append(f"{path.relative_to(REPO)}: {match.group(0)}")
    assert len(MACHINERY_TEMPLATES) > 20
    assert not found, "machinery templates that branch on the task:\n" + "\n".join(found)


def test_no_file_over_250_lines(package: Path, request: pytest.FixtureRequest) -> None:
    lengths = {rel: len(p.read_text().splitlines()) for rel, p in sources(package).items()}
    long = {rel: n for rel, n in lengths.items() if n > MAX_FILE_LINES}
    name = request.node.callspec.params["package"]
    print(f"\n{name} render: src/ {sum(lengths.values())} lines in {len(lengths)} files;", end=" ")
    print(f"over {MAX_FILE_LINES}: {long or 'none'}")
    unexplained = {rel: n for rel, n in long.items() if rel not in KNOWN_LONG}
    assert not unexplained, f"files over {MAX_FILE_LINES} lines: {unexplained}"


def test_the_known_long_files_are_still_long(rendered: Callable[[str], Path]) -> None:
    """An entry of KNOWN_LONG that no render needs any more goes."""
    longest: dict[str, int] = {}
    for name in RENDERS:
        for rel, path in sources(rendered(name)).items():
            longest[rel] = max(longest.get(rel, 0), len(path.read_text().splitlines()))
    stale = [rel for rel in KNOWN_LONG if longest.get(rel, 0) <= MAX_FILE_LINES]
    assert not stale, f"no longer over {MAX_FILE_LINES} lines in any render: {stale}"


def test_no_import_cycle(package: Path) -> None:
    top, files = package.name, sources(package)
    modules = {module_name(rel): rel for rel in files}
    graph: dict[str, set[str]] = {}
    for module, rel in modules.items():
        nodes = imports(ast.parse(files[rel].read_text()), everywhere=False)
        named = {n for node in nodes for n in targets(node, module, rel.endswith("__init__.py"), top)}
        # A module's own packages are imported before it, whatever it names: not an edge.
        graph[module] = {n for n in named if n in modules and not is_within(module, n)}
    cycle = find_cycle(graph)
    assert not cycle, "an import cycle among the package's modules: " + " -> ".join(cycle)


def is_within(module: str, package: str) -> bool:
    """engine.loop is within engine, and every module within the top package ('')."""
    return package == "" or module == package or module.startswith(f"{package}.")


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """A cycle of the graph as a list of nodes (first == last), or [] if it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return []


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []
