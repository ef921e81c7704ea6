"""The `ddp-new` command line. Thin: options here, work in render.py and questions.py.

Start-up stays fast: neither torch nor copier is imported until a project is rendered.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
import typer.core
from typer.core import TyperGroup

from generator import __version__
from generator.errors import EXIT_CONFLICTS, EXIT_INTERRUPTED, GeneratorError

# The click that Typer runs on: its own copy in recent versions, the click package before.
_click = getattr(typer.core, "_click", None) or __import__("click")


class DefaultToNew(TyperGroup):
    """Make `ddp-new NAME` mean `ddp-new new NAME` (Typer has no default subcommand), and
    report usage errors (an unknown option, a missing argument) on one line."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["new", *args]
        with _one_line_usage_errors():
            return super().parse_args(ctx, args)

    def invoke(self, ctx: typer.Context):
        with _one_line_usage_errors():
            return super().invoke(ctx)


@contextmanager
def _one_line_usage_errors() -> Iterator[None]:
    """`error: No such option: -x (see ddp-new new --help)` on stderr, exit status 2, instead
    of the usage, a hint and a box. Plain `ddp-new` still prints the help."""
    no_args = getattr(_click.exceptions, "NoArgsIsHelpError", ())
    try:
        yield
    except no_args:
        raise
    except _click.exceptions.UsageError as error:
        where = f" (see {error.ctx.command_path} --help)" if error.ctx else ""
        message = " ".join(error.format_message().split()).rstrip(".")
        typer.echo(f"error: {message}{where}", err=True)
        raise typer.Exit(error.exit_code) from None


app = typer.Typer(
    cls=DefaultToNew,
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Create a PyTorch DistributedDataParallel training project: `ddp-new NAME`.",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ddp-new {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Create a PyTorch DistributedDataParallel training project: `ddp-new NAME`."""


def _fail(error: GeneratorError) -> typer.Exit:
    typer.echo(f"error: {error}", err=True)
    return typer.Exit(error.exit_code)


@app.command()
def new(
    name: Annotated[str, typer.Argument(help="Project name; the project is written to ./NAME.")],
    defaults: Annotated[
        bool, typer.Option("--defaults", "-y", help="Take the default for every question not set by --data.")
    ] = False,
    data: Annotated[
        list[str] | None,
        typer.Option(
            "--data", "-d", help="Answer a question: key=value (repeatable; see `ddp-new options`)."
        ),
    ] = None,
    dest: Annotated[
        Path | None, typer.Option(help="Directory to create instead of ./NAME.", show_default=False)
    ] = None,
    template: Annotated[
        str | None,
        typer.Option(help="Render another copier template (a path or git URL) instead of the bundled one."),
    ] = None,
    vcs_ref: Annotated[
        str | None, typer.Option(help="Git tag or commit of a git template to render (default: latest tag).")
    ] = None,
    force: Annotated[
        bool, typer.Option(help="Render into a non-empty directory, overwriting files the template owns.")
    ] = False,
    trust: Annotated[
        bool,
        typer.Option(
            help="Allow a template to run its own commands (copier tasks, migrations); review it first."
        ),
    ] = False,
    git: Annotated[
        bool, typer.Option("--git", help="Also run git init and commit the project (updates need git).")
    ] = False,
) -> None:
    """Create a new training project in ./NAME by answering the template's questions."""
    from generator import questions, render, templates

    try:
        render.check_name(name)
        if template is not None:
            src = render.check_template(template)
            known = _local_questions(src)
        else:
            known = questions.load_questions(questions.bundled_template())
        answers = questions.parse_data(data or [], known)
        if "project_name" in answers:
            raise GeneratorError("set the project name as NAME, not with --data project_name=...")
        answers["project_name"] = name
        if not isinstance(known, _AnyKey):
            _check_asked(known, answers, {}, None)
        target = render.resolve_target(dest or Path(name))
        render.check_target(target, force)
        if template is None:
            if not defaults:  # copier's own prompts serve third-party templates
                answers, defaults = _ask(known, answers), True
            src, ref = templates.bundled_source()
            vcs_ref = vcs_ref or ref
        render.render(
            src, target, answers, defaults=defaults, force=force, trust=trust, vcs_ref=vcs_ref, git=git
        )
    except GeneratorError as error:
        raise _fail(error) from None
    except KeyboardInterrupt:
        typer.echo("interrupted; nothing was written", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    _print_next_steps(target)


def _check_asked(known: dict, data: dict, recorded: dict, project: Path | None) -> None:
    """Refuse --data for a question these answers skip (strategy without 'fsdp' in features):
    copier would render with it once and not record it, so the next update would undo it."""
    from generator import prompts

    with prompts.new_destination() as empty:
        skipped = prompts.unasked(known, data, recorded, project or empty)
    if skipped:
        key = skipped[0]
        raise GeneratorError(
            f"--data {key}: the question is asked only when {prompts.describe_when(known[key])},"
            " which these answers do not meet; change those answers too (ddp-new options)"
        )


def _ask(known: dict, answers: dict) -> dict:
    from generator import prompts

    if not sys.stdin.isatty():
        raise GeneratorError("no terminal to ask the questions in; pass --defaults (-y) and --data key=value")
    return prompts.ask(known, answers)


def _local_questions(src: str) -> dict:
    """Questions of a local template; for a git URL copier itself checks --data later."""
    from generator import questions

    path = Path(src).expanduser()
    if path.is_dir():
        return questions.load_questions(path)
    return _AnyKey()


class _AnyKey(dict):
    """Accept every --data key as a plain string (remote templates are checked by copier)."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str):
        from generator.questions import Question

        return Question(key=key)


def _print_next_steps(target: Path) -> None:
    from generator.project import read_answers

    typer.echo(f"Created {target}")
    try:
        package = read_answers(target).get("package_name")
    except GeneratorError:
        return  # a third-party template without an answers file: nothing more to say
    if package:
        typer.echo(
            "Next:\n"
            f"  cd {target}\n"
            '  pip install -e ".[dev]"   # after installing the torch build for your machine\n'
            f"  torchrun --standalone --nproc_per_node=2 -m {package}.train --max-steps 20"
        )


@app.command()
def update(
    path: Annotated[
        Path, typer.Argument(help="Project to update (a clean git work tree), or a folder in it.")
    ] = Path("."),
    data: Annotated[
        list[str] | None,
        typer.Option("--data", "-d", help="Change an answer while updating: key=value (repeatable)."),
    ] = None,
    vcs_ref: Annotated[
        str | None,
        typer.Option(help="Template tag or commit to update to (default: this ddp-new's version)."),
    ] = None,
    trust: Annotated[
        bool, typer.Option(help="Let a third-party template run its migrations; ddp-new's own needs no flag.")
    ] = False,
) -> None:
    """Pull template changes into a project, keeping your edits; exits 3 if conflicts are left."""
    from generator import project, questions
    from generator import update as updating

    try:
        path = project.find_project(path)  # run in src/, it updates the project
        answers = project.read_answers(path)
        src = answers["_src_path"]
        bundled = src == updating.LINK
        known = questions.load_questions(questions.bundled_template()) if bundled else _local_questions(src)
        given = questions.parse_data(data or [], known)
        if not isinstance(known, _AnyKey):
            _check_asked(known, given, answers, path)
        report = updating.update(path, given, vcs_ref=vcs_ref, trust=trust)
    except GeneratorError as error:
        raise _fail(error) from None
    except KeyboardInterrupt:
        typer.echo("interrupted; check `git status` and `git checkout .` to undo", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if report.up_to_date:
        typer.echo(f"{path.resolve()} is already up to date (template {report.new_version})")
        return
    typer.echo(f"Updated {path.resolve()} from template {report.old_version} to {report.new_version}")
    for label, paths in (("added", report.added), ("changed", report.changed), ("removed", report.removed)):
        for item in paths:
            typer.echo(f"  {label:<8} {item}")
    if bundled:  # ddp-new's own template: what the releases in between changed, and what to do
        from generator.changelog import notes

        text = notes(questions.bundled_template(), report.old_version, report.new_version)
        typer.echo(f"\n{text}\n" if text else "", nl=False)
    if report.conflicts or report.kept:
        typer.echo("error: conflicts to resolve, then commit:", err=True)
        for item in report.conflicts:
            typer.echo(f"  conflict {item}  (edit the <<<<<<< markers)", err=True)
        for item in report.kept:
            if given:  # a changed answer may drop files: a capability taken out of features
                why = "your new answers or the new template dropped this file"
                then = "keep it as your own, or carry your changes over and delete it"
            else:
                why = "the new template dropped or moved this file"
                then = "carry your changes over, then delete it"
            typer.echo(
                f"  conflict {item}  ({why}, which you had changed: your version is kept; {then})", err=True
            )
        raise typer.Exit(EXIT_CONFLICTS)
    typer.echo("Review with `git diff`, then commit.")


@app.command()
def options(
    as_json: Annotated[bool, typer.Option("--json", help="Print the questions as JSON.")] = False,
    template: Annotated[
        Path | None, typer.Option(help="Read the questions of another local template.", show_default=False)
    ] = None,
) -> None:
    """Print every question: its key, type, default, choices and help (the keys of --data)."""
    from generator import prompts, questions

    try:
        root = template or questions.bundled_template()
        found = questions.load_questions(root)
    except GeneratorError as error:
        raise _fail(error) from None
    if as_json:
        typer.echo(json.dumps([q.public() for q in found.values()], indent=2))
        return
    for q in found.values():
        kind = f"{q.type}, several of" if q.multiselect else q.type
        typer.echo(f"{q.key} ({kind})")
        typer.echo(f"    {q.help}")
        if q.choices:
            typer.echo(f"    choices: {', '.join(str(c) for c in q.choices)}")
        if q.default is not None:
            typer.echo(f"    default: {prompts.describe_default(q)}")
        if q.when is not True:
            typer.echo(f"    asked only when: {prompts.describe_when(q)}")


def main() -> None:
    app(prog_name="ddp-new")


if __name__ == "__main__":
    sys.exit(main())
