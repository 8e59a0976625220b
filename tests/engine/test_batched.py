"""The batched (GPU) engine, run on CPU tensors: its prepare kernel through the Triton interpreter.

The CUDA-specific parts (streams, events, pinned and mapped memory) run on the GPU machine
(benchmarks/e2e.py); here the loop's logic is checked: steps and band pieces, the halo carried between
steps, forward fill and centering, warm-up rows, resume, column selection, budgets and errors.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch
import zarr

import tsconv
from tsconv import config
from tsconv.engine.batched import parse_bytes, plan_step_rows, run_batched
from tsconv.engine.chunked import run_chunked
from tsconv.engine.compute import Backend
from tsconv.errors import TsconvError
from tsconv.io.ffill import forward_fill
from tsconv.io.readers.blocks import ArraySource
from tsconv.kernels import prepare as prep
from tsconv.kernels.prepare import prepare
from tsconv.pipeline.spec import pipeline_from_dict, resolve

from ..helpers import (
    assert_matches_reference,
    mostly_slow,
    price_series,
    process_batched,
    read_output,
    tripling_coin,
    write_store,
)

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="the prepare kernel runs on CPU only under the interpreter",
)

BANK = {"conv": [{"name": "bank", "filters": ["diff:1", "diff:4", "dev:8"]}]}
TWO_STAGES = {
    "conv": [
        {"name": "bank", "filters": ["diff:1", "ma:4"]},
        {"name": "smooth", "filters": ["ma:3"], "dilation": 2, "weight_dtype": "float32"},
    ]
}


def _prep_reference(raw, state, carry, *, fill=True):
    """The chunked engine's arithmetic: forward fill, the level, (carry ; rows) as they are."""
    filled, new_state = forward_fill(raw.astype(np.float32), state.copy())
    level = state.copy()
    for j in np.flatnonzero(np.isnan(level)):
        v = filled[np.isfinite(filled[:, j]), j]
        level[j] = v[0] if v.size else 0.0
    rows = filled if fill else raw.astype(np.float32)
    x = np.concatenate([carry, rows])
    return x, new_state, level, rows[-carry.shape[0] :] if carry.shape[0] else None


@pytest.mark.parametrize(
    "pieces", mostly_slow([[90], [33, 50, 7], [1, 1, 88], [700], [300, 3, 397]], fast=(0, 1, 4))
)
@pytest.mark.parametrize("fill", [True, False])
@pytest.mark.parametrize(
    "dtype",
    [
        np.float32,
        pytest.param(np.float64, marks=pytest.mark.slow),
        pytest.param(np.float16, marks=pytest.mark.slow),
    ],
)
@pytest.mark.parametrize("split", [True, False])
def test_prepare_equals_the_chunked_engines_arithmetic(pieces, fill, dtype, split, monkeypatch):
    monkeypatch.setattr(prep, "_SEG", 64)  # pieces of 90+ rows in several segments (up to 11)
    rng = np.random.default_rng(3)
    n, C, halo = sum(pieces), 19, 6
    raw = price_series(n, C, seed=1, nan_fraction=0.15).astype(dtype)
    raw[:50, 2] = np.nan  # late start inside the step
    raw[:, 4] = np.nan  # never starts
    raw[:, 5] = np.nan
    raw[n - 150 : n - 140, 5] = 99.5  # valid only in one segment, NaN for several segments after it
    raw[60:260, 6] = np.nan  # NaN across whole segments
    raw[: 3 * n // 4, 12] = np.nan  # infinite first prints, whole tiles before the first finite value
    raw[n // 3, 12], raw[n // 2, 12] = np.inf, -np.inf
    state = np.full(C, np.nan, np.float32)
    state[:9] = 101.25
    carry = rng.uniform(90, 110, size=(halo, C)).astype(np.float32)
    want, want_state, want_level, want_carry = _prep_reference(raw, state, carry, fill=fill)
    xc = torch.full((halo + n, C), 123.0)  # poisoned
    st, lv = torch.from_numpy(state.copy()), torch.from_numpy(state.copy())
    cin, cout = torch.from_numpy(carry.copy()), torch.full((halo, C), -7.0)
    off = 0
    for k, p in enumerate(pieces):
        prepare(torch.from_numpy(raw[off : off + p]), xc=xc, state=st, level=lv, carry_in=cin,
                carry_out=cout, off=off, n_step=n, fill=fill, last=k == len(pieces) - 1, split=split)  # fmt: skip
        off += p
    np.testing.assert_array_equal(xc.numpy(), want)
    np.testing.assert_array_equal(st.numpy(), want_state)
    np.testing.assert_array_equal(lv.numpy(), want_level)
    np.testing.assert_array_equal(cout.numpy(), want_carry)


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.uint8])
@pytest.mark.parametrize("pieces", [[90], [33, 50, 7]])
def test_prepare_of_integer_rows_leaves_the_last_row_as_the_fill_state(dtype, pieces):
    """The rows past a piece's last tile were loaded as 0 or the integer type's minimum (a masked load's NaN
    cannot be an integer) and taken for values: the fill state leaving the step, which the output records
    for its next update, was 0 or -2^31 instead of the last row."""
    n, C, halo = sum(pieces), 5, 3
    raw = (np.arange(n * C).reshape(n, C) % 97 + 1).astype(dtype)
    state = np.full(C, np.nan, np.float32)
    carry = np.zeros((halo, C), np.float32)
    want, want_state, want_level, want_carry = _prep_reference(raw, state, carry)
    xc = torch.full((halo + n, C), 123.0)
    st, lv = torch.from_numpy(state.copy()), torch.from_numpy(state.copy())
    cin, cout = torch.from_numpy(carry.copy()), torch.full((halo, C), -7.0)
    off = 0
    for k, p in enumerate(pieces):
        prepare(torch.from_numpy(raw[off : off + p]), xc=xc, state=st, level=lv, carry_in=cin,
                carry_out=cout, off=off, n_step=n, last=k == len(pieces) - 1)  # fmt: skip
        off += p
    np.testing.assert_array_equal(st.numpy(), want_state)
    np.testing.assert_array_equal(xc.numpy(), want)
    np.testing.assert_array_equal(lv.numpy(), want_level)
    np.testing.assert_array_equal(cout.numpy(), want_carry)


def test_prepare_selects_columns():
    raw = price_series(40, 11, seed=2, nan_fraction=0.1)
    cols = np.array([9, 0, 4, 4, 10])
    state = np.full(5, np.nan, np.float32)
    carry = np.zeros((0, 5), np.float32)
    want, _, want_level, _ = _prep_reference(raw[:, cols], state, carry)
    xc = torch.full((40, 5), np.nan)
    st, lv = torch.from_numpy(state.copy()), torch.from_numpy(state.copy())
    empty = torch.zeros((0, 5))
    prepare(torch.from_numpy(raw), xc=xc, state=st, level=lv, carry_in=empty, carry_out=empty, off=0,
            n_step=40, cols=torch.from_numpy(cols))  # fmt: skip
    np.testing.assert_array_equal(xc.numpy(), want)
    np.testing.assert_array_equal(lv.numpy(), want_level)


def _batched(x, plan, *, step_rows, band_rows, start=0, warmup="nan"):
    out = []
    run_batched(ArraySource(x, band_rows=band_rows), plan, Backend(plan, torch.device("cpu")),
                lambda a, release: (out.append(a.copy()), release()), start=start, step_rows=step_rows, warmup=warmup)  # fmt: skip
    return np.concatenate(out)


@pytest.mark.parametrize(
    ("pipe", "step_rows", "band_rows"),
    mostly_slow(
        [(BANK, 64, 50), (BANK, 128, 128), (TWO_STAGES, 64, 37), (TWO_STAGES, 192, 500)], fast=(0, 2)
    ),
)
@pytest.mark.parametrize("warmup", ["nan", pytest.param("zero", marks=pytest.mark.slow)])
def test_batched_matches_the_float64_reference(pipe, step_rows, band_rows, warmup):
    x = price_series(301, 5, seed=4, nan_fraction=0.05)
    x[:70, 1] = np.nan  # late listing across the first step
    plan = resolve(pipeline_from_dict(pipe), tuple(f"x{j}" for j in range(5)))
    y = _batched(x, plan, step_rows=step_rows, band_rows=band_rows, warmup=warmup)
    assert y.shape == (301, plan.n_outputs)
    assert_matches_reference(y, x, plan, warmup=warmup)


def test_only_steps_that_read_a_level_compute_one(monkeypatch):
    from tsconv.engine import batched, chunked, stream

    calls = []
    real, real_chunked = batched.level_before_torch, chunked.level_before
    monkeypatch.setattr(batched, "level_before_torch", lambda *a: (calls.append(1), real(*a)))
    monkeypatch.setattr(chunked, "level_before", lambda *a: (calls.append(1), real_chunked(*a))[1])
    monkeypatch.setattr(stream, "level_before", lambda *a: (calls.append(1), real_chunked(*a))[1])
    x = price_series(200, 3, seed=6, nan_fraction=0.05)
    x[:90, 2] = np.nan
    taps = np.random.default_rng(6).normal(size=(4, 3, 5)) / 5
    dense = {"weight_dtype": "float32", "conv": [{"name": "c", "weights": taps}]}
    for pipe, steps in ((BANK, 0), (dense, 4)):  # a bank reads raw values; a dense stage centred ones
        calls.clear()
        plan = resolve(pipeline_from_dict(pipe), tuple(f"x{j}" for j in range(3)))
        y = _batched(x, plan, step_rows=64, band_rows=50)
        assert len(calls) == steps
        assert_matches_reference(y, x, plan)
        calls.clear()  # the chunked engine (the CPU's): the same rule per chunk
        y = tsconv.features(x, pipe, device="cpu", chunk=64)
        assert len(calls) == steps
        assert_matches_reference(y, x, plan)
        calls.clear()  # a stream's chunks, pushed in pieces
        live = tsconv.Stream(pipe, features=3, chunk=64, device="cpu")
        pushed = np.concatenate([live.push(x[a : a + 50]) for a in range(0, 200, 50)])
        assert len(calls) == steps
        np.testing.assert_array_equal(pushed, y)


@pytest.mark.parametrize(("taps", "spike"), [([-1.0, 1.0], 1e7), ([0.0, -1.0, 1.0], -1e7)])
def test_one_bad_print_before_a_step_is_not_the_next_steps_level(taps, spike):
    """The step's level read the carried halo rows only: with a halo of 1 or 2 rows one bad print on a
    step's last row (two, negative, for 2) was the next step's level, and its float32 rows lost the moves.
    The carries hold the 5 rows the level reads whatever the halo."""
    rng = np.random.default_rng(0)
    x = (100 + np.cumsum(rng.integers(-3, 4, 256)) * 0.01).astype(np.float32)[:, None]
    x[127, 0] = spike
    plan = resolve(pipeline_from_dict({"weight_dtype": "float32", "conv": [{"weights": np.array([[taps]])}]}),
                   ("x0",))  # fmt: skip
    y = _batched(x, plan, step_rows=128, band_rows=100)[:, 0].astype(np.float64)
    xd, k = x[:, 0].astype(np.float64), len(taps)
    want = xd[k - 1 :] - xd[k - 2 : -1]
    after = slice(128 + k, 256)  # the next step, past the rows that read the print itself
    assert np.abs(y[after] - want[after.start - k + 1 :]).max() <= 2e-5


@pytest.mark.slow
def test_batched_resume_equals_the_tail_of_a_whole_run():
    x = price_series(300, 4, seed=5, nan_fraction=0.1)
    x[:150, 3] = np.nan
    plan = resolve(pipeline_from_dict(TWO_STAGES), tuple(f"x{j}" for j in range(4)))
    whole = _batched(x, plan, step_rows=64, band_rows=40)
    tail = _batched(x, plan, step_rows=64, band_rows=40, start=128)
    assert tail.shape == (172, plan.n_outputs)
    np.testing.assert_array_equal(np.isnan(tail), np.isnan(whole[128:]))
    np.testing.assert_allclose(tail, whole[128:], rtol=1e-5, atol=1e-5)


def test_batched_equals_the_chunked_engine_with_preprocess():
    pipe = {
        "preprocess": {"select": ["x0", "x2", "x3"], "transform": "log_return", "zscore": 16},
        "conv": [{"name": "bank", "filters": ["diff:1", "ma:4"]}],
    }
    x = price_series(260, 5, seed=6, nan_fraction=0.05)
    plan = resolve(pipeline_from_dict(pipe), tuple(f"x{j}" for j in range(5)))
    y = _batched(x, plan, step_rows=64, band_rows=45)
    ref: list[np.ndarray] = []
    run_chunked(
        ArraySource(x), plan, Backend(plan, torch.device("cpu")), ref.append, start=0, chunk=64, warmup="nan"
    )
    want = np.concatenate(ref)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert_matches_reference(y, x, plan)


def test_process_batched_on_a_store_matches_the_chunked_engine(tmp_path):
    x = price_series(700, 6, seed=7, nan_fraction=0.03)
    src = write_store(tmp_path / "in.zarr", x, chunks=(150, 6))
    a = tsconv.process(src, tmp_path / "a.zarr", pipeline=BANK, device="cpu", chunk=128)
    b = process_batched(src, tmp_path / "b.zarr", pipeline=BANK, device="cpu", chunk=128,
                       gpu_mem="80MB")  # fmt: skip
    assert a.stage_seconds is None and a.transfer is None
    assert b.step_rows and b.step_rows % 128 == 0 and b.bound_by in b.stage_seconds
    assert set(b.stage_seconds) >= {"decode", "h2d", "compute", "d2h", "write"}
    ya, yb = read_output(tmp_path / "a.zarr"), read_output(tmp_path / "b.zarr")
    np.testing.assert_array_equal(np.isnan(ya), np.isnan(yb))
    np.testing.assert_allclose(yb, ya, rtol=1e-5, atol=1e-5)
    g = zarr.open_group(str(tmp_path / "b.zarr"), mode="r")
    assert g.attrs["tsconv"]["complete"] is True


def test_the_write_stage_counts_the_chunks_written_as_the_run_finishes(tmp_path):
    # 700 rows fit one output chunk, which the writer stores only in finish(): the report said write 0.000
    x = price_series(700, 6, seed=7, nan_fraction=0.03)
    src = write_store(tmp_path / "in.zarr", x, chunks=(150, 6))
    r = process_batched(src, tmp_path / "b.zarr", pipeline=BANK, device="cpu", chunk=128, gpu_mem="80MB")
    assert zarr.open_group(str(tmp_path / "b.zarr"), mode="r")["values"].chunks[0] >= 700
    assert r.stage_seconds["write_busy"] > 0 and r.stage_seconds["write"] > 0


def test_big_endian_rows_of_a_zarr_2_store_and_an_array_equal_the_chunked_engine(tmp_path):
    # zarr 2 keeps '>f4' as stored (reads are big-endian arrays), which torch cannot wrap: the batched engine,
    # the default on CUDA, failed with numpy's 'byte order different from the native byte order'
    x = price_series(300, 3, seed=4, nan_fraction=0.03)
    big = x.astype(">f4")
    g = zarr.open_group(str(tmp_path / "in.zarr"), mode="w", zarr_format=2)
    g.create_array("values", data=big, chunks=(64, 3))
    g.create_array("time", data=np.arange(300, dtype=np.int64) * 1_000_000 + 1_767_346_200_000_000_000,
                   chunks=(64,))  # fmt: skip
    g.attrs["features"] = ["a", "b", "c"]
    a = tsconv.process(tmp_path / "in.zarr", tmp_path / "a.zarr", pipeline=BANK, device="cpu", chunk=64)
    b = process_batched(tmp_path / "in.zarr", tmp_path / "b.zarr", pipeline=BANK, device="cpu", chunk=64)
    assert a.rows == b.rows == 300
    ya, yb = read_output(tmp_path / "a.zarr"), read_output(tmp_path / "b.zarr")
    np.testing.assert_array_equal(np.isnan(ya), np.isnan(yb))
    np.testing.assert_allclose(yb, ya, rtol=1e-5, atol=1e-5)
    ident = {"conv": [{"filters": ["id"]}], "preprocess": {"fill": "none"}}
    with config.override(engine="batched"):
        y = tsconv.features(big, pipeline=ident, device="cpu")
    np.testing.assert_array_equal(y, x)


def test_result_slots_lent_to_the_writer_threads_are_reused_only_once_stored(tmp_path, monkeypatch):
    """The writer threads store chunks straight from the engine's host slots and free them in any order:
    no slot is refilled while a write still reads it. One write of the first step (slot 0) is held until
    a step after the third has been written, or the engine has waited for slot 0 (its first wait for a slot
    that times out: steps 0-2 take free slots; a correct engine always ends up there, after 0.25 s), or 6 s
    have passed; a slot refilled too early shows in it."""
    import random
    import threading
    import types

    from tsconv import config
    from tsconv.engine import batched, outputs
    from tsconv.io.writers.zarr_writer import OutputWriter

    # steps of 64 rows: interpreted, the prepare kernel's scan costs per row and per step
    x = price_series(700, 4, seed=11, nan_fraction=0.02)
    src = write_store(tmp_path / "in.zarr", x, chunks=(75, 4))
    monkeypatch.setattr(batched, "MAX_STEP_ROWS", 64)  # 11 steps through 3 slots
    monkeypatch.setattr(outputs, "output_chunk_rows", lambda chunk, n_outputs: 16)  # 4 chunks a step
    with config.override(write_threads=0):
        process_batched(src, tmp_path / "sync.zarr", pipeline=BANK, device="cpu", chunk=16, gpu_mem="80MB")
    rng, real, later = random.Random(3), OutputWriter._write, threading.Event()

    def slow(self, a, b, buf, *rest):
        if a == 16:
            later.wait(6)
        elif a >= 3 * 64:
            later.set()
        time.sleep(rng.random() * 0.01)
        real(self, a, b, buf, *rest)

    monkeypatch.setattr(OutputWriter, "_write", slow)

    class Slot(threading.BoundedSemaphore):
        def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
            got = super().acquire(blocking, timeout)
            if not got:  # the engine waits for a lent slot: step 3 for slot 0, held above
                later.set()
            return got

    spy = types.ModuleType("threading")
    spy.__dict__.update(vars(threading))
    spy.BoundedSemaphore = Slot
    monkeypatch.setattr(batched, "threading", spy)
    with config.override(write_threads=4):
        r = process_batched(
            src, tmp_path / "lent.zarr", pipeline=BANK, device="cpu", chunk=16, gpu_mem="80MB"
        )
    assert r.step_rows == 64
    want, got = read_output(tmp_path / "sync.zarr"), read_output(tmp_path / "lent.zarr")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_an_error_while_writing_stops_the_run():
    x = price_series(300, 3, seed=8)
    plan = resolve(pipeline_from_dict(BANK), ("x0", "x1", "x2"))
    calls = []

    def emit(block, release):  # fails without releasing its slot: the engine must not wait for it
        calls.append(block.shape[0])
        if len(calls) < 2:
            release()
        if len(calls) == 2:
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        run_batched(ArraySource(x, band_rows=64), plan, Backend(plan, torch.device("cpu")), emit, start=0,
                    step_rows=64, warmup="nan")  # fmt: skip
    assert len(calls) == 2


def test_step_rows_follow_the_budget_and_refuse_what_cannot_fit():
    names = tuple(f"x{j}" for j in range(1024))
    plan = resolve(pipeline_from_dict({"conv": [{"name": "b", "filters": ["diff:1", "ma:16"]}]}), names)
    kw = dict(src_features=1024, src_itemsize=4, chunk=1024, transfer="pinned", rows=10**7)
    small = plan_step_rows(plan, budget=parse_bytes("200MB"), **kw)
    big = plan_step_rows(plan, budget=parse_bytes("1.2GB"), **kw)
    assert small % 1024 == 0 and big % 1024 == 0 and 1024 <= small < big <= 65536
    assert plan_step_rows(plan, budget=parse_bytes("1.2GB"), **{**kw, "rows": 3000}) == 3072
    with pytest.raises(TsconvError, match="does not fit the GPU memory budget"):
        plan_step_rows(plan, budget=parse_bytes("60MB"), **kw)
    # what the process holds outside torch comes off the top: 1.2 GB with 1 GB held plans like 200 MB
    held = plan_step_rows(plan, budget=parse_bytes("1.2GB"), outside=parse_bytes("1GB"), **kw)
    assert held == small
    with pytest.raises(TsconvError, match=r"budget is 1,200 MB, of which this process's CUDA context and "
                       r"kernels hold about 1,150 MB") as err:  # fmt: skip
        plan_step_rows(plan, budget=parse_bytes("1.2GB"), outside=parse_bytes("1.15GB"), **kw)
    need = float(err.value.hint.split("at least ")[1].split("GB")[0])
    assert plan_step_rows(plan, budget=parse_bytes(f"{need}GB"), outside=parse_bytes("1.15GB"), **kw) >= 1024
    with pytest.raises(TsconvError, match="does not fit"):  # the hint's figure is the least that fits
        plan_step_rows(plan, budget=parse_bytes(f"{need - 0.02}GB"), outside=parse_bytes("1.15GB"), **kw)


def test_a_warm_up_longer_than_a_chunk_is_in_the_budgets_figure():
    """The refusal's figure was one chunk's (1.08 GB) where a step must also hold the warm-up: at that budget
    the run was refused again, as a warm-up that does not fit, with no figure (4.01 GB was the least)."""
    names = tuple(f"x{j}" for j in range(4096))
    plan = resolve(pipeline_from_dict({"conv": [{"name": "b", "filters": ["ma:5000"]}]}), names)
    kw = dict(src_features=4096, src_itemsize=4, chunk=1024, transfer="pinned", rows=10**6)
    for budget in ("300MB", "1.2GB"):
        with pytest.raises(TsconvError, match="a step of 5120 rows .the warm-up of 4999 steps") as err:
            plan_step_rows(plan, budget=parse_bytes(budget), **kw)
        assert "shorten the filters" in err.value.hint and "--chunk" not in err.value.hint
    need = float(err.value.hint.split("at least ")[1].split("GB")[0])
    assert plan_step_rows(plan, budget=parse_bytes(f"{need}GB"), **kw) == 5120
    with pytest.raises(TsconvError, match="does not fit"):  # the hint's figure is the least that fits
        plan_step_rows(plan, budget=parse_bytes(f"{need - 0.02}GB"), **kw)


def test_a_series_that_one_step_covers_needs_no_room_for_a_next_steps_warm_up(tmp_path):
    """Every step was planned to hold the next one's warm-up, also where one step covers every row: 2,000
    rows through ma:3000 were refused at a budget one 2,048-row step fits ("warm-up of 2999 steps does not
    fit", no figure)."""
    pipe = {"conv": [{"name": "b", "filters": ["diff:1", "ma:3000"]}]}
    plan = resolve(pipeline_from_dict(pipe), tuple(f"x{j}" for j in range(4)))
    kw = dict(src_features=4, src_itemsize=4, chunk=1024, transfer="pinned")

    def steps(budget: int, rows: int) -> int | None:
        try:
            return plan_step_rows(plan, budget=budget, rows=rows, **kw)
        except TsconvError:
            return None

    lo, hi = 1, 10**9  # the least budget that plans the 2,000 rows
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if steps(mid, 2000) else (mid + 1, hi)
    assert steps(lo, 2000) == 2048
    with pytest.raises(TsconvError, match=r"a step of 3072 rows .the warm-up of 2999 steps"):
        plan_step_rows(plan, budget=lo, rows=10**6, **kw)  # more steps: each holds the next one's warm-up
    with pytest.raises(TsconvError, match=r"one step of its 2000 rows") as err:
        plan_step_rows(plan, budget=lo - 1, rows=2000, **kw)
    assert float(err.value.hint.split("at least ")[1].split("GB")[0]) * 1e9 >= lo
    x = price_series(2000, 4, seed=3)
    src = write_store(tmp_path / "in.zarr", x, chunks=(500, 4))
    b = process_batched(src, tmp_path / "b.zarr", pipeline=pipe, device="cpu", chunk=1024, gpu_mem=lo)
    assert b.step_rows == 2048
    tsconv.process(src, tmp_path / "a.zarr", pipeline=pipe, device="cpu", chunk=1024)
    ya, yb = read_output(tmp_path / "a.zarr"), read_output(tmp_path / "b.zarr")
    assert np.array_equal(ya.view(np.uint32), yb.view(np.uint32))


def test_steps_that_encode_on_the_gpu_hold_whole_output_chunks_and_their_encoder():
    names = tuple(f"x{j}" for j in range(96))
    plan = resolve(
        pipeline_from_dict({"conv": [{"name": "b", "filters": ["diff:1", "diff:32", "dev:32"]}]}), names
    )
    kw = dict(src_features=96, src_itemsize=4, chunk=1024, transfer="pinned", rows=10**7)
    plain = plan_step_rows(plan, budget=parse_bytes("300MB"), **kw)
    enc = plan_step_rows(plan, budget=parse_bytes("300MB"), encode_rows=11264, **kw)
    assert enc % 11264 == 0 and 11264 <= enc < plain  # its buffers come out of the same budget
    assert (
        plan_step_rows(plan, budget=parse_bytes("300MB"), encode_rows=11264, **{**kw, "rows": 3000}) == 11264
    )
    with pytest.raises(
        TsconvError, match="one output chunk of 1126400 rows"
    ):  # plan_run then plans without it
        plan_step_rows(plan, budget=parse_bytes("300MB"), encode_rows=1126400, **kw)


@pytest.mark.parametrize(("text", "value"), [("1.2GB", 1_200_000_000), ("800MB", 800_000_000),
                                             ("512MiB", 512 * 2**20), ("2e9", 2_000_000_000), (1000, 1000)])  # fmt: skip
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("bad", ["lots", "1.2TBX", "-5MB", "0"])
def test_parse_bytes_refuses_nonsense(bad):
    with pytest.raises(TsconvError):
        parse_bytes(bad)


def test_process_refuses_an_unknown_transfer_mode_and_cuda_options_on_the_cpu(tmp_path):
    src = write_store(tmp_path / "in.zarr", price_series(100, 2))
    with pytest.raises(TsconvError, match="unknown transfer mode"):
        process_batched(src, tmp_path / "o.zarr", pipeline=BANK, device="cpu", transfer="carrier-pigeon")
    for option in ({"transfer": "pinned"}, {"gpu_mem": "1GB"}, {"decode": "cpu"}):
        name = next(iter(option))
        with pytest.raises(TsconvError, match=f"{name}=.* does not apply to a run on the CPU"):
            tsconv.process(src, tmp_path / "o.zarr", pipeline=BANK, device="cpu", **option)
        if name != "decode":  # features() decodes nothing
            with pytest.raises(TsconvError, match=f"{name}=.* does not apply to a run on the CPU"):
                tsconv.features(price_series(100, 2), BANK, device="cpu", **option)
    assert not (tmp_path / "o.zarr").exists()


def test_cuda_options_with_local_workers_and_no_gpu_here_are_refused_before_a_cluster_starts(
    tmp_path, monkeypatch
):
    # device auto with workers=N left each worker to resolve it, and CPU workers ignored the CUDA options
    from tsconv import config
    from tsconv.engine import cluster

    def no_cluster(*args, **kwargs):
        raise AssertionError("a local cluster was started")

    monkeypatch.setattr(cluster, "_driver_gpus", lambda: [])  # the driver lists no GPU
    monkeypatch.setattr(cluster, "_make", no_cluster)
    src = write_store(tmp_path / "in.zarr", price_series(100, 2))
    for option in ({"transfer": "mapped"}, {"gpu_mem": "2GB"}, {"decode": "gpu"}):
        name = next(iter(option))
        with pytest.raises(TsconvError, match=f"{name}=.* does not apply to a run on the CPU .*no CUDA GPU"):
            tsconv.process(src, tmp_path / "o.zarr", pipeline=BANK, workers=1, **option)
    assert not (tmp_path / "o.zarr").exists()
    # the batched engine on the CPU takes them, as a single process does: on to the cluster
    with (
        config.override(engine="batched"),
        pytest.raises(AssertionError, match="a local cluster was started"),
    ):
        tsconv.process(src, tmp_path / "o.zarr", pipeline=BANK, workers=1, transfer="mapped")


def test_pieces_smaller_than_a_band_wrap_the_device_ring(monkeypatch):
    from tsconv.engine import batched

    monkeypatch.setattr(batched, "PIECE_BYTES", 7 * 5 * 4)  # 7 rows of 5 float32 features per piece
    x = price_series(250, 5, seed=9, nan_fraction=0.1)
    x[:90, 4] = np.nan
    plan = resolve(pipeline_from_dict(TWO_STAGES), tuple(f"x{j}" for j in range(5)))
    y = _batched(x, plan, step_rows=64, band_rows=100)
    assert_matches_reference(y, x, plan)


@pytest.mark.slow
def test_strided_in_memory_sources_are_read_correctly():
    x = price_series(200, 4, seed=10, nan_fraction=0.05)
    plan = resolve(pipeline_from_dict(BANK), tuple(f"x{j}" for j in range(4)))
    flipped = np.ascontiguousarray(x[::-1])[::-1]  # negative row stride, same values
    fortran = np.asfortranarray(x)
    for src in (flipped, fortran):
        assert not src.flags.c_contiguous
        y = _batched(src, plan, step_rows=64, band_rows=50)
        assert_matches_reference(y, x, plan)


def test_a_narrow_step_is_one_piece_and_a_wide_one_eight_up_to_the_cap():
    from tsconv.engine.batched import MIN_PIECE_BYTES, PIECE_BYTES, _piece_bytes, _ring_slots

    # 2,097,152 x 96 with the default bank: 24,576-row steps of 9.4 MB were 8 pieces of 1.2 MB
    assert _piece_bytes(24576, 384) == 24576 * 384 // 2 >= MIN_PIECE_BYTES
    assert _piece_bytes(5120, 384) == 5120 * 384  # under MIN_PIECE_BYTES: the whole step
    assert _ring_slots(5120, 384) == _ring_slots(24576, 384) == 2
    # wide steps: eighths, capped
    assert _piece_bytes(38912, 4096) == 38912 * 4096 // 8 and _ring_slots(38912, 4096) == 4
    assert _piece_bytes(65536, 16384) == PIECE_BYTES
    assert _piece_bytes(1, 384) == 384


def test_the_step_plan_counts_the_ring_of_the_step_it_plans():
    from tsconv.engine import batched

    names = tuple(f"x{j}" for j in range(96))
    plan = resolve(pipeline_from_dict({"conv": [{"name": "b", "filters": ["diff:1", "dev:32", "dev:256"]}]}),
                   names)  # fmt: skip
    kw = dict(src_features=96, src_itemsize=4, chunk=1024, transfer="pinned", rows=10**7)
    per = batched._bytes_per_row(plan)

    def used(step, encode_rows):
        ring = batched._ring_slots(step, 384) * batched._piece_bytes(step, 384)
        enc = (
            0
            if encode_rows is None
            else (
                (batched._ENCODE_BYTES_PER_OUTPUT * plan.n_outputs + 16)
                * encode_rows
                * batched.encode_group(encode_rows, plan.n_outputs)
                + batched._ENCODE_FIXED
            )
        )
        return per * step + ring + enc

    # every budget from 70 MB to 400 MB: the ring is not monotone in the step (a step of 2 pieces holds less
    # than one of a single piece just below it), so a step rounded down from what fits must be checked again
    for mb in range(70, 400):
        for encode_rows in (None, 3072):
            try:
                step = plan_step_rows(plan, budget=mb * 10**6, encode_rows=encode_rows, **kw)
            except TsconvError:  # the encoder's buffers do not fit: plan_run plans without them
                assert encode_rows and mb < 200
                continue
            avail = int(mb * 10**6 * batched._ALLOCATED_SHARE) - batched._FIXED_BYTES - plan.halo * 4 * 96 * 3
            assert used(step, encode_rows) <= avail, (mb, encode_rows, step)
            unit = encode_rows or 1024
            if step + unit <= batched.MAX_STEP_ROWS and step % unit == 0:
                assert used(step + 2 * unit, encode_rows) > avail  # and not far below what fits


def test_pieces_of_whole_bands_stop_at_the_ring_wrap_and_the_step_end():
    from tsconv.engine.batched import _pieces

    # bands of 100 rows, up to 3 bands per piece, a ring of 5 bands: never across band 5, 10, ...
    assert _pieces(0, 1000, 100, 300, 5) == [(0, 300), (300, 500), (500, 800), (800, 1000)]
    assert _pieces(250, 640, 100, 300, 5) == [(250, 500), (500, 640)]
    # pieces below a band (or no ring): within one band, at most piece_rows rows
    assert _pieces(0, 250, 100, 40) == [(0, 40), (40, 80), (80, 100), (100, 140), (140, 180), (180, 200),
                                        (200, 240), (240, 250)]  # fmt: skip
    assert _pieces(0, 250, 100, 300) == [(0, 100), (100, 200), (200, 250)]


def test_multi_band_pieces_through_the_reader_match_the_chunked_engine(tmp_path, monkeypatch):
    from tsconv.engine import batched

    monkeypatch.setattr(batched, "_PIECES_PER_STEP", 1)  # pieces as large as a step allows...
    monkeypatch.setattr(batched, "PIECE_BYTES", 3 * 100 * 6 * 4)  # ...up to 3 bands: the ring holds 5 + 3
    seen: list[tuple[int, int]] = []
    real = batched._pieces

    def spy(*a, **kw):
        out = real(*a, **kw)
        seen.extend(out)
        return out

    monkeypatch.setattr(batched, "_pieces", spy)
    x = price_series(1900, 6, seed=11, nan_fraction=0.05)
    src = write_store(tmp_path / "in.zarr", x, chunks=(100, 6))
    tsconv.process(src, tmp_path / "a.zarr", pipeline=TWO_STAGES, device="cpu", chunk=128)
    process_batched(src, tmp_path / "b.zarr", pipeline=TWO_STAGES, device="cpu", chunk=128)
    sizes = {hi - lo for lo, hi in seen}
    assert max(sizes) == 300 and 200 in sizes  # 3-band pieces, and 2-band ones cut at the ring's wrap
    ya, yb = read_output(tmp_path / "a.zarr"), read_output(tmp_path / "b.zarr")
    np.testing.assert_array_equal(np.isnan(ya), np.isnan(yb))
    np.testing.assert_allclose(yb, ya, rtol=1e-5, atol=1e-5)


def test_a_short_last_step_runs_at_the_full_step_shape(monkeypatch):
    # one kernel shape per run: a short last step would be a new autotune shape class, tuned mid-run
    x = price_series(301, 5, seed=12, nan_fraction=0.05)
    plan = resolve(pipeline_from_dict(TWO_STAGES), tuple(f"x{j}" for j in range(5)))
    lengths = []
    real = Backend._stages

    def spy(self, xc, first_row, level, **kw):
        lengths.append(xc.shape[0])
        return real(self, xc, first_row, level, **kw)

    monkeypatch.setattr(Backend, "_stages", spy)
    y = _batched(x, plan, step_rows=128, band_rows=100)  # steps of 128, 128 and 45 rows
    assert len(lengths) == 3 and len(set(lengths)) == 1
    assert_matches_reference(y, x, plan)


@pytest.mark.slow
def test_recentering_keeps_a_long_steps_error_at_the_chunked_engines():
    """A trending series in one long step: one centering level per step lets the centered input grow with
    the trend, and a zero-sum filter over it loses digits (the CUDA engine's error at 64 features was 7x
    the CPU engine's). With the Triton kernels (here interpreted) the first stage re-centers per block of
    outputs (conv1d's ``recenter``): the error falls below the chunked engine's (128-row chunks here)."""
    from tsconv.kernels.reference import pipeline_reference

    rng = np.random.default_rng(11)
    n, C = 512, 3
    x = (1000.0 + 0.5 * np.arange(n)[:, None] + np.cumsum(rng.normal(0, 0.05, (n, C)), axis=0)).astype(
        np.float32
    )
    # the filters' taps as a weights stage (a bank computes in float64 and has no such error to keep down)
    from tsconv.pipeline.filters import bank_weights

    taps = bank_weights(("dev:32", "diff:4"), C)
    stage = {"weights": taps, "groups": "depthwise", "weight_dtype": "float32"}
    plan = resolve(pipeline_from_dict({"conv": [stage]}), ["a", "b", "c"])
    ref = pipeline_reference(x, plan)

    def err(y):
        ok = ~np.isnan(ref)
        scale = np.nanmax(np.abs(ref), axis=0, keepdims=True)
        return float(np.max((np.abs(y.astype(np.float64) - ref) / scale)[ok]))

    errs = {}
    for recenter in (False, True):
        backend = Backend(plan, torch.device("cpu"), use_triton=True)
        backend.recenter_first = recenter
        out: list[np.ndarray] = []
        run_batched(ArraySource(x, band_rows=512), plan, backend, lambda a, release, out=out: (out.append(a.copy()), release()),
                    start=0, step_rows=n, warmup="nan")  # fmt: skip
        errs[recenter] = err(np.concatenate(out))
    chunked: list[np.ndarray] = []
    run_chunked(ArraySource(x), plan, Backend(plan, torch.device("cpu")), chunked.append, start=0, chunk=128,
            warmup="nan")  # fmt: skip
    err_cpu = err(np.concatenate(chunked))
    assert errs[True] * 5 < errs[False], errs
    assert errs[True] <= err_cpu, (errs, err_cpu)


def test_weight_bytes_count_every_form_the_engine_keeps():
    from tsconv.engine.batched import weight_bytes

    names = tuple(f"x{j}" for j in range(64))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 64, 5)).astype(np.float32)
    hw = rng.standard_normal((16, 4)).astype(np.float32)
    plan = resolve(
        pipeline_from_dict({"weight_dtype": "float32", "conv": [{"name": "c", "weights": w}],
                            "head": {"weights": hw}}),
        names,
    )  # fmt: skip
    # stored float32 + prepared float32 + two float64 tap-sum tables + biases; head: 16 bytes per weight
    assert weight_bytes(plan) == 4 * w.size + 4 * w.size + 16 * 16 * 64 + 16 * 16 + 16 * hw.size + 8 * 4


def _encode_on_the_cpu(monkeypatch, chunk_rows: int) -> None:
    """The GPU encoder's path on CPU tensors: numcodecs' LZ4 in nvCOMP's place, the framing kernel through
    the interpreter, ``chunk_rows``-row output chunks."""
    from tsconv import config
    from tsconv.engine import outputs
    from tsconv.kernels import lz4_encode

    from ..kernels.test_lz4_encode import CpuLZ4

    monkeypatch.setattr(
        lz4_encode, "encode_reason", lambda device: None if config.current().gpu_encode else "off"
    )
    monkeypatch.setattr(
        lz4_encode, "default_compressor", lambda lay, *, max_streams, device: CpuLZ4(lay.neblock)
    )
    monkeypatch.setattr(outputs, "output_chunk_rows", lambda chunk, n_outputs: chunk_rows)
    monkeypatch.setattr(lz4_encode, "MIN_OUTPUT_BYTES", 0)  # these outputs are a few hundred KB


def _chunk_headers(out) -> dict[str, object]:
    from tsconv.kernels import blosc_header

    root = out / "values" / "c"
    return {
        str(p.relative_to(root)): blosc_header.parse_header(p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_chunks_encoded_in_the_engine_store_the_host_encoders_values(tmp_path, monkeypatch):
    """Frames from the engine (LZ4 streams, Blosc framing on the device) hold bit for bit the values the
    host's c-blosc stores, the store's short last chunk padded as zarr pads it and an all-NaN chunk left out
    as zarr leaves it out; the report says where the chunks were encoded."""
    from tsconv import config

    x = price_series(1000, 5, seed=21, nan_fraction=0.02)
    x[:300] = np.nan  # every symbol starts late: the first two 128-row output chunks are all NaN
    src = write_store(tmp_path / "in.zarr", x, chunks=(200, 5))
    _encode_on_the_cpu(monkeypatch, 128)
    kw = dict(pipeline=BANK, device="cpu", chunk=64, gpu_mem="80MB", compression="lz4")
    from tsconv.io.writers.zarr_writer import OutputWriter

    with config.override(gpu_encode=False):
        host = process_batched(src, tmp_path / "host.zarr", **kw)
    framed, real = [], OutputWriter.append_frames

    def counted(self, frames, *, rows, empty, release):
        framed.append((rows, list(empty)))
        real(self, frames, rows=rows, empty=empty, release=release)

    monkeypatch.setattr(OutputWriter, "append_frames", counted)
    gpu = process_batched(src, tmp_path / "gpu.zarr", **kw)
    assert sum(r for r, _ in framed) == 1000 and sum(map(sum, (e for _, e in framed))) == 2
    assert "encoded on the GPU" in gpu.compression and "GPU" not in host.compression
    assert gpu.step_rows % 128 == 0
    want, got = read_output(tmp_path / "host.zarr"), read_output(tmp_path / "gpu.zarr")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    hosts, gpus = _chunk_headers(tmp_path / "host.zarr"), _chunk_headers(tmp_path / "gpu.zarr")
    assert set(gpus) == set(hosts) and "0/0" not in gpus and "1/0" not in gpus and len(gpus) == 6
    import numcodecs

    last = np.frombuffer(
        numcodecs.Blosc().decode((tmp_path / "gpu.zarr/values/c/7/0").read_bytes()), np.float32
    )
    tail = last.reshape(128, -1)[1000 - 7 * 128 :]
    assert tail.size and np.isnan(tail).all()  # padded past the store's end with the fill value, as zarr pads


def test_auto_compression_decides_from_the_first_chunk_before_any_frame(tmp_path, monkeypatch):
    """``compression="auto"`` with the encoder on: features that LZ4 shrinks stay LZ4, encoded in the engine;
    random bits are stored uncompressed by the host (no frames), as without the encoder."""
    x = price_series(600, 4, seed=22)
    src = write_store(tmp_path / "in.zarr", x, chunks=(200, 4))
    _encode_on_the_cpu(monkeypatch, 128)
    r = process_batched(src, tmp_path / "a.zarr", pipeline=BANK, device="cpu", chunk=64, gpu_mem="80MB")
    assert r.compression.startswith("lz4 (auto") and "encoded on the GPU" in r.compression
    noise = {"conv": [{"name": "n", "filters": ["diff:1"]}]}
    y = np.random.default_rng(5).standard_normal((600, 4)).astype(np.float32) * 1e6
    src2 = write_store(tmp_path / "noise.zarr", y, chunks=(200, 4))
    r2 = process_batched(src2, tmp_path / "b.zarr", pipeline=noise, device="cpu", chunk=64, gpu_mem="80MB")
    assert r2.compression.startswith("none (auto") and "GPU" not in r2.compression
    assert {h.memcpyed for h in _chunk_headers(tmp_path / "b.zarr").values()} == {True}


def test_leading_all_nan_steps_leave_the_codec_to_a_later_chunk_then_frames_follow(tmp_path, monkeypatch):
    """Every symbol starts after row 400: the first step's sample has no value, so it and the next step go to
    the writer threads, which settle auto from the first chunk with values; later steps come as frames."""
    from tsconv import config
    from tsconv.engine import batched
    from tsconv.io.writers.zarr_writer import OutputWriter

    x = price_series(1400, 4, seed=25)
    x[:400] = np.nan
    src = write_store(tmp_path / "in.zarr", x, chunks=(200, 4))
    _encode_on_the_cpu(monkeypatch, 128)
    monkeypatch.setattr(batched, "MAX_STEP_ROWS", 256)  # two output chunks a step
    kw = dict(pipeline=BANK, device="cpu", chunk=64, gpu_mem="80MB")
    with config.override(gpu_encode=False):
        host = process_batched(src, tmp_path / "host.zarr", **kw)
    framed, real = [], OutputWriter.append_frames

    def counted(self, frames, *, rows, empty, release):
        framed.append(rows)
        real(self, frames, rows=rows, empty=empty, release=release)

    monkeypatch.setattr(OutputWriter, "append_frames", counted)
    gpu = process_batched(src, tmp_path / "gpu.zarr", **kw)
    assert gpu.step_rows == 256 and "100%" not in gpu.compression and "100%" not in host.compression
    assert gpu.compression.startswith("lz4 (auto") and "encoded on the GPU" in gpu.compression
    assert 0 < sum(framed) <= 1400 - 512  # the first two steps were stored by the writer threads
    want, got = read_output(tmp_path / "host.zarr"), read_output(tmp_path / "gpu.zarr")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_small_outputs_are_encoded_by_the_host(tmp_path, monkeypatch):
    from tsconv.kernels import lz4_encode

    x = price_series(600, 4, seed=24)
    src = write_store(tmp_path / "in.zarr", x, chunks=(200, 4))
    _encode_on_the_cpu(monkeypatch, 128)
    kw = dict(pipeline=BANK, device="cpu", chunk=64, gpu_mem="80MB", compression="lz4")
    monkeypatch.setattr(lz4_encode, "MIN_OUTPUT_BYTES", 600 * 12 * 4 + 1)  # one byte more than the output
    assert "GPU" not in process_batched(src, tmp_path / "a.zarr", **kw).compression
    monkeypatch.setattr(lz4_encode, "MIN_OUTPUT_BYTES", 600 * 12 * 4)
    assert "encoded on the GPU" in process_batched(src, tmp_path / "b.zarr", **kw).compression


def test_an_update_with_encoded_chunks_equals_a_full_run(tmp_path, monkeypatch):
    import zarr as _zarr

    x = price_series(900, 3, seed=23, nan_fraction=0.01)
    src = write_store(tmp_path / "in.zarr", x[:700], chunks=(100, 3))
    _encode_on_the_cpu(monkeypatch, 128)
    kw = dict(pipeline=BANK, device="cpu", chunk=64, gpu_mem="80MB", compression="lz4")
    process_batched(src, tmp_path / "out.zarr", **kw)
    g = _zarr.open_group(str(src), mode="r+")
    g["values"].resize((900, 3))
    g["values"][700:] = x[700:]
    if "time" in g.array_keys():
        g["time"].resize((900,))
        g["time"][700:] = np.asarray(g["time"][:700])[-1] + 1 + np.arange(200)
    r = process_batched(src, tmp_path / "out.zarr", update=True, **kw)
    assert r.updated_from == 700 and "encoded on the GPU" in r.compression
    full = process_batched(src, tmp_path / "full.zarr", **kw)
    assert "encoded on the GPU" in full.compression
    a, b = read_output(tmp_path / "out.zarr"), read_output(tmp_path / "full.zarr")
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize(
    ("taps", "use_triton"),
    [
        ([-0.5, 0.0, 0.5], False),
        pytest.param([-0.5, 0.0, 0.5], True, marks=pytest.mark.slow),
        ([0.3, -0.1, -0.2], False),
        ([0.3, -0.1, -0.2], True),
    ],
)
def test_a_price_that_triples_within_a_step_keeps_its_moves_digits(taps, use_triton):
    """The prepare kernel centred a whole step on one level in float32: once a price had moved more than
    about 2x from it (a coin at 1e-4 tripling within a step), x - level rounded at the level's resolution,
    and a difference of the price was 7.6e-6 / 9.1e-6 of its scale off (either taps, either path). The rows
    now reach the blocks' re-centring as they are."""
    rows = 1024
    x = tripling_coin(rows)
    plan = resolve(pipeline_from_dict({"weight_dtype": "float32", "conv": [{"weights": np.array([[taps]])}]}),
                   ("x0",))  # fmt: skip
    out: list[np.ndarray] = []
    backend = Backend(plan, torch.device("cpu"), use_triton=use_triton)
    run_batched(ArraySource(x, band_rows=300), plan, backend,
                lambda a, release: (out.append(a.copy()), release()), start=0, step_rows=rows, warmup="nan")  # fmt: skip
    got = np.concatenate(out)[:, 0].astype(np.float64)
    xd, k = x[:, 0].astype(np.float64), len(taps)
    want = sum(t * xd[j : rows - (k - 1 - j)] for j, t in enumerate(taps))
    err = np.abs(got[k - 1 :] - want).max() / np.abs(want).max()
    assert err < 5e-7, err


@pytest.mark.parametrize("use_triton", [False, True])
def test_a_symbol_listed_inside_a_block_is_centred_on_the_steps_level(use_triton):
    """A block whose samples of a feature are NaN (the symbol lists after the block's first output) takes the
    step's level for it, the symbol's first price: on 0 instead, its outputs were computed on raw prices near
    100 and a zero-sum filter of 0.01-tick moves lost their digits."""
    rng = np.random.default_rng(3)
    rows, late = 512, 203  # inside a block of outputs, whatever the kernels' time tiles
    x = (100 + np.cumsum(rng.integers(-3, 4, size=(rows, 3)), axis=0) * 0.01).astype(np.float32)
    x[:late, 1] = np.nan
    w = rng.normal(size=(2, 3, 3))
    w -= w.mean(axis=(1, 2), keepdims=True)  # zero-sum over channels and taps
    plan = resolve(pipeline_from_dict({"weight_dtype": "float32", "conv": [{"weights": w}]}),
                   ("x0", "x1", "x2"))  # fmt: skip
    out: list[np.ndarray] = []
    backend = Backend(plan, torch.device("cpu"), use_triton=use_triton)
    run_batched(ArraySource(x, band_rows=100), plan, backend,
                lambda a, release: (out.append(a.copy()), release()), start=0, step_rows=rows, warmup="nan")  # fmt: skip
    got = np.concatenate(out).astype(np.float64)
    xd = x.astype(np.float64)
    want = np.stack([sum(xd[j : rows - (2 - j)] @ w[o, :, j] for j in range(3)) for o in range(2)], axis=1)
    listed = want[late:]  # outputs from step late + 2 on, the first whose taps all read the symbol's prices
    err = np.abs(got[late + 2 :] - listed).max() / np.abs(listed).max()
    assert np.isnan(got[late + 1]).all()  # a window that reads a row before the listing: NaN
    assert err < 2e-6, err
