"""Shared test helpers: small stores, random pipelines, and the fp32 error bound."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np
import pytest
import zarr

from tsconv.kernels.reference import pipeline_reference, preprocess_reference
from tsconv.pipeline.spec import ResolvedPipeline

T0 = 1_767_346_200_000_000_000  # 2026-01-02 09:30 UTC in ns


def mostly_slow(cases: Sequence[object], *, fast: Collection[int]) -> list[object]:
    """``cases`` for ``pytest.mark.parametrize`` with every case but those at the ``fast`` indices marked
    slow: the default run keeps a representative few, ``pytest -m slow`` runs the rest. A tuple is one
    case of several arguments."""
    out: list[object] = []
    for i, case in enumerate(cases):
        values = case if isinstance(case, tuple) else (case,)
        out.append(pytest.param(*values, marks=() if i in fast else pytest.mark.slow))
    return out


def price_series(rows: int, features: int, *, seed: int = 0, nan_fraction: float = 0.0) -> np.ndarray:
    """Random walks near 100 on a 0.01 tick grid, float32, with optional NaN cells."""
    rng = np.random.default_rng(seed)
    steps = rng.choice([-1, 0, 0, 0, 1], size=(rows, features)) * 0.01
    x = (100.0 + rng.uniform(-20, 20, size=features) + np.cumsum(steps, axis=0)).astype(np.float32)
    if nan_fraction:
        x[rng.random(x.shape) < nan_fraction] = np.nan
    return x


def write_store(
    path: Path,
    x: np.ndarray,
    *,
    chunks: tuple[int, int] | None = None,
    time: bool = True,
    zarr_format: int = 3,
) -> Path:
    g = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    g.create_array("values", data=x, chunks=chunks or (min(4096, x.shape[0]), x.shape[1]))
    if time:
        g.create_array(
            "time",
            data=T0 + np.arange(x.shape[0], dtype=np.int64) * 1_000_000,
            chunks=(chunks or (4096,))[:1],
        )
    g.attrs["features"] = [f"x{j}" for j in range(x.shape[1])]
    return path


def process_batched(*args: object, **kw: object) -> object:
    """``tsconv.process`` with the batched engine forced (on the CPU: through the Triton interpreter)."""
    import tsconv
    from tsconv import config

    with config.override(engine="batched"):
        return tsconv.process(*args, **kw)


def read_output(path: Path) -> np.ndarray:
    return np.asarray(zarr.open_group(str(path), mode="r")["values"][:])


# The engine re-centres the first stage on levels per block of output rows (tsconv's conv1d: its time tile,
# at most 256 rows; the CPU path: 16 rows or the halo), on a value of x from that block's window.
_RECENTER_WINDOW = 256 + 3


def error_bound(x: np.ndarray, plan: ResolvedPipeline, *, level: np.ndarray | None = None) -> np.ndarray:
    """Elementwise bound on the engine's error against the float64 reference with the weights as given.

    fp32 rounding: a multiple of eps32 times the magnitude pipeline, which runs |x| through |w|, |b|
    without activations (all used activations are 1-Lipschitz), so it bounds every partial sum the float32
    computation forms. The engine centres each feature on a level taken from the data before the first
    stage, so |x - c| <= |x| + |c| with |c| at most ``level`` per feature (default max|x|: any value of the
    series). With a ``[preprocess]`` block, x is the preprocessed float64 series (computed in float64 by
    the engine too, then rounded once to float32).

    FP16 storage: a stage's rounded weights w16 move its output by conv(input; w - w16), carried through
    the later stages. For the centred first stage on levels the input is x less a level from its own
    re-centring block, so |x[t - k] - v| is at most the range of x over the window ending at t (or the
    centred magnitude where that window holds history or non-finite values).
    """
    import torch
    import torch.nn.functional as F

    pre = preprocess_reference(x, plan)
    mag_x = np.nan_to_num(np.abs(pre), nan=0.0, posinf=0.0)
    mag = mag_x + (mag_x.max(axis=0, keepdims=True) if level is None else np.asarray(level)[None, :])
    y = torch.from_numpy(mag.T.copy())[None]
    err = None  # the FP16 storage error, [1, C, T], carried through the stages
    terms = 1
    centred = (
        plan.preprocess is None
        or (plan.preprocess.transform == "log" and plan.preprocess.zscore is None)
        or not plan.preprocess.computes
    )
    for i, layer in enumerate(plan.layers):
        w = torch.from_numpy(np.abs(layer.given))
        dw = torch.from_numpy(np.abs(layer.given - layer.weight.astype(np.float64)))
        b = None if layer.bias is None else torch.from_numpy(np.abs(layer.bias).astype(np.float64))
        if err is not None:
            err = F.conv1d(F.pad(err, (layer.halo, 0)), w, dilation=layer.dilation, groups=layer.groups)
        if dw.any():
            if i == 0 and centred:
                spread = torch.from_numpy(_local_range(pre, layer.halo + _RECENTER_WINDOW, mag).T.copy())[
                    None
                ]
                g = layer.groups
                a = dw.sum(dim=2)  # [O, C/groups]: the residual's reach per input channel
                o_g, c_g = a.shape[0] // g, a.shape[1]
                moved = torch.einsum("goc,gct->got", a.view(g, o_g, c_g), spread[0].view(g, c_g, -1))
                moved = moved.reshape(1, g * o_g, -1)
            else:
                moved = F.conv1d(F.pad(y, (layer.halo, 0)), dw, dilation=layer.dilation, groups=layer.groups)
            err = moved if err is None else err + moved
        y = F.conv1d(F.pad(y, (layer.halo, 0)), w, b, dilation=layer.dilation, groups=layer.groups)
        terms += layer.weight.shape[1] * layer.taps
    out = y[0].T
    moved = None if err is None else err[0].T
    if plan.head is not None:
        hw = torch.from_numpy(np.abs(plan.head.given))
        dhw = torch.from_numpy(np.abs(plan.head.given - plan.head.weight.astype(np.float64)))
        moved = None if moved is None else moved @ hw
        if dhw.any():
            moved = out @ dhw if moved is None else moved + out @ dhw
        out = out @ hw
        if plan.head.bias is not None:
            out = out + torch.from_numpy(np.abs(plan.head.bias).astype(np.float64))
        terms += plan.head.weight.shape[0]
    eps = float(np.finfo(np.float32).eps)
    bound = 4 * eps * terms * (out.numpy() + 1e-30) + 1e-30
    return bound if moved is None else bound + 1.01 * moved.numpy()


def _local_range(p: np.ndarray, window: int, mag: np.ndarray) -> np.ndarray:
    """Per row and feature, max - min of ``p`` over the ``window`` rows ending there; where the window
    reaches before row 0 or holds a value that is not finite, the largest ``mag`` over that window (the
    residual reads every row of it, not only the last)."""
    import torch
    import torch.nn.functional as F

    n = p.shape[0]
    m = torch.from_numpy(mag.T.copy())[None]  # [1, C, T], >= 0: zero padding never raises a max
    mag_win = F.max_pool1d(F.pad(m, (window - 1, 0)), window, stride=1)[0].T.numpy()
    if n < window:
        return mag_win
    finite = np.isfinite(p)
    t = torch.from_numpy(np.where(finite, p, 0.0).T.copy())[None]  # [1, C, T]
    hi = F.max_pool1d(t, window, stride=1)[0].T.numpy()  # rows window-1 .. n-1
    lo = -F.max_pool1d(-t, window, stride=1)[0].T.numpy()
    bad = torch.from_numpy((~finite).astype(np.float64).T.copy())[None]
    any_bad = F.max_pool1d(bad, window, stride=1)[0].T.numpy() > 0
    out = mag_win.copy()
    tail = mag_win[window - 1 :]
    out[window - 1 :] = np.where(any_bad, tail, np.minimum(hi - lo, tail))
    return out


def assert_matches_reference(
    y: np.ndarray, x: np.ndarray, plan: ResolvedPipeline, *, warmup: str = "nan"
) -> None:
    ref = pipeline_reference(x, plan, warmup=warmup)
    assert y.shape == ref.shape
    assert y.dtype == np.float32
    np.testing.assert_array_equal(
        np.isnan(y), np.isnan(ref), err_msg="NaN pattern differs from the reference"
    )
    ok = ~np.isnan(ref)
    err = np.abs(y.astype(np.float64) - ref)[ok]
    bound = error_bound(x, plan)[ok]
    worst = np.argmax(err / bound) if err.size else 0
    assert (err <= bound).all(), f"error {err[worst]:.3g} > bound {bound[worst]:.3g}"
