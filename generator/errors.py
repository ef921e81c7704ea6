"""The one exception type the generator raises for problems a user can fix, and the one
translation of copier's exceptions into it."""

from collections.abc import Iterator
from contextlib import contextmanager

# Exit statuses of the `ddp-new` command.
EXIT_FAILED = 1  # the work could not be done (I/O, git, copier)
EXIT_USAGE = 2  # bad input: nothing was written
EXIT_CONFLICTS = 3  # an update left conflicts to resolve
EXIT_UNSAFE = 4  # the template needs --trust
EXIT_INTERRUPTED = 130  # Ctrl-C


class GeneratorError(Exception):
    """A problem the user can fix; the CLI prints it on one line and exits with `exit_code`."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(" ".join(message.split()))  # always one line
        self.exit_code = exit_code


@contextmanager
def copier_errors(action: str, vcs_ref: str | None = None) -> Iterator[None]:
    """Turn what copier (and git under it) raises into one-line GeneratorErrors.

    `action` names the work in messages: "render", "update"; `vcs_ref` is the version asked for.
    """
    import jinja2
    from copier import errors
    from plumbum import ProcessExecutionError

    try:
        yield
    except errors.UnsafeTemplateError as error:
        raise GeneratorError(
            f"{error}. Read the template's copier.yml; if you trust it, run again with --trust",
            exit_code=EXIT_UNSAFE,
        ) from None
    except errors.CopierAnswersInterrupt:  # Ctrl-C at one of copier's prompts
        raise KeyboardInterrupt from None
    except errors.InteractiveSessionError:
        raise GeneratorError(
            "no terminal to ask the questions in; pass --defaults (-y) and --data key=value"
        ) from None
    except ValueError as error:
        if vcs_ref is not None and str(error) == f"Unknown revision: {vcs_ref!r}":
            raise GeneratorError(f"--vcs-ref {vcs_ref}: no such tag or commit in the template") from None
        if "Unknown revision" in str(error):  # (update.py names a project's unknown _commit itself)
            raise GeneratorError(
                f"{error}: no such version in the template's history", exit_code=EXIT_FAILED
            ) from None
        raise GeneratorError(str(error)) from None  # copier's validators and choices
    except errors.CopierError as error:
        message = str(error).strip().splitlines() or ["copier failed"]
        raise GeneratorError(f"{action} failed: {message[-1]}", exit_code=EXIT_FAILED) from None
    except jinja2.TemplateError as error:
        raise GeneratorError(f"the template failed to render: {error}", exit_code=EXIT_FAILED) from None
    except OSError as error:
        raise GeneratorError(f"{action} failed: {error}", exit_code=EXIT_FAILED) from None
    except ProcessExecutionError as error:  # git, for a template given as a URL or repository
        detail = (error.stderr or "").strip().splitlines() or [str(error)]
        raise GeneratorError(f"git failed: {detail[-1]}", exit_code=EXIT_FAILED) from None
    except (ArithmeticError, LookupError, TypeError, RuntimeError) as error:  # a template's own bug
        raise GeneratorError(
            f"the template failed to render: {type(error).__name__}: {error}", exit_code=EXIT_FAILED
        ) from None
