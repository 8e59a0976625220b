"""The batched engine's step graph (tsconv.engine.batched._StepGraph): which steps run eagerly, when the
capture happens, replays after it, and the fall back to eager steps when a capture fails. The orchestration
runs on the CPU with a stand-in for torch.cuda.CUDAGraph; the GPU test checks that a run with the graph
writes exactly the bytes of a run without it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import tsconv
from tsconv import config
from tsconv.engine import batched

from ..helpers import price_series, read_output, write_store


class _FakeGraph:
    log: list = []

    def capture_begin(self, *, capture_error_mode: str) -> None:
        assert capture_error_mode == "thread_local"
        self.log.append("begin")

    def capture_end(self) -> None:
        self.log.append("end")

    def replay(self) -> None:
        self.log.append("replay")


def _step_graph(monkeypatch, *, fail: bool = False) -> tuple[batched._StepGraph, list]:
    log: list = []
    monkeypatch.setattr(_FakeGraph, "log", log)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append("empty"))
    capturing = {"now": False}

    def fn(first_row: int) -> torch.Tensor:
        capturing["now"] = log[-1:] == ["begin"]
        log.append(("fn", first_row))
        if fail and capturing["now"]:
            raise RuntimeError("operation not permitted when stream is capturing")
        return torch.full((2,), float(first_row))

    return batched._StepGraph(fn, None, enabled=True), log


def test_the_second_eligible_step_is_captured_and_later_steps_replay_it(monkeypatch) -> None:
    g, log = _step_graph(monkeypatch)
    assert g.status == "eager"
    assert g(-8)[0] == -8  # rows of the warm-up history: always eager
    assert g(56)[0] == 56  # the first eligible step: eager (compiles, tunes, packs weights)
    assert g.status == "eager"
    out = g(120)  # captured, then replayed
    assert g.status == "replayed" and out[0] == 120
    assert g(184) is out and g(248) is out  # replays write the captured output buffer
    assert log == [("fn", -8), ("fn", 56), "empty", "begin", ("fn", 120), "end", "replay", "replay", "replay"]
    assert g(-1)[0] == -1 and log[-1] == ("fn", -1)
    assert g.release() and not g.release()  # the graph dropped once


def test_the_eager_steps_cached_blocks_are_freed_before_the_capture(monkeypatch) -> None:
    g, log = _step_graph(monkeypatch)
    for r in (-8, 56, 120, 184):
        g(r)
    # freed once, after the eager steps and before the capture (the graph's pool then holds the intermediates)
    assert log == [("fn", -8), ("fn", 56), "empty", "begin", ("fn", 120), "end", "replay", "replay"]


def test_a_failed_capture_leaves_every_step_eager(monkeypatch) -> None:
    g, log = _step_graph(monkeypatch, fail=True)
    g(0)
    assert g(64)[0] == 64  # the capture failed: the step ran again, eagerly
    assert g.status.startswith("off: the capture failed (RuntimeError: operation not permitted")
    assert log == [("fn", 0), "empty", "begin", ("fn", 64), "end", ("fn", 64)]
    assert not g.release()
    g(128)
    assert log[-1] == ("fn", 128) and "replay" not in log


def test_disabled_graphs_run_every_step_eagerly(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    calls = []
    g = batched._StepGraph(lambda r: calls.append(r) or torch.zeros(1), None, enabled=False)
    for r in (0, 64, 128, 192):
        g(r)
    assert calls == [0, 64, 128, 192] and g.status == "off"


@pytest.mark.parametrize(("value", "on"), [(None, True), ("1", True), ("0", False), ("off", False)])
def test_the_cuda_graph_setting(monkeypatch, value, on) -> None:
    if value is None:
        monkeypatch.delenv("TSCONV_CUDA_GRAPH", raising=False)
    else:
        monkeypatch.setenv("TSCONV_CUDA_GRAPH", value)
    assert config.current().cuda_graph is on


def _dense_pipeline(directory: Path, features: int) -> Path:
    """The e2e benchmark's kind of pipeline, small: a dense conv K=5 -> 32 (ReLU), then a head -> 8."""
    rng = np.random.default_rng(5)
    np.save(
        directory / "conv.npy",
        (rng.standard_normal((32, features, 5)) / np.sqrt(features * 5)).astype(np.float32),
    )
    np.save(directory / "head.npy", (rng.standard_normal((32, 8)) / np.sqrt(32)).astype(np.float32))
    path = directory / "dense.toml"
    path.write_text(
        'name = "dense"\nweight_dtype = "float16"\n\n[[conv]]\nname = "mix"\nweights = "conv.npy"\n'
        'activation = "relu"\n\n[head]\nweights = "head.npy"\n'
    )
    return path


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("decode", ["gpu", "cpu"])
@pytest.mark.parametrize("pipe", ["bank", "dense", "preprocess"])
def test_a_run_with_the_step_graph_writes_the_bytes_of_one_without(tmp_path: Path, monkeypatch, decode, pipe):
    x = price_series(40_000, 48, seed=11, nan_fraction=0.02)
    src = write_store(tmp_path / "in.zarr", x.astype(np.float32), chunks=(2048, 48))
    bank = {"conv": [{"name": "bank", "filters": ["diff:1", "diff:32", "dev:32"]}]}
    pipeline = {
        "bank": bank,
        "dense": _dense_pipeline(tmp_path, 48) if pipe == "dense" else None,
        # the float64 transform and z-score inside the graph
        "preprocess": {"preprocess": {"transform": "log_return", "zscore": 64}, **bank},
    }[pipe]
    monkeypatch.setattr(batched, "MAX_STEP_ROWS", 4096)  # ten steps
    kw = dict(pipeline=pipeline, device="cuda", decode=decode)
    with config.override(cuda_graph=False):
        a = tsconv.process(src, tmp_path / "a.zarr", **kw)
    b = tsconv.process(src, tmp_path / "b.zarr", **kw)
    assert a.cuda_graph == "off" and b.cuda_graph == "replayed", (a.cuda_graph, b.cuda_graph)
    assert b.rows == 40_000 and b.step_rows == 4096
    ya, yb = read_output(tmp_path / "a.zarr"), read_output(tmp_path / "b.zarr")
    assert np.isfinite(yb[-1000:]).mean() > (0.5 if pipe == "preprocess" else 0.999)  # not a NaN-poisoned run
    reserved = torch.cuda.memory_reserved()
    tsconv.process(src, tmp_path / "c.zarr", **kw)
    assert torch.cuda.memory_reserved() <= reserved + (8 << 20)  # a run's graph leaves no memory behind
    np.testing.assert_array_equal(ya.view(np.uint32), yb.view(np.uint32))
