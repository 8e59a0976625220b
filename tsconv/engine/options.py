"""The rules of the options every entry takes (:func:`tsconv.process`, :func:`tsconv.features`,
:class:`tsconv.Stream`, :class:`tsconv.nn.Pipeline`), in one place with their messages.

Light on purpose: an entry on in-memory data imports neither zarr nor the output writers through it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tsconv.errors import StoreError, TsconvError
from tsconv.pipeline.spec import ResolvedPipeline

__all__ = ["WARMUPS", "check_chunk", "check_length", "check_warmup", "refuse", "refuse_time_range"]

WARMUPS = ("nan", "zero")


def check_warmup(warmup: str) -> None:
    """``warmup`` is one of :data:`WARMUPS`."""
    if warmup not in WARMUPS:
        raise TsconvError(f"warmup must be one of {', '.join(WARMUPS)}, got {warmup!r}")


def check_chunk(chunk: int, *, default: int) -> int:
    """``chunk`` (steps a chunk) is a positive integer, a numpy one too; returned as an int (it is recorded in
    JSON: an output's fingerprint and attributes). ``default``: the caller's, for the hint."""
    if isinstance(chunk, bool | np.bool_) or not isinstance(chunk, int | np.integer) or chunk < 1:
        raise TsconvError(
            f"chunk must be a positive integer, got {chunk!r}", hint=f"the default is {default}."
        )
    return int(chunk)


def check_length(rows: int, plan: ResolvedPipeline, warmup: str, where: str, *, empty_hint: str = "write its rows first.") -> None:  # fmt: skip
    """A series of ``rows`` steps has an output row that is not all warm-up; ``empty_hint``: what to do
    about a series of none."""
    if rows == 0:
        raise StoreError(f"{where}: the series is empty (0 steps)", hint=empty_hint)
    # each output has its own warm-up (a bank's short filters are valid before its long ones)
    shortest = min(plan.nan_rows(warmup), default=0)
    if rows <= shortest:
        if plan.pre_halo:
            hint = (
                f"use a longer series or a shorter [preprocess]: its first {plan.pre_halo} steps are NaN "
                "whatever --warmup, and every output's window must reach past them."
            )
        else:
            hint = "use a longer series, shorter filters, or warmup='zero' (--warmup zero) for zero history."
        raise StoreError(
            f"{where}: the series has {rows} steps but the pipeline's shortest warm-up is {shortest} steps, "
            "so every output would be NaN",
            hint=hint,
        )


# the command line's flag of each option whose name differs there
_FLAGS = {"client": "--scheduler"}


def refuse(given: dict[str, Any], where: str) -> None:
    """Options that do not apply to ``where``: an error naming the first one given."""
    for name, value in given.items():
        if value is not None:
            flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
            raise TsconvError(
                f"{name}={value!r} does not apply to {where}",
                hint=f"leave {name} out ({flag} at the command line).",
            )


def refuse_time_range(plan: ResolvedPipeline, what: str, *, hint: str | None = None) -> None:
    """``[preprocess] time_range`` selects output rows of a store with time; refuse it elsewhere. ``hint``:
    what to do instead, where the default (process() a store, or slice the result) does not fit."""
    if plan.preprocess is not None and plan.preprocess.time_range is not None:
        raise TsconvError(
            f"{plan.pipeline.origin}: [preprocess] time_range is not supported by {what}",
            hint=hint
            or "it selects output rows of a store with time in tsconv.process(); slice the result instead.",
        )
