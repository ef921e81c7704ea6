"""README.md agrees with the code: the test command CI runs, the table of copier.yml's questions."""

from __future__ import annotations

import re

from conftest import REPO

from generator.questions import load_questions


def test_the_readmes_test_command_is_what_ci_runs() -> None:
    readme = (REPO / "README.md").read_text()
    commands = re.search(r"```bash\n(.*?)```", readme, re.S).group(1).strip().splitlines()
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    pytest_line = next(line for line in ci if line.startswith("python -m pytest"))
    assert commands[-1].endswith(f"&& {pytest_line}"), commands[-1]
    assert 'pip install -e ".[test]"' in commands[-1]
    assert any('pip install -q -e ".[test]"' in line for line in ci)


def question_table() -> dict[str, str]:
    """README.md's table of the questions: each key in its first column -> its whole row."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("### The questions", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            for key in re.findall(r"`([a-z_]+)`", first):
                rows[key] = line
    return rows


def test_the_readmes_question_table_has_every_question_and_choice() -> None:
    """Every question of copier.yml has a row, and its row names each of the question's choices."""
    questions = load_questions(REPO)
    rows = question_table()
    assert sorted(rows) == sorted(questions), "README.md's question table and copier.yml differ"
    for key, question in questions.items():
        missing = [
            c
            for c in question.choices
            if not re.search(rf"(?<![\w.-]){re.escape(str(c))}(?![\w-])", rows[key])
        ]
        assert missing == [], f"README.md's row for {key} lacks {missing}"
