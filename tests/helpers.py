"""Shared test helpers: small stores, random pipelines, and the fp32 error bound."""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np
import pytest
import zarr

from tsconv.kernels.reference import bank_reference, pipeline_reference, preprocess_reference
from tsconv.kernels.torch_side import apply_activation
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


def tripling_coin(rows: int, *, seed: int = 7) -> np.ndarray:
    """[rows, 1] float32 prices of a coin near 1e-4 on a 1e-9 grid that triples over its second half: rows move
    far more than 2x from any one level taken at the start (a chunk's or a step's)."""
    rng = np.random.default_rng(seed)
    lp = np.log(1e-4) + np.cumsum(rng.normal(scale=1e-3, size=rows))
    lp[rows // 2 :] += np.linspace(0.0, np.log(3.0), rows - rows // 2)
    x = (np.round(np.exp(lp) / 1e-9) * 1e-9).astype(np.float32)[:, None]
    assert x.max() > 2.5 * x[0, 0]  # the premise
    return x


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


# The engine re-centres the first stage on levels per block of output rows (see below) on a value of x from
# the block's window: how far back, in steps, a level can lie from an output. CPU: blocks of max(16, halo)
# outputs, the median of x at a block's first output step and the two steps before it. Triton kernels: time
# tiles of at most 256 rows (the register-window kernel: up to 32 rows a dilation apart), the median of x at
# the first output's step and 1 and 2 dilations before it.
def _level_reach(halo: int, dilation: int) -> int:
    return halo + 2 * dilation + max(256, 32 * dilation)


_EPS = 2.0**-23  # float32's unit in the last place of 1
_GELU_LIPSCHITZ = 1.13  # max |d gelu / dx| = 1.1289 (at x = sqrt(2)); relu and tanh: 1


def _zscore_float64_error(x: np.ndarray, plan: ResolvedPipeline) -> np.ndarray:
    """[T, C]: what float64 arithmetic leaves in a ``[preprocess]`` z-score before its float32 rounding.

    The engine standardises u less a level (the column's first finite value, which no output before it can
    depend on) from pairwise window sums and sums of squared deviations, the reference from each window's
    own two-pass moments: the two differ by a few eps64 x (max|u| over the window + |level|) / std, which
    a z-score near 0 on a nearly flat window of log prices shows against eps32 x |z|. Zero without a z-score.
    """
    pp = plan.preprocess
    if pp is None or pp.zscore is None:
        return np.zeros((x.shape[0], len(plan.input_names)))
    import dataclasses

    bare = dataclasses.replace(plan.pipeline, preprocess=dataclasses.replace(pp, zscore=None))
    u = preprocess_reference(x, dataclasses.replace(plan, pipeline=bare))
    w = pp.zscore
    out = np.zeros_like(u)
    if u.shape[0] >= w:
        finite = np.isfinite(u)
        first = np.argmax(finite, axis=0)
        level = np.where(finite.any(axis=0), np.abs(u[first, np.arange(u.shape[1])]), 0.0)
        win = np.lib.stride_tricks.sliding_window_view(u, w, axis=0)  # [T - w + 1, C, w]
        with np.errstate(invalid="ignore", divide="ignore"):
            big = np.nan_to_num(np.abs(win).max(axis=2), nan=0.0, posinf=0.0) + level
            std = win.std(axis=2)
            term = np.where(std > 0, 64 * 2.0**-52 * big / std, 0.0)
        out[w - 1 :] = np.nan_to_num(term, nan=0.0, posinf=0.0)
    return out


def error_bound(x: np.ndarray, plan: ResolvedPipeline, *, level: np.ndarray | None = None) -> np.ndarray:
    """Per output (row and channel) bound on the engine's error against the float64 reference with the
    weights as given (``pipeline_reference``), built stage by stage from the taps each output applies.

    Each stage's output error is what it inherits plus what it adds. Inherited: the previous stage's bound
    through |w| (x 1.13 after gelu). Added, for output channel o with n_o nonzero stored taps:

    - rounding: eps (8 + a + f n_o) x (sum over its taps of |w16| x |input| + |bias| + level terms), eps =
      2^-23, a = 4 with an activation, f = 5 for tensor-core shapes (dense kernels with >= 16 channels in
      and out per group, and the head: split-TF32 products, truncated accumulation), else 1 (float32 FMAs,
      torch's CPU conv);
    - FP16 storage: sum over its taps of |given - stored| x |input| (the reference uses the given weights).

    |input| is what the engine actually multiplies. On levels the first stage computes conv(x - v) + v *
    sum(taps) with v a value of x from the block's own window (``_level_reach`` steps), so |x - v| is at
    most the range of x over that window. The subtractions are exact where a feature's values all lie
    within a factor 2 (Sterbenz); elsewhere, where the window holds a non-finite value or the zero
    history, the magnitude is max|x| over the window + the level's (``level`` per feature bounds the
    chunk's centring level, default max|x|), with eps x that much for the subtractions. The level terms:
    |sum(taps)| x that same magnitude. A computing ``[preprocess]`` is float64 rounded once to float32:
    eps/2 |p| more per input value (and a z-score's float64 error, :func:`_zscore_float64_error`); its returns
    and z-scores are not centred (magnitude |p| per tap).
    Later stages and the head: |reference output| + its bound per input.
    """
    import torch
    import torch.nn.functional as F

    pre = preprocess_reference(x, plan)
    T, C = pre.shape
    finite = np.isfinite(pre)
    mag = np.where(finite, np.abs(pre), 0.0)
    pp = plan.preprocess
    computes = pp is not None and pp.computes
    centred = not computes or (pp.transform == "log" and pp.zscore is None)
    if level is None:
        lvl = mag.max(axis=0) if T else np.zeros(C)
    else:
        lvl = np.asarray(level, dtype=np.float64)
        if plan.columns is not None and lvl.shape[0] != C:
            lvl = lvl[list(plan.columns)]

    def t3(a: np.ndarray) -> torch.Tensor:  # [T, C] -> [1, C, T]
        return torch.from_numpy(np.ascontiguousarray(a.T, dtype=np.float64))[None]

    def conv(y: torch.Tensor, w: np.ndarray, layer) -> torch.Tensor:  # noqa: ANN001
        return F.conv1d(F.pad(y, (layer.halo, 0)), torch.from_numpy(w), dilation=layer.dilation,
                        groups=layer.groups)  # fmt: skip

    def per_channel(w: np.ndarray, u: torch.Tensor, layer) -> torch.Tensor:  # noqa: ANN001
        """sum over c of w[o, c] x u[c, t] within each group: [1, O, T]."""
        g = layer.groups
        a = torch.from_numpy(w)  # [O, C/g]
        o_g, c_g = a.shape[0] // g, a.shape[1]
        out = torch.einsum("goc,gct->got", a.view(g, o_g, c_g), u[0].view(g, c_g, -1))
        return out.reshape(1, g * o_g, -1)

    y_ref = t3(np.where(finite, pre, np.nan))  # the reference's values, stage by stage
    err = None  # [1, O, T]: the bound of the previous stage's outputs
    for i, layer in enumerate(plan.layers):
        w16 = layer.weight.astype(np.float64)
        aw, dw = np.abs(w16), np.abs(layer.given - w16)
        tensor_cores = layer.weight.shape[1] >= 16 and layer.out_channels // layer.groups >= 16
        n = np.count_nonzero(layer.weight.reshape(layer.out_channels, -1), axis=1)
        act = layer.activation not in (None, "none")
        gamma = torch.from_numpy(_EPS * (8 + 4 * act + (5 if tensor_cores else 1) * n))[None, :, None]
        bias = torch.zeros(1, layer.out_channels, 1, dtype=torch.float64)
        if layer.bias is not None:
            bias = torch.from_numpy(np.abs(layer.bias).astype(np.float64))[None, :, None]
        if i == 0:
            if centred:
                reach = _level_reach(layer.halo, layer.dilation)
                hi, lo, bad = _window_stats(pre, reach + 1)
                m_win = np.maximum(np.abs(hi), np.abs(lo))  # max |x| over the window (0 without values)
                v = np.maximum(m_win, lvl[None, :])  # bounds |v| and the chunk's level |c|
                p32 = pre.astype(np.float32)
                with np.errstate(invalid="ignore"):
                    lo32 = np.where(np.isfinite(p32), np.abs(p32), np.inf).min(axis=0)
                    hi32 = np.where(np.isfinite(p32), np.abs(p32), 0.0).max(axis=0)
                    same_sign = (np.where(np.isfinite(p32), p32, 1) > 0).all(axis=0) | (
                        np.where(np.isfinite(p32), p32, -1) < 0
                    ).all(axis=0)
                exact = same_sign & (hi32 <= 2 * lo32)  # x - c and (x - c) - (v - c) are exact
                past = np.arange(T)[:, None] >= layer.halo  # taps read data rows only
                good = past & ~bad & exact[None, :]
                u = np.where(good, hi - lo, m_win + v)
                e_u = np.where(exact[None, :], 0.0, _EPS * (m_win + 3 * v))
                if computes:
                    e_u = e_u + _EPS / 2 * m_win
                U, E_u, V = t3(u), t3(e_u), t3(v)
                size = per_channel(aw.sum(axis=2), U, layer)
                moved = per_channel(dw.sum(axis=2), U, layer)
                inherited = per_channel((aw + dw).sum(axis=2), E_u, layer)
                levels = per_channel(np.abs(layer.tap_sums), V, layer)
            else:
                a = t3(mag)
                size, moved = conv(a, aw, layer), conv(a, dw, layer)
                inherited = conv(_EPS / 2 * a + t3(_zscore_float64_error(x, plan)), aw + dw, layer)
                levels = 0.0
            added = gamma * (size + bias + levels) + moved
        else:
            a = torch.nan_to_num(y_ref.abs(), nan=0.0, posinf=0.0)
            size = conv(a + err, aw, layer)
            inherited = conv(err, aw, layer)
            added = gamma * (size + bias) + conv(a, dw, layer)
        lip = _GELU_LIPSCHITZ if layer.activation == "gelu" else 1.0
        err = lip * (inherited + added)
        if layer.filters is not None:
            # std:W is bounded through the taps of ma:W; its gain over them is up to sqrt(W / (W - 1)) (|d std| <=
            # ||d x||_2 / sqrt(W - 1)): 1.41 at W = 2, which an FP16 dense stage's error before it showed
            m_all = len(layer.filters)
            for m, f in enumerate(layer.filters):
                if f.kind == "std":
                    err[:, m::m_all, :] *= math.sqrt(f.taps / (f.taps - 1))
        if layer.filters is not None:  # by each filter's own window, as the engine computes a bank
            y_ref = apply_activation(bank_reference(y_ref, layer.filters, layer.dilation), layer.activation)
            continue
        b = None if layer.bias is None else torch.from_numpy(layer.bias.astype(np.float64))
        y_ref = apply_activation(
            F.conv1d(F.pad(y_ref, (layer.halo, 0)), torch.from_numpy(layer.given), b, dilation=layer.dilation,
                     groups=layer.groups),
            layer.activation,
        )  # fmt: skip
    out_err = err[0].T  # [T, O]
    if plan.head is not None:
        h16 = plan.head.weight.astype(np.float64)
        ah, dh = torch.from_numpy(np.abs(h16)), torch.from_numpy(np.abs(plan.head.given - h16))
        n = np.count_nonzero(plan.head.weight, axis=0)
        act = plan.head.activation not in (None, "none")
        gamma = torch.from_numpy(_EPS * (8 + 4 * act + 5 * n))[None, :]
        a = torch.nan_to_num(y_ref[0].T.abs(), nan=0.0, posinf=0.0)
        bias = 0.0 if plan.head.bias is None else torch.from_numpy(np.abs(plan.head.bias).astype(np.float64))
        added = gamma * ((a + out_err) @ ah + bias) + a @ dh
        lip = _GELU_LIPSCHITZ if plan.head.activation == "gelu" else 1.0
        out_err = lip * (out_err @ ah + added)
    return out_err.numpy() + 1e-30


def _window_stats(p: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row and column of ``p`` [T, C], over the ``window`` rows ending there (clipped at row 0): the
    largest and smallest finite value (0 and 0 where there is none) and whether any value is not finite."""
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(np.ascontiguousarray(p.T))[None]  # [1, C, T]
    fin = torch.isfinite(t)
    inf = float("inf")

    def run_max(v: torch.Tensor) -> np.ndarray:
        return F.max_pool1d(F.pad(v, (window - 1, 0), value=-inf), window, stride=1)[0].T.numpy()

    hi = run_max(torch.where(fin, t, -inf))
    lo = -run_max(torch.where(fin, -t, -inf))
    bad = run_max((~fin).to(torch.float64)) > 0
    some = np.isfinite(hi)
    return np.where(some, hi, 0.0), np.where(some, lo, 0.0), bad


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


def spy_fill_walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first row of every read that the engines' walks for a fill state make
    (``tsconv.engine.fill.fill_state_before``), filled in as they run."""
    import tsconv.engine.fill as fill

    lowest: list[int] = []
    real = fill.fill_state_before

    def spy(source, row, dtype, **kw):  # noqa: ANN001, ANN003, ANN202
        read = source.read
        source.read = lambda a, b: (lowest.append(a), read(a, b))[1]
        try:
            return real(source, row, dtype, **kw)
        finally:
            del source.read

    monkeypatch.setattr(fill, "fill_state_before", spy)
    return lowest


def warned_once_then_inspected(src: Path, out: Path, *, pipeline: object, match: str, label: str) -> str:
    """Run ``tsconv.process`` on ``src`` (CPU), assert exactly one TsconvWarning matching ``match``, then
    ``tsconv inspect src``; return inspect's line starting with ``label``."""
    from click.testing import CliRunner

    import tsconv
    from tsconv.cli import main
    from tsconv.errors import TsconvWarning

    with pytest.warns(TsconvWarning, match=match) as seen:
        tsconv.process(src, pipeline=pipeline, output=out, device="cpu")
    assert len([w for w in seen if w.category is TsconvWarning and re.search(match, str(w.message))]) == 1
    res = CliRunner().invoke(main, ["inspect", str(src)])
    assert res.exit_code == 0, res.output
    return next(ln for ln in res.output.splitlines() if label in ln)
