"""Errors a user can act on: what was expected, what arrived, and how to fix it."""

from __future__ import annotations

import errno


class TsconvError(ValueError):
    """Base error of tsconv. The CLI prints its message on one line and exits non-zero."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message}; hint: {hint}" if hint else message)


class StoreError(TsconvError):
    """The input or output store is missing, malformed or not usable."""


class PipelineError(TsconvError):
    """A pipeline file or pipeline object is invalid."""


class ShapeError(TsconvError):
    """Arrays, weights or options have shapes, dtypes or devices that do not fit together."""


class OutputExistsError(TsconvError):
    """The output store exists and neither overwrite nor resume was asked for."""


class OutputBusyError(StoreError):
    """Another run holds the output's lock: one writer per output at a time."""


class OutputLostError(StoreError):
    """Another run took over this run's output (an object store's lock, lost while this run stalled): this run
    writes nothing more to it."""


class GpuError(TsconvError):
    """The GPU could not run the job: its memory is taken (by this run's budget or another process)."""


class TsconvWarning(UserWarning):
    """A result is computed but may not be what the user expects (e.g. FP16 weight rounding)."""


def first_line(exc: BaseException) -> str:
    """An exception's message as one line for a user: its first non-empty line (libraries such as polars put
    the cause there and generic advice after it), whitespace collapsed, at most 300 characters; the
    exception's type name where it has no message."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = " ".join((lines[0] if lines else type(exc).__name__).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def disk_advice(exc: OSError) -> str:
    """What a failed write asks of the user, for a hint: free space where the disk is full, else both."""
    return "free space on its disk" if exc.errno == errno.ENOSPC else "check free space and permissions"
