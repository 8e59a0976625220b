"""Built-in filters against an independent float64 reference, on price-like data.

The reference here shares no code with tsconv: window sums are long-double prefix sums of the finite
values with integer counts of NaN / +inf / -inf per window (the engine uses float64 pairwise sums), flat
windows are found by counting changes, and the EMA is checked against the exact recursion. Data: prices
between 20 and 500 (multiplicative walks on a 0.01 grid), symbols that start late, NaN gaps (with
``fill = "none"``, so they reach the filters) and +-inf prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tsconv
from tsconv.kernels.filterbank import filter_bank
from tsconv.pipeline.filters import FILTER_DOCS, FILTER_KINDS, filter_spec, parse_filter
from tsconv.pipeline.spec import pipeline_from_dict, resolve

from ..helpers import write_store
from .sm90 import run_compile_script

ALL = ["id", "lag:3", "diff:1", "diff:32", "ret:1", "ret:16", "ma:7", "ma:32", "dev:32", "dev:256",
       "std:2", "std:20", "std:100", "zscore:7", "zscore:64", "ema:8", "ema:32", "ema:5:9", "ema:1:4"]  # fmt: skip
DEFAULT = ["diff:1", "diff:32", "diff:256", "dev:32", "dev:256"]
# every kind the compiled CPU bank takes (a bank with ret or an EMA, like ALL, runs on torch ops)
NATIVE = ["id", "lag:3", "diff:1", "diff:32", "ma:7", "ma:32", "dev:32", "dev:256", "dev:20", "std:2", "std:20",
          "zscore:64", "zscore:13"]  # fmt: skip
REL = 2e-6  # of each output's scale


def prices(
    rows: int, cols: int, *, seed: int, late: bool = True, gaps: bool = True, inf: bool = True
) -> np.ndarray:
    """Multiplicative random walks between 20 and 500 on a 0.01 grid (float32), with optional late
    starts, NaN gaps and +-inf prints."""
    rng = np.random.default_rng(seed)
    lo, hi = np.log(20.0), np.log(500.0)
    start = rng.uniform(lo, hi, size=cols)
    logp = start + np.cumsum(rng.normal(scale=1e-3, size=(rows, cols)), axis=0)
    logp = lo + np.abs((logp - lo) % (2 * (hi - lo)) - (hi - lo))  # reflect into [log 20, log 500]
    x = np.round(np.exp(logp), 2).astype(np.float32)
    if late and cols > 1:
        x[: rows // 3, 1] = np.nan
    if gaps and cols > 2:
        for a in rng.integers(0, rows - 50, size=3):
            x[a : a + rng.integers(1, 40), 2] = np.nan
    if inf and cols > 3:
        x[rng.integers(0, rows, size=2), 3] = np.inf
        x[rng.integers(0, rows, size=1), 3] = -np.inf
    return x


# ------------------------------------------------------------------------------------------ reference


def _window_counts(a: np.ndarray, w: int, d: int) -> np.ndarray:
    """Sums over the windows a[t], a[t-d], ..., a[t-(w-1)d] (zero before row 0), exactly, for integers."""
    out = np.zeros_like(a)
    for k in range(w):
        out[k * d :] += a[: a.shape[0] - k * d]
    return out


def _window_sum(v: np.ndarray, w: int, d: int) -> np.ndarray:
    """Long-double prefix-sum windows of ``v`` along axis 0 (zero history), per dilation phase."""
    out = np.empty(v.shape, dtype=np.longdouble)
    for p in range(d):
        col = v[p::d].astype(np.longdouble)
        c = np.concatenate([np.zeros((1,) + col.shape[1:], np.longdouble), np.cumsum(col, axis=0)])
        n = col.shape[0]
        idx = np.arange(n)
        out[p::d] = c[idx + 1] - c[np.maximum(idx + 1 - w, 0)]
    return out


def reference(x: np.ndarray, spec: str, d: int = 1) -> np.ndarray:
    """One filter over every column of ``x`` [T, C] in float64 (zero history before step 0, so rows in
    the warm-up are what --warmup zero gives)."""
    f = filter_spec(spec)
    pad = f.halo * d  # zero history, made explicit: every window below then lies inside the padded series
    x = np.concatenate([np.zeros((pad, x.shape[1])), x.astype(np.float64)])
    return _reference(x, f, d)[pad:]


def _reference(x: np.ndarray, f, d: int) -> np.ndarray:  # noqa: ANN001
    T = x.shape[0]
    L = f.n

    def lagged(k: int) -> np.ndarray:
        out = np.zeros_like(x)
        out[k:] = x[: T - k]
        return out

    with np.errstate(all="ignore"):
        if f.kind == "id":
            return x.copy()
        if f.kind == "lag":
            return lagged(L * d)
        if f.kind == "diff":
            return x - lagged(L * d)
        if f.kind == "ret":
            a, b = x, lagged(L * d)
            return np.where((a > 0) & (b > 0), np.log(a / b), np.nan)
        w = f.taps
        nan = _window_counts(np.isnan(x).astype(np.int64), w, d)
        pos = _window_counts(np.isposinf(x).astype(np.int64), w, d)
        neg = _window_counts(np.isneginf(x).astype(np.int64), w, d)
        special = np.where(nan > 0, np.nan, np.where((pos > 0) & (neg > 0), np.nan,
                           np.where(pos > 0, np.inf, np.where(neg > 0, -np.inf, 0.0))))  # fmt: skip
        bad = (nan + pos + neg) > 0
        finite = np.where(np.isfinite(x), x, 0.0)
        if f.kind == "ema":  # the truncated, renormalised EMA over its K taps
            a = f.alpha
            taps = a * (1 - a) ** np.arange(w)
            taps /= taps.sum()
            s = np.zeros_like(x)
            for k in range(w):
                s[k * d :] += taps[k] * finite[: T - k * d]
            return np.where(bad, special, s)
        base = np.nanmedian(
            np.where(np.isfinite(x), x, np.nan), axis=0
        )  # any constant: kept off the cancellation
        base = np.where(np.isfinite(base), base, 0.0)
        c = np.where(np.isfinite(x), x - base, 0.0)
        s1 = _window_sum(c, w, d)
        mean = np.where(bad, special, (s1 / w).astype(np.float64) + base)
        if f.kind == "ma":
            return mean
        if f.kind == "dev":
            return x - mean
        s2 = _window_sum(c * c, w, d)
        var = np.maximum((s2 - s1 * s1 / w) / (w - 1), 0).astype(np.float64)
        changes = np.zeros(x.shape, np.int64)
        changes[d:] = (x[d:] != x[:-d]).astype(np.int64)
        moves = _window_counts(changes, w - 1, d)  # changes between consecutive window values
        std = np.where(moves == 0, 0.0, np.sqrt(var))
        std = np.where(bad, np.nan, std)
        if f.kind == "std":
            return std
        return np.where(std > 0, (x - mean) / std, np.nan)


def _warm(y: np.ndarray, spec: str, d: int = 1) -> np.ndarray:
    y = y.copy()
    y[: filter_spec(spec).halo * d] = np.nan
    return y


def _check(got: np.ndarray, want: np.ndarray, what: str, rel: float = REL) -> float:
    """Same NaN / +inf / -inf pattern; finite values within ``rel`` of the output's scale (its largest
    finite |value|). Returns the worst error relative to the scale."""
    for name, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        differ = np.flatnonzero(test(got) != test(want))
        assert differ.size == 0, f"{what}: {name} pattern differs at rows {differ[:5]} (of {differ.size})"
    ok = np.isfinite(want)
    if not ok.any():
        return 0.0
    scale = np.abs(want[ok]).max()
    err = np.abs(got[ok].astype(np.float64) - want[ok]).max() / max(scale, 1e-300)
    assert err <= rel, f"{what}: error {err:.3g} of the scale {scale:.4g}"
    return err


def _run(x: np.ndarray, filters: list[str], *, d: int = 1, chunk: int = 65536, warmup: str = "nan",
         fill: str = "none") -> np.ndarray:  # fmt: skip
    pipe = {"preprocess": {"fill": fill}, "conv": [{"filters": filters, "dilation": d}]}
    return tsconv.features(x, pipe, chunk=chunk, warmup=warmup, device="cpu")


# ------------------------------------------------------------------------------------------ tests


def test_the_issue_example_each_filter_keeps_its_own_warm_up() -> None:
    """3000 x 2 random walk, the second column starting at row 1000: diff1 has 1 and 1001 NaNs, not 256
    and 1256 (the bank's longest filter)."""
    rng = np.random.default_rng(0)
    x = (100 + np.cumsum(rng.normal(size=(3000, 2)), axis=0)).astype(np.float32)
    x[:1000, 1] = np.nan
    y, names = tsconv.features(x, return_names=True, device="cpu")
    nans = dict(zip(names, np.isnan(y).sum(axis=0).tolist(), strict=True))
    assert nans == {"f0.diff1": 1, "f0.diff32": 32, "f0.diff256": 256, "f0.dev32": 31, "f0.dev256": 255,
                    "f1.diff1": 1001, "f1.diff32": 1032, "f1.diff256": 1256, "f1.dev32": 1031,
                    "f1.dev256": 1255}  # fmt: skip


@pytest.mark.parametrize("d", [1, 3])
@pytest.mark.parametrize("bank", [ALL, NATIVE], ids=["torch-ops", "native"])
def test_every_filter_against_the_reference(d: int, bank: list[str]) -> None:
    x = prices(6000, 5, seed=d)
    y = _run(x, bank, d=d, chunk=777)
    for m, spec in enumerate(bank):
        for c in range(x.shape[1]):
            want = _warm(reference(x[:, c : c + 1], spec, d)[:, 0], spec, d)
            _check(y[:, c * len(bank) + m], want, f"x{c}.{spec} d={d}")


@pytest.mark.parametrize("factor", [1e-7, 1e5], ids=["micro-prices", "six-figure-prices"])
@pytest.mark.parametrize("bank", [ALL, NATIVE], ids=["torch-ops", "native"])
def test_every_filter_against_the_reference_at_far_price_levels(factor: float, bank: list[str]) -> None:
    # prices of 2e-6..5e-5 (a token quoted in another) and 2e6..5e7 (an index in points, a stock like BRK.A
    # in cents): the error bound is relative to each output's scale, whatever the level
    x = (prices(6000, 5, seed=11).astype(np.float64) * factor).astype(np.float32)
    y = _run(x, bank, chunk=777)
    for m, spec in enumerate(bank):
        for c in range(x.shape[1]):
            want = _warm(reference(x[:, c : c + 1], spec, 1)[:, 0], spec, 1)
            _check(y[:, c * len(bank) + m], want, f"x{c}.{spec} x{factor:g}")


@pytest.mark.parametrize(
    "bank", [["zscore:8", "std:8", "ema:4"], ["zscore:8", "std:8"]], ids=["torch-ops", "native"]
)
def test_a_print_whose_square_overflows_float64_gives_nan_z_scores_not_0(bank: list[str]) -> None:
    # float64 rows (read as float64 on the CPU): the squares of a print of 1e160 overflow, the std is inf and
    # x - mean over it was 0 where the true z-score is 2.47; NaN there, the other windows as the reference
    x = prices(600, 2, seed=4, late=False, gaps=False, inf=False).astype(np.float64)
    x[300, 0] = 1e160
    y = _run(x, bank, chunk=128)
    assert np.isnan(y[300:308, 0]).all()  # zscore:8 of the windows holding the print
    assert np.isposinf(y[300:308, 1]).all()  # their std, cast to float32
    for m, spec in enumerate(bank):
        want = _warm(reference(x[:, 1:2], spec, 1)[:, 0], spec, 1)
        _check(y[:, len(bank) + m], want, f"x1.{spec}")
        want = _warm(reference(x[:300, :1], spec, 1)[:, 0], spec, 1)
        _check(y[:300, m], want, f"x0.{spec} before the print")
    for m in range(
        2
    ):  # after the print's windows (the reference's prefix sums cannot hold 1e160 beside prices)
        want = reference(x[301:, :1], bank[m], 1)[7:, 0]
        _check(y[308:, m], want, f"x0.{bank[m]} after the print")


def test_an_ema_of_alpha_1_is_the_current_value_beside_a_float64_print_beyond_float32() -> None:
    """ema:1:K (alpha = 1) is x[t], NaN or +-inf only where its window holds one: a finite float64 print of
    1e40 (beyond float32's range) in the window made its float32 mean inf, and the outputs after it were inf."""
    x = np.array([[100.0], [1e40], [101.0], [102.0], [103.0], [104.0], [105.0]])
    x[5, 0] = np.inf
    y = _run(x, ["ema:1:4"], chunk=3)[:, 0]
    np.testing.assert_array_equal(y[3:5], [102.0, 103.0])
    assert np.isposinf(y[5:]).all()  # the +inf print's windows


def test_the_reference_gives_a_window_of_equal_values_std_0() -> None:
    # three equal float64 values whose float64 mean is an ulp off them: std 0, z-score NaN, as the bank gives
    from tsconv.kernels.reference import bank_reference

    v = -0.408248290463863
    assert np.mean([v, v, v]) != v
    y = torch.tensor([[[1.0, 2.0, v, v, v, v]]], dtype=torch.float64)
    filters = tuple(filter_spec(f) for f in ("std:3", "zscore:3"))
    ref = bank_reference(y, filters, 1)[0].numpy()
    np.testing.assert_array_equal(ref[0, 4:], [0.0, 0.0])
    assert np.isnan(ref[1, 4:]).all()
    bank = filter_bank(y[0].T, filters, dilation=1).numpy()  # [6 - 2, 2]: rows 2..5
    np.testing.assert_array_equal(bank[2:, 0], [0.0, 0.0])
    assert np.isnan(bank[2:, 1]).all()


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch-ops"])
def test_flat_float64_windows_of_any_length_give_std_0_and_z_score_nan(native: bool) -> None:
    """A window of 3+ binary digits joined its segments' means from their rounded sum: on float64 ticks a flat
    window of 7, 31 or 255 steps gave a std of 1e-14 and a z-score of 1.87 where the value had not moved."""
    from tsconv import config

    rng = np.random.default_rng(5)
    x = np.round(100 + np.cumsum(rng.choice([-1, 0, 0, 0, 0, 1], size=(1500, 8)), axis=0) * 0.01, 2)
    x[:, 3] = 216.08
    x[700:, 5] = x[699, 5]  # a symbol that stops trading
    windows = (3, 7, 13, 31, 100, 255)
    bank = [f"{k}:{w}" for w in windows for k in ("std", "zscore")]
    with config.override(native_bank=native):
        y = _run(x, bank)
    for m, spec in enumerate(bank):
        w = int(spec.split(":")[1])
        flat = (
            np.ptp(np.lib.stride_tricks.sliding_window_view(x, w, axis=0), axis=2) == 0
        )  # [rows - w + 1, c]
        got = y[w - 1 :, m :: len(bank)][flat]
        assert flat.sum() > 100
        if spec.startswith("std"):
            assert (got == 0).all(), (
                f"{spec}: {np.count_nonzero(got)} flat windows with a std, e.g. {got[got != 0][:3]}"
            )
        else:
            assert np.isnan(got).all(), (
                f"{spec}: {np.count_nonzero(~np.isnan(got))} flat windows with a z-score"
            )
        want = _warm(reference(x, spec)[:, :], spec)
        for c in range(x.shape[1]):
            _check(y[:, c * len(bank) + m], want[:, c], f"x{c}.{spec}")


def test_warmup_zero_uses_zero_history() -> None:
    x = prices(800, 4, seed=5, inf=False)
    y = _run(x, ALL, warmup="zero", chunk=100)
    for m, spec in enumerate(ALL):
        for c in range(x.shape[1]):
            _check(y[:, c * len(ALL) + m], reference(x[:, c : c + 1], spec)[:, 0], f"x{c}.{spec} (zero)")


def test_ema_equals_the_exact_recursion_after_its_warm_up() -> None:
    x = prices(20_000, 3, seed=2, late=False, gaps=False, inf=False)
    specs = ["ema:2", "ema:8", "ema:32", "ema:200"]
    y = _run(x, specs)
    for m, spec in enumerate(specs):
        a = filter_spec(spec).alpha
        e = np.empty(x.shape, np.float64)
        e[0] = x[0]
        for t in range(1, x.shape[0]):  # e[t] = a x[t] + (1 - a) e[t - 1], started at x[0]
            e[t] = a * x[t] + (1 - a) * e[t - 1]
        k = filter_spec(spec).halo
        got = y[k:, m :: len(specs)].astype(np.float64)
        err = np.abs(got - e[k:]).max() / np.abs(e[k:]).max()
        assert err <= 1e-6, f"{spec}: {err:.3g}"


@pytest.mark.parametrize("d", [1, 2])
@pytest.mark.parametrize("bank", [ALL, NATIVE], ids=["torch-ops", "native"])
def test_chunked_equals_whole_bit_for_bit(d: int, bank: list[str]) -> None:
    """Every output depends on its own window only: any chunking gives the same bits."""
    x = prices(3000, 4, seed=9)
    whole = _run(x, bank, d=d, chunk=3000)
    for chunk in (13, 97, 1024):
        np.testing.assert_array_equal(_run(x, bank, d=d, chunk=chunk), whole, err_msg=f"chunk {chunk}")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a.view(torch.int32), b.view(torch.int32)))


def test_the_threads_tiles_equal_one_threads_and_a_forked_child_has_no_pool() -> None:
    """Tiles on the persistent threads give one thread's bits; a child forked after a bank ran (a dask
    worker, say) has none of the parent's threads, so it must not be handed the parent's pool."""
    import os

    from tsconv.kernels import cpu_tiles as fb

    x = torch.from_numpy(prices(40_000, 24, seed=4))  # several tiles of 24 channels
    bank = tuple(filter_spec(s) for s in ("diff:1", "diff:32", "dev:32", "dev:256", "std:20"))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = filter_bank(x, bank)
        torch.set_num_threads(2)
        assert _same_bits(filter_bank(x, bank), want) and _same_bits(filter_bank(x, bank), want)
    finally:
        torch.set_num_threads(before)
    assert 2 in fb._POOLS
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: say how many pools it inherited, nothing else
        os.write(w, str(len(fb._POOLS)).encode())
        os._exit(0)
    os.close(w)
    got = os.read(r, 16).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert got == "0"


@pytest.mark.parametrize("activation", ["none", "relu", "gelu"])
def test_a_bank_writes_into_a_given_out(activation: str) -> None:
    """An engine's reused buffer: the result lands in ``out`` (gelu's too), with a fresh call's bits."""
    x = torch.from_numpy(prices(700, 3, seed=2))
    bank = tuple(filter_spec(s) for s in ("diff:1", "dev:32", "zscore:20", "ema:8"))
    want = filter_bank(x, bank, activation=activation)
    buf = torch.full(want.shape, 7.0)
    got = filter_bank(x, bank, activation=activation, out=buf)
    assert got.data_ptr() == buf.data_ptr()
    torch.testing.assert_close(buf, want, rtol=0, atol=0, equal_nan=True)
    cols = torch.full((want.shape[1], want.shape[0]), 7.0)  # feature-major: each output's column contiguous
    assert filter_bank(x, bank, activation=activation, out=cols.T).data_ptr() == cols.data_ptr()
    torch.testing.assert_close(cols.T, want, rtol=0, atol=0, equal_nan=True)
    for bad in (torch.empty(want.shape[0] + 1, want.shape[1]), torch.empty(want.shape, dtype=torch.float64),
                torch.empty(2 * want.shape[0], want.shape[1])[::2]):  # fmt: skip
        with pytest.raises(ValueError, match="out must be a float32"):
            filter_bank(x, bank, out=bad)


def test_a_bank_refuses_an_out_over_x_and_a_dilation_below_one() -> None:
    """filter_bank's out= overlapping x (its tiles read rows that earlier tiles had written) gave other
    numbers silently, and dilation=0 read every tap at the current row (diff:1 all zeros), a negative one
    failing inside torch: both are refused as conv1d refuses them, and the op's dilation too."""
    bank = tuple(filter_spec(s) for s in ("diff:1", "ma:4"))
    buf = torch.from_numpy(prices(300, 6, seed=3, late=False, gaps=False, inf=False))
    x = buf[:, :3]  # a column view of the buffer whose rows from 3 on the result would take
    with pytest.raises(tsconv.ShapeError, match="out overlaps x"):
        filter_bank(x, bank, out=buf[3:])
    for d in (0, -1):
        with pytest.raises(tsconv.ShapeError, match="dilation must be an int >= 1"):
            filter_bank(x, bank, dilation=d)
        with pytest.raises(tsconv.ShapeError, match="dilation must be an int >= 1"):
            torch.ops.tsconv.filter_bank(x.contiguous(), "diff:1,ma:4", d, "none", None)
    with pytest.raises(tsconv.ShapeError, match="activation must be one of"):
        filter_bank(x, bank, activation="sigmoid")
    with pytest.raises(tsconv.ShapeError, match=r"x must be a \[L, C\] tensor"):
        filter_bank(x[:, 0], bank)


def test_two_stages_and_a_head_chunked_equal_whole() -> None:
    x = prices(3000, 3, seed=4, late=False, gaps=False, inf=False)
    pipe = {"conv": [{"filters": ["ema:8", "dev:16", "std:8"]}, {"filters": ["id", "ma:4", "zscore:8"],
            "dilation": 4, "activation": "tanh"}],
            "head": {"weights": np.random.default_rng(0).normal(size=(27, 2))}}  # fmt: skip
    whole = tsconv.features(x, pipe, chunk=3000, device="cpu")
    np.testing.assert_array_equal(tsconv.features(x, pipe, chunk=111, device="cpu"), whole)
    plan = resolve(pipeline_from_dict(pipe), ["f0", "f1", "f2"])
    # the head mixes every output: its warm-up is the longest path, ema:8 (66) + zscore:8 dilated (28)
    assert plan.warmups == (94, 94) and np.isnan(whole[:94]).all() and not np.isnan(whole[94:1000]).any()


def test_a_short_chunk_process_run_equals_one_long_run(tmp_path) -> None:
    x = prices(4000, 4, seed=3)
    src = write_store(tmp_path / "in.zarr", x, chunks=(500, 4))
    pipe = {"conv": [{"filters": ALL}]}
    tsconv.process(src, tmp_path / "a.zarr", pipeline=pipe, chunk=37)
    tsconv.process(src, tmp_path / "b.zarr", pipeline=pipe, chunk=100_000)
    import zarr

    a = np.asarray(zarr.open_group(str(tmp_path / "a.zarr"), mode="r")["values"][:])
    b = np.asarray(zarr.open_group(str(tmp_path / "b.zarr"), mode="r")["values"][:])
    np.testing.assert_array_equal(a, b)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's log of the masked-out values
@pytest.mark.interpreted
def test_the_triton_kernels_equal_the_torch_path() -> None:
    """Interpreted on CPU tensors (TRITON_INTERPRET=1): the same operations, so the same bits."""
    x = torch.from_numpy(prices(400, 4, seed=6))
    fs = tuple(filter_spec(s) for s in ALL)
    for d in (1, 2):
        a = filter_bank(x, fs, dilation=d, triton_kernels=False)
        b = filter_bank(x, fs, dilation=d, triton_kernels=True)
        np.testing.assert_array_equal(b.numpy(), a.numpy())


@pytest.mark.interpreted
def test_the_triton_path_cuts_wide_inputs_by_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tile of every channel would leave a wide input with tiles of a few rows, each re-reading its halo:
    with a small tile budget the ladder's kernels (a bank with an EMA) take 3 channels at a time (5 channels:
    two groups, the second partial) and give the same bits as the torch path. Tiles keep 1024 rows or more, so
    1400 rows give each group a long tile and a short one (interpreted, the time goes with rows x groups)."""
    import tsconv.kernels.filterbank as fb

    monkeypatch.setattr(fb, "_CUDA_TILE", 4096)
    x = torch.from_numpy(prices(1400, 5, seed=9))
    fs = tuple(filter_spec(s) for s in ("diff:1", "ma:16", "std:8", "ema:3"))
    launches: list[tuple[int, ...]] = []
    real = fb._bank_tile
    monkeypatch.setattr(
        fb, "_bank_tile", lambda tile, *a, **k: (launches.append(tuple(tile.shape)), real(tile, *a, **k))[1]
    )
    got = filter_bank(x, fs, triton_kernels=True)
    assert launches and max(c for _, c in launches) == 3
    assert sum(r < 1024 for r, _ in launches) <= 2  # only each channel group's last rows are short
    np.testing.assert_array_equal(got.numpy(), filter_bank(x, fs, triton_kernels=False).numpy())


# Every fused kind, windows of a power of two and not (sub-blocks with and without the rows past the first
# b), windows of 1 and 2, and several filters on one window.
FUSED = ["id", "lag:3", "diff:1", "diff:32", "ret:1", "ret:16", "ma:1", "ma:7", "ma:32", "dev:3", "dev:20",
         "dev:32", "dev:256", "std:2", "std:20", "zscore:20", "zscore:64"]  # fmt: skip


def _compare(got: np.ndarray, x: np.ndarray, specs: list[str], d: int) -> None:
    halo = max(filter_spec(s).halo for s in specs) * d
    for m, spec in enumerate(specs):
        want = reference(x, spec, d)[halo:]
        for c in range(x.shape[1]):
            _check(got[:, c * len(specs) + m], want[:, c], f"d={d} x{c}.{spec}")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's log of the masked-out values
@pytest.mark.parametrize(("rows", "cols", "d"), [(1500, 5, 1), (1201, 3, 2), (900, 4, 3)])
@pytest.mark.interpreted
def test_the_fused_kernel_matches_the_float64_reference(rows: int, cols: int, d: int) -> None:
    """The fused CUDA kernel (interpreted): every fused kind within REL of float64, NaN and infinity patterns
    identical, on prices with late starts, gaps and +-inf prints; row counts that end mid-block, odd
    channel counts, dilations."""
    from tsconv.kernels.filterbank import fused_plan

    fs = tuple(filter_spec(s) for s in FUSED)
    assert fused_plan(fs) is not None
    x = prices(rows, cols, seed=rows)
    got = filter_bank(torch.from_numpy(x), fs, dilation=d, triton_kernels=True).numpy()
    assert got.shape[0] >= 100  # past the bank's warm-up (765 rows at d = 3): rows that check something
    _compare(got, x, FUSED, d)


def _bank_kernels(
    x: torch.Tensor,
    specs,  # noqa: ANN001
    d: int = 1,
    *,
    running: tuple[int, int, int, int],
    rows: int | None = None,
    channels: int | None = None,
) -> np.ndarray:
    """``run_fused`` (interpreted) with the running-sum kernel's tile ``running`` (rows 0: the fused kernel
    alone) and the fused kernel's flags from it; ``rows`` and ``channels`` override the fused kernel's tile."""
    from tsconv.kernels.filterbank import bank_halo, fused_plan
    from tsconv.kernels.filterbank_triton import run_fused

    fs = tuple(filter_spec(s) for s in specs)
    plan = fused_plan.__wrapped__(fs, running=running, rows=rows, channels=channels)
    halo = bank_halo(fs, d)
    out = torch.full((x.shape[0] - halo, x.shape[1] * len(fs)), 12345.0)  # poisoned: every cell is written
    run_fused(plan, x, out, halo=halo, dilation=d)
    return out.numpy()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.interpreted
def test_the_fused_kernel_gives_the_cpu_paths_bits_for_the_default_bank_on_prices() -> None:
    """Window sums of float32 prices are exact in float64 whatever the order, so the fused kernel's scans
    and the CPU's ladder agree bit for bit on tick-grid prices (power-of-two windows: 1 / W is exact)."""
    x = torch.from_numpy(prices(2000, 4, seed=8))
    fs = tuple(filter_spec(s) for s in DEFAULT)
    a = _bank_kernels(x, DEFAULT, running=(0, 0, 1, 1))
    np.testing.assert_array_equal(a, filter_bank(x, fs, triton_kernels=False).numpy())


# Every kind the running-sum kernel sums, windows of 1, 2, a power of two and not, two filters on a window.
RUNNING = ["id", "lag:3", "diff:1", "diff:16", "ret:2", "ma:1", "ma:2", "ma:7", "dev:7", "dev:16", "ma:16"]


def _flagged_bank_kernels(
    x: torch.Tensor,
    specs,  # noqa: ANN001
    d: int = 1,
    **tile: Any,  # running, rows, channels: as for _bank_kernels
) -> tuple[np.ndarray, list[int]]:
    """:func:`_bank_kernels` and the flags its running-sum kernel wrote, which the fused kernel then read
    (each set to -1 before the launch: every flag is written), from one run of each kernel: interpreted, the
    running kernel's step loop is most of a test's time."""
    from tsconv.kernels import filterbank_triton

    real = filterbank_triton.running_kernel
    seen: list[torch.Tensor] = []

    class _Spy:
        def __init__(self, plan) -> None:  # noqa: ANN001
            self.kernel = real(plan)

        def __getitem__(self, grid):  # noqa: ANN001, ANN204
            def launch(x, out, flags, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
                flags.fill_(-1)
                self.kernel[grid](x, out, flags, *args, **kwargs)
                seen.append(flags)

            return launch

    filterbank_triton.running_kernel = _Spy
    try:
        got = _bank_kernels(x, specs, d, **tile)
    finally:
        filterbank_triton.running_kernel = real
    assert len(seen) == 1
    return got, seen[0].tolist()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(
    ("specs", "rows", "cols", "d"), [(RUNNING, 130, 4, 1), (RUNNING, 150, 4, 2), (DEFAULT, 320, 4, 1)]
)
@pytest.mark.interpreted
def test_the_running_kernel_matches_the_float64_reference(
    specs: list[str], rows: int, cols: int, d: int
) -> None:
    """The running-sum kernel (interpreted), every kind it sums, against float64 with identical NaN and
    infinity patterns (late starts, gaps, +-inf prints: counted, not summed), row counts ending mid-tile,
    dilations; it takes every tile of these prices itself (no flag), and gives the CPU ladder's bits."""
    x = prices(rows, cols, seed=rows)
    tile = (32, 32, 1, 2)
    n = rows - max(filter_spec(s).halo for s in specs) * d
    got, flags = _flagged_bank_kernels(torch.from_numpy(x), specs, d, running=tile)
    assert flags == [0] * (-(-n // (32 * d)) * d)
    _compare(got, x, specs, d)
    fs = tuple(filter_spec(s) for s in specs)
    np.testing.assert_array_equal(
        got, filter_bank(torch.from_numpy(x), fs, dilation=d, triton_kernels=False).numpy()
    )


def _check_after_the_print(got: np.ndarray, x: np.ndarray, row: int, c: int) -> None:
    """A 1e30 print at input ``row`` of channel ``c`` sets that channel's scale, under which any error of the
    steps after it passes: the steps it has left every window of (RUNNING's halo is 16) are checked at their own
    scale, against a reference from the rows after it. There a tile's running sums (the print added, then taken
    away) are wrong, by a whole value for ma:16: only the fused kernel's recomputing gets them right."""
    for m, spec in enumerate(RUNNING):
        want = reference(x[row + 1 :, c : c + 1], spec)[16:, 0]
        _check(got[row + 1 :, c * len(RUNNING) + m], want, f"x{c}.{spec} after the print")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(
    ("tile", "flagged"), [((64, 32, 1, 1), [0, 1, 1]), ((32, 32, 1, 1), [0, 0, 1, 1, 1])]
)
@pytest.mark.interpreted
def test_the_running_kernel_hands_tiles_whose_sums_are_not_exact_to_the_fused_kernel(tile, flagged) -> None:  # noqa: ANN001
    """A 1e30 print, and a column whose values span 1e-3 to 1e5: running sums would lose the windows after
    them (x - x[t-W] of a 1e30 is not the window's sum); those tiles are flagged, recomputed by the fused
    kernel, and every output stays within REL of float64."""
    x = prices(160, 3, seed=4, late=False, gaps=False, inf=False)
    x[100, 0] = 1e30
    x[150:, 2] = np.where(np.arange(150, 160) % 7 == 0, 1e-3, 1e5).astype(np.float32)
    # tiles of T output rows read input rows T k .. T k + T + 15: the print at row 100, the wide values from
    # row 150 (tiles of 32 steps: fewer than the fused kernel's 64, each of its programs reads two flags)
    got, flags = _flagged_bank_kernels(torch.from_numpy(x), RUNNING, running=tile)
    assert flags == flagged
    _compare(got, x, RUNNING, 1)
    _check_after_the_print(got, x, 100, 0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.interpreted
def test_a_flagged_tile_of_a_later_channel_group_is_recomputed_there() -> None:
    """40 channels in running tiles of 16 (three groups, the last one partial), two tiles of steps: a 1e30
    print in channel 37 flags only the third group's second tile, and the fused kernel recomputes that group's
    channels, not the first's (its programs are one per running tile, looping over their channel tiles of 4,
    channel 37 in the second of them). Tiles of 32 steps in both kernels: interpreted, the running kernel's
    step loop is the test's time."""
    x = prices(80, 40, seed=5, late=False, gaps=False, inf=False)
    x[50, 37] = 1e30  # output step 34 (halo 16): the second tile of steps, its sums wrong from step 50
    got, flags = _flagged_bank_kernels(
        torch.from_numpy(x), RUNNING, running=(32, 16, 1, 1), rows=32, channels=4
    )
    assert flags == [0, 0, 0, 0, 0, 1]
    _compare(got, x, RUNNING, 1)
    _check_after_the_print(got, x, 50, 37)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.interpreted
def test_the_fused_kernel_on_tiny_and_strided_inputs() -> None:
    """One output row, fewer rows than a block, a time-major view of channel-major data, flat windows."""
    from tsconv.kernels.filterbank import bank_halo

    fs = tuple(filter_spec(s) for s in ("diff:2", "dev:5", "std:4", "zscore:4"))
    halo = bank_halo(fs, 1)
    for rows in (halo + 1, halo + 9, 300):
        x = prices(rows, 3, seed=rows, gaps=False, inf=False)
        x[:, 2] = 100.25  # flat: std exactly 0, zscore NaN
        cm = torch.from_numpy(np.ascontiguousarray(x.T))  # channel-major; .T is a strided time-major view
        got = filter_bank(cm.T, fs, triton_kernels=True).numpy()
        _compare(got, x, ["diff:2", "dev:5", "std:4", "zscore:4"], 1)
        assert (got[:, 2 * 4 + 2] == 0).all() and np.isnan(got[:, 2 * 4 + 3]).all()


def test_which_banks_the_fused_kernel_takes() -> None:
    from tsconv.kernels.filterbank import (
        FUSED_KINDS,
        FUSED_MAX_WINDOW,
        RUNNING_KINDS,
        bank_bytes_per_row,
        fused_plan,
    )
    from tsconv.kernels.filterbank_triton import FUSED_KINDS as GENERATED
    from tsconv.kernels.filterbank_triton import RUNNING_KINDS as SUMMED

    assert FUSED_KINDS == GENERATED and RUNNING_KINDS == SUMMED
    default = tuple(filter_spec(s) for s in DEFAULT)
    assert fused_plan(default) is not None and bank_bytes_per_row(default, 8, cuda=True) == 0
    assert fused_plan(default).run_rows == 256  # the running sums first
    assert (
        fused_plan(tuple(filter_spec(s) for s in ("diff:1", "std:20"))).run_rows == 0
    )  # moments: fused only
    assert bank_bytes_per_row(default, 8) > 0  # the CPU's float64 tiles
    for other in (("diff:1", "ema:8"), (f"ma:{FUSED_MAX_WINDOW + 1}",)):
        fs = tuple(filter_spec(s) for s in other)
        assert fused_plan(fs) is None and bank_bytes_per_row(fs, 8, cuda=True) > 0


def test_the_fused_source_takes_integers_and_known_kinds_only() -> None:
    from dataclasses import replace

    from tsconv.kernels.filterbank import fused_plan
    from tsconv.kernels.filterbank_triton import fused_source

    plan = fused_plan(tuple(filter_spec(s) for s in DEFAULT))
    with pytest.raises(ValueError, match="not fused"):
        fused_source(replace(plan, kinds=("diff", "diff", "diff", "dev", "__import__('os')")))
    with pytest.raises(ValueError, match="bad filter parameter"):
        fused_source(replace(plan, params=(1, 32, 256, 32, "1); import os; (1")))


@pytest.mark.gpu
def test_cuda_fused_bank_equals_the_float64_reference_at_scale() -> None:
    """The fused kernel on the GPU, 300k x 16 prices, every fused kind, dilations 1 and 3."""
    x = prices(300_000, 16, seed=13)
    fs = tuple(filter_spec(s) for s in FUSED)
    for d in (1, 3):
        _compare(filter_bank(torch.from_numpy(x).cuda(), fs, dilation=d).cpu().numpy(), x, FUSED, d)


@pytest.mark.gpu
def test_cuda_running_bank_gives_the_cpu_bits_at_scale() -> None:
    """The running-sum kernel on the GPU (default tiles), 300k x 40 prices with late starts, gaps and +-inf
    prints: the CPU ladder's bits, dilations 1 and 3 (a bank whose longest window reaches past its longest lag
    too: the row leaving that window at a tile's first step lies before the input); with a 1e30 print and a
    column spanning 1e-3 to 1e5 (tiles handed to the fused kernel) within REL of float64."""
    x = prices(300_000, 40, seed=14)
    for specs in (DEFAULT, RUNNING, ["diff:1", "ret:1", "ma:7", "dev:20", "lag:5"]):
        fs = tuple(filter_spec(s) for s in specs)
        for d in (1, 3):
            got = filter_bank(torch.from_numpy(x).cuda(), fs, dilation=d).cpu().numpy()
            want = filter_bank(torch.from_numpy(x), fs, dilation=d, triton_kernels=False).numpy()
            np.testing.assert_array_equal(got, want)
    wild = x.copy()
    wild[100_000, 5] = 1e30
    wild[200_000:, 7] = np.where(np.arange(200_000, 300_000) % 7 == 0, 1e-3, 1e5)
    fs = tuple(filter_spec(s) for s in DEFAULT)
    _compare(filter_bank(torch.from_numpy(wild).cuda(), fs).cpu().numpy(), wild, DEFAULT, 1)


def test_the_running_kernel_compiles_for_sm90_without_spills() -> None:
    """The default bank's running-sum kernel and the flagged fused kernel, compiled offline for sm_90."""
    out = run_compile_script(
        """
from types import SimpleNamespace
from tsconv.kernels.filterbank import fused_plan
from tsconv.kernels.filterbank_triton import fused_kernel, running_kernel
from tsconv.pipeline.filters import filter_spec
plan = fused_plan(tuple(filter_spec(s) for s in ("diff:1", "diff:32", "diff:256", "dev:32", "dev:256")))
rt = [i32(k) for k in ("n", "C", "sx_t", "sx_c", "so", "halo")]
ptrs = [("x_ptr", "*fp32", "D"), ("o_ptr", "*fp32", "D"), ("f_ptr", "*i32", "D")]
cfg = SimpleNamespace(meta={}, num_warps=plan.run_warps, num_stages=1)
regs, spills = ptxas_usage(build(running_kernel(plan), ptrs + rt, {"D": 1}, cfg))
assert spills == 0, (regs, spills)  # 255 registers under Triton 3.6, 128 or fewer under 3.7: both spill-free
cfg = SimpleNamespace(meta={}, num_warps=plan.warps, num_stages=1)
consts = {"D": 1, "RT": plan.run_rows, "FK": 1, "FC": plan.run_channels // plan.channels, "FLAGS": True}
ck = build(fused_kernel(plan), ptrs + rt[:1] + [i32("n_in")] + rt[1:], consts, cfg)
print("compiled OK", regs, spills)
"""
    )
    assert "compiled OK" in out


def test_filter_docs_cover_every_kind_with_formula_and_warm_up() -> None:
    assert list(FILTER_DOCS) == list(FILTER_KINDS)
    for kind, doc in FILTER_DOCS.items():
        f = filter_spec(doc.example)
        assert f.kind == kind and parse_filter(doc.example).size == f.taps
        assert doc.warmup and doc.description


def test_pipelines_readme_lists_the_filters_in_the_order_tsconv_filters_prints() -> None:
    text = (Path(__file__).resolve().parents[2] / "pipelines" / "README.md").read_text()
    table = text.split("### Built-in filters", 1)[1].split("\n\n(", 1)[0]
    rows = [line.split("`")[1].split(":")[0] for line in table.splitlines() if line.startswith("| `")]
    assert list(dict.fromkeys(rows)) == list(FILTER_DOCS)


@pytest.mark.parametrize(("spec", "match"), [("std:1", "at least 2"), ("zscore:1", "at least 2"),
                                             ("ret", "needs a parameter"), ("lag:2:3", "one parameter")])  # fmt: skip
def test_bad_new_filters(spec: str, match: str) -> None:
    with pytest.raises(tsconv.TsconvError, match=match):
        filter_spec(spec)


def test_the_fingerprint_records_how_a_bank_is_computed() -> None:
    plan = resolve(pipeline_from_dict({"conv": [{"filters": DEFAULT}]}), ["a"])
    assert plan.as_run()["stages"][0]["compute"] == "filters-3"
    # a std or z-score window of 3+ binary digits joins its segments otherwise than before: its outputs are
    # not continued by this version; the other banks' bits are unchanged and theirs are
    for filters, carried in (
        (["std:7"], True),
        (["zscore:100", "diff:1"], True),
        (["std:20", "zscore:64"], False),
    ):
        stage = resolve(pipeline_from_dict({"conv": [{"filters": filters}]}), ["a"]).as_run()["stages"][0]
        assert (stage.get("moments") == "carried-mean") is carried, filters


def test_window_moments_of_a_flat_float64_window_are_exactly_0() -> None:
    from tsconv.kernels.filterbank import window_moments

    x = torch.full((300, 2), 216.08, dtype=torch.float64)
    for w in (7, 31, 100, 255):
        s, m = window_moments(x, w)
        assert (m == 0).all(), (w, m.abs().max())


@pytest.mark.slow
def test_default_filters_on_a_million_prices() -> None:
    """Every built-in filter on ~1e6 steps of prices 20..500: within 2e-6 of each output's scale."""
    x = prices(1_000_000, 2, seed=11, late=True, gaps=False, inf=False)
    specs = ALL + DEFAULT
    specs = list(dict.fromkeys(specs))
    y = _run(x, specs, chunk=65536, fill="ffill")
    worst = {}
    for m, spec in enumerate(specs):
        for c in range(x.shape[1]):
            want = _warm(reference(x[:, c : c + 1], spec)[:, 0], spec)
            worst[spec] = max(worst.get(spec, 0.0), _check(y[:, c * len(specs) + m], want, f"x{c}.{spec}"))


@pytest.mark.gpu
def test_cuda_bank_equals_the_float64_reference_at_scale() -> None:
    """The Triton kernels on the GPU, 200k x 64 prices, every filter, against the float64 reference."""
    x = prices(200_000, 64, seed=12)
    fs = tuple(filter_spec(s) for s in ALL)
    y = filter_bank(torch.from_numpy(x).cuda(), fs, dilation=1).cpu().numpy()
    halo = max(f.halo for f in fs)
    for m, spec in enumerate(ALL):
        want = reference(x, spec)[halo:]
        for c in range(x.shape[1]):
            _check(y[:, c * len(ALL) + m], want[:, c], f"x{c}.{spec}")
    # and the engine end to end, chunked on the GPU's batched engine against the CPU engine's bits' values
    pipe = {"preprocess": {"fill": "none"}, "conv": [{"filters": ALL}]}
    gpu = tsconv.features(x, pipe, device="cuda")
    cpu = tsconv.features(x, pipe, device="cpu")
    for j in range(gpu.shape[1]):
        _check(gpu[:, j], cpu[:, j].astype(np.float64), f"engine output {j}")


def test_filter_bank_op_passes_opcheck_and_compiles_into_one_graph():
    """Under torch.compile a bank is one tsconv::filter_bank node (its tiles and worker threads untraced)."""
    x = torch.from_numpy(
        100 + np.cumsum(np.random.default_rng(0).normal(size=(80, 3)), axis=0).astype(np.float32)
    )
    filters = tuple(filter_spec(s) for s in ("diff:1", "ma:4", "ema:8", "std:5"))
    torch.library.opcheck(
        torch.ops.tsconv.filter_bank.default, (x, "diff:1,ma:4,ema:8,std:5", 2, "tanh", None)
    )

    def f(x: torch.Tensor) -> torch.Tensor:
        return filter_bank(x, filters, dilation=2, activation="tanh")

    torch._dynamo.reset()
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    assert torch.equal(got.nan_to_num(nan=7.0), f(x).nan_to_num(nan=7.0))


@pytest.mark.parametrize("triton_kernels", [False, True], ids=["cpu", "triton"])
def test_weights_a_bank_wrote_into_out_are_not_served_stale_from_the_cache(triton_kernels: bool) -> None:
    """The bank's kernels write ``out`` unseen by torch's version counter, as conv1d's did (2f9c448): a conv
    whose weights are that buffer, written again between its calls, was served the packed copy of the first
    values (conv1d keeps it while the version is unchanged)."""
    from tsconv.kernels.conv1d import conv1d

    dev = "cuda" if torch.cuda.is_available() else "cpu"  # (conftest: interpreted on the CPU)
    if dev == "cuda" and not triton_kernels:
        pytest.skip("the CPU bank runs on CPU tensors, whose conv1d takes the torch path here")
    g = torch.Generator().manual_seed(3)
    bank = (filter_spec("diff:1"),)
    x = torch.randn(1, 4, 30, generator=g).to(dev)
    buf = torch.empty(3, 4, device=dev)  # 4 rows in, one of halo: 3 taps of 4 depthwise filters
    filter_bank(torch.randn(4, 4, generator=g).to(dev), bank, out=buf, triton_kernels=triton_kernels)
    first = conv1d(x, buf.view(4, 1, 3), groups=4)
    filter_bank(torch.randn(4, 4, generator=g).to(dev), bank, out=buf, triton_kernels=triton_kernels)
    second = conv1d(x, buf.view(4, 1, 3), groups=4)
    w = buf.view(4, 1, 3).double()
    want = torch.nn.functional.conv1d(torch.nn.functional.pad(x.double(), (2, 0)), w, groups=4).float()
    assert not torch.equal(first, second)
    torch.testing.assert_close(second, want, rtol=1e-5, atol=1e-5)


def test_the_fused_kernel_reads_no_flag_past_the_running_kernels_tiles() -> None:
    """Running tiles of 32 steps, fused tiles of 64 over 144 steps: five flags, and the last fused program's
    second flag would be a sixth. No flag set, and the word after the five set: nothing is recomputed (it
    read that word, and recomputed the last tile, on the strength of memory that was not its flags)."""
    from tsconv.kernels.filterbank import bank_halo, fused_plan
    from tsconv.kernels.filterbank_triton import fused_kernel

    fs = tuple(filter_spec(s) for s in RUNNING)
    plan = fused_plan.__wrapped__(fs, running=(32, 32, 1, 1))
    assert (plan.rows, plan.run_rows) == (64, 32)
    halo = bank_halo(fs, 1)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the real kernel, else interpreted (conftest)
    x = torch.from_numpy(prices(144 + halo, 3, seed=4, late=False, gaps=False, inf=False)).to(dev)
    n, c = 144, 3
    out = torch.full((n, c * len(fs)), 12345.0, device=dev)
    words = torch.ones(8, dtype=torch.int32, device=dev)
    flags = words[:5]
    flags.zero_()
    grid = (-(-n // plan.rows), -(-c // plan.run_channels))
    fused_kernel(plan)[grid](x, out, flags, n, x.shape[0], c, x.stride(0), x.stride(1), out.stride(0), halo, D=1,
                             RT=plan.run_rows, FK=plan.rows // plan.run_rows, FC=plan.run_channels // plan.channels,
                             FLAGS=True, num_warps=plan.warps)  # fmt: skip
    assert (out == 12345.0).all()
