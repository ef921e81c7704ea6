"""Read the template's questions from copier.yml without importing copier.

`ddp-new options` and the checks on `--data` run before any rendering, so they must
stay cheap: PyYAML only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from generator.errors import GeneratorError

PACKAGE_DIR = Path(__file__).resolve().parent
# A yes/no answer, at a prompt or in --data (the prompt says yes/no; true/false is YAML's spelling).
BOOLEANS = {"yes": True, "y": True, "true": True, "no": False, "n": False, "false": False}


def bundled_template() -> Path:
    """The template shipped with this installation: inside the wheel, or the source checkout."""
    for root in (PACKAGE_DIR / "_bundled", PACKAGE_DIR.parent):
        if (root / "copier.yml").is_file():
            return root
    raise GeneratorError("the bundled template is missing; reinstall ddp-new", exit_code=1)


@dataclass
class Question:
    key: str
    type: str = "str"
    help: str = ""
    default: Any = None
    choices: list[Any] = field(default_factory=list)
    multiselect: bool = False
    validator: str = ""  # a Jinja template: renders to the problem, or to nothing
    when: Any = True  # a bool, or a Jinja template: whether the question is asked at all

    def public(self) -> dict[str, Any]:
        """What `ddp-new options --json` shows of the question."""
        return {
            name: getattr(self, name) for name in ("key", "type", "help", "default", "choices", "multiselect")
        }

    def parse(self, raw: str) -> Any:
        """Turn a typed answer (`--data key=value`, or at a prompt) into the value copier expects."""
        if self.multiselect:
            items = load_yaml(raw) if raw.strip().startswith("[") else raw.split(",")
            value = [str(item).strip() for item in items or [] if str(item).strip()]
            unknown = [item for item in value if item not in self.choices]
            if unknown:
                raise self._bad_choice(", ".join(unknown))
            return value
        if self.type == "int":
            try:
                value = int(raw)
            except ValueError:
                raise GeneratorError(f"{self.key}: expected an integer, got {raw!r}") from None
        elif self.type == "bool":
            value = BOOLEANS.get(raw.strip().lower())
            if value is None:
                raise GeneratorError(f"{self.key}: expected yes or no (or true, false), got {raw!r}")
        else:
            value = raw
        if self.choices and value not in self.choices:
            raise self._bad_choice(raw)
        return value

    def _bad_choice(self, got: str) -> GeneratorError:
        choices = ", ".join(str(choice) for choice in self.choices)
        return GeneratorError(f"{self.key}: {got!r} is not one of: {choices}")


def load_yaml(text: str, source: str = "") -> Any:
    """Parse YAML; a syntax error names `source` (a file) and the place, on one line."""
    import yaml

    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        place = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        what = getattr(error, "problem", None) or "invalid YAML"
        raise GeneratorError(f"{source or repr(text[:80])}: {what}{place}") from None


def load_questions(template: Path) -> dict[str, Question]:
    """The questions of a local template, in order, keyed by name (settings `_*` skipped)."""
    for name in ("copier.yml", "copier.yaml"):
        path = template / name
        if path.is_file():
            try:
                config = load_yaml(path.read_text(encoding="utf-8"), source=str(path)) or {}
            except (OSError, UnicodeDecodeError) as error:
                raise GeneratorError(f"cannot read {path}: {error}") from None
            break
    else:
        raise GeneratorError(f"{template} is not a copier template (no copier.yml in it)")
    if not isinstance(config, dict):
        raise GeneratorError(f"{path} is not a copier template: expected questions (a mapping)")
    questions = {}
    for key, spec in config.items():
        if not isinstance(key, str):
            raise GeneratorError(f"{path}: {key!r} is not a question name; names are text, such as colour")
        if key.startswith("_"):
            continue
        if not isinstance(spec, dict):  # the short form `key: default`
            spec = {"default": spec}
        choices = spec.get("choices") or []
        if isinstance(choices, dict):  # {label: value}
            choices = list(choices.values())
        if not isinstance(choices, list):
            raise GeneratorError(f"{path}: {key}: choices must be a list or a mapping, not {choices!r}")
        questions[key] = Question(
            key=key,
            type=str(spec.get("type", "str")),
            help=str(spec.get("help", "")).strip(),
            default=spec.get("default"),
            choices=list(choices),
            multiselect=bool(spec.get("multiselect", False)),
            validator=str(spec.get("validator", "")),
            when=spec.get("when", True),
        )
    return questions


def check_package_name(name: str, target: Path | None = None) -> None:
    """Refuse a package name that a module importable here already has (torch, numpy, a package
    of the project's dependencies): the project's package would shadow it, or be shadowed.
    copier.yml refuses the standard library's names; this covers whatever is installed. A module
    found inside `target` (the project being rendered again) is the project's own."""
    import importlib.util
    import re
    import sys

    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or name in sys.stdlib_module_names:
        return  # copier.yml's validator says what is wrong with it
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return
    if spec is None:
        return
    where = spec.origin or next(iter(spec.submodule_search_locations or []), "")
    if target is not None and where and Path(where).resolve().is_relative_to(target.resolve()):
        return
    raise GeneratorError(
        f"package_name '{name}' would shadow the module '{name}' that this Python imports"
        f" ({where or 'built in'}); choose another name"
    )


def parse_data(pairs: list[str], questions: dict[str, Question]) -> dict[str, Any]:
    """Parse repeated `--data key=value` options against the template's questions."""
    data: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise GeneratorError(f"--data expects key=value, got {pair!r}")
        if key not in questions:
            known = ", ".join(questions)
            raise GeneratorError(f"--data {key}: unknown question; known keys: {known}")
        if key in data:
            raise GeneratorError(f"--data {key} given twice")
        try:
            data[key] = questions[key].parse(raw)
            if key == "package_name":
                check_package_name(data[key])
        except GeneratorError as error:
            raise GeneratorError(f"--data {error}") from None
    return data
