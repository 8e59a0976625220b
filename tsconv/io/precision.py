"""What reading input values as float32 loses: which dtypes float32 holds, and where rounding to it matters.

On the CPU an input float32 does not hold is read as float64 (``tsconv.engine.compute.Backend.reads_float64``);
the GPU's engine reads float32, and ``tsconv ingest --dtype float32`` stores float32. There a float64 price near
400 moves by up to 1.5e-5, which is 1.5e-3 of a 0.01 step, and every difference or deviation of such prices
carries it: :func:`float32_loss` says so where it exceeds :data:`WARN_AT` of a feature's typical step.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tsconv.errors import TsconvWarning

__all__ = [
    "WARN_AT",
    "Float32Check",
    "WideIntegerCheck",
    "exact_in_float32",
    "float32_loss",
    "float32_loss_by_feature",
    "float32_loss_in_blocks",
]


def exact_in_float32(dtype: Any) -> bool:
    """Whether float32 holds every value of ``dtype``, a numpy or torch dtype (float16, bfloat16 and float32,
    integers of up to 16 bits)."""
    if getattr(dtype, "is_floating_point", None) is not None:  # a torch dtype (bfloat16 has no numpy twin)
        return dtype.itemsize <= (4 if dtype.is_floating_point else 2)
    dtype = np.dtype(dtype)
    return (dtype.kind == "f" and dtype.itemsize <= 4) or (dtype.kind in "iub" and dtype.itemsize <= 2)


# The FP16-storage warning's threshold (README, "Precision"): half the 1e-3 of an output's scale promised.
WARN_AT = 5e-4
_SAMPLE_ROWS = 1024


_READ = "the input's values are {dtype}, and they are read as float32"
_ADVICE = ("for results exact to the input, compute on the CPU (which reads float64), or store float32 values near "
           "zero (prices less a reference level) or prices in ticks as integers below 2^24")  # fmt: skip


def float32_loss(
    sample: np.ndarray, names: Sequence[str], *, context: str = _READ, advice: str = _ADVICE
) -> str | None:
    """A warning's text where rounding ``sample`` [n, F] (the input's rows in its own dtype) to float32 moves
    a feature's values by more than :data:`WARN_AT` of its typical step (the mean of its nonzero one-step
    changes), or past float32's range; None where it does not. ``context`` opens the text (``{dtype}``: the
    sample's), ``advice`` ends it."""
    return float32_loss_by_feature(sample, names, context=context, advice=advice)[0]


def float32_loss_by_feature(
    sample: np.ndarray, names: Sequence[str], *, context: str = _READ, advice: str = _ADVICE,
    groups: np.ndarray | None = None,
) -> tuple[str | None, np.ndarray]:  # fmt: skip
    """:func:`float32_loss`, and which features the sample settled ([F] bool): those with a nonzero step in
    it (the others, a symbol not trading yet, are for a later sample to judge).

    ``groups``: a group number per row (0, 1, ...; each group's rows together, in time order), whose rows are
    separate series: a feature per group and column, ``names`` group by group (each symbol's columns of long
    tick files, judged in one pass however many symbols); the whole sample is judged, not its first rows."""
    if groups is None:
        x = np.asarray(sample[:_SAMPLE_ROWS], dtype=np.float64)
        n_groups = 1
    else:
        x = np.asarray(sample, dtype=np.float64)
        n_groups = int(groups.max()) + 1 if groups.size else 0
    cols = x.shape[1] if x.ndim == 2 else 0
    settled = np.zeros(n_groups * cols, dtype=bool)
    if exact_in_float32(sample.dtype):
        return None, ~settled
    if x.size == 0:
        return None, settled
    stats = _loss_stats(x, groups, n_groups)
    message = _loss_message(stats, names, dtype=sample.dtype, context=context, advice=advice)
    return message, (~settled if stats[0].any() else stats[2] > 0)  # a value beyond float32 settles them all


def float32_loss_in_blocks(
    blocks: Iterable[tuple[np.ndarray, Sequence[str]]], *, context: str = _READ, advice: str = _ADVICE
) -> str | None:
    """:func:`float32_loss` over the whole samples [n, F_i] of several column blocks of one series (their
    rows in time order), judged as one: the warning names the worst feature of them all and counts the
    others. The blocks are taken one at a time, so a wide file's sample never has to be held whole."""
    parts: list[tuple[np.ndarray, ...]] = []
    names: list[str] = []
    dtype: Any = None
    for sample, block_names in blocks:
        if exact_in_float32(sample.dtype) or sample.size == 0:
            continue
        dtype = sample.dtype
        parts.append(_loss_stats(np.asarray(sample, dtype=np.float64), None, 1))
        names.extend(block_names)
    if not parts:
        return None
    stats = tuple(np.concatenate(column) for column in zip(*parts, strict=True))
    return _loss_message(stats, names, dtype=dtype, context=context, advice=advice)


def _loss_stats(x: np.ndarray, groups: np.ndarray | None, n_groups: int) -> tuple[np.ndarray, ...]:
    """Per feature: whether a value leaves float32's range, the largest move of rounding, the count of
    nonzero finite steps and their total (``groups`` as :func:`float32_loss_by_feature` takes them)."""
    cols = x.shape[1]
    with np.errstate(over="ignore", invalid="ignore"):  # infinities: inf - inf, judged by `finite` below
        rounded = x.astype(np.float32).astype(np.float64)
        steps = np.abs(np.diff(x, axis=0))
        moved_all = np.abs(x - rounded)
    finite = np.isfinite(x)
    lost = finite & ~np.isfinite(rounded)
    moved_rows = np.where(finite, moved_all, 0.0)
    # the mean of the nonzero finite steps, one pass (a median took 0.2-0.6 s on 4,096 x 1,024 on the VM)
    used = np.isfinite(steps) & (steps > 0)
    if groups is None:
        return (
            lost.any(axis=0),
            moved_rows.max(axis=0),
            used.sum(axis=0),
            np.where(used, steps, 0.0).sum(axis=0),
        )
    # per group: no step across two groups' rows
    used &= (groups[1:] == groups[:-1])[:, None]
    beyond = np.zeros((n_groups, cols), dtype=bool)
    moved, count, total = (np.zeros((n_groups, cols)), np.zeros((n_groups, cols)), np.zeros((n_groups, cols)))
    np.logical_or.at(beyond, groups, lost)
    np.maximum.at(moved, groups, moved_rows)
    np.add.at(count, groups[1:], used)
    np.add.at(total, groups[1:], np.where(used, steps, 0.0))
    return beyond.reshape(-1), moved.reshape(-1), count.reshape(-1), total.reshape(-1)


def _loss_message(
    stats: tuple[np.ndarray, ...], names: Sequence[str], *, dtype: Any, context: str, advice: str
) -> str | None:
    beyond, moved, count, total = stats
    if beyond.any():
        j = int(np.flatnonzero(beyond)[0])
        return (
            f"{context.format(dtype=dtype)}: {names[j]!r} holds values beyond float32's range (about "
            f"3.4e38), which become infinities; rescale them"
        )
    if not count.any():
        return None
    typical = total / np.maximum(count, 1)
    share = np.where(count > 0, moved / np.where(count > 0, typical, 1.0), 0.0)
    over = np.flatnonzero(share > WARN_AT)
    if not over.size:
        return None
    j = int(over[np.argmax(share[over])])
    others = f" (and {over.size - 1:,} more features)" if over.size > 1 else ""
    return (
        f"{context.format(dtype=dtype)}: rounding the values of {names[j]!r} to float32 moves them by up to "
        f"{moved[j]:.2g}, {share[j]:.1e} of their mean nonzero one-step change ({typical[j]:.2g}){others}, and "
        f"differences and deviations of them carry that error; {advice}"
    )


# Reads a check looks at before it stops waiting for the features with no step yet (symbols not trading)
_MAX_CHECKS = 64


class Float32Check:
    """Checks the rows a run reads (or an ingest stores) in a dtype float32 does not hold, and warns once, from
    the caller's thread, where rounding them to float32 matters (:func:`float32_loss`). A feature is judged on
    the first read in which it moves (a symbol that starts late, on a later one); the check stops at the
    warning, once every feature is judged, or after :data:`_MAX_CHECKS` reads. ``context``, ``advice``: as
    for :func:`float32_loss`."""

    def __init__(self, names: Sequence[str], *, context: str = _READ, advice: str = _ADVICE) -> None:
        self.names = tuple(names)
        self.context, self.advice = context, advice
        self.pending = np.ones(len(self.names), dtype=bool)
        self.checks = 0
        self.warned = False

    @property
    def done(self) -> bool:
        return not self.pending.any() or self.checks >= _MAX_CHECKS

    def see(self, rows: np.ndarray, columns: Sequence[int] | None = None) -> None:
        """Check ``rows`` [n, F] (as read: one column per name, or ``columns`` of them, in the names' order)
        for the features not judged yet; nothing is copied once every feature is judged or for a dtype
        float32 holds."""
        if self.done or rows.shape[0] == 0 or exact_in_float32(rows.dtype):
            return
        self.checks += 1
        cols = np.flatnonzero(self.pending)
        sel = cols if columns is None else np.asarray(columns)[cols]
        # from the first row where one of them has a value (a late symbol's first rows in this read), a block
        # at a time: a read can be a band of 65,536 rows of a wide store, too much to copy for a sample
        first = rows.shape[0]
        for a in range(0, rows.shape[0], _SAMPLE_ROWS):
            finite = np.isfinite(rows[a : a + _SAMPLE_ROWS, sel]).any(axis=1)
            if finite.any():
                first = a + int(np.argmax(finite))
                break
        part = rows[first : first + _SAMPLE_ROWS, sel]
        names = [self.names[j] for j in cols]
        message, settled = float32_loss_by_feature(part, names, context=self.context, advice=self.advice)
        self.pending[cols[settled]] = False
        if message is not None:
            self.pending[:] = False
            self.warned = True
            warnings.warn(message, TsconvWarning, stacklevel=3)


# float64 holds every integer up to 2^53 in magnitude; int64 and uint64 go beyond
_FLOAT64_EXACT = 2**53


class WideIntegerCheck:
    """Warns once, from the caller's thread, where int64 or uint64 rows hold values beyond 2^53, which the CPU's
    float64 read rounds (nanosecond timestamps as a feature: differences of 100 and 150 came out as 0 and 256).
    Every read of such a dtype is checked until it warns: its minimum and maximum, without a copy. ``notes``:
    where given, the warning's message is appended there instead of given (a dask task's, which the client
    gives)."""

    def __init__(self, names: Sequence[str], *, notes: list[str] | None = None) -> None:
        self.names = tuple(names)
        self.notes = notes
        self.warned = False

    def see(self, rows: np.ndarray) -> None:
        """Check ``rows`` [n, F] (one column per name) as read, before their float64 conversion."""
        if self.warned or rows.dtype.kind not in "iu" or rows.dtype.itemsize < 8 or rows.size == 0:
            return
        if int(rows.max()) <= _FLOAT64_EXACT and int(rows.min()) >= -_FLOAT64_EXACT:  # two passes, no copy
            return
        big = (
            (rows > _FLOAT64_EXACT) | (rows < -_FLOAT64_EXACT)
            if rows.dtype.kind == "i"
            else rows > _FLOAT64_EXACT
        )
        hit = np.flatnonzero(big.any(axis=0))
        if hit.size == 0:
            return
        j = int(hit[0])
        self._warn(self.names[j], int(rows[int(np.argmax(big[:, j])), j]), len(hit))

    def see_ranges(self, ranges: Mapping[str, tuple[int, int]]) -> None:
        """Check the least and greatest value of integer columns, by feature name (names not among this
        check's are not read), where the values reach the reader already converted: a frame's columns."""
        if self.warned:
            return
        hit = [
            (n, lo, hi)
            for n, (lo, hi) in ranges.items()
            if n in self.names and not -_FLOAT64_EXACT <= lo <= hi <= _FLOAT64_EXACT
        ]
        if hit:
            name, lo, hi = hit[0]
            self._warn(name, hi if hi > _FLOAT64_EXACT else lo, len(hit))

    def _warn(self, name: str, value: int, count: int) -> None:
        """Warn of ``name``, one of ``count`` features (itself included) holding such values."""
        self.warned = True
        # the others only: "(1 feature(s) like it)" of a feature alone said there was a second one
        others = f" (and {count - 1:,} more features)" if count > 1 else ""
        message = (
            f"feature {name!r} holds integers beyond 2^53 (e.g. {value:,}), which float64 rounds to a "
            f"multiple of {int(np.spacing(np.float64(abs(value)))):,}: its differences and deviations lose "
            f"those low digits{others}; subtract a reference value (e.g. the first) before "
            "storing them, or store them as float64 if that rounding is acceptable"
        )
        if self.notes is not None:
            self.notes.append(message)
        else:
            warnings.warn(message, TsconvWarning, stacklevel=4)
