"""Ask the bundled template's questions in the terminal, one line each.

copier's own prompts cut a validation message at the terminal width, answer a non-integer
with "Invalid input" and turn Ctrl-C into a page of internals. These print each question's
help, choices and default, check an answer as copier will (type, choices, the question's
validator from copier.yml), print the whole problem on its own line and ask again. Ctrl-C
raises KeyboardInterrupt, which the CLI reports in one line (exit status 130). copier still
checks every answer once more when it renders.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from generator.errors import GeneratorError
from generator.questions import Question

FALSE = {"", "0", "n", "no", "f", "false", "off", "~", "null", "none"}  # as copier reads `when`


def ask(
    questions: dict[str, Question],
    given: dict[str, Any],
    read: Callable[[str], str] = input,
    write: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Answers for every question not in `given`, asked in copier.yml's order."""
    answers = dict(given)
    for key, value in given.items():  # NAME and --data: refuse a bad one before asking anything
        problem = _problem(questions[key], value, answers) if key in questions else ""
        if problem:
            raise GeneratorError(problem)
    write("Answer each question; Enter takes the [default]. Ctrl-C stops, writing nothing.")
    for question in questions.values():
        if question.key in answers or not _asked(question, answers):
            continue
        default = _default(question, answers)
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


def _asked(question: Question, answers: dict[str, Any]) -> bool:
    when = question.when
    if isinstance(when, str):
        when = render(when, answers).strip().lower() not in FALSE
    return bool(when)


def _default(question: Question, answers: dict[str, Any]) -> Any:
    default = question.default
    if isinstance(default, str) and "{" in default:
        default = render(default, answers)
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
    if "_copier_conf.dst_path" in default:
        return "the project's directory name (NAME)"
    from jinja2 import TemplateError, meta

    try:
        needs = sorted(meta.find_undeclared_variables(_env().parse(default)))
        value = "" if needs else render(default, {})
    except TemplateError:
        return default
    if needs:
        return f"computed from {', '.join(needs)}"
    return f"{value} (from today's date)" if "strftime" in default else value


def _normalize(question: Question, raw: str) -> str:
    raw = raw.strip()
    return "" if question.multiselect and raw == "-" else raw


def _problem(question: Question, value: Any, answers: dict[str, Any]) -> str:
    """The question's validator rendered with this answer: a message, or empty when valid."""
    if not question.validator:
        return ""
    return " ".join(render(question.validator, {**answers, question.key: value}).split())


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
