"""Chunked equals whole for every input value: infinities, NaN and huge values at chunk and step edges.

The first stage is centred on a level taken from the rows before each chunk (tsconv.engine.level). An
infinite level made every output of the next chunk NaN, and a huge one left them off by about 1e23;
here each engine's chunked result must have the whole-series result's non-finite pattern exactly, and
its finite values within the fp32 bound of the values the outputs actually read.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import tsconv
from tsconv.engine.batched import run_batched
from tsconv.engine.compute import Backend
from tsconv.io.readers.blocks import ArraySource
from tsconv.pipeline.spec import pipeline_from_dict, resolve

from ..helpers import error_bound, price_series

ROWS, FEATURES, CHUNK = 1300, 3, 256
EDGES = range(CHUNK, ROWS, CHUNK)
EXTREMES = [np.inf, -np.inf, np.nan, 1e30, -1e30]
PIPELINES = {
    "default": None,
    "dense_head": {
        "conv": [
            {
                "weights": np.random.default_rng(0).normal(size=(4, FEATURES, 5)),
                "dilation": 2,
                "weight_dtype": "float32",
            }
        ],
        "head": {"weights": np.random.default_rng(1).normal(size=(4, 2))},
    },
    "ema_ma": {"conv": [{"filters": ["ema:8", "ma:16", "diff:1"], "weight_dtype": "float32"}]},
}
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _series(value: float, where: str) -> tuple[np.ndarray, np.ndarray]:
    """A price series with ``value`` placed around every chunk edge of column 1 (and the typical level
    magnitude of each column, for the bound)."""
    x = price_series(ROWS, FEATURES, seed=11)
    typical = np.abs(x).max(axis=0)
    for edge in EDGES:
        if where == "before_edge":  # the last row before the edge: once the level's only candidate
            x[edge - 1, 1] = value
        elif where == "at_edge":
            x[edge, 1] = value
        elif where == "tail":  # two rows in a row just before the edge
            x[edge - 3 : edge - 1, 1] = value
        elif where == "halo":
            x[edge - CHUNK // 2, 1] = value
    if where == "late_start":  # a symbol whose first print is the extreme value, just before an edge
        x[: 2 * CHUNK - 1, 2] = np.nan
        x[2 * CHUNK - 1, 2] = value
        if np.isfinite(value):  # its first finite value is the only causal level (tsconv.engine.level)
            typical[2] = abs(value)
    return x, typical


def _assert_same(chunked: np.ndarray, whole: np.ndarray, x: np.ndarray, plan, typical: np.ndarray) -> None:
    for name, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        differ = np.argwhere(test(chunked) != test(whole))
        where = ", ".join(f"row {r} output {c}: {chunked[r, c]} against {whole[r, c]}" for r, c in differ[:3])
        assert differ.size == 0, f"{name} pattern differs at {len(differ)} places: {where}"
    finite = np.isfinite(whole)
    err = np.abs(chunked.astype(np.float64) - whole)[finite]
    bound = 2 * error_bound(x, plan, level=typical)[finite]
    worst = int(np.argmax(err / bound)) if err.size else 0
    assert (err <= bound).all(), f"error {err[worst]:.3g} > bound {bound[worst]:.3g}"


CASES = [
    pytest.param(value, where, id=f"{value:g}-{where}")
    for value in EXTREMES
    for where in ("before_edge", "at_edge", "tail", "halo", "late_start")
    if not (where == "tail" and np.isnan(value))
]


@pytest.mark.filterwarnings("ignore::tsconv.errors.TsconvWarning")
@pytest.mark.parametrize("pipe", list(PIPELINES))
@pytest.mark.parametrize(("value", "where"), CASES)
def test_chunked_cpu_engine_equals_whole(value, where, pipe):
    x, typical = _series(value, where)
    plan = resolve(pipeline_from_dict(PIPELINES[pipe]) if PIPELINES[pipe] else tsconv.pipeline.spec.default_pipeline(),
                   tuple(f"f{j}" for j in range(FEATURES)))  # fmt: skip
    whole = tsconv.features(x, PIPELINES[pipe], chunk=ROWS)
    chunked = tsconv.features(x, PIPELINES[pipe], chunk=CHUNK)
    _assert_same(chunked, whole, x, plan, typical)


def _batched(x, plan, device, *, triton: bool) -> np.ndarray:
    out: list[np.ndarray] = []
    backend = Backend(plan, device, use_triton=triton)
    run_batched(ArraySource(x, band_rows=CHUNK), plan, backend, lambda a, release: (out.append(a.copy()), release()), start=0,
                step_rows=CHUNK, warmup="nan")  # fmt: skip
    return np.concatenate(out)


def _batched_case(value, where, pipe, device, *, triton):
    x, typical = _series(value, where)
    pipeline = (
        pipeline_from_dict(PIPELINES[pipe]) if PIPELINES[pipe] else tsconv.pipeline.spec.default_pipeline()
    )
    plan = resolve(pipeline, tuple(f"f{j}" for j in range(FEATURES)))
    whole = tsconv.features(x, PIPELINES[pipe], chunk=ROWS)
    _assert_same(_batched(x, plan, device, triton=triton), whole, x, plan, typical)


# The interpreted prepare kernel takes seconds per case: the cases where the level is chosen, each pipeline
# taking half of them (all of them run on the GPU below).
BATCHED_CASES = [
    pytest.param(value, where, pipe, id=f"{value:g}-{where}-{pipe}", marks=() if fast else pytest.mark.slow)
    for value, where, pipe, fast in [
        (np.inf, "before_edge", "default", True),
        (-np.inf, "tail", "dense_head", False),
        (np.nan, "late_start", "default", False),
        (np.inf, "late_start", "dense_head", False),
        (1e30, "tail", "default", False),
        (-1e30, "at_edge", "dense_head", False),
    ]
]


@pytest.mark.skipif(not INTERPRETED, reason="the prepare kernel runs on CPU only under the interpreter")
@pytest.mark.filterwarnings("ignore::tsconv.errors.TsconvWarning")
@pytest.mark.parametrize(("value", "where", "pipe"), BATCHED_CASES)
def test_batched_engine_steps_equal_whole(value, where, pipe):
    """The batched engine's steps (prepare kernel interpreted, torch stages) against the whole series."""
    _batched_case(value, where, pipe, torch.device("cpu"), triton=False)


@pytest.mark.skipif(not INTERPRETED, reason="the Triton kernels run on CPU only under the interpreter")
@pytest.mark.filterwarnings("ignore::tsconv.errors.TsconvWarning")
@pytest.mark.parametrize(
    ("value", "where"),
    [(1e30, "at_edge"), pytest.param(np.inf, "before_edge", marks=pytest.mark.slow),
     pytest.param(-1e30, "tail", marks=pytest.mark.slow)],
)  # fmt: skip
def test_batched_engine_with_the_triton_kernels_equals_whole(value, where):
    """The same through tsconv's dense conv1d, whose blocks re-centre on their own level (interpreted; the
    banks' kernels, slow to interpret, run in the GPU test below)."""
    _batched_case(value, where, "dense_head", torch.device("cpu"), triton=True)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore::tsconv.errors.TsconvWarning")
@pytest.mark.parametrize("pipe", list(PIPELINES))
@pytest.mark.parametrize(("value", "where"), CASES)
def test_cuda_engine_steps_equal_whole(value, where, pipe):
    _batched_case(value, where, pipe, torch.device("cuda"), triton=True)
