"""Float64 whole-series reference of a pipeline: the semantics every engine path must reproduce.

Written straight from the definitions (per-stage causal zero padding, forward fill, each output's own
warm-up rows, every built-in filter from its formula over its own window), sharing no code with the
streaming engine, so tests and benchmarks can trust it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from tsconv.kernels.torch_side import apply_activation
from tsconv.pipeline.filters import Filter
from tsconv.pipeline.spec import ResolvedPipeline

__all__ = ["bank_reference", "forward_fill_reference", "preprocess_reference", "pipeline_reference"]


def forward_fill_reference(x: np.ndarray) -> np.ndarray:
    """Forward-fill NaNs down each column; leading NaNs stay NaN."""
    out = np.array(x, dtype=np.float64, copy=True)
    for j in range(out.shape[1]):
        col = out[:, j]
        last = np.nan
        for t in range(col.shape[0]):
            if np.isnan(col[t]):
                col[t] = last
            else:
                last = col[t]
    return out


def preprocess_reference(x: np.ndarray, plan: ResolvedPipeline) -> np.ndarray:
    """The ``[preprocess]`` series of ``x`` [T, F] (all the source's features) in float64: [T, C].

    Fill, select, transform, z-score, straight from the definitions: p_t is NaN where it needs a step
    before 0; log of a value <= 0 is NaN; a z-score window with a NaN or with all values equal is NaN.
    """
    pre = plan.preprocess
    x = np.asarray(x, dtype=np.float64)
    p = forward_fill_reference(x) if pre is None or pre.fill == "ffill" else x.copy()
    if plan.columns is not None:
        p = p[:, list(plan.columns)]
    if pre is None:
        return p
    if pre.transform in ("log", "log_return"):
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), np.nan)
    if pre.transform in ("diff", "log_return"):
        d = np.full_like(p, np.nan)
        d[1:] = p[1:] - p[:-1]
        p = d
    if pre.zscore is not None:
        w = pre.zscore
        z = np.full_like(p, np.nan)
        for t in range(w - 1, p.shape[0]):
            win = p[t - w + 1 : t + 1]  # [w, C]
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # squares past float64: NaN
                mean = win.mean(axis=0)
                std = np.sqrt(((win - mean) ** 2).mean(axis=0))
                zt = (p[t] - mean) / std
            flat = (win == win[0]).all(axis=0)
            zt[flat | ~np.isfinite(win).all(axis=0) | ~np.isfinite(std)] = np.nan
            z[t] = zt
        p = z
    return p


def pipeline_reference(x: np.ndarray, plan: ResolvedPipeline, *, warmup: str = "nan") -> np.ndarray:
    """Run ``plan`` on the whole series ``x`` [T, F] in float64 with the weights as given (before any
    rounding to their stored dtype; biases as stored); returns [T, D]."""
    filled = preprocess_reference(x, plan)
    y = torch.from_numpy(filled.T.copy())[None]  # [1, C, T]
    for layer in plan.layers:
        if layer.filters is not None:
            y = apply_activation(bank_reference(y, layer.filters, layer.dilation), layer.activation)
            continue
        w = torch.from_numpy(layer.given)
        b = None if layer.bias is None else torch.from_numpy(layer.bias.astype(np.float64))
        y = F.conv1d(F.pad(y, (layer.halo, 0)), w, b, dilation=layer.dilation, groups=layer.groups)
        y = apply_activation(y, layer.activation)
    out = y[0].T  # [T, O]
    if plan.head is not None:
        out = out @ torch.from_numpy(plan.head.given)
        if plan.head.bias is not None:
            out = out + torch.from_numpy(plan.head.bias.astype(np.float64))
        out = apply_activation(out, plan.head.activation)
    result = out.numpy().copy()
    if warmup == "nan":
        warm = plan.warmups or (plan.halo,) * result.shape[1]
        for j, w in enumerate(warm):
            result[:w, j] = np.nan
    return result


def bank_reference(y: torch.Tensor, filters: tuple[Filter, ...], dilation: int) -> torch.Tensor:
    """A bank over ``y`` [1, C, T] float64, each filter by its formula over its own window (not the padded
    taps, whose zeros would carry a NaN across the longest filter's reach): [1, C x M, T], channel-major."""
    series = y[0].numpy()
    outs = [_filter_reference(series[c], f, dilation) for c in range(series.shape[0]) for f in filters]
    return torch.from_numpy(np.stack(outs))[None]


def _filter_reference(s: np.ndarray, f: Filter, dilation: int) -> np.ndarray:
    """One built-in filter over the float64 series ``s`` [T] with zero history before step 0, each step from
    its window ``s[t], s[t - d], ..., s[t - (taps - 1) d]`` (newest first) by the filter's formula."""
    pad = f.halo * dilation
    padded = np.concatenate([np.zeros(pad), s])
    idx = np.arange(s.shape[0])[:, None] + pad - dilation * np.arange(f.taps)[None, :]
    win = padded[idx]  # [T, taps], newest first
    now, old = win[:, 0], win[:, -1]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if f.kind == "id":
            return now.copy()
        if f.kind == "lag":
            return old.copy()
        if f.kind == "diff":
            return now - old
        if f.kind == "ret":
            ok = (now > 0) & (old > 0)
            return np.where(ok, np.log(np.where(ok, now, 1.0) / np.where(ok, old, 1.0)), np.nan)
        if f.kind == "ema":
            w = f.alpha * (1.0 - f.alpha) ** np.arange(f.taps)
            if f.alpha < 1:
                return win @ (w / w.sum())
            # alpha 1: the current value, NaN or +-inf where the window holds one (as its mean)
            mean = win.mean(axis=1)
            return np.where(np.isfinite(mean), now, mean)
        mean = win.mean(axis=1)
        if f.kind == "ma":
            return mean
        if f.kind == "dev":
            return now - mean
        finite = np.isfinite(win).all(axis=1)
        std = np.sqrt(((win - mean[:, None]) ** 2).sum(axis=1) / (f.taps - 1))
        # a window of equal values has std 0 exactly (its float64 mean can be an ulp off each of them)
        std = np.where((win == win[:, :1]).all(axis=1), 0.0, std)
        std = np.where(finite, std, np.nan)
        if f.kind == "std":
            return std
        return np.where((std > 0) & (std < np.inf), (now - mean) / std, np.nan)  # zscore
