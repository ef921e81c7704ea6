"""The one exception type the generator raises for problems a user can fix."""

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
