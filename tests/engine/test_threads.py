"""A CPU run's bits do not depend on the process's thread count (a dask worker's share of the cores, a job
under ``OMP_NUM_THREADS=1``): torch's CPU conv and matmul split their sums by thread count, so the engine runs
them in tiles of fixed shape, each on one thread (tsconv.kernels.cpu_tiles)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch

import tsconv
from tsconv.kernels.cpu_tiles import run_parts
from tsconv.kernels.torch_side import conv1d_cpu, rows_matmul

from ..helpers import price_series

THREADS = (1, 2, 3, 8)


@contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _bits(a: np.ndarray | torch.Tensor) -> bytes:
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32)).tobytes()


def test_a_dense_pipeline_gives_the_same_bits_on_any_number_of_threads() -> None:
    """Differences into two dense stages and a head, on 1,024-row chunks: torch's conv of [1, 6, 1030] by
    [6, 6, 7] alone gave other bits on 2 threads than on 1 or 3 (1,354 cells), and a whole run 11,418."""
    rng = np.random.default_rng(7)
    pipe = {
        "preprocess": {"transform": "diff"},
        "conv": [
            {"weights": rng.normal(size=(6, 6, 7)) * 0.3, "activation": "relu", "weight_dtype": "float32"},
            {"weights": rng.normal(size=(4, 6, 3)) * 0.3, "weight_dtype": "float32"},
        ],
        "head": {"weights": rng.normal(size=(4, 3)), "weight_dtype": "float32"},
    }
    x = price_series(6_000, 6, seed=3, nan_fraction=0.01)
    x[:2_000, 1] = np.nan  # a symbol that starts late
    runs = {}
    for n in THREADS:
        with _threads(n):
            runs[n] = _bits(tsconv.features(x, pipe, chunk=1024, device="cpu"))
            assert torch.get_num_threads() == n  # the run held torch on one thread, then gave the count back
    assert all(runs[n] == runs[1] for n in THREADS), {n: runs[n] == runs[1] for n in THREADS}


def test_a_first_dense_stage_on_levels_gives_the_same_bits_on_any_number_of_threads() -> None:
    """The re-centred first stage (blocks of rows in one batch) and a depthwise stage after it."""
    rng = np.random.default_rng(8)
    pipe = {
        "conv": [
            {"weights": rng.normal(size=(32, 24, 5)) * 0.2, "activation": "gelu"},
            {
                "weights": rng.normal(size=(32, 1, 9)) * 0.3,
                "groups": 32,
                "dilation": 2,
                "weight_dtype": "float32",
            },
        ],
    }
    x = price_series(5_000, 24, seed=5, nan_fraction=0.01)
    runs = {}
    for n in THREADS:
        with _threads(n):
            runs[n] = _bits(tsconv.features(x, pipe, chunk=4096, device="cpu"))
    assert all(runs[n] == runs[1] for n in THREADS), {n: runs[n] == runs[1] for n in THREADS}


@pytest.mark.parametrize(("shape", "weight"), [((1, 6, 1030), (6, 6, 7)), ((3, 32, 40), (16, 32, 5)),
                                               ((1, 64, 3000), (64, 1, 9))])  # fmt: skip
def test_conv1d_cpu_is_torchs_conv_and_the_same_on_any_number_of_threads(shape, weight) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).cumsum(-1)
    w = torch.randn(weight, generator=g)
    groups = shape[1] // weight[1]
    with _threads(1):
        want = conv1d_cpu(x, w, None, groups=groups)
    ref = torch.nn.functional.conv1d(x.double(), w.double(), groups=groups)
    assert want.shape == ref.shape and torch.allclose(want.double(), ref, rtol=1e-5, atol=1e-3)
    for n in THREADS:
        with _threads(n):
            assert torch.equal(conv1d_cpu(x, w, None, groups=groups), want), n


@pytest.mark.parametrize("rows", [1, 2, 7, 1025, 3000])
def test_rows_matmul_is_the_same_on_any_number_of_threads_and_rows(rows: int) -> None:
    """[7, 100] @ [100, 16] gave other bits on 2 threads than on 1; a row's bits do not depend on how many
    rows share its call either (a Stream's pushes)."""
    g = torch.Generator().manual_seed(rows)
    y, w = torch.randn(rows, 100, generator=g), torch.randn(100, 16, generator=g)
    with _threads(1):
        want = rows_matmul(y, w)
    assert torch.allclose(want.double(), y.double() @ w.double(), rtol=1e-5, atol=1e-4)
    for n in THREADS:
        with _threads(n):
            assert torch.equal(rows_matmul(y, w), want), n
            assert torch.equal(rows_matmul(y[-1:], w), want[-1:]), n


def test_the_thread_count_is_the_callers_again_after_fewer_parts_than_threads() -> None:
    """A native bank of few tasks ran on as many threads, and left torch on that many for the rest of the
    process (and every later conv on other bits)."""
    seen: list[int] = []
    with _threads(4):
        run_parts(lambda k, count: seen.append(torch.get_num_threads()), 2)
        assert torch.get_num_threads() == 4
    assert seen == [1, 1]


def test_a_thread_that_first_ran_torch_during_another_threads_run_does_not_leave_the_process_on_one() -> None:
    """A ThreadPoolExecutor over symbols: a worker whose first parallel torch op ran while another worker's
    dense run held torch at one thread kept 1 (torch reads the process's count once per thread), and its own
    run then gave torch back 1: every thread started afterwards ran torch, and tsconv's tiles, on one."""
    import threading

    from tsconv.kernels.cpu_tiles import one_thread

    def fresh_count() -> int:
        seen: list[int] = []
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start()
        t.join()
        return seen[0]

    counts: dict[str, int] = {}
    started, release = threading.Event(), threading.Event()

    def late_worker() -> None:
        counts["first"] = torch.get_num_threads()  # its first torch op, while the main thread's block holds
        started.set()
        release.wait()
        run_parts(lambda k, count: None, 2)  # a bank's parts, as features() runs them
        counts["after"] = torch.get_num_threads()

    with _threads(3):
        worker = threading.Thread(target=late_worker)
        with one_thread():
            worker.start()
            assert started.wait(10)
        release.set()
        worker.join(10)
        assert counts["first"] == 1  # torch's own rule, which tsconv cannot change
        assert (counts["after"], fresh_count(), torch.get_num_threads()) == (3, 3, 3)


def test_calls_from_several_threads_give_what_each_gives_alone() -> None:
    """README, Threads: calls in a thread pool (built-in and custom pipelines, other data and chunks each) give
    the bits each call gives run alone."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(3)
    dense = {"conv": [{"weights": rng.normal(size=(4, 3, 5)).astype(np.float32)}]}
    calls = [
        (price_series(3000, 3, seed=k, nan_fraction=0.01), p, chunk)
        for k, (p, chunk) in enumerate([("default", 700), (dense, 1024), ("trend_ema", 333), (dense, 64)] * 2)
    ]
    alone = [tsconv.features(x, p, chunk=c, device="cpu") for x, p, c in calls]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda a: tsconv.features(a[0], a[1], chunk=a[2], device="cpu"), calls))
    for a, b in zip(alone, together, strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
