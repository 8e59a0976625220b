"""The engine's head path (tsconv.engine.head): forced paths, the auto chooser, its decision cache.

The Triton paths run through the interpreter on CPU tensors (small shapes: each program costs milliseconds).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import tsconv
from tsconv.engine import head
from tsconv.engine.batched import run_batched
from tsconv.engine.chunked import run_chunked
from tsconv.engine.compute import Backend
from tsconv.errors import TsconvError
from tsconv.io.readers.blocks import ArraySource
from tsconv.kernels import autotune, fused
from tsconv.pipeline.spec import pipeline_from_dict, resolve

from ..helpers import assert_matches_reference, error_bound, mostly_slow, price_series, write_store

NAMES = ("a", "b", "c", "d")
RNG = np.random.default_rng(7)
# One dense stage straight into the head: the last stage is the first (centred on a level per chunk).
SINGLE = {
    "conv": [{"weights": RNG.normal(size=(12, 4, 3)) / 4, "bias": RNG.normal(size=12), "activation": "relu"}],
    "head": {"weights": RNG.normal(size=(12, 3)) / 3, "bias": RNG.normal(size=3), "activation": "tanh"},
}
# A depthwise bank, then a dense stage into the head, float32 weights.
TWO = {
    "conv": [
        {"filters": ["diff:1", "ma:4"]},
        {"weights": RNG.normal(size=(10, 8, 2)) / 4, "dilation": 2, "activation": "gelu"},
    ],
    "head": {"weights": RNG.normal(size=(10, 5)) / 3},
    "weight_dtype": "float32",
}
# The last stage grouped: never fused.
GROUPED = {
    "conv": [
        {"filters": ["diff:1", "ma:4"]},
        {"weights": RNG.normal(size=(8, 4, 2)) / 4, "groups": 2},
    ],
    "head": {"weights": RNG.normal(size=(8, 3)) / 3},
}
NO_HEAD = {"conv": [{"weights": RNG.normal(size=(6, 4, 3)) / 4}]}
# A bank straight into the head.
BANK_HEAD = {
    "conv": [{"filters": ["diff:1", "ma:4", "dev:8"]}],
    "head": {"weights": RNG.normal(size=(12, 3)) / 3, "bias": RNG.normal(size=3), "activation": "tanh"},
    "weight_dtype": "float32",
}

PIPES = {"single": SINGLE, "two": TWO, "grouped": GROUPED, "no_head": NO_HEAD, "bank_head": BANK_HEAD}
pytestmark = pytest.mark.filterwarnings("ignore::tsconv.errors.TsconvWarning")  # FP16 sums of random weights


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    """No forced path from the caller's environment; decisions cached under tmp_path only."""
    assert os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
    monkeypatch.setenv("TSCONV_HEAD_PATH", "auto")
    monkeypatch.delenv("TSCONV_AUTOTUNE", raising=False)
    monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path / "cache"))
    autotune.clear_memory_cache()
    yield
    autotune.clear_memory_cache()


def _plan(name):
    return resolve(pipeline_from_dict(PIPES[name]), NAMES)


def _data(rows=300):
    x = price_series(rows, 4, seed=3, nan_fraction=0.03)
    x[:40, 1] = np.nan  # a late start
    return x


def _chunked(x, plan, backend, chunk=128):
    out: list[np.ndarray] = []
    run_chunked(ArraySource(x), plan, backend, out.append, start=0, chunk=chunk, warmup="nan")
    return np.concatenate(out)


def _batched(x, plan, backend, step_rows=128):
    out: list[np.ndarray] = []
    run_batched(ArraySource(x, band_rows=64), plan, backend, lambda a, release: (out.append(a.copy()), release()), start=0,
                step_rows=step_rows, warmup="nan")  # fmt: skip
    return np.concatenate(out)


def _cpu_backend(plan, monkeypatch, path=None):
    if os.environ.get("TRITON_INTERPRET") != "1":  # (a GPU host runs these kernels on CUDA, in other tests)
        pytest.skip("Triton kernels on CPU tensors need the interpreter")
    if path is None:
        monkeypatch.setenv("TSCONV_HEAD_PATH", "auto")
    else:
        monkeypatch.setenv("TSCONV_HEAD_PATH", path)
    return Backend(plan, torch.device("cpu"), use_triton=True)


def _assert_close_to(y, ref_y, x, plan):
    """Both within the fp32 bound of the float64 reference, so within twice the bound of each other."""
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref_y))
    ok = ~np.isnan(ref_y)
    bound = 2 * error_bound(x, plan)[ok]
    err = np.abs(y.astype(np.float64) - ref_y)[ok]
    assert (err <= bound).all(), f"{err.max():.3g} over the bound"


@pytest.mark.parametrize("pipe", mostly_slow(["single", "two"], fast=(0,)))
def test_each_forced_path_matches_the_unfused_path_and_the_reference(pipe, monkeypatch):
    x, plan = _data(), _plan(pipe)
    base = _cpu_backend(plan, monkeypatch, "unfused")
    y0 = _chunked(x, plan, base)
    assert base.head_path == "unfused"
    assert_matches_reference(y0, x, plan)
    for path in ("gemm", "fused"):
        backend = _cpu_backend(plan, monkeypatch, path)
        assert backend._head.offered == ("unfused", "gemm", "fused")
        # the Triton paths read the head's stored float16 values as float16 (exact)
        want = torch.float16 if pipe == "single" else torch.float32
        assert backend._head.head_weight.dtype == want
        fused.last_launch.clear()
        y = _chunked(x, plan, backend)
        assert backend.head_path == path
        assert fused.last_launch.get("path") == ("fused" if path == "fused" else None)
        assert_matches_reference(y, x, plan)
        _assert_close_to(y, y0, x, plan)


def test_forced_fused_through_the_batched_engine(monkeypatch):
    """The batched engine's steps with the fused path equal the chunked engine's unfused path."""
    x, plan = _data(), _plan("single")
    y0 = _chunked(x, plan, _cpu_backend(plan, monkeypatch, "unfused"))
    backend = _cpu_backend(plan, monkeypatch, "fused")
    y = _batched(x, plan, backend)
    assert backend.head_path == "fused"
    assert_matches_reference(y, x, plan)
    _assert_close_to(y, y0, x, plan)


def test_auto_on_the_cpu_keeps_the_torch_path(monkeypatch):
    def no_timing(*_a, **_k):
        raise AssertionError("auto must not time paths on the CPU")

    monkeypatch.setattr(head, "_time_path", no_timing)
    x, plan = _data(200), _plan("single")
    torch_backend = Backend(plan, torch.device("cpu"))  # the CPU engine: torch convs
    y = _chunked(x, plan, torch_backend)
    assert torch_backend.head_path == "unfused" and torch_backend._head.offered == ("unfused",)
    assert_matches_reference(y, x, plan)
    triton_backend = _cpu_backend(plan, monkeypatch)  # interpreted Triton convs, auto
    _chunked(x, plan, triton_backend)
    assert triton_backend.head_path == "unfused"
    # a forced path does not apply to a backend that does not run Triton kernels
    monkeypatch.setenv("TSCONV_HEAD_PATH", "fused")
    forced_torch = Backend(plan, torch.device("cpu"))
    _chunked(x, plan, forced_torch)
    assert forced_torch.head_path == "unfused"


def _measured(monkeypatch, table):
    """auto selection on the CPU with made-up timings (tuning on); returns the list of timed paths."""
    monkeypatch.setenv("TSCONV_AUTOTUNE", "1")
    calls: list[str] = []

    def fake(path, fn, device):
        calls.append(path)
        return table[path]

    monkeypatch.setattr(head, "can_measure", lambda device: True)
    monkeypatch.setattr(head, "_time_path", fake)
    return calls


@pytest.mark.parametrize(("table", "want"), [
    ({"unfused": 3.0, "gemm": 1.0, "fused": 2.0}, "gemm"),
    ({"unfused": 3.0, "gemm": 2.0, "fused": 1.0}, "fused"),
    ({"unfused": 1.0, "gemm": 2.0, "fused": float("inf")}, "unfused"),
])  # fmt: skip
def test_auto_picks_the_fastest_path_and_decides_once_per_shape_class(table, want, monkeypatch):
    calls = _measured(monkeypatch, table)
    x, plan = _data(256), _plan("single")
    backend = _cpu_backend(plan, monkeypatch)
    y = _chunked(x, plan, backend, chunk=128)  # two chunks of 128 rows: one shape class
    assert backend.head_path == want
    assert sorted(calls) == ["fused", "gemm", "unfused"]
    assert_matches_reference(y, x, plan)


def test_a_failing_path_is_not_chosen(monkeypatch):
    monkeypatch.setattr(head, "can_measure", lambda device: True)

    def fake(path, fn, device):
        if path == "fused":
            raise RuntimeError("out of resources")
        return {"unfused": 2.0, "gemm": 3.0}[path]

    monkeypatch.setattr(head, "_time_path", fake)
    x, plan = _data(128), _plan("single")
    backend = _cpu_backend(plan, monkeypatch)
    _chunked(x, plan, backend)
    assert backend.head_path == "unfused"


def test_the_decision_round_trips_through_the_disk_cache(monkeypatch, tmp_path):
    calls = _measured(monkeypatch, {"unfused": 3.0, "gemm": 2.0, "fused": 1.0})
    x, plan = _data(128), _plan("single")
    b1 = _cpu_backend(plan, monkeypatch)
    y1 = _chunked(x, plan, b1)
    assert b1.head_path == "fused" and len(calls) == 3
    path = tmp_path / "cache" / "autotune-cpu.json"
    entries = json.loads(path.read_text())["entries"]
    (full, rec), *_ = [(k, v) for k, v in entries.items() if k.startswith(head.SPACE + "|")]
    assert rec["config"] == "fused" and rec["timings_ms"] == {"unfused": 3.0, "gemm": 2.0, "fused": 1.0}
    assert "|C=4|O=12|D=3|K=3|" in full and "|rows=128|" in full and full.endswith(f"triton={head_triton()}")
    assert [e.source for e in autotune.events() if e.space == head.SPACE][-1] == "tuned"

    # a new process: memory forgotten, the disk decision reused without timing
    autotune.clear_memory_cache()
    calls.clear()
    b2 = _cpu_backend(plan, monkeypatch)
    y2 = _chunked(x, plan, b2)
    assert b2.head_path == "fused" and calls == []
    assert [e.source for e in autotune.events() if e.space == head.SPACE][-1] == "disk"
    np.testing.assert_array_equal(y1, y2)

    # another step length bucket is another shape class
    _chunked(_data(64), plan, _cpu_backend(plan, monkeypatch))
    assert len(calls) == 3


def head_triton() -> str:
    import triton

    return triton.__version__


def test_autotune_off_keeps_the_unfused_path_without_timing(monkeypatch):
    calls = _measured(monkeypatch, {"unfused": 3.0, "gemm": 2.0, "fused": 1.0})
    monkeypatch.setenv("TSCONV_AUTOTUNE", "0")
    x, plan = _data(128), _plan("single")
    backend = _cpu_backend(plan, monkeypatch)
    _chunked(x, plan, backend)
    assert backend.head_path == "unfused" and calls == []


@pytest.mark.slow
def test_no_head_or_a_grouped_last_stage_never_offers_fused(monkeypatch):
    calls = _measured(monkeypatch, {"unfused": 3.0, "gemm": 2.0, "fused": 1.0})
    x = _data(128)
    plan = _plan("no_head")
    backend = _cpu_backend(plan, monkeypatch)
    assert backend._head is None
    y = _chunked(x, plan, backend)
    assert backend.head_path is None
    assert_matches_reference(y, x, plan)

    plan = _plan("grouped")
    backend = _cpu_backend(plan, monkeypatch)
    assert backend._head.offered == ("unfused", "gemm") and "groups=2" in backend._head.fused_reason
    _chunked(x, plan, backend)
    assert backend.head_path == "gemm" and sorted(calls) == ["gemm", "unfused"]
    # forcing "fused" runs what conv1d_head itself falls back to (conv1d + gemm)
    y0 = _chunked(x, plan, _cpu_backend(plan, monkeypatch, "unfused"))
    forced = _cpu_backend(plan, monkeypatch, "fused")
    y = _chunked(x, plan, forced)
    assert forced.head_path == "gemm"
    assert_matches_reference(y, x, plan)
    _assert_close_to(y, y0, x, plan)


def test_a_bad_head_path_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("TSCONV_HEAD_PATH", "cudnn")
    with pytest.raises(TsconvError, match="TSCONV_HEAD_PATH"):
        Backend(_plan("single"), torch.device("cpu"), use_triton=True)
    monkeypatch.setenv("TSCONV_HEAD_PATH", " Auto ")
    assert head.requested_path() is None


def test_the_report_names_the_head_path(tmp_path):
    x = _data(200)
    src = write_store(tmp_path / "in.zarr", x, chunks=(64, 4))
    with_head = tsconv.process(src, tmp_path / "a.zarr", pipeline=SINGLE, device="cpu")
    assert with_head.head_path == "unfused" and with_head.to_dict()["head_path"] == "unfused"
    without = tsconv.process(src, tmp_path / "b.zarr", pipeline=NO_HEAD, device="cpu")
    assert without.head_path is None


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["unfused", "gemm", "fused", None])
def test_each_path_on_the_gpu_through_the_batched_engine(path, monkeypatch, tmp_path):
    """On CUDA: each forced path and auto (timed, then cached) give the reference within the fp32 bound."""
    x = price_series(5000, 16, seed=9, nan_fraction=0.01)
    rng = np.random.default_rng(1)
    pipe = {
        "conv": [
            {"weights": rng.normal(size=(64, 16, 5)) / 8, "bias": rng.normal(size=64), "activation": "relu"}
        ],
        "head": {"weights": rng.normal(size=(64, 8)) / 8, "bias": rng.normal(size=8)},
    }
    plan = resolve(pipeline_from_dict(pipe), tuple(f"x{j}" for j in range(16)))
    if path is None:
        monkeypatch.setenv("TSCONV_HEAD_PATH", "auto")
        monkeypatch.setenv("TSCONV_AUTOTUNE", "1")  # with tuning off, auto takes a cached choice or "unfused"
        monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path))
        autotune.clear_memory_cache()
    else:
        monkeypatch.setenv("TSCONV_HEAD_PATH", path)
    backend = Backend(plan, torch.device("cuda"))
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # as the engine runs
    try:
        y = _batched(x, plan, backend, step_rows=2048)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    assert_matches_reference(y, x, plan)
    if path is None:
        assert backend.head_path in backend._head.offered
        assert any(e.space == head.SPACE and e.source == "tuned" for e in autotune.events())
    else:
        assert backend.head_path == path


def test_the_default_head_path_is_tsconvs_gemm(monkeypatch):
    monkeypatch.delenv("TSCONV_HEAD_PATH", raising=False)
    assert head.requested_path() == "gemm"
    monkeypatch.setenv("TSCONV_HEAD_PATH", "auto")
    assert head.requested_path() is None


@pytest.mark.parametrize("path", mostly_slow(["unfused", "gemm", "fused"], fast=(1,)))
@pytest.mark.parametrize("pipe", ["single", "two"])
def test_only_the_first_stage_recenters_on_every_head_path(pipe, path, monkeypatch):
    """The Triton backend's first stage (level data) runs with conv1d's ``recenter``, whichever path
    computes it; later stages never do (their inputs are features, not levels), and a bank first stage
    needs none (it computes in float64)."""
    from tsconv.kernels import conv1d as conv1d_mod

    calls: list[tuple[str, int, bool]] = []
    history: list[int] = []  # recenter_from of each recentered call: the zero-history rows of its input
    real_conv, real_fused = conv1d_mod.conv1d, fused.conv1d_head

    def conv_spy(x, w, *a, **kw):
        calls.append(("conv1d", int(w.shape[1]), kw.get("recenter", False)))
        if kw.get("recenter"):
            history.append(kw.get("recenter_from", 0))
        return real_conv(x, w, *a, **kw)

    def fused_spy(x, w, *a, **kw):
        calls.append(("conv1d_head", int(w.shape[1]), kw.get("recenter", False)))
        if kw.get("recenter"):
            history.append(kw.get("recenter_from", 0))
        return real_fused(x, w, *a, **kw)

    monkeypatch.setattr(conv1d_mod, "conv1d", conv_spy)
    monkeypatch.setattr(fused, "conv1d_head", fused_spy)
    x, plan = _data(160), _plan(pipe)
    backend = _cpu_backend(plan, monkeypatch, path)
    y = _batched(x, plan, backend, step_rows=64)
    assert_matches_reference(y, x, plan)
    if pipe == "single":  # the first stage is the last: the head path itself recenters
        first_cg = plan.layers[0].weight.shape[1]  # input channels per group of the first stage
        assert calls and {c for c in calls if c[1] == first_cg and c[2]} == {c for c in calls if c[2]}
        # the first step's input starts with the whole halo of zero history; later steps have none
        assert history[0] == plan.halo and set(history[1:]) == {0}, history
        assert all(rc for _, _, rc in calls)
        assert {name for name, _, _ in calls} == {"conv1d_head" if path == "fused" else "conv1d"}
    else:  # the first stage is a bank (computed from its filters, no conv); the dense last stage never recenters
        assert calls and not history and not any(rc for _, _, rc in calls)
        assert all(cg == 8 for _, cg, _ in calls)


@pytest.mark.parametrize("path", ["gemm", "unfused"])
def test_a_banks_head_runs_on_the_gemm_by_default_and_the_report_names_it(path, monkeypatch):
    """A bank as the last stage: its head on tsconv's gemm where the Triton paths run (or torch's matmul
    when unfused is asked for), within the fp32 bound, and the backend says which ran."""
    x, plan = _data(300), _plan("bank_head")
    backend = _cpu_backend(plan, monkeypatch, path)
    y = _chunked(x, plan, backend)
    assert backend.head_path == path
    assert_matches_reference(y, x, plan)
    torch_backend = Backend(plan, torch.device("cpu"))  # the CPU engine: torch's matmul, named
    _chunked(x, plan, torch_backend)
    assert torch_backend.head_path == "unfused"


@pytest.mark.gpu
def test_a_banks_head_on_the_gpu_runs_on_the_gemm(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.delenv("TSCONV_HEAD_PATH", raising=False)  # the default
    x = price_series(5000, 4, seed=5, nan_fraction=0.01)
    plan = _plan("bank_head")
    backend = Backend(plan, torch.device("cuda"))
    y = _batched(x, plan, backend, step_rows=2048)
    assert backend.head_path == "gemm"
    assert_matches_reference(y, x, plan)
