"""Lock files: JSON naming the holder, written in one step, its modification time a heartbeat.
A live lock keeps others out; a stale one (its holder surely gone) is taken over with a warning.
Their users: OUT_DIR/run.lock (runlock.py) and the data caches' conversions (files.wait_turn)."""

import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

HEARTBEAT_S = 30.0
STALE_AFTER_S = 120.0
DAMAGED_AFTER_S = 10.0


def this_process() -> dict[str, Any]:
    """What the lock says about its holder, and what staleness is judged against."""
    me: dict[str, Any] = {
        "host": socket.gethostname(),
        "boot_id": boot_id(),
        "pid_namespace": _pid_namespace(),
        "pid": os.getpid(),
        "process_start": process_start(os.getpid()),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "heartbeat_s": HEARTBEAT_S,  # the file's modification time is refreshed this often
    }
    env, attempts = os.environ, ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
    me |= {key.lower(): env[key] for key in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID") if key in env}
    return me | {key.lower(): int(env.get(key, 0)) for key in attempts}


def _pid_namespace() -> str:
    """Containers on one host can share a host name but not their pids: tell them apart."""
    with contextlib.suppress(OSError):
        return os.readlink("/proc/self/ns/pid")
    return ""  # not Linux: the host name alone


def boot_id() -> str:
    """This machine's boot id; another one means another machine (or a reboot). "": no /proc."""
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return ""


def process_start(pid: int) -> str | None:
    """When process `pid` started ("BOOT_ID TICKS", from /proc), which tells a reused pid apart;
    None if it does not run (gone, or a zombie), or where there is no /proc to tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, *fields = stat.rpartition(")")[2].split()  # after "pid (command)", which may hold ")"
    machine = boot_id()
    return None if state in ("Z", "X") or not machine else f"{machine} {fields[18]}"  # starttime


def _machine(record: dict[str, Any]) -> str | None:
    """The boot id a lock or this_process() names (locks before it: from process_start)."""
    start = record.get("process_start")
    return record.get("boot_id") or (start.split()[0] if isinstance(start, str) else None)


def same_pids(holder: dict[str, Any], me: dict[str, Any]) -> bool:
    """Is the holder's pid one of this process's pids? Same machine (boot id) and pid namespace:
    a replaced pod on another node can repeat the host name, the namespace inode and the pid."""
    theirs, mine = _machine(holder), _machine(me)
    same_host = all(holder.get(key) == me.get(key) for key in ("host", "pid_namespace"))
    return same_host and not (theirs and mine and theirs != mine)


def read_lock(path: Path) -> tuple[dict[str, Any] | None, float] | None:
    """The holder (None: unreadable, {}: empty or damaged) and heartbeat age in s; None: no lock."""
    age = 0.0  # a lock that cannot even be looked at counts as fresh: refused, not taken over
    try:
        age = time.time() - path.stat().st_mtime
        holder = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError:  # not JSON (or not even UTF-8)
        return {}, age
    except OSError:
        return None, age
    return (holder if isinstance(holder, dict) else {}), age


def stale_reason(holder: dict[str, Any] | None, age: float, me: dict[str, Any]) -> str | None:
    """Why a lock is stale (its holder is surely gone), or None if it may be running: an
    earlier attempt of this job (torchrun restart, SLURM requeue); a process gone from this
    machine (a live one keeps its lock, even stopped with Ctrl-Z); no heartbeat for STALE_AFTER_S
    (another machine; clocks agree to within a minute); empty or damaged for DAMAGED_AFTER_S."""
    heartbeat_stopped = f"no heartbeat for {age:.0f} s" if age > STALE_AFTER_S else None
    if holder is None:
        return heartbeat_stopped  # cannot be read (another user's?): judged by its heartbeat
    if not holder:  # a lock appears whole (_create): its writer died, or its disk filled
        return f"empty or damaged for {age:.0f} s" if age > DAMAGED_AFTER_S else None
    for job, attempt, what in (
        ("torchelastic_run_id", "torchelastic_restart_count", "torchrun restarted this job"),
        ("slurm_job_id", "slurm_restart_count", "SLURM requeued this job"),
    ):
        if job in me and holder.get(job) == me[job] and holder.get(attempt, 0) < me[attempt]:
            return what
    pid = holder.get("pid")
    if same_pids(holder, me):
        if not pid_exists(pid):
            return f"process {pid} is gone"
        recorded, now = holder.get("process_start"), process_start(pid)
        if recorded and now and now != recorded:  # /proc on both sides: not the same process
            return f"process {pid} is gone (its pid was reused)"
        if pid == me["pid"]:
            return "left by an earlier run in this process"
        if recorded and now:
            return None  # the very process that took the lock
    return heartbeat_stopped


def pid_exists(pid: Any) -> bool:
    """Whether process `pid` exists on this host (signal 0 only checks)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    return True


def describe(holder: dict[str, Any] | None) -> str:
    """Whose lock it is, in a message."""
    if not holder:
        return "unreadable lock file" if holder is None else "empty or damaged lock file"
    return f"host {holder.get('host')}, pid {holder.get('pid')}, started {holder.get('started')}"


class LockFile:
    """A lock that one process at a time holds, from take() to release(); a heartbeat meanwhile."""

    def __init__(self, path: Path) -> None:
        self.path, self.content = path, ""  # content: what this process wrote, while it holds it
        self._lost: str | None = None  # once lost, a lock stays lost
        self._stop = threading.Event()

    def take(self) -> tuple[dict[str, Any] | None, float] | None:
        """Take the lock (a stale one with a warning): None if taken, else read_lock's answer."""
        me = this_process()
        for _ in range(3):  # a lock created, removed or taken over meanwhile: look again
            if (found := read_lock(self.path)) is None:
                if self._create(json.dumps(me)):
                    return None
                continue
            reason = stale_reason(*found, me)
            if reason is None:
                return found
            print(f"warning: taking over {self.path}, left by a run that is gone ({reason})")
            again = read_lock(self.path)  # unless another run has just replaced it with its own
            if again is not None and again[0] == found[0]:
                self.path.unlink(missing_ok=True)
        return None, 0.0

    def _create(self, content: str) -> bool:
        """Atomically: the whole file appears as the lock (then its heartbeat starts), or none."""
        tmp = self.path.with_name(f"{self.path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
        tmp.write_text(content)
        try:
            os.link(tmp, self.path)  # fails if the lock exists, even on NFS
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links (some FUSE or SMB mounts)
            try:
                with open(self.path, "x") as file:  # "x": only if it does not exist
                    file.write(content)  # readers see it empty for a moment: DAMAGED_AFTER_S
            except FileExistsError:
                return False
        finally:
            tmp.unlink()
        self.content = content
        threading.Thread(target=self._heartbeat, name=self.path.name, daemon=True).start()
        return True

    def lost(self) -> str | None:
        """Why this process no longer holds the lock (taken over, removed); None while it does."""
        content = self.content  # read once: release() may clear it meanwhile
        if self._lost or not content:
            return self._lost
        try:
            if self.path.read_text(errors="replace") == content:
                return None
        except FileNotFoundError:
            pass
        except OSError:
            return None  # the file system's trouble, not another run's: the write will tell
        found = read_lock(self.path)  # another run's lock, or None: removed
        taken = f"taken over by another run ({describe(found[0])})" if found else "removed"
        self._lost = f"{self.path} was {taken}"
        return self._lost

    def _heartbeat(self) -> None:
        """Refresh the heartbeat until released, or until the lock is lost: never another's."""
        while not self._stop.wait(HEARTBEAT_S) and self.lost() is None:
            with contextlib.suppress(OSError):  # removed meanwhile: lost() says so next time
                os.utime(self.path)

    def release(self) -> None:
        """Remove the lock if this process holds it; never raises (runs on the way out)."""
        self._stop.set()
        with contextlib.suppress(OSError):
            if self.content and self.path.read_text(errors="replace") == self.content:
                self.path.unlink()  # this process's lock, not one that took it over
        self.content = ""
