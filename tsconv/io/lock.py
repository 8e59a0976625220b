"""One writer per output: an exclusive lock on a file beside the output path.

The lock file is ``.<name>.tsconv-lock`` in the output's parent directory, not inside the output, so it
outlives the output being renamed aside and replaced (``--overwrite``). It is taken with ``flock``
(non-blocking: a second writer is refused at once) and released by the kernel when the process exits,
however it exits; a clean exit also removes the file. While held, the file names its holder (pid, host,
start time, run id) for the refusal message.

An output in an object store (:class:`ObjectLock`) has no flock and no kernel to release a lock: there the
lock is an expiring object, ``.<name>.tsconv-lock`` beside the output, created only where none is (a
conditional PUT, ``If-None-Match: *``) and renewed by a thread every quarter of the ``lock_ttl`` setting.
A lock not renewed for ``lock_ttl`` seconds (its holder is gone) is taken over, on S3 by a PUT
conditional on the stale copy's ETag, so two runs cannot both take it. A run paused for longer than the
TTL (its machine suspended) can lose it to another run; its writer then stops before its next chunk or
metadata write (:meth:`ObjectLock.check`), and the run id re-read from the store before each metadata write and
before the store is marked complete (:func:`tsconv.io.writers.zarr_writer.check_owner`) stops it from marking
the other's store.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from tsconv import config
from tsconv.errors import OutputBusyError, OutputLostError, StoreError, TsconvError
from tsconv.io.objstore import StoreURL, remote_error

__all__ = ["LOCK_SUFFIX", "ObjectLock", "OutputLock", "check_free", "lock_path", "output_lock"]

LOCK_SUFFIX = ".tsconv-lock"
_HOLDER_BYTES = 4096


def output_lock(output: Path | StoreURL, *, run_id: str, resumable: bool = False) -> OutputLock | ObjectLock:
    """The lock of an output: an flock beside a local path, an expiring lock object beside a URL.
    ``resumable``: a stopped run's output can be continued with --resume (the busy error says so)."""
    if isinstance(output, StoreURL):
        return ObjectLock(output, run_id=run_id, resumable=resumable)
    return OutputLock(output, run_id=run_id, resumable=resumable)


def check_free(output: Path | StoreURL, *, resumable: bool = False) -> None:
    """Raise :class:`~tsconv.errors.OutputBusyError` naming the holder when another run holds the lock of
    ``output`` now; takes no lock and writes nothing (for a refusal made before a run takes it)."""
    output_lock(output, run_id="", resumable=resumable).check_free()


# The longest name a run gives a file beside its output, past the output's own name (a pid of up to 7 digits):
# a Parquet output's temporary ".<name>.tsconv-<pid>.tmp" and ingest's replaced store ".<name>.ingest-<pid>.old";
# the lock's ".<name>.tsconv-lock" and --overwrite's ".<name>.tsconv-discarded" are shorter.
_SIBLING_EXTRA = len(".") + len(".tsconv-") + 7 + len(".tmp")


def _check_name_length(output: Path) -> None:
    """Refuse an output name too long for the files a run makes beside it (the filesystem's name limit):
    the run failed later, naming a temporary file the user never gave."""
    parent = Path(output).absolute().parent
    try:
        limit = os.pathconf(parent if parent.exists() else "/", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    size = len(os.fsencode(Path(output).name))
    if size + _SIBLING_EXTRA > limit:
        raise TsconvError(
            f"the output's name is {size} bytes; tsconv makes files beside it named after it (a temporary "
            f"'.<name>.tsconv-<pid>.tmp', its lock) that this filesystem's {limit}-byte limit on a name "
            "does not allow",
            hint=f"choose a name of at most {limit - _SIBLING_EXTRA} bytes.",
        )


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

    def __init__(self, output: Path, *, run_id: str, resumable: bool = False) -> None:
        self.output = Path(output)
        _check_name_length(self.output)
        self.path = lock_path(self.output)
        self.run_id = run_id
        self.resume_note = " (--resume continues a stopped run)" if resumable else ""
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
                    raise self._busy(holder) from None
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
        self._fd = fd  # held from here: release() lets it go whatever fails below
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder).encode(), 0)
        except OSError:
            # The record only names the holder in a second run's refusal ("holder details not yet written"
            # without it). On a full disk (or quota) it failed the whole command with a bare "[Errno 28] No
            # space left on device" naming no file, and kept `tsconv repair` from running: the run goes on,
            # and its own writes say what could not be written, naming the store.
            pass
        return self

    def check(self) -> None:
        """Raise :class:`~tsconv.errors.OutputLostError` when the file at the lock's path is no longer the one
        this run holds. Called before each write of the output (a stat: microseconds).

        The flock holds the file, not the path: once another process removed the file (a clean-up of dot
        files, a user), a second run made a new one, locked it and wrote the same output beside this run; a
        --overwrite with another pipeline then ended with both runs' chunks in one store that it marked
        complete."""
        fd = self._fd
        if fd is None or self._holds_path(fd):
            return
        raise OutputLostError(
            f"the lock file of the output {str(self.output)!r} ({self.path.name}) was removed or replaced while "
            f"this run (run {self.run_id[:12]}) held it, so another run may be writing that output now; this run "
            "writes nothing more to it",
            hint="let no clean-up remove tsconv's lock files during a run; once no other run writes the output, "
            "finish it with --resume, or compute it again with --overwrite.",
        )

    def _holds_path(self, fd: int) -> bool:
        """Whether the file at the lock's path is the one open as ``fd``."""
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path))
        except FileNotFoundError:
            return False

    def check_free(self) -> None:
        """Raise :class:`~tsconv.errors.OutputBusyError` naming the holder when another process holds the
        lock now, without taking it or creating its file."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # no lock file: no holder (one that cannot be opened is acquire's to report)
            return
        try:
            # shared, and let go at once: a run taking it in that instant is refused as by any second writer
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise self._busy(_read_holder(fd)) from None
        finally:
            os.close(fd)

    def _busy(self, holder: dict[str, Any] | None) -> OutputBusyError:
        return OutputBusyError(
            f"output {str(self.output)!r} is being written by another tsconv run "
            f"({_describe(holder)}); refusing to start a second writer",
            hint=f"wait for that run to finish or stop it, then run again{self.resume_note}.",
        )

    def release(self) -> None:
        """Give the lock up and remove the file (a killed run leaves it; the next run reuses it)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # Unlinked while still held, so no run can lock this file after we let go of it; a file made by
            # another run after ours was removed is that run's, and stays.
            if self._holds_path(fd):
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


class ObjectLock:
    """An exclusive, expiring lock on one output in an object store, for one run (a context manager; see the module
    docstring). ``acquire`` raises :class:`~tsconv.errors.OutputBusyError` naming the holder while another run's
    lock is live; ``lost`` says whether it could not be renewed within its ttl (another run may hold it), and
    ``check`` raises then."""

    def __init__(
        self, output: StoreURL, *, run_id: str, ttl: float | None = None, resumable: bool = False
    ) -> None:
        self.output = output
        self.resume_note = " (--resume continues it)" if resumable else ""
        self.url = output.with_name(f".{output.name}{LOCK_SUFFIX}")
        self.run_id = run_id
        self.ttl = float(config.current().lock_ttl if ttl is None else ttl)
        self._lost = threading.Event()  # set by the renewal thread, read by the writer's threads
        self._renewed = 0.0  # time.time() of the last successful PUT (wall clock: it runs on while suspended)
        self._etag: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")

    @property
    def held(self) -> bool:
        return self._thread is not None

    @property
    def lost(self) -> bool:
        """Whether this run may no longer hold the lock (not renewed within its ttl, or taken over)."""
        return self._lost.is_set()

    def check(self) -> None:
        """Raise :class:`~tsconv.errors.OutputLostError` when this run may no longer write its output: the lock was
        lost, or not renewed for ``ttl`` seconds and no longer this run's in the store. Called before each write.

        A write can still land between this check and its PUT (S3 has no PUT conditional on another object);
        the renewal every ``ttl / 4`` and the look at the lock object once renewals are overdue keep that
        window to a write already under way when the run stalled."""
        if not self.lost and time.time() - self._renewed > self.ttl:
            # renewals are overdue (the process was paused or its machine suspended) and the renewal thread may
            # not have run since: look at the lock object now rather than write on a lock that may be another's
            try:
                raw = self.url.read_bytes()
                mine = raw is not None and json.loads(raw).get("run_id") == self.run_id
            except Exception:  # out of reach: the write itself fails with its own error, or goes on
                mine = True
            if not mine:
                self._lost.set()
        if self.lost:
            raise OutputLostError(
                f"the lock on the output {self.output.url!r} (run {self.run_id[:12]}) was taken over by another "
                f"run, or could not be renewed, after this run stalled longer than TSCONV_LOCK_TTL "
                f"({self.ttl:g} s); this run wrote nothing more to it, and the other run's output stands",
                hint="check that output, and rerun this one if it is still wanted; for runs that may pause (a "
                "suspended machine, a stopped process), raise TSCONV_LOCK_TTL.",
            )

    def _doc(self) -> bytes:
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": self._started,
                  "run_id": self.run_id, "renewed": time.time(), "ttl": self.ttl}  # fmt: skip
        return json.dumps(holder).encode()

    def _put(self, **conditions: Any) -> None:
        fs, path = self.url.filesystem()
        out = fs.pipe_file(path, self._doc(), **conditions)
        # s3fs returns put_object's answer; the ETag makes the next renewal conditional on this copy
        self._etag = out.get("ETag") if isinstance(out, dict) else None
        self._renewed = time.time()

    def acquire(self) -> ObjectLock:
        """Take the lock now, or refuse (another run renewed its lock less than ``ttl`` seconds ago)."""
        if self.held:
            return self
        try:
            try:
                self._put(mode="create")
            except FileExistsError:
                self._take_over()
        except (OutputBusyError, StoreError):
            raise
        except Exception as exc:
            raise remote_error(exc, self.url, "take the lock of the output") from None
        self._thread = threading.Thread(target=self._renew, name="tsconv-lock-renew", daemon=True)
        self._thread.start()
        return self

    def _take_over(self) -> None:
        fs, path = self.url.filesystem()
        try:
            raw, info = fs.cat_file(path), fs.info(path)
        except FileNotFoundError:  # released since: try once more
            raw, info = None, None
        if raw is None:
            self._put(mode="create")
            return
        if (busy := self._busy(raw)) is not None:
            raise busy
        try:  # the stale lock is replaced only if no one replaced it since we read it
            if self.url.protocol in ("s3", "s3a") and info.get("ETag"):
                self._put(IfMatch=info["ETag"])
            else:  # no conditional overwrite known for this filesystem: delete, then create if absent
                fs.rm_file(path)
                self._put(mode="create")
        except (FileExistsError, OSError):
            raise OutputBusyError(
                f"output {self.output.url!r}: another run took over its stale lock first",
                hint=f"wait for that run to finish, then run again{self.resume_note}.",
            ) from None

    def check_free(self) -> None:
        """Raise :class:`~tsconv.errors.OutputBusyError` naming the holder while another run's lock object is
        live (renewed less than its ttl ago), without taking it."""
        try:
            raw = self.url.read_bytes()
        except Exception:  # out of reach: taking the lock reports it
            return
        if raw is not None and (busy := self._busy(raw)) is not None:
            raise busy

    def _busy(self, raw: bytes) -> OutputBusyError | None:
        """The refusal a lock object holding ``raw`` gives while live; None once it is stale."""
        try:
            holder = json.loads(raw)
        except ValueError:
            holder = {}
        holder = holder if isinstance(holder, dict) else {}
        age = time.time() - float(holder.get("renewed") or 0)
        ttl = float(self.ttl if holder.get("ttl") is None else holder["ttl"])  # the holder's own, 0 included
        if age >= ttl:
            return None
        return OutputBusyError(
            f"output {self.output.url!r} is being written by another tsconv run ({_describe(holder)}, "
            f"its lock renewed {age:.0f} s ago); refusing to start a second writer",
            hint="wait for that run to finish or stop it; a stopped run's lock can be taken over "
            f"{ttl:.0f} s after its last renewal{self.resume_note}.",
        )

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                if self._etag is not None:
                    self._put(IfMatch=self._etag)
                else:
                    raw = self.url.read_bytes()
                    if raw is None or json.loads(raw).get("run_id") != self.run_id:
                        raise FileExistsError("the lock is another run's")
                    self._put()
            except Exception:
                # Taken over (the condition failed), or out of reach for now. A lock is taken over only once it
                # went unrenewed for ttl seconds, so before that a failure is transient: try again next tick;
                # after it the lock may be another run's, and the writer stops (check).
                if time.time() - self._renewed >= self.ttl:
                    self._lost.set()
                    return

    def release(self) -> None:
        """Stop renewing and delete the lock object if it is still this run's."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join()
        try:
            raw = self.url.read_bytes()
            if raw is not None and json.loads(raw).get("run_id") == self.run_id:
                fs, path = self.url.filesystem()
                fs.rm_file(path)
        except Exception:  # a lock left behind goes stale after ttl seconds
            pass

    def __enter__(self) -> ObjectLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
