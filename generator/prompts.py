"""Ask the bundled template's questions in the terminal, one line each.

copier's own prompts cut a validation message at the terminal width, answer a non-integer
with "Invalid input" and turn Ctrl-C into a page of internals. These print each question's
help, choices and default, check an answer as copier will (type, choices, the question's
validator from copier.yml), print the whole problem on its own line and ask again. Ctrl-C
raises KeyboardInterrupt, whenever it comes (terminal.py), which the CLI reports in one
line (exit status 130). copier still checks every answer once more when it renders.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from generator.errors import GeneratorError
from generator.questions import Question, check_package_name, load_yaml
from generator.terminal import read_line

FALSE = {"", "0", "n", "no", "f", "false", "off", "~", "null", "none"}  # as copier reads `when`
ANSWERS_FILE = ".copier-answers.yml"


def ask(
    questions: dict[str, Question],
    given: dict[str, Any],
    read: Callable[[str], str] = read_line,
    write: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Answers for every question not in `given`, asked in copier.yml's order, for a new
    project (copier renders it into an empty directory: the defaults are computed there)."""
    with new_destination() as dst:
        return _ask(questions, given, read, write, copier_context(dst))


def _ask(
    questions: dict[str, Question],
    given: dict[str, Any],
    read: Callable[[str], str],
    write: Callable[[str], None],
    system: dict[str, Any],
) -> dict[str, Any]:
    answers = dict(given)
    for key, value in given.items():  # NAME and --data: refuse a bad one before asking anything
        problem = _problem(questions[key], value, answers) if key in questions else ""
        if problem:
            raise GeneratorError(problem)
    write("Answer each question; Enter takes the [default]. Ctrl-C stops, writing nothing.")
    for question in questions.values():
        if question.key in answers or not _asked(question, {**system, **answers}):
            continue
        default = _default(question, {**system, **answers})
        write("")
        write(f"{question.help}")
        while True:
            try:
                raw = read(f"  {question.key}{_hint(question)} [{_show(default)}]: ")
            except EOFError:
                raise GeneratorError("the input ended before every question was answered") from None
            except KeyboardInterrupt:
                write("")  # end the prompt's line: the CLI's message gets a line of its own
                raise
            try:
                value = default if not raw.strip() else question.parse(_normalize(question, raw))
                problem = _problem(question, value, answers)
            except GeneratorError as error:
                problem = str(error)
            if not problem:
                break
            write(f"  {problem}")
        answers[question.key] = value
    return answers


@contextmanager
def new_destination() -> Iterator[Path]:
    """An empty directory: where copier renders a new project (render.py's scratch directory)."""
    with tempfile.TemporaryDirectory(prefix="ddp-new-questions.") as tmp:
        yield Path(tmp)


def copier_context(dst: Path) -> dict[str, Any]:
    """What copier.yml's expressions may read of copier's own settings, rendering into `dst`:
    `features` defaults to every capability where `dst` already holds an answers file."""
    return {"_copier_conf": {"dst_path": str(dst), "answers_file": ANSWERS_FILE}}


def unasked(
    questions: dict[str, Question], given: dict[str, Any], known: dict[str, Any], dst: Path
) -> list[str]:
    """The keys of `given` (--data) whose question is not asked with these answers (`given`,
    then `known`, a project's recorded answers, then the defaults, rendering into `dst`), and
    whose value is not the default: copier would render with it once but not record it, so the
    next update would lose it."""
    from jinja2 import TemplateError

    answers = complete(questions, given, known, dst)
    skipped = []
    for key in given:
        try:
            question = questions.get(key)
            if question and not _asked(question, answers) and given[key] != _default(question, answers):
                skipped.append(key)
        except (TemplateError, GeneratorError, ValueError):  # cannot tell here; copier decides
            continue
    return skipped


def complete(
    questions: dict[str, Question], given: dict[str, Any], known: dict[str, Any], dst: Path
) -> dict[str, Any]:
    """Every question's answer: `given`, else `known` (a project's recorded answers), else its
    default, rendering into `dst`; with copier's settings that the expressions read. A default
    that cannot be computed here is left out."""
    from jinja2 import TemplateError

    answers = {**copier_context(dst), **known}  # copier's expressions see every recorded answer
    for question in questions.values():
        key = question.key
        if key in given:
            answers[key] = given[key]
        elif key in known:
            answers[key] = known[key]
        else:
            try:
                answers[key] = _default(question, answers)
            except (TemplateError, GeneratorError, ValueError):  # left out: `when` decides without it
                continue
    return answers


def _asked(question: Question, answers: dict[str, Any]) -> bool:
    when = question.when
    if isinstance(when, str):
        when = render(when, answers).strip().lower() not in FALSE
    return bool(when)


def _default(question: Question, answers: dict[str, Any]) -> Any:
    default = question.default
    if isinstance(default, str) and "{" in default:
        default = render(default, answers)
        if question.multiselect:  # copier reads a rendered list as YAML
            default = load_yaml(default) if default.strip() else []
    if question.type == "int" and isinstance(default, str):
        default = int(default)
    return [] if default is None and question.multiselect else default


def _hint(question: Question) -> str:
    """How to answer: the choices, or the form of the value."""
    choices = ", ".join(str(choice) for choice in question.choices)
    if question.multiselect:
        return f" (any of {choices}; comma-separated, '-' for none)"
    if question.choices:
        return f" ({choices})"
    return {"bool": " (yes/no)", "int": " (an integer)"}.get(question.type, "")


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(str(item) for item in value) or "-"
    return str(value)


def describe_default(question: Question) -> str:
    """A question's default as `ddp-new options` shows it: a template expression is rendered
    when it needs no answers, else named by what it is computed from."""
    default = question.default
    if not (isinstance(default, str) and ("{{" in default or "{%" in default)):
        return _show(default)
    from jinja2 import TemplateError, meta

    if "_copier_conf.answers_file" in default:  # features: none for a new project, more for an old one
        try:
            recorded = sorted(meta.find_undeclared_variables(_env().parse(default)) - {"_copier_conf"})
            with new_destination() as dst:
                new = _show(_default(question, copier_context(dst)) or "none")
                (dst / ANSWERS_FILE).touch()
                context = {**copier_context(dst), **dict.fromkeys(recorded, "")}
                old = _show(_default(question, context) or "none")
        except (TemplateError, GeneratorError):
            return default
        if new == old:
            return new
        which = f" that recorded {', '.join(recorded)}" if recorded else ""
        return f"{new} for a new project; {old} when updating a project rendered before this question{which}"
    if "_copier_conf.dst_path" in default:
        return "the project's directory name (NAME)"
    try:
        needs = sorted(meta.find_undeclared_variables(_env().parse(default)))
        value = "" if needs else render(default, {})
    except TemplateError:
        return default
    if needs:
        return f"computed from {', '.join(needs)}"
    return f"{value} (from today's date)" if "strftime" in default else value


def describe_when(question: Question) -> str:
    """The condition under which a question is asked, as copier.yml writes it without the braces."""
    when = question.when
    if isinstance(when, str):
        return " ".join(when.replace("{{", "").replace("}}", "").split())
    return "never" if not when else "always"


def _normalize(question: Question, raw: str) -> str:
    raw = raw.strip()
    return "" if question.multiselect and raw == "-" else raw


def _problem(question: Question, value: Any, answers: dict[str, Any]) -> str:
    """The question's validator rendered with this answer: a message, or empty when valid.
    A package name must also not be a module importable here (copier.yml knows only the
    standard library's): asked again now rather than refused after rendering."""
    problem = ""
    if question.validator:
        problem = " ".join(render(question.validator, {**answers, question.key: value}).split())
    if question.key == "package_name" and not problem and isinstance(value, str):
        try:
            check_package_name(value)
        except GeneratorError as error:
            problem = str(error)
    return problem


def render(template: str, context: dict[str, Any]) -> str:
    """Render a copier.yml expression with the filters copier provides (regex_search, strftime...)."""
    return _compile(template).render(**context)


@cache
def _compile(template: str) -> Any:
    return _env().from_string(template)


@cache
def _env() -> Any:
    from jinja2.sandbox import SandboxedEnvironment

    return SandboxedEnvironment(extensions=["jinja2_ansible_filters.AnsibleCoreFiltersExtension"])
