"""Read an answer at the terminal so that Ctrl-C always stops it."""

from __future__ import annotations

import os
import select
import signal
import sys
import threading


def read_line(prompt: str) -> str:
    """input() for a terminal, except that a Ctrl-C is never lost.

    input() writes the prompt, then blocks reading the terminal. A Ctrl-C that comes between
    the two runs Python's signal handler, which only sets a flag, and the read then waits on
    for a whole line: the Ctrl-C is lost. Here the handler also writes a byte to a pipe
    (signal.set_wakeup_fd), and select() waits for the terminal and that pipe together, so
    Python gets control back and raises KeyboardInterrupt. The terminal still edits the line.
    """
    if os.name == "nt" or threading.current_thread() is not threading.main_thread():
        return input(prompt)  # Windows's select() takes only sockets; only the main thread gets signals
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)  # set_wakeup_fd's requirement
    previous = signal.set_wakeup_fd(wake_write)
    try:
        sys.stdout.write(prompt)
        sys.stdout.flush()
        return _read_until_newline(sys.stdin.fileno(), wake_read).decode(sys.stdin.encoding, "replace")
    finally:
        signal.set_wakeup_fd(previous)
        os.close(wake_read)
        os.close(wake_write)


def _read_until_newline(terminal: int, wake: int) -> bytes:
    """One line from `terminal`, without its newline; a signal's byte on `wake` lets its handler run."""
    line = b""
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([terminal, wake], [], [])
        if wake in ready:
            os.read(wake, 512)  # Ctrl-C's handler has raised KeyboardInterrupt by now; another's: go on
            continue
        chunk = os.read(terminal, 4096)
        if not chunk:  # end of input (Ctrl-D)
            if not line:
                raise EOFError
            break
        line += chunk
    return line.removesuffix(b"\n")
