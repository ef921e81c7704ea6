"""The interactive questions, driven through a pseudo-terminal as a person at a terminal answers them."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from conftest import REPO, answers_of, work_dir, write_template

pexpect = pytest.importorskip("pexpect")
pytestmark = pytest.mark.skipif(os.name == "nt", reason="pseudo-terminals are POSIX")


FEATURES_HINT = "(any of fsdp, comm_hooks, tools, profiler; comma-separated, '-' for none)"


def spawn(*args: str | Path, cwd: Path) -> pexpect.spawn:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm"}
    return pexpect.spawn(
        sys.executable, ["-m", "generator", *map(str, args)], cwd=str(cwd), env=env,
        encoding="utf-8", timeout=60, dimensions=(24, 80),
    )  # fmt: skip


def answer(child: pexpect.spawn, key: str, text: str) -> None:
    child.expect_exact(f"  {key}")
    child.expect_exact("]: ")
    child.sendline(text)


def finish(child: pexpect.spawn) -> tuple[int, str]:
    """Exit status and output, without the terminal's control sequences."""
    output = child.read()
    child.close()
    return child.exitstatus, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output)


def test_questions_answered_at_the_terminal(tmp_path: Path) -> None:
    child = spawn("proj", cwd=tmp_path)
    answer(child, "package_name", "")  # Enter: the default, proj
    answer(child, "description", 'Says "hi"')
    answer(child, "author_name", "")
    answer(child, "author_email", "")
    answer(child, "python_version", "3.12")
    answer(child, "license", "Apache-2.0")
    answer(child, "copyright_year", "")
    answer(child, "task", "")
    answer(child, "precision", "fp8")
    child.expect_exact("precision: 'fp8' is not one of: bf16, fp16, fp32")
    answer(child, "precision", "fp32")
    child.expect_exact(f"  features {FEATURES_HINT} [-]: ")  # a new project starts lean
    child.sendline("fsdp,gpu")
    child.expect_exact("features: 'gpu' is not one of: fsdp, comm_hooks, tools, profiler")
    answer(child, "features", "fsdp,tools")
    answer(child, "strategy", "fsdp")  # asked: fsdp is among the features
    answer(child, "grad_accum_steps", "two")
    child.expect_exact("grad_accum_steps: expected an integer, got 'two'")
    answer(child, "grad_accum_steps", "0")
    child.expect_exact("grad_accum_steps must be an integer from 1 to 1024")
    answer(child, "grad_accum_steps", "3")
    answer(child, "launchers", "local,slurm")
    answer(child, "logger", "")
    child.expect_exact("include_ci (yes/no) [yes]: ")  # the hint and the error agree
    child.sendline("maybe")
    child.expect_exact("include_ci: expected yes or no (or true, false), got 'maybe'")
    answer(child, "include_ci", "no")
    status, output = finish(child)
    assert status == 0, output
    answers = answers_of(tmp_path / "proj")
    assert answers["package_name"] == "proj" and answers["description"] == 'Says "hi"'
    assert (answers["precision"], answers["grad_accum_steps"], answers["license"]) == (
        "fp32",
        3,
        "Apache-2.0",
    )
    assert answers["launchers"] == ["local", "slurm"] and answers["include_ci"] is False
    assert answers["features"] == ["fsdp", "tools"] and answers["strategy"] == "fsdp"
    assert not (tmp_path / "proj" / ".github").exists()


def test_strategy_is_not_asked_without_fsdp(tmp_path: Path) -> None:
    child = spawn("proj", cwd=tmp_path)
    for key in ("package_name", "description", "author_name", "author_email", "python_version", "license",
                "copyright_year", "task", "precision"):  # fmt: skip
        answer(child, key, "")
    child.expect_exact(f"  features {FEATURES_HINT} [-]: ")
    child.sendline("-")  # none, as Enter: the lean core
    child.expect_exact("  grad_accum_steps")
    assert "strategy" not in child.before
    child.sendcontrol("c")
    status, output = finish(child)
    assert status == 130, output
    assert list(tmp_path.iterdir()) == []


def test_the_image_task_chosen_at_the_terminal(tmp_path: Path) -> None:
    child = spawn("proj", cwd=tmp_path)
    for key in ("package_name", "description", "author_name", "author_email", "python_version", "license",
                "copyright_year"):  # fmt: skip
        answer(child, key, "")
    answer(child, "task", "image")
    for key in ("precision", "features", "grad_accum_steps", "launchers", "logger", "include_ci"):
        answer(child, key, "")
    status, output = finish(child)
    assert status == 0, output
    assert answers_of(tmp_path / "proj")["task"] == "image"
    package = tmp_path / "proj" / "src" / "proj"
    assert (package / "engine" / "images.py").is_file() and not (package / "engine" / "datafiles.py").exists()


def test_a_wrong_answer_gets_the_whole_message_and_is_asked_again(tmp_path: Path) -> None:
    child = spawn("proj", cwd=tmp_path)
    answer(child, "package_name", "Bad Name")
    # Longer than the 80-column terminal: printed in full, on lines of its own.
    message = "package_name must be a lowercase Python identifier: a-z, 0-9 and '_', starting"
    child.expect_exact(message)
    answer(child, "package_name", "__main__")
    child.expect_exact(message)
    for shadowing in ("copy", "pyparsing", "sitecustomize"):  # stdlib, a dependency's, a start-up hook
        answer(child, "package_name", shadowing)
        child.expect_exact(f"package_name '{shadowing}' would shadow")
    answer(child, "package_name", "good_name")
    answer(child, "description", "")
    answer(child, "author_name", "")
    answer(child, "author_email", "a\\q@b.co")  # a backslash breaks pyproject.toml
    child.expect_exact("author_email must look like name@example.com")
    child.expect_exact("  author_email")
    child.sendcontrol("c")
    status, output = finish(child)
    assert status == 130, output
    assert not (tmp_path / "proj").exists()


def test_ctrl_c_at_a_prompt_is_one_line_and_130(tmp_path: Path) -> None:
    child = spawn("proj", cwd=tmp_path)
    child.expect_exact("  package_name")
    child.sendcontrol("c")
    status, output = finish(child)
    assert status == 130, output
    assert output.strip().splitlines()[-1] == "interrupted; nothing was written"
    assert "Traceback" not in output and "AnswersMap" not in output
    assert list(tmp_path.iterdir()) == []


def spawn_script_at_prompt(script: str, cwd: Path) -> pexpect.spawn:
    """A Python `script` run in a terminal, once it shows the prompt '  name: ' and reads a line."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = pexpect.spawn(sys.executable, ["-c", script], cwd=str(cwd), env=env, encoding="utf-8", timeout=30)
    child.expect_exact("  name: ")
    return child


def test_ctrl_c_that_comes_before_the_read_is_not_lost(tmp_path: Path) -> None:
    """A Ctrl-C between writing the prompt and reading the answer runs Python's handler, which
    only sets a flag; input() would then wait for a line. Here the handler runs on another
    thread while the prompt reads (the main thread blocks SIGINT), the same situation."""
    script = (
        "import signal, threading\n"
        "from generator.terminal import read_line\n"
        "threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
        "try:\n"
        "    read_line('  name: ')\n"
        "except KeyboardInterrupt:\n"
        "    print('stopped')\n"
    )
    child = spawn_script_at_prompt(script, tmp_path)
    child.sendcontrol("c")
    status, output = finish(child)
    assert status == 0 and output.strip().endswith("stopped"), output


def test_a_line_read_at_the_terminal_is_the_answer(tmp_path: Path) -> None:
    script = "from generator.terminal import read_line\nprint(repr(read_line('  name: ')))\n"
    child = spawn_script_at_prompt(script, tmp_path)
    child.sendline("caf\u00e9 au lait")
    status, output = finish(child)
    assert status == 0 and output.strip().splitlines()[-1] == "'caf\u00e9 au lait'", output


def test_bad_name_is_refused_before_any_question(tmp_path: Path) -> None:
    child = spawn("name-", cwd=tmp_path)
    status, output = finish(child)
    assert status == 2, output
    assert "end with a letter or digit" in output and "package_name" not in output


def test_ctrl_c_at_a_third_party_templates_prompt(tmp_path: Path) -> None:
    """Other templates keep copier's own prompts; Ctrl-C there is one line and 130 too."""
    questions = "project_name:\n  type: str\ncolour:\n  type: str\n  help: Colour\n"
    template = write_template(tmp_path / "tpl", questions, **{"README.md.jinja": "{{ colour }}\n"})
    work = work_dir(tmp_path)
    child = spawn("proj", "--template", template, cwd=work)
    child.expect_exact("Colour")
    child.sendcontrol("c")
    status, output = finish(child)
    assert status == 130, output
    assert output.strip().splitlines()[-1] == "interrupted; nothing was written"
    assert "AnswersMap" not in output
    assert list(work.iterdir()) == []
