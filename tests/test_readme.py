"""README.md's first screen: its test command is the one CI runs."""

from __future__ import annotations

import re

from conftest import REPO


def test_the_readmes_test_command_is_what_ci_runs() -> None:
    readme = (REPO / "README.md").read_text()
    commands = re.search(r"```bash\n(.*?)```", readme, re.S).group(1).strip().splitlines()
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    pytest_line = next(line for line in ci if line.startswith("python -m pytest"))
    assert commands[-1].endswith(f"&& {pytest_line}"), commands[-1]
    assert 'pip install -e ".[test]"' in commands[-1]
    assert any('pip install -q -e ".[test]"' in line for line in ci)
