"""Process plumbing shared by every process radixlm starts: IPC addresses, logging, parent-death watching, exit.

Runs in every process: the server's main process (addresses, logging, exit), its scheduler and detokenizer
children (die_with_parent), tensor-parallel worker ranks and grammar compile workers (the parent-death
signal and watch). Standard library only, so any process can import it first.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

_PR_SET_PDEATHSIG = 1
PARENT_POLL_S = 0.5  # how often a child's parent watch checks that the parent is still there
LOG_FORMAT = "%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s"


@dataclass(frozen=True)
class IpcAddrs:
    """ZMQ endpoints; each receiver binds its own PULL socket, senders connect PUSH sockets."""

    scheduler_in: str
    detokenizer_in: str
    tokenizer_in: str
    dp_size: int = 1  # scheduler ranks, each with its own input (scheduler_ins)

    @classmethod
    def in_dir(cls, directory: str, dp_size: int = 1) -> "IpcAddrs":
        return cls(*(f"ipc://{os.path.join(directory, name)}" for name in ("sched", "detok", "tok")), dp_size)

    @property
    def scheduler_ins(self) -> list[str]:
        """One input per data-parallel scheduler rank; dp_size 1 keeps the single scheduler's name."""
        if self.dp_size == 1:
            return [self.scheduler_in]
        return [f"{self.scheduler_in}{rank}" for rank in range(self.dp_size)]

    def for_rank(self, rank: int) -> "IpcAddrs":
        """What scheduler rank `rank` binds and connects to (it reads only scheduler_in)."""
        return dataclasses.replace(self, scheduler_in=self.scheduler_ins[rank], dp_size=1)

    @property
    def directory(self) -> str:
        return os.path.dirname(self.scheduler_in[len("ipc://"):])


def setup_logging(level: str, fmt: str = LOG_FORMAT) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), force=True, format=fmt)


def set_parent_death_signal() -> None:
    """Linux: the kernel SIGKILLs this process when the thread that started it exits (even mid-compile,
    even if the parent was SIGKILLed). Elsewhere a no-op: pair it with watch_parent."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass


def watch_parent(parent_pid: int, on_orphan: Callable[[], None] | None = None,
                 poll_s: float = PARENT_POLL_S) -> None:
    """A daemon thread that calls on_orphan (default: exit with status 1) once parent_pid is no longer
    this process's parent; also checked right away, for a parent that died before the watch started."""
    orphaned = on_orphan or (lambda: os._exit(1))
    if os.getppid() != parent_pid:
        orphaned()

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        orphaned()

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def die_with_parent(parent_pid: int, cleanup_dir: str | None = None) -> None:
    """Make this server child exit when the server process dies, however it dies (even SIGKILL).

    Without cleanup_dir: the kernel's parent-death signal (SIGKILL, Linux) plus the polling watch for
    other platforms and for the race where the parent died before prctl ran. With cleanup_dir (the
    detokenizer, which never blocks long): only the polling watch, which first removes that directory
    (the socket files a SIGKILLed server could not remove) and then exits."""
    if cleanup_dir is None:
        set_parent_death_signal()

    def orphaned() -> None:
        if cleanup_dir is not None:
            shutil.rmtree(cleanup_dir, ignore_errors=True)
        os._exit(1)

    watch_parent(parent_pid, orphaned)
    # Ctrl-C and `kill -- -PGID` reach the whole process group; the server decides when children stop
    # (after a drain), so they ignore these signals and are ended by the server with SIGKILL.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def exit_now(code: int) -> None:
    """Leave without interpreter finalization: every resource is already released by then, and tearing
    down torch and ZMQ contexts at exit can block for seconds (a context's term waits on sockets that
    the garbage collector has not closed yet)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
