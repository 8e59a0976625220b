"""Built-in filters: causal filters named by short strings such as ``"ma:16"``, applied in banks.

A bank is applied depthwise: every input feature gets each filter of the bank. A filter reads the current
step and earlier ones only: with a stage's dilation d, ``x[t], x[t - d], ..., x[t - (taps - 1) d]``. Each
filter is computed from its definition (:mod:`tsconv.kernels.filterbank`), not as a convolution padded to
the bank's longest filter: its output at step t is NaN only where a value it reads is NaN (lag, diff and
ret read the two ends of their window, the other filters all of it) or where a formula below says so, and with ``--warmup nan`` only its own first ``taps - 1`` steps (times the
dilation) are warm-up.

Filters (W, L, S integers >= 1; std and zscore need W >= 2):

- ``id``         ``x[t]``.
- ``lag:L``      ``x[t - L]``.
- ``diff:L``     ``x[t] - x[t - L]``.
- ``ret:L``      log return ``log(x[t] / x[t - L])``; NaN where either value is <= 0 (or NaN).
- ``ma:W``       mean of the last W values.
- ``dev:W``      ``x[t] - ma_W[t]``.
- ``std:W``      sample standard deviation (ddof = 1, as polars' and pandas' rolling std) of the last W
                 values; NaN where the window holds an infinity.
- ``zscore:W``   ``(x[t] - ma_W[t]) / std_W[t]``; NaN where std_W is 0 (a flat window) or NaN.
- ``ema:S``      exponential moving average of span S, alpha = 2 / (S + 1): the weights alpha (1 - alpha)^k of
                 the last K values renormalised to sum 1, with K the smallest window whose dropped weight
                 (1 - alpha)^K is at most 2^-24 (float32's resolution): about 8.3 (S + 1) steps, so it equals
                 the exact recursion e[t] = alpha x[t] + (1 - alpha) e[t - 1] to float32 resolution once
                 warmed up. ``ema:S:K`` sets K.

Window sums are float64 pairwise sums over exactly the window's values (no running subtraction), so a
huge or infinite value changes only the outputs whose window holds it, and the result does not depend on
where a chunk starts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from tsconv.errors import PipelineError

__all__ = [
    "FILTER_KINDS",
    "FILTER_DOCS",
    "Filter",
    "FilterDoc",
    "MAX_PARAMETER",
    "ema_taps",
    "filter_spec",
    "largest_ema_span",
    "parse_filter",
    "bank_weights",
]

# the order `tsconv filters` and pipelines/README.md list them in
FILTER_KINDS = ("id", "lag", "diff", "ret", "ma", "dev", "std", "zscore", "ema")
# at most 18 digits a parameter (the largest allowed has 5): int() refuses 4,300 digits with a traceback
_FILTER_RE = re.compile(
    r"^(ma|diff|dev|ema|std|zscore|lag|ret|id)(?::(\d{1,18}))?(?::(\d{1,18}))?$", re.ASCII
)
_MAX_TAPS = 1 << 16
MAX_PARAMETER = _MAX_TAPS
# (1 - alpha)^K <= 2^-24: the weight an ema:S drops is below float32's resolution
_EMA_DROP_LOG2 = 24


@dataclass(frozen=True)
class FilterDoc:
    """One filter kind as ``tsconv filters`` lists it."""

    syntax: str  # e.g. "ema:S[:K]"
    taps: str  # the window, in the parameters' names
    warmup: str  # steps of warm-up (NaN with --warmup nan), times the stage's dilation
    description: str
    example: str  # a spec that parses


FILTER_DOCS = {
    "id": FilterDoc("id", "1", "0", "the input itself", "id"),
    "lag": FilterDoc("lag:L", "L + 1", "L", "the value L steps back, x[t - L]", "lag:1"),
    "diff": FilterDoc("diff:L", "L + 1", "L", "difference (momentum) x[t] - x[t - L]", "diff:1"),
    "ret": FilterDoc(
        "ret:L", "L + 1", "L", "log return log(x[t] / x[t - L]); NaN where either value is <= 0", "ret:1"
    ),
    "ma": FilterDoc("ma:W", "W", "W - 1", "mean of the last W values", "ma:16"),
    "dev": FilterDoc(
        "dev:W",
        "W",
        "W - 1",
        "deviation from the W-step mean, x[t] - ma_W[t] (free of the price level)",
        "dev:64",
    ),
    "std": FilterDoc(
        "std:W",
        "W",
        "W - 1",
        "sample standard deviation (ddof = 1) of the last W values, W >= 2; NaN where the window holds an infinity",
        "std:32",
    ),
    "zscore": FilterDoc(
        "zscore:W",
        "W",
        "W - 1",
        "(x[t] - ma_W[t]) / std_W[t], W >= 2; NaN where std_W is 0 (all W values equal) or NaN",
        "zscore:64",
    ),
    "ema": FilterDoc(
        "ema:S[:K]",
        "K",
        "K - 1",
        "exponential moving average, alpha = 2 / (S + 1): weights alpha (1 - alpha)^k over the last K values, "
        "renormalised to sum 1; K defaults to the smallest window with (1 - alpha)^K <= 2^-24 (about 8.3 (S + 1)), "
        "so it is the exact recursion to float32 resolution",
        "ema:32",
    ),
}


@dataclass(frozen=True)
class Filter:
    """One parsed filter: its kind, parameter and window (``taps``: the steps it reads, the current one
    included, in units of the stage's dilation)."""

    spec: str  # as written, stripped
    kind: str
    n: int  # W, L or S (0 for id)
    taps: int

    @property
    def halo(self) -> int:
        """Steps before the current one that the filter reads (its warm-up), per unit of dilation."""
        return self.taps - 1

    @property
    def label(self) -> str:
        """``ma:16`` -> ``ma16``, ``ema:8:4`` -> ``ema8_4``: unique per filter, no ':' in column names."""
        kind, *params = self.spec.split(":")
        return kind + "_".join(params)

    @property
    def alpha(self) -> float:
        """The EMA's smoothing factor 2 / (S + 1) (ema only)."""
        return 2.0 / (self.n + 1.0)


def ema_taps(span: int) -> int:
    """The default window of ``ema:span``: the smallest K with (1 - alpha)^K <= 2^-24."""
    alpha = 2.0 / (span + 1.0)
    if alpha >= 1.0:
        return 1
    return max(1, math.ceil(_EMA_DROP_LOG2 * math.log(2.0) / -math.log1p(-alpha)))


def filter_spec(spec: str) -> Filter:
    """Parse one filter given as ``"kind:param[:taps]"``; a :class:`PipelineError` names what is wrong."""
    m = _FILTER_RE.match(spec.strip()) if isinstance(spec, str) else None
    if m is None:
        shown = spec[:60] + "..." if isinstance(spec, str) and len(spec) > 60 else spec
        msg = f"unknown filter {shown!r}"
        raise PipelineError(
            msg,
            hint=f"use 'id' or one of {', '.join(k + ':N' for k in FILTER_KINDS if k != 'id')}, e.g. 'ma:16'.",
        )
    kind, p, q = m.group(1), m.group(2), m.group(3)
    text = spec.strip()
    if kind == "id":
        if p is not None:
            raise PipelineError(f"filter {spec!r} takes no parameter", hint="write 'id'.")
        return Filter(text, "id", 0, 1)
    if p is None:
        raise PipelineError(f"filter {spec!r} needs a parameter", hint=f"write e.g. '{kind}:16'.")
    n = int(p)
    if q is not None and kind != "ema":
        raise PipelineError(f"filter {spec!r} takes one parameter", hint=f"write '{kind}:{n}'.")
    if n < 1 or n > _MAX_TAPS:
        raise PipelineError(
            f"filter {spec!r}: parameter must be between 1 and {_MAX_TAPS}, got {n}",
            hint=f"write e.g. '{kind}:{min(max(n, 1), _MAX_TAPS)}'.",
        )
    if kind in ("std", "zscore") and n < 2:
        raise PipelineError(
            f"filter {spec!r}: a standard deviation needs a window of at least 2 steps",
            hint=f"write e.g. '{kind}:2'.",
        )
    if kind in ("diff", "lag", "ret"):
        taps = n + 1
    elif kind == "ema":
        taps = int(q) if q is not None else ema_taps(n)
        if taps < 1 or taps > _MAX_TAPS:
            raise PipelineError(
                f"filter {spec!r}: taps must be between 1 and {_MAX_TAPS}, got {taps}",
                hint=f"an ema:S window holds about 8.3 (S + 1) steps: S up to {largest_ema_span():,}, or set "
                "the taps with 'ema:S:K'."
                if q is None
                else None,
            )
    else:
        taps = n
    return Filter(text, kind, n, taps)


def largest_ema_span() -> int:
    """The largest S of an ``ema:S`` whose default window fits the most taps (7,879)."""
    lo, hi = 1, _MAX_TAPS
    while lo < hi:  # the largest S whose default window fits
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ema_taps(mid) <= _MAX_TAPS else (lo, mid - 1)
    return lo


def parse_filter(spec: str) -> np.ndarray:
    """The float64 taps (oldest first) of the filter's linear form.

    Linear filters (id, lag, diff, ma, dev, ema) are these FIR filters up to how NaN and infinities spread;
    std, zscore and ret are not linear and give the taps of ma:W (std, zscore) or diff:L (ret), which have
    their window. The engine computes every filter from its definition (see the module's docstring); these
    taps size windows, record the stage and bound errors in tests.
    """
    f = filter_spec(spec)
    if f.kind == "id":
        return np.ones(1)
    if f.kind in ("ma", "std", "zscore"):
        return np.full(f.n, 1.0 / f.n)
    if f.kind in ("diff", "ret"):
        w = np.zeros(f.taps)
        w[0], w[-1] = -1.0, 1.0
        return w
    if f.kind == "lag":
        w = np.zeros(f.taps)
        w[0] = 1.0
        return w
    if f.kind == "dev":
        w = np.full(f.n, -1.0 / f.n)
        w[-1] += 1.0
        return w
    alpha = f.alpha
    lags = np.arange(f.taps)[::-1]  # oldest tap first
    w = alpha * (1.0 - alpha) ** lags
    return w / math.fsum(w)


def bank_weights(filters: tuple[str, ...], channels: int) -> np.ndarray:
    """The linear forms (:func:`parse_filter`) as depthwise weights [channels * M, 1, K], left-padded with
    zeros to the longest filter. Output channel ``c * M + m`` is filter ``m`` applied to input channel ``c``
    (torch's grouped layout)."""
    taps = [parse_filter(f) for f in filters]
    k = max(len(t) for t in taps)
    bank = np.zeros((len(taps), k))
    for m, t in enumerate(taps):
        bank[m, k - len(t) :] = t  # zeros in front keep the filter causal and aligned on the current step
    return np.tile(bank, (channels, 1))[:, None, :]
