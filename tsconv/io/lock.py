"""One writer per output: an exclusive lock on a file beside the output path.

The lock file is ``.<name>.tsconv-lock`` in the output's parent directory, not inside the output, so it
outlives the output being renamed aside and replaced (``--overwrite``). It is taken with ``flock``
(non-blocking: a second writer is refused at once) and released by the kernel when the process exits,
however it exits; a clean exit also removes the file. While held, the file names its holder (pid, host,
start time, run id) for the refusal message.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any

from tsconv.errors import OutputBusyError, StoreError

__all__ = ["LOCK_SUFFIX", "OutputLock", "lock_path"]

LOCK_SUFFIX = ".tsconv-lock"
_HOLDER_BYTES = 4096


def lock_path(output: Path) -> Path:
    """The lock file of ``output``: ``.<name>.tsconv-lock`` beside it (in its parent, symlinks resolved, so
    every spelling of the directory finds the same file)."""
    output = Path(output).absolute()
    return output.parent.resolve() / f".{output.name}{LOCK_SUFFIX}"


class OutputLock:
    """An exclusive hold on one output path for one run (a context manager).

    ``acquire`` raises :class:`~tsconv.errors.OutputBusyError` naming the holder when another process
    holds it. Not reentrant: one ``OutputLock`` per run.
    """

    def __init__(self, output: Path, *, run_id: str) -> None:
        self.output = Path(output)
        self.path = lock_path(self.output)
        self.run_id = run_id
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this lock is taken (by this object)."""
        return self._fd is not None

    def acquire(self) -> OutputLock:
        """Take the lock now or refuse; records this process as the holder."""
        if self._fd is not None:
            return self
        while True:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise StoreError(
                    f"cannot create the lock file of the output {str(self.output)!r} "
                    f"({str(self.path)!r}: {exc.strerror})",
                    hint="tsconv writes a lock file beside the output: it needs write access to that directory.",
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read_holder(fd)
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise OutputBusyError(
                        f"output {str(self.output)!r} is being written by another tsconv run "
                        f"({_describe(holder)}); refusing to start a second writer",
                        hint="wait for that run to finish or stop it, then run again (--resume continues a stopped run).",
                    ) from None
                raise StoreError(
                    f"cannot lock the output {str(self.output)!r} ({self.path.name}: {exc.strerror})",
                    hint="tsconv takes an flock beside the output; write to a filesystem that supports it.",
                ) from None
            # A holder that was just finishing unlinked the file after we opened it: our lock is on a
            # file no one else will open, so take the one now at the path instead.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "run_id": self.run_id,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Give the lock up and remove the file (a killed run leaves it; the next run reuses it)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # Unlinked while still held, so no run can lock this file after we let go of it.
            self.path.unlink(missing_ok=True)
        finally:
            os.close(fd)

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> dict[str, Any] | None:
    try:
        doc = json.loads(os.pread(fd, _HOLDER_BYTES, 0) or b"null")
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "holder details not yet written"
    return (
        f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}, "
        f"run {str(holder.get('run_id', '?'))[:12]}"
    )
