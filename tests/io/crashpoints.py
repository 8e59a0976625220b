"""Stop a process right after its n-th change to a zarr store: a kill -9 at a chosen instant, made
deterministic. Used in-process (raising) and in subprocesses (SIGKILL) by the ingest crash tests.

:func:`install` counts zarr's own changes (attributes, resizes, row writes); :func:`install_fs` counts
the file-system changes that commit anything (a rename or replace onto its final name, an unlink, a
rmdir), which also sees tsconv's output writer, whose chunk and metadata files bypass zarr.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import zarr
from zarr.core.attributes import Attributes

# What one change is: an attribute write, an array resize, or a write of array rows.
_PATCHED = ((Attributes, "__setitem__"), (zarr.Array, "resize"), (zarr.Array, "__setitem__"))


def install(at: int, crash: Callable[[], None]) -> tuple[list[str], Callable[[], None]]:
    """Call ``crash`` right after store change number ``at`` (0-based) completes. Returns the log of
    changes made so far (e.g. 'resize values') and a function that undoes the patch."""
    log: list[str] = []
    saved = [(cls, name, getattr(cls, name)) for cls, name in _PATCHED]

    def wrap(kind: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = orig(self, *args, **kwargs)
            what = f"{kind} {args[0]}" if isinstance(self, Attributes) else f"{kind} {self.basename}"
            log.append(what)
            if len(log) - 1 == at:
                crash()
            return result

        return patched

    for cls, name, orig in saved:
        kind = "attrs" if cls is Attributes else ("resize" if name == "resize" else "write")
        setattr(cls, name, wrap(kind, orig))

    def undo() -> None:
        for cls, name, orig in saved:
            setattr(cls, name, orig)

    return log, undo


# The file-system calls that make a change visible: everything else writes under a temporary name first.
_FS_CALLS = ("replace", "rename", "unlink", "rmdir")


def install_fs(
    at: int, crash: Callable[[str], None], *, before: bool = False
) -> tuple[list[str], Callable[[], None]]:
    """Call ``crash(change)`` right after file-system change number ``at`` (0-based) completes, or right
    before it starts when ``before`` (a chunk's temporary file written, not yet renamed in). Counts
    ``os.replace``, ``os.rename``, ``os.unlink`` and ``os.rmdir`` from every thread (pathlib and
    shutil.rmtree call them too). Returns the log of changes (e.g. 'replace .../values/c/3/0') and a
    function that undoes the patch."""
    log: list[str] = []
    lock = threading.Lock()
    saved = [(name, getattr(os, name)) for name in _FS_CALLS]

    def wrap(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        def patched(*args: Any, **kwargs: Any) -> Any:
            what = f"{name} {os.fsdecode(args[1] if name in ('replace', 'rename') else args[0])}"
            with lock:
                n = len(log)
                log.append(what)
            if before and n == at:
                crash(what)
            result = orig(*args, **kwargs)
            if not before and n == at:
                crash(what)
            return result

        return patched

    for name, orig in saved:
        setattr(os, name, wrap(name, orig))

    def undo() -> None:
        for name, orig in saved:
            setattr(os, name, orig)

    return log, undo


def kill_now() -> None:
    """What a crash is: no cleanup, no finally blocks, no flushing."""
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    # python -m tests.io.crashpoints AT CHUNK_BYTES BAND_BYTES FILE STORE: append FILE to STORE, killed
    # right after store change AT.
    import tsconv.io.ingest as ing

    at, chunk_bytes, band_bytes, file, store = sys.argv[1:6]
    ing._CHUNK_BYTES, ing._BAND_BYTES = int(chunk_bytes), int(band_bytes)
    install(int(at), kill_now)
    ing.ingest(file, store, append=True)
