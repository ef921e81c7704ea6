"""The ddp-new command: help, version, options, and refusing bad input without writing anything."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, answers_of, cli, render, work_dir, write_template

from generator import __version__


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_version() -> None:
    result = cli("--version")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"ddp-new {__version__}"


def test_help_lists_commands_and_options() -> None:
    result = cli("--help")
    assert result.exit_code == 0, result.output
    for word in ("new", "options", "ddp-new NAME"):
        assert word in result.output
    result = cli("new", "--help")
    assert result.exit_code == 0, result.output
    for option in ("--defaults", "--data", "--template", "--force", "--dest", "--trust", "--vcs-ref"):
        assert option in result.output


def test_options_lists_every_question() -> None:
    result = cli("options", "--json")
    assert result.exit_code == 0, result.output
    questions = {q["key"]: q for q in json.loads(result.output)}
    expected = {
        "project_name", "package_name", "description", "author_name", "author_email",
        "python_version", "precision", "grad_accum_steps", "launchers", "logger", "task",
        "include_ci", "license", "features", "strategy",
    }  # fmt: skip
    assert expected <= set(questions)
    assert questions["precision"]["choices"] == ["bf16", "fp16", "fp32"]
    assert questions["launchers"]["multiselect"] is True
    assert questions["features"]["multiselect"] is True
    assert questions["features"]["choices"] == ["fsdp", "comm_hooks", "tools", "profiler"]
    assert all(q["help"] for q in questions.values())
    text = cli("options").output
    assert "launchers (str, several of)" in text and "choices: local, multinode, slurm" in text
    assert "features (str, several of)" in text and "choices: fsdp, comm_hooks, tools, profiler" in text
    assert "strategy (str)" in text and "choices: ddp, fsdp" in text
    assert "asked only when: 'fsdp' in features" in text


def test_options_says_what_computed_defaults_mean() -> None:
    """Not copier.yml's Jinja: what the default is, or what it is computed from."""
    import datetime

    text = cli("options").output
    assert "{{" not in text and "{%" not in text, text
    defaults = {}
    for block in text.split("\n"):
        if not block.startswith(" "):
            key = block.split(" ")[0]
        elif block.strip().startswith("default: "):
            defaults[key] = block.strip().removeprefix("default: ")
    assert defaults["project_name"] == "the project's directory name (NAME)"
    assert defaults["package_name"] == "computed from project_name"
    assert defaults["copyright_year"] == f"{datetime.date.today().year} (from today's date)"
    assert defaults["include_ci"] == "yes"  # as the prompt shows it
    assert defaults["launchers"] == "local,multinode,slurm"  # as --data takes it
    assert defaults["features"] == (
        "none for a new project; fsdp,comm_hooks,tools,profiler when updating a project rendered"
        " before this question that recorded strategy"
    )


@pytest.mark.parametrize(
    ("raw", "value"),
    [("", []), ("tools", ["tools"]), ("tools,profiler", ["tools", "profiler"]),
     (" fsdp , comm_hooks ", ["fsdp", "comm_hooks"]), ("[tools, fsdp]", ["tools", "fsdp"])],
)  # fmt: skip
def test_features_data_is_a_list(raw: str, value: list[str]) -> None:
    """`--data features=` is none (the lean core); a comma-separated or YAML list is several."""
    from generator.questions import bundled_template, load_questions, parse_data

    assert parse_data([f"features={raw}"], load_questions(bundled_template())) == {"features": value}


def test_readme_documents_every_question() -> None:
    from generator.questions import bundled_template, load_questions

    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("### The questions") : readme.index("### Exit statuses")]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    documented = {key for cell in rows for key in re.findall(r"`(\w+)`", cell)}
    assert documented == set(load_questions(bundled_template()))


@pytest.mark.parametrize("args", [["-b"], ["new"], ["update", "--nope"], ["options", "--jsn"], ["a", "b"]])
def test_usage_errors_are_one_line(args: list[str], tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "generator", *args], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert re.fullmatch(r"error: .+ \(see ddp-new (new|update|options) --help\)\n", proc.stderr), proc.stderr
    assert listing(tmp_path) == []


@pytest.mark.parametrize(("raw", "value"), [("yes", True), ("No", False), ("true", True), ("false", False),
                                            ("y", True), ("n", False)])  # fmt: skip
def test_yes_no_and_true_false_are_both_answers(raw: str, value: bool) -> None:
    from generator.questions import Question

    assert Question(key="include_ci", type="bool").parse(raw) is value


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["options"], ["new", "--help"]])
def test_startup_imports_neither_torch_nor_copier(args: list[str]) -> None:
    code = (
        "import sys\nfrom generator.cli import main\nsys.argv = ['ddp-new', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'copier'})\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    assert "HEAVY []" in out.stdout, out.stdout


def test_defaults_render_into_name(tmp_path: Path, template_dir: Path) -> None:
    result = cli("demo-proj", "-y", "--template", template_dir, cwd=tmp_path)
    assert result.exit_code == 0, result.output
    answers = answers_of(tmp_path / "demo-proj")
    assert answers["project_name"] == "demo-proj"
    assert answers["package_name"] == "demo_proj"
    assert answers["features"] == [] and "strategy" not in answers  # the lean core
    assert not (tmp_path / "demo-proj" / "src" / "demo_proj" / "tools").exists()
    assert "demo_proj.train" in result.output  # next steps name the entry point
    assert listing(tmp_path)[0] == "demo-proj"  # no temporary directory left beside it


def test_data_sets_answers(tmp_path: Path, template_dir: Path) -> None:
    project = render(
        template_dir, tmp_path / "p", precision="fp32", grad_accum_steps=4, launchers=["local", "slurm"],
        include_ci="no", package_name="custom_pkg", features=["fsdp", "tools"], strategy="fsdp",
    )  # fmt: skip
    answers = answers_of(project)
    assert answers["features"] == ["fsdp", "tools"] and answers["strategy"] == "fsdp"
    assert (project / "src" / "custom_pkg" / "tools" / "doctor.py").is_file()
    assert not (project / "src" / "custom_pkg" / "engine" / "profiling.py").exists()
    assert answers["precision"] == "fp32"
    assert answers["grad_accum_steps"] == 4
    assert answers["launchers"] == ["local", "slurm"]
    assert answers["include_ci"] is False
    assert (project / "src" / "custom_pkg").is_dir()


def test_bundled_template_renders(tmp_path: Path) -> None:
    result = cli("bundled", "-y", "--vcs-ref", "HEAD", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "bundled" / "src" / "bundled" / "train.py").is_file()


def test_no_terminal_without_defaults_is_a_clear_error(tmp_path: Path, template_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "generator", "p", "--template", template_dir],
        cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "--defaults" in proc.stderr and "Traceback" not in proc.stderr
    assert listing(tmp_path) == []


BAD_INPUTS = [
    # (arguments after the project name, expected exit status, words in the message)
    (["my-pkg", "--data", "package_name=my-pkg"], 2, "package_name must be a lowercase Python identifier"),
    (["p", "--data", "package_name=class"], 2, "is a Python keyword"),
    (["p", "--data", "package_name=1abc"], 2, "package_name must be a lowercase Python identifier"),
    (["p", "--data", "package_name="], 2, "package_name must be a lowercase Python identifier"),
    (["p", "--data", "package_name=../x"], 2, "package_name must be a lowercase Python identifier"),
    (["p", "--data", "package_name=torch"], 2, "would shadow"),
    ([""], 2, "project name is empty"),
    (["a/b"], 2, "is a path"),
    (["../x"], 2, "is a path"),
    (["a\\b"], 2, "is a path"),
    (["x" * 300], 2, "the limit is 64"),
    (["CON"], 2, "reserved device name"),
    (["nul.txt"], 2, "reserved device name"),
    (["a\udcff"], 2, "not valid UTF-8"),
    (["-bad"], 2, "No such option"),
    (["1abc"], 2, "start with a letter"),
    (["name-"], 2, "end with a letter or digit"),
    (["p", "--data", "package_name=copy"], 2, "would shadow"),
    (["p", "--data", "package_name=tqdm"], 2, "would shadow"),
    (["p", "--data", "package_name=pyparsing"], 2, "would shadow"),  # matplotlib imports it
    (["p", "--data", "package_name=sitecustomize"], 2, "would shadow"),  # run at every start-up
    (["p", "--data", "package_name=__main__"], 2, "package_name must be a lowercase Python identifier"),
    (["p", "--data", "author_email=a\\q@b.co"], 2, "author_email must look like"),  # breaks TOML
    (["p", "--data", "author_email=a\x01@b.co"], 2, "author_email must look like"),
    (["p", "--data", "description=two\nlines"], 2, "description must be one line"),
    (["p", "--data", "nosuchkey=1"], 2, "unknown question"),
    (["p", "--data", "precision=fp8"], 2, "'fp8' is not one of: bf16, fp16, fp32"),
    (["p", "--data", "launchers=local,mpi"], 2, "'mpi' is not one of"),
    (["p", "--data", "features=tools,gpu"], 2, "--data features: 'gpu' is not one of: fsdp, comm_hooks"),
    # strategy is asked only with fsdp: copier would render the answer once and not record it
    (["p", "--data", "strategy=fsdp"], 2, "--data strategy: the question is asked only when 'fsdp' in"),
    (["p", "--data", "license=Proprietary", "--data", "copyright_year=2020"], 2, "only when license !="),
    (["p", "--data", "logger=neptune"], 2, "'neptune' is not one of"),
    (["p", "--data", "grad_accum_steps=0"], 2, "grad_accum_steps must be an integer from 1 to 1024"),
    (["p", "--data", "grad_accum_steps=two"], 2, "expected an integer"),
    (["p", "--data", "include_ci=maybe"], 2, "include_ci: expected yes or no (or true, false), got 'maybe'"),
    (["p", "--data", "author_email=nobody"], 2, "author_email must look like"),
    (["p", "--data", "project_name=q"], 2, "set the project name as NAME"),
    (["p", "--data", "noequals"], 2, "--data expects key=value"),
    (["p", "--template", "/nonexistent/template"], 2, "does not exist"),
]


@pytest.mark.parametrize(("args", "status", "message"), BAD_INPUTS, ids=lambda v: repr(v)[:40])
def test_bad_input_is_refused_and_nothing_written(
    tmp_path: Path, template_dir: Path, args: list[str], status: int, message: str
) -> None:
    work = work_dir(tmp_path)
    if "--template" not in args:
        args = [*args, "--template", str(template_dir)]
    proc = subprocess.run(
        [sys.executable, "-m", "generator", *args, "--defaults"],
        cwd=work, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == status, stderr
    assert message in stderr
    assert "Traceback" not in stderr
    assert listing(work) == []


def test_not_a_template_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tpl").mkdir()
    result = cli("p", "-y", "--template", tmp_path / "tpl", cwd=tmp_path)
    assert result.exit_code == 2
    assert "not a copier template" in result.output
    assert not (tmp_path / "p").exists()


def test_non_empty_target_needs_force(tmp_path: Path, template_dir: Path) -> None:
    target = tmp_path / "p"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    result = cli("p", "-y", "--template", template_dir, cwd=tmp_path)
    assert result.exit_code == 2
    assert "not empty" in result.output and "--force" in result.output
    assert listing(tmp_path) == ["p", "p/notes.txt"]

    result = cli("p", "-y", "--template", template_dir, "--force", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert (target / "notes.txt").read_text() == "mine"  # the user's own file stays
    assert (target / ".copier-answers.yml").is_file()


def test_empty_target_is_used(tmp_path: Path, template_dir: Path) -> None:
    (tmp_path / "p").mkdir()
    result = cli("p", "-y", "--template", template_dir, cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p" / ".copier-answers.yml").is_file()


def test_target_that_is_a_file_is_refused(tmp_path: Path, template_dir: Path) -> None:
    (tmp_path / "p").write_text("file")
    result = cli("p", "-y", "--template", template_dir, "--force", cwd=tmp_path)
    assert result.exit_code == 2
    assert "is not a directory" in result.output


def test_dest_puts_the_project_elsewhere(tmp_path: Path, template_dir: Path) -> None:
    (tmp_path / "work").mkdir()
    result = cli(
        "p", "-y", "--template", template_dir, "--dest", tmp_path / "elsewhere", cwd=tmp_path / "work"
    )
    assert result.exit_code == 0, result.output
    assert answers_of(tmp_path / "elsewhere")["project_name"] == "p"
    assert listing(tmp_path / "work") == []


def test_failure_while_rendering_leaves_nothing(tmp_path: Path, template_dir: Path) -> None:
    files = {"ok.txt": "fine", "bad.txt.jinja": "{{ project_name | no_such_filter }}"}
    broken = write_template(tmp_path / "broken", "project_name:\n  type: str\n", **files)
    work = work_dir(tmp_path)
    result = cli("p", "-y", "--template", broken, cwd=work)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert listing(work) == []


def test_template_with_tasks_needs_trust(tmp_path: Path) -> None:
    questions = "project_name:\n  type: str\n_tasks:\n  - touch ran\n"
    tpl = write_template(tmp_path / "tpl", questions, **{"README.md": "hi"})
    work = work_dir(tmp_path)
    result = cli("p", "-y", "--template", tpl, cwd=work)
    assert result.exit_code == 4
    assert "--trust" in result.output
    assert listing(work) == []
    result = cli("p", "-y", "--template", tpl, "--trust", cwd=work)
    assert result.exit_code == 0, result.output
    assert (work / "p" / "ran").exists()


def test_nul_in_name_is_refused(tmp_path: Path, template_dir: Path) -> None:
    result = cli("a\0b", "-y", "--template", template_dir, cwd=tmp_path)
    assert result.exit_code == 2
    assert "NUL" in result.output
    assert listing(tmp_path) == []


def test_non_utf8_bytes_in_name_are_refused(tmp_path: Path, template_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable.encode(), b"-m", b"generator", b"caf\xe9", b"-y", b"--template", bytes(template_dir)],
        cwd=tmp_path, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert b"not valid UTF-8" in proc.stderr and b"Traceback" not in proc.stderr
    assert listing(tmp_path) == []


def test_read_only_parent_is_refused(tmp_path: Path, template_dir: Path) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    if os.geteuid() == 0:  # root ignores permission bits; the immutable attribute binds root too
        if subprocess.run(["chattr", "+i", parent], capture_output=True).returncode != 0:
            pytest.skip("running as root on a file system without chattr +i")
    else:
        parent.chmod(0o555)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "generator", "p", "-y", "--template", template_dir],
            cwd=parent, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    finally:
        subprocess.run(["chattr", "-i", parent], capture_output=True)
        parent.chmod(0o755)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot write to {parent}" in proc.stderr and "Traceback" not in proc.stderr
    assert listing(parent) == []


def test_dest_on_a_read_only_file_system_is_named(tmp_path: Path, template_dir: Path) -> None:
    """A read-only mount (root can write through permission bits, not through this)."""
    mount = tmp_path / "ro"
    mount.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1M", "tmpfs", mount], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "generator", "p", "-y", "--template", template_dir, "--dest", mount / "p"],
            cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        left = listing(mount)
    finally:
        subprocess.run(["umount", mount], check=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"error: cannot write to {mount}: it is on a read-only file system;"
        " put the project elsewhere (--dest PATH)\n"
    )
    assert left == []


def test_ctrl_c_while_rendering_leaves_nothing(tmp_path: Path) -> None:
    import signal
    import time

    endless = "{% for i in range(99999) %}{% for j in range(9999) %}{% endfor %}{% endfor %}"
    slow = write_template(tmp_path / "slow", "project_name:\n  type: str\n", **{"slow.txt.jinja": endless})
    work = work_dir(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "generator", "p", "-y", "--template", slow],
        cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        # A shell starts background jobs (`cmd &`) with SIGINT ignored, and children inherit
        # that: Python would then ignore Ctrl-C too. Give the CLI a terminal's default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not list(work.glob(".p.*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(work.glob(".p.*")), "rendering never started"
    time.sleep(0.5)  # well inside the slow file
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted; nothing was written" in stderr and "Traceback" not in stderr
    assert listing(work) == []


def test_two_renders_into_one_target_give_one_project(tmp_path: Path, template_dir: Path) -> None:
    """Started together, one render wins; the other exits 2 (busy, or target not empty)."""
    cmds = [
        [sys.executable, "-m", "generator", "p", "-y", "--template", template_dir, "--data", f"precision={p}"]
        for p in ("fp32", "fp16")
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True) for cmd in cmds]
    results = [(proc.wait(timeout=120), proc.stderr.read()) for proc in procs]
    assert sorted(status for status, _ in results) == [0, 2], results
    loser = next(err for status, err in results if status == 2)
    assert "rendering into" in loser or "not empty" in loser, loser
    precision = answers_of(tmp_path / "p")["precision"]  # whichever won, all of it is its
    config = (tmp_path / "p" / "src" / "p" / "engine" / "config.py").read_text()
    assert re.search(rf'precision: str = option\(\s*"{precision}"', config), config
    assert listing(tmp_path)[0] == "p" and not [n for n in listing(tmp_path) if n.startswith(".")]


def test_render_while_another_holds_the_target_is_refused(tmp_path: Path, template_dir: Path) -> None:
    from generator.lock import claim

    lock = tmp_path / ".p.ddp-new.lock"
    with claim(lock, f"rendering into {tmp_path / 'p'}"):
        result = cli("p", "-y", "--template", template_dir, cwd=tmp_path)
    assert result.exit_code == 2
    assert result.output == (
        f"error: another ddp-new (process {os.getpid()}) is rendering into {tmp_path / 'p'} right now"
        f" (lock {lock}); wait for it to finish or choose another name\n"
    )
    assert listing(tmp_path) == []


def test_force_over_a_file_where_a_directory_goes_changes_nothing(tmp_path: Path, template_dir: Path) -> None:
    target = tmp_path / "p"
    target.mkdir()
    (target / "src").write_text("my notes, not a directory")
    (target / "README.md").write_text("my readme")
    result = cli("p", "-y", "--force", "--template", template_dir, cwd=tmp_path)
    assert result.exit_code == 2, result.output
    assert f"{target / 'src'} is a file where the project has a directory" in result.output
    assert listing(tmp_path) == ["p", "p/README.md", "p/src"]
    assert (target / "README.md").read_text() == "my readme"


def test_force_that_fails_half_way_leaves_the_target_as_it_was(
    tmp_path: Path, template_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "p"
    (target / "tests").mkdir(parents=True)
    (target / "README.md").write_text("my readme")
    (target / "tests" / "mine.py").write_text("# mine")
    before = listing(tmp_path)
    real_replace = os.replace

    def disk_full_at_pyproject(src: str | Path, dst: str | Path) -> None:
        if Path(dst).name == "pyproject.toml":
            raise OSError(28, "No space left on device", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", disk_full_at_pyproject)
    result = cli("p", "-y", "--force", "--template", template_dir, cwd=tmp_path)
    assert result.exit_code == 1, result.output
    assert "No space left on device" in result.output and "was left as it was" in result.output
    assert listing(tmp_path) == before
    assert (target / "README.md").read_text() == "my readme"


def test_plain_copier_names_the_project_after_its_folder(tmp_path: Path, template_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "copier", "copy", "--defaults", template_dir, "my-proj"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert answers_of(tmp_path / "my-proj")["project_name"] == "my-proj"
    assert answers_of(tmp_path / "my-proj")["package_name"] == "my_proj"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("project_name: [open\n" + "x: " + "y" * 6000 + "\n", "copier.yml: did not find expected ','"),
        ("- just\n- a list\n", "copier.yml is not a copier template: expected questions"),
        ("colour:\n  type: str\n  choices: 5\n", "copier.yml: colour: choices must be a list or a mapping"),
        ("5:\n  type: str\n", "copier.yml: 5 is not a question name"),
    ],
    ids=["yaml-error", "list", "choices-int", "key-int"],
)
def test_broken_template_config_is_one_short_line(tmp_path: Path, text: str, message: str) -> None:
    template = write_template(tmp_path / "tpl", text)
    for args in (["p", "-y"], ["options"]):
        proc = subprocess.run(
            [sys.executable, "-m", "generator", *args, "--template", template],
            cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr) < 300 and proc.stderr.count("\n") == 1  # one line, not the whole file
    assert not (tmp_path / "p").exists()


def test_vcs_ref_that_does_not_exist_is_named(tmp_path: Path) -> None:
    result = cli("p", "-y", "--vcs-ref", "v9.9.9", cwd=tmp_path)
    assert result.exit_code == 2, result.output
    assert result.output == "error: --vcs-ref v9.9.9: no such tag or commit in the template\n"
    assert listing(tmp_path) == []


def test_dest_inside_a_file_is_refused(tmp_path: Path, template_dir: Path) -> None:
    (tmp_path / "afile").write_text("x")
    result = cli("p", "-y", "--template", template_dir, "--dest", tmp_path / "afile" / "p", cwd=tmp_path)
    assert result.exit_code == 2
    assert "afile is not a directory" in result.output


def test_symlink_to_an_empty_directory_is_a_target(tmp_path: Path, template_dir: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    result = cli("p", "-y", "--template", template_dir, "--dest", tmp_path / "link", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "real" / ".copier-answers.yml").is_file()
    assert (tmp_path / "link").is_symlink()


@pytest.mark.parametrize("home_kind", ["file", "read-only"])
def test_unusable_home_is_one_line(tmp_path: Path, home_kind: str) -> None:
    home = tmp_path / "home"
    if home_kind == "file":
        home.write_text("not a directory")
    else:
        home.mkdir()
        if os.geteuid() == 0:
            if subprocess.run(["chattr", "+i", home], capture_output=True).returncode != 0:
                pytest.skip("running as root on a file system without chattr +i")
        else:
            home.chmod(0o555)
    work = work_dir(tmp_path)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "generator", "p", "-y"],
            cwd=work, capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO), "HOME": str(home)},
        )  # fmt: skip
    finally:
        subprocess.run(["chattr", "-i", home], capture_output=True)
    assert proc.returncode == 1, proc.stderr
    assert "cannot write" in proc.stderr and "HOME" in proc.stderr and "Traceback" not in proc.stderr
    assert listing(work) == []
