"""Shared test helpers: small stores, random pipelines, and the fp32 error bound."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr

from tsconv.kernels.reference import pipeline_reference, preprocess_reference
from tsconv.spec import ResolvedPipeline

T0 = 1_767_346_200_000_000_000  # 2026-01-02 09:30 UTC in ns


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


def read_output(path: Path) -> np.ndarray:
    return np.asarray(zarr.open_group(str(path), mode="r")["values"][:])


def error_bound(x: np.ndarray, plan: ResolvedPipeline, *, level: np.ndarray | None = None) -> np.ndarray:
    """Elementwise bound on fp32 rounding error: a multiple of eps32 times the magnitude pipeline.

    The magnitude pipeline runs |x| through |w|, |b| without activations (all used activations are
    1-Lipschitz), so it bounds every partial sum the float32 computation forms. The engine centres each
    feature on a level taken from the data before the first stage, so |x - c| <= |x| + |c| with |c| at
    most ``level`` per feature (default max|x|: any value of the series). With a ``[preprocess]`` block,
    x is the preprocessed float64 series (computed in float64 by the engine too, then rounded once to
    float32).
    """
    mag_x = np.nan_to_num(np.abs(preprocess_reference(x, plan)), nan=0.0, posinf=0.0)
    mag = mag_x + (mag_x.max(axis=0, keepdims=True) if level is None else np.asarray(level)[None, :])
    import torch
    import torch.nn.functional as F

    y = torch.from_numpy(mag.T.copy())[None]
    terms = 1
    for layer in plan.layers:
        w = torch.from_numpy(np.abs(layer.weight).astype(np.float64))
        b = None if layer.bias is None else torch.from_numpy(np.abs(layer.bias).astype(np.float64))
        y = F.conv1d(F.pad(y, (layer.halo, 0)), w, b, dilation=layer.dilation, groups=layer.groups)
        terms += layer.weight.shape[1] * layer.taps
    out = y[0].T
    if plan.head is not None:
        out = out @ torch.from_numpy(np.abs(plan.head.weight).astype(np.float64))
        if plan.head.bias is not None:
            out = out + torch.from_numpy(np.abs(plan.head.bias).astype(np.float64))
        terms += plan.head.weight.shape[0]
    eps = float(np.finfo(np.float32).eps)
    return 4 * eps * terms * (out.numpy() + 1e-30) + 1e-30


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
