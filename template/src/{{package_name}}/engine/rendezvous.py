"""Where the ranks meet before the process group exists: a key-value store at MASTER_ADDR and
MASTER_PORT, which rank 0 (or torchrun) serves and every rank connects to. A failure to meet
is one line naming that address and what failed, instead of a traceback through C++ frames."""

import contextlib
import os
import re
import socket
import sys
import tempfile
from collections.abc import Iterator
from datetime import timedelta

import torch.distributed as torch_dist

from .options import ConfigError


def store(world_size: int, timeout: timedelta) -> torch_dist.Store | None:
    """The store the ranks meet in; None means torch's default (env://: rank 0 listens at
    MASTER_ADDR:MASTER_PORT, the others connect to it)."""
    if "RANK" not in os.environ:
        return torch_dist.HashStore()  # one process: nobody to meet, an in-memory store will do
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    try:  # torch would retry a name that does not resolve for --dist-timeout: ask once here
        socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:  # UnicodeError: not a host name at all
        reason = err.strerror if isinstance(err, OSError) else err
        why = f"host {address} does not resolve ({reason})"
        raise ConfigError(f"{endpoint()}: {why}; set MASTER_ADDR to rank 0's host") from None
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's store keeps the keys of workers that died: a restarted rank could read a
        # dead peer's address and hang (pytorch/pytorch#135712). A prefix per attempt: clean.
        agent = torch_dist.TCPStore(address, port, world_size, is_master=False, timeout=timeout)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return torch_dist.PrefixStore(f"attempt_{attempt}", agent)
    return None


@contextlib.contextmanager
def one_line_failures(world_size: int, timeout_s: int) -> Iterator[None]:
    """Around creating the process group: torch's failure to meet becomes a ConfigError, one
    line, without the C++ log lines of the attempts (held_log)."""
    if "RANK" not in os.environ:  # one process: nothing to meet
        yield
        return
    failures = (torch_dist.DistNetworkError, torch_dist.DistStoreError)
    try:
        with held_log(failures):
            yield
    except failures as err:
        raise ConfigError(problem(err, world_size, timeout_s)) from None


@contextlib.contextmanager
def held_log(failures: tuple[type[BaseException], ...]) -> Iterator[None]:
    """torch's C++ code logs every failed attempt to meet, with stack frames, straight to file
    descriptor 2: held in a temporary file meanwhile, and written out unless one of `failures`
    ended the block (the caller says it in one line)."""
    sys.stderr.flush()
    saved, failed = os.dup(2), False
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except failures:
            failed = True
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if not failed:
                held.seek(0)
                os.write(2, held.read())


def endpoint() -> str:
    """'cannot meet the other ranks at MASTER_ADDR:MASTER_PORT host:port'."""
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    return f"cannot meet the other ranks at MASTER_ADDR:MASTER_PORT {where}"


def problem(err: torch_dist.DistError, world_size: int, timeout_s: int) -> str:
    """One line for torch's error when the ranks could not meet: what failed, what to do."""
    text = str(err)
    port = os.environ.get("MASTER_PORT")
    if "failed to listen" in text:  # rank 0 serves the store
        found = re.search(r"message: ([^\n]+)", text)
        why = found.group(1) if found else "the port is taken, or not allowed"
        return f"{endpoint()}: rank 0 cannot listen on port {port} ({why}); set a free MASTER_PORT"
    if isinstance(err, torch_dist.DistStoreError):  # the ranks that came waited for the rest
        return (
            f"{endpoint()}: not all {world_size} processes (WORLD_SIZE) joined within"
            f" --dist-timeout {timeout_s} s; start every rank, with the same MASTER_ADDR and"
            " MASTER_PORT"
        )
    return (
        f"{endpoint()}: nothing listening there, or not reachable from this host, within"
        f" --dist-timeout {timeout_s} s; start rank 0 (it listens there), and check that"
        " MASTER_ADDR is its host and that the port is open between the hosts"
    )
