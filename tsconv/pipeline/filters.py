"""Built-in filter banks: causal FIR filters named by short strings such as ``"ma:16"``.

A bank is applied depthwise: every input feature gets each filter of the bank. Filters follow the
conv1d convention of tsconv: ``out[t] = sum_k w[k] * x[t - (K - 1 - k) * dilation]``, so the last tap
``w[K - 1]`` multiplies the current step and the filter never looks ahead.

Filters:
- ``ma:W``       moving average of the last W steps.
- ``diff:L``     difference (momentum) ``x[t] - x[t - L]``.
- ``dev:W``      deviation from the moving average, ``x[t] - ma_W[t]`` (zero-sum: level-free).
- ``ema:S``      exponential moving average of span S (alpha = 2 / (S + 1)), truncated to 3*S + 1 taps and
                 renormalised to sum 1; ``ema:S:K`` sets the number of taps.
- ``id``         the input itself (one tap).

Power-of-two windows (``ma:16``, ``dev:64``) have weights that FP16 stores exactly; other windows are
rounded (the level term still uses the exact sum; tsconv warns where the rounding moves the outputs by
more than 1e-3 of their scale on the data it runs on).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from tsconv.errors import PipelineError

__all__ = ["FILTER_KINDS", "FILTER_DOCS", "FilterDoc", "parse_filter", "bank_weights"]

FILTER_KINDS = ("ma", "diff", "dev", "ema", "id")
_FILTER_RE = re.compile(r"^(ma|diff|dev|ema|id)(?::(\d+))?(?::(\d+))?$")
_MAX_TAPS = 1 << 16


@dataclass(frozen=True)
class FilterDoc:
    """One filter kind as ``tsconv filters`` lists it."""

    syntax: str  # e.g. "ema:S[:K]"
    taps: str  # the number of taps, in the parameters' names
    description: str
    example: str  # a spec that parses


FILTER_DOCS = {
    "ma": FilterDoc("ma:W", "W", "moving average of the last W steps", "ma:16"),
    "diff": FilterDoc("diff:L", "L + 1", "difference (momentum) x[t] - x[t - L]", "diff:1"),
    "dev": FilterDoc(
        "dev:W",
        "W",
        "deviation from the W-step mean, x[t] - ma_W[t] (zero-sum: free of the price level)",
        "dev:64",
    ),
    "ema": FilterDoc(
        "ema:S[:K]",
        "3S + 1, or K",
        "exponential moving average of span S (alpha = 2 / (S + 1)), truncated to K taps and renormalised to sum 1",
        "ema:32",
    ),
    "id": FilterDoc("id", "1", "the input itself", "id"),
}
MAX_PARAMETER = _MAX_TAPS


def parse_filter(spec: str) -> np.ndarray:
    """Return the float64 taps of one filter given as ``"kind:param[:taps]"`` (oldest tap first)."""
    m = _FILTER_RE.match(spec.strip()) if isinstance(spec, str) else None
    if m is None:
        msg = f"unknown filter {spec!r}"
        raise PipelineError(
            msg, hint=f"use one of {', '.join(k + ':N' for k in FILTER_KINDS[:-1])} or 'id', e.g. 'ma:16'."
        )
    kind, p, q = m.group(1), m.group(2), m.group(3)
    if kind == "id":
        if p is not None:
            raise PipelineError(f"filter {spec!r} takes no parameter", hint="write 'id'.")
        return np.ones(1)
    if p is None:
        raise PipelineError(f"filter {spec!r} needs a parameter", hint=f"write e.g. '{kind}:16'.")
    n = int(p)
    if q is not None and kind != "ema":
        raise PipelineError(f"filter {spec!r} takes one parameter", hint=f"write '{kind}:{n}'.")
    if n < 1 or n > _MAX_TAPS:
        raise PipelineError(f"filter {spec!r}: parameter must be between 1 and {_MAX_TAPS}, got {n}")
    if kind == "ma":
        return np.full(n, 1.0 / n)
    if kind == "diff":
        w = np.zeros(n + 1)
        w[0], w[-1] = -1.0, 1.0
        return w
    if kind == "dev":
        w = np.full(n, -1.0 / n)
        w[-1] += 1.0
        return w
    # ema
    alpha = 2.0 / (n + 1.0)
    taps = int(q) if q is not None else 3 * n + 1
    if taps < 1 or taps > _MAX_TAPS:
        raise PipelineError(f"filter {spec!r}: taps must be between 1 and {_MAX_TAPS}, got {taps}")
    lags = np.arange(taps)[::-1]  # oldest tap first
    w = alpha * (1.0 - alpha) ** lags
    return w / math.fsum(w)


def bank_weights(filters: tuple[str, ...], channels: int) -> np.ndarray:
    """Depthwise weights [channels * M, 1, K] for M filters, left-padded with zeros to the longest one.

    Output channel ``c * M + m`` is filter ``m`` applied to input channel ``c`` (torch's grouped layout).
    """
    taps = [parse_filter(f) for f in filters]
    k = max(len(t) for t in taps)
    bank = np.zeros((len(taps), k))
    for m, t in enumerate(taps):
        bank[m, k - len(t) :] = t  # zeros in front keep the filter causal and aligned on the current step
    return np.tile(bank, (channels, 1))[:, None, :]
