"""Engine behaviour: read granularity, NaN policy across chunks, warm-up, library API, report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

import tsconv
import tsconv.io.source as engine
from tsconv.io.readers.blocks import BlockReader
from tsconv.io.readers.threads import ParallelBandReader
from tsconv.pipeline.spec import default_pipeline, resolve

from ..helpers import T0, assert_matches_reference, price_series, read_output, write_store


class _CountingArray:
    """Stands in for a zarr array and records every row slice asked of it."""

    def __init__(self, array):
        self.array, self.shape, self.chunks, self.ndim = array, array.shape, array.chunks, array.ndim
        self.dtype = array.dtype
        self.slices: list[tuple[int, int]] = []

    def __getitem__(self, key):
        rows = key[0] if isinstance(key, tuple) else key
        self.slices.append((rows.start, rows.stop))
        return self.array[key]


def test_reader_decodes_each_store_chunk_once(tmp_path: Path) -> None:
    x = price_series(50_000, 3, seed=0)
    src = write_store(tmp_path / "in.zarr", x, chunks=(16384, 2))
    arr = _CountingArray(zarr.open_group(str(src))["values"])
    reader = BlockReader(arr)
    got = np.concatenate([reader.read(a, min(a + 1024, 50_000)) for a in range(0, 50_000, 1024)])
    np.testing.assert_array_equal(got, x)
    assert arr.slices == [(0, 16384), (16384, 32768), (32768, 49152), (49152, 50_000)]


@pytest.mark.parametrize("zarr_format", [3, 2])
def test_process_reads_at_store_chunk_granularity(tmp_path: Path, monkeypatch, zarr_format: int) -> None:
    x = price_series(40_000, 2, seed=0)
    src = write_store(tmp_path / "in.zarr", x, chunks=(16384, 2), zarr_format=zarr_format)
    readers: list[ParallelBandReader] = []

    class Recording(ParallelBandReader):
        def __init__(self, array, **kw):
            super().__init__(array, **kw)
            readers.append(self)

    monkeypatch.setattr(engine, "ParallelBandReader", Recording)
    tsconv.process(src, tmp_path / "out.zarr", chunk=1024)
    # Format 3 (zstd) takes the fast path (chunk files decoded in threads), format 2 zarr reads; either
    # way each of the 3 bands of store chunks is decoded once.
    assert [(r.fast, r.bands_decoded) for r in readers] == [(zarr_format == 3, 3)]


@pytest.mark.parametrize("chunk", [1, 5, 64, 1000])
def test_nan_forward_fill_is_carried_across_chunk_boundaries(tmp_path: Path, chunk: int) -> None:
    x = np.full((300, 3), np.nan, dtype=np.float32)
    x[10] = [1.0, 2.0, np.nan]  # then a gap of 190 rows spanning many chunks
    x[200:, :2] = 5.0
    x[250, 2] = 7.0  # feature 2 starts late: NaN before, filled after
    pipe = {"conv": [{"filters": ["id", "diff:1"]}]}
    y = tsconv.features(x, pipe, chunk=chunk)
    # Each filter reads its own window: "id" reads the current step only, so it is NaN exactly where the
    # filled series is (before a feature's first value), whatever diff:1 beside it reads.
    ident = y[:, 0::2]
    assert np.isnan(ident[:10]).all()
    np.testing.assert_array_equal(ident[10:200, 0], 1.0)
    np.testing.assert_array_equal(ident[10:200, 1], 2.0)
    np.testing.assert_array_equal(ident[200:, :2], 5.0)
    assert np.isnan(ident[:250, 2]).all() and (ident[250:, 2] == 7.0).all()
    diff = y[:, 1::2]
    assert np.isnan(diff[10, 0]) and (diff[11:200, 0] == 0.0).all() and diff[200, 0] == 4.0
    assert np.isnan(diff[250, 2]) and (diff[251:, 2] == 0.0).all()


def test_leading_nans_propagate_through_a_dense_stage() -> None:
    x = price_series(100, 3, seed=0)
    x[:20, 1] = np.nan
    w = np.ones((2, 3, 4)) / 12
    y = tsconv.features(x, {"conv": [{"weights": w, "weight_dtype": "float32"}]}, warmup="zero")
    assert np.isnan(y[:23]).all()  # every output sees feature 1 until its first value leaves the window
    assert not np.isnan(y[23:]).any()


def test_warmup_rows_are_nan_or_zero_history() -> None:
    x = price_series(500, 2, seed=1)
    pipe = {
        "conv": [{"filters": ["ma:4"], "dilation": 3}, {"filters": ["diff:2"]}],
        "weight_dtype": "float32",
    }
    plan = resolve(tsconv.pipeline.spec.pipeline_from_dict(pipe), ["a", "b"])
    assert plan.halo == 3 * 3 + 2
    y_nan = tsconv.features(x, pipe, chunk=7)
    assert np.isnan(y_nan[: plan.halo]).all() and not np.isnan(y_nan[plan.halo :]).any()
    y_zero = tsconv.features(x, pipe, chunk=7, warmup="zero")
    assert not np.isnan(y_zero).any()
    assert_matches_reference(y_zero, x, plan, warmup="zero")
    np.testing.assert_array_equal(y_zero[plan.halo :], y_nan[plan.halo :])


def test_features_keeps_the_input_kind_and_matches_process(tmp_path: Path) -> None:
    x = price_series(3000, 4, seed=5, nan_fraction=0.02)
    y_np = tsconv.features(x, chunk=1024)
    y_t = tsconv.features(torch.from_numpy(x), chunk=1024)
    assert isinstance(y_np, np.ndarray) and isinstance(y_t, torch.Tensor)
    np.testing.assert_array_equal(y_np, y_t.numpy())
    src = write_store(tmp_path / "in.zarr", x, chunks=(700, 3))
    tsconv.process(src, tmp_path / "out.zarr", chunk=1024)
    np.testing.assert_array_equal(read_output(tmp_path / "out.zarr"), y_np)


def test_output_store_follows_the_convention(tmp_path: Path) -> None:
    x = price_series(5000, 3, seed=0)
    src = write_store(tmp_path / "ticks.zarr", x, chunks=(999, 3))
    report = tsconv.process(src, chunk=512)
    out = tmp_path / "ticks.features.zarr"  # default: beside the input
    assert Path(report.output) == out
    g = zarr.open_group(str(out), mode="r")
    plan = resolve(default_pipeline(), ["x0", "x1", "x2"])
    assert g["values"].shape == (5000, 15) and g["values"].dtype == np.float32
    np.testing.assert_array_equal(np.asarray(g["time"][:]), T0 + np.arange(5000) * 1_000_000)
    assert g.attrs["features"] == list(plan.output_names)
    assert g.attrs["source"] == str(src.resolve())
    assert g.attrs["pipeline"]["stages"][0]["filters"] == [
        "diff:1",
        "diff:32",
        "diff:256",
        "dev:32",
        "dev:256",
    ]
    assert g.attrs["tsconv"]["complete"] is True
    assert g["values"].chunks[0] % 512 == 0 or g["values"].chunks[0] == 5000
    assert report.rows == 5000 and report.rows_per_s > 0 and report.peak_rss_bytes > 0
    assert (report.peak_gpu_allocated_bytes is None) == (report.device == "cpu")
    assert_matches_reference(np.asarray(g["values"][:]), x, plan)


def test_bare_array_and_format_2_inputs(tmp_path: Path) -> None:
    x = price_series(2000, 5, seed=2)
    bare = zarr.create_array(
        str(tmp_path / "bare.zarr"), shape=x.shape, chunks=(300, 2), dtype="float64", zarr_format=2
    )
    bare[:] = x.astype(np.float64)
    tsconv.process(tmp_path / "bare.zarr", tmp_path / "out.zarr", chunk=256)
    g = zarr.open_group(str(tmp_path / "out.zarr"))
    assert "time" not in g.array_keys()
    assert g.attrs["features"][0] == "f0.diff1"
    np.testing.assert_array_equal(np.asarray(g["values"][:]), tsconv.features(x, chunk=256))


def test_float16_and_integer_inputs(tmp_path: Path) -> None:
    x16 = (np.random.default_rng(0).normal(size=(1500, 2))).astype(np.float16)
    write_store(tmp_path / "h.zarr", x16)
    tsconv.process(tmp_path / "h.zarr", tmp_path / "h.out.zarr")
    np.testing.assert_array_equal(
        read_output(tmp_path / "h.out.zarr"), tsconv.features(x16.astype(np.float32), chunk=1024)
    )
    xi = np.random.default_rng(0).integers(0, 1000, size=(1500, 2)).astype(np.int32)
    write_store(tmp_path / "i.zarr", xi)
    tsconv.process(tmp_path / "i.zarr", tmp_path / "i.out.zarr")
    np.testing.assert_array_equal(
        read_output(tmp_path / "i.out.zarr"), tsconv.features(xi.astype(np.float32), chunk=1024)
    )


@pytest.mark.interpreted
def test_the_triton_path_of_the_engine_matches_the_reference() -> None:
    """The CUDA route (Triton kernels per stage: the filter bank's running-sum kernel, dense and grouped
    conv1d) run through the interpreter on CPU tensors, over two chunks (the second short), both warm-ups.
    Chunks of 125 steps: with the later stages' 3 rows of halo the bank gets 128 rows, one running-kernel tile
    of 64 steps a dilation phase (128 would spill 3 rows into a second tile: interpreted, each tile costs its
    64 steps whatever it holds)."""
    import os

    from tsconv.engine.chunked import run_chunked
    from tsconv.engine.compute import Backend
    from tsconv.io.readers.blocks import ArraySource
    from tsconv.pipeline.spec import pipeline_from_dict

    assert os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
    x = price_series(200, 4, seed=4, nan_fraction=0.02)
    x[:30, 2] = np.nan
    rng = np.random.default_rng(0)
    pipe = pipeline_from_dict(
        {
            "conv": [
                {"filters": ["diff:1", "dev:8", "ma:4", "id"], "dilation": 2},  # the filter bank's kernels
                {
                    "weights": rng.normal(size=(16, 16, 3)) / 8,
                    "bias": rng.normal(size=16),
                    "activation": "gelu",
                },
                {"weights": rng.normal(size=(4, 8, 2)) / 4, "groups": 2, "activation": "tanh"},  # grouped
            ],
            "head": {"weights": rng.normal(size=(4, 2))},
            "weight_dtype": "float32",
        }
    )
    plan = resolve(pipe, ["a", "b", "c", "d"])
    for warmup in ["nan", "zero"]:
        out: list[np.ndarray] = []
        backend = Backend(plan, torch.device("cpu"), use_triton=True)
        run_chunked(ArraySource(x), plan, backend, out.append, start=0, chunk=125, warmup=warmup)
        assert_matches_reference(np.concatenate(out), x, plan, warmup=warmup)


def test_the_gil_switch_interval_is_short_during_a_cuda_run_and_restored():
    import sys

    from tsconv.engine import run

    before = sys.getswitchinterval()
    with run._gil_switch(torch.device("cuda")):
        assert sys.getswitchinterval() == pytest.approx(
            run.SWITCH_INTERVAL_S, rel=0.02
        )  # (microsecond clock)
    assert sys.getswitchinterval() == before
    with run._gil_switch(torch.device("cpu")):
        assert sys.getswitchinterval() == before


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda x, src: tsconv.features(x, 42),
            r"pipeline must be a path to a TOML file, a dict or a tsconv.Pipeline .*got int",
        ),
        (lambda x, src: tsconv.features([[1.0, 2.0], [3.0]], None), "expected a 2-D series"),
        # a store's path was "a 2-D series ... got 0-D with shape []", hint: reshape with x[:, None]
        (
            lambda x, src: tsconv.features(str(src)),
            r"in memory .*got the path .*hint: .*tsconv.process\(path",
        ),
        (lambda x, src: tsconv.features(src), r"in memory .*got the path .*hint: .*tsconv.process\(path"),
        (lambda x, src: tsconv.process(src, device=None), "device must be 'auto', 'cpu' or 'cuda', got None"),
        (lambda x, src: tsconv.process(src, overwrite="no"), "overwrite must be True or False"),
        (lambda x, src: tsconv.process(src, resume=True, overwrite=True), "exclude each other"),
        (lambda x, src: tsconv.process(src, progress="yes"), "progress must be True or False"),
        (lambda x, src: tsconv.process(src, workers=0), "workers must be a positive integer"),
        (lambda x, src: tsconv.process(src, partition_rows=1000), "partition_rows needs workers or client"),
        # bytes reached pathlib's raw TypeError
        (
            lambda x, src: tsconv.process(src, b"pp.zarr"),
            r"output must be a str path, an os.PathLike .*got bytes",
        ),
        (lambda x, src: tsconv.process(bytes(src)), r"input must be a str path, an os.PathLike .*got bytes"),
        # an array's 300-character repr, and no word of features()
        (
            lambda x, src: tsconv.process(x),
            r"input must be a store's location .*got a numpy ndarray of shape \(400, 2\).*tsconv.features\(data",
        ),
        (lambda x, src: tsconv.load_pipeline(3), "a pipeline is a path to a TOML file or a dict"),
        # '' (an unset variable) is the current directory: process(src, "", overwrite=True) run inside a store
        # would have replaced it
        (lambda x, src: tsconv.process(src, "", overwrite=True), r"output '' names no store .*variable"),
        (lambda x, src: tsconv.process(""), r"input '' names no store"),
    ],
)
def test_library_misuse_is_a_clear_error(tmp_path: Path, call, match) -> None:
    x = price_series(400, 2, seed=1)
    src = write_store(tmp_path / "in.zarr", x)
    with pytest.raises(tsconv.TsconvError, match=match):
        call(x, src)
    assert not (tmp_path / "in.features.zarr").exists()


@pytest.mark.parametrize("chunk", [700, 65536])
def test_features_writes_into_out_and_returns_it(chunk: int) -> None:
    """``out=``: the same bits as a new result, written into the caller's buffer (scribbled on first), which is
    returned; a tensor input takes a tensor."""
    x = price_series(3000, 4, seed=6, nan_fraction=0.02)
    want = tsconv.features(x, chunk=chunk)
    buf = np.full(want.shape, 12345.0, np.float32)
    got = tsconv.features(x, chunk=chunk, out=buf)
    assert got is buf
    np.testing.assert_array_equal(buf, want)
    tbuf = torch.full(want.shape, -1.0)
    tgot, cols = tsconv.features(torch.from_numpy(x), chunk=chunk, out=tbuf, return_names=True)
    assert tgot is tbuf and len(cols) == want.shape[1]
    np.testing.assert_array_equal(tbuf.numpy(), want)


def test_features_into_a_tensor_bumps_its_version_as_torchs_out_ops_do() -> None:
    """features(x, out=buf) wrote the tensor through numpy, unseen by autograd: a product saved for backward
    before the next batch was written into buf gave that batch's gradient, silently (torch's own out= ops
    raise), and tsconv's kernels served weights cached from buf's earlier values."""
    x = torch.from_numpy(price_series(400, 2, seed=3))
    buf = torch.empty(400, 10)
    w = torch.ones(10, requires_grad=True)
    before = buf._version
    tsconv.features(x, out=buf)
    assert buf._version > before
    loss = (buf * w).sum()
    tsconv.features(x + 1, out=buf)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_features_refuses_an_out_it_cannot_fill() -> None:
    import polars as pl

    x = price_series(600, 2, seed=2)
    d = 10  # the default pipeline's five outputs per feature
    cases = [
        (np.empty((600, d), np.float64), "float32 numpy array"),
        (torch.empty((600, d)), "float32 numpy array"),  # a tensor for an array
        (np.empty((600, d + 1), np.float32), r"shape \[600, 10\]"),
        (np.empty((d, 600), np.float32).T, "C-contiguous"),
        (np.empty((600, 2 * d), np.float32)[:, :d], "C-contiguous"),
    ]
    ro = np.empty((600, d), np.float32)
    ro.flags.writeable = False
    cases.append((ro, "writeable"))
    for out, match in cases:
        with pytest.raises(tsconv.ShapeError, match=match):
            tsconv.features(x, out=out)
    one = np.empty(600 * 2 + 600 * d - 200, np.float32)  # x and out in one buffer, overlapping
    xs = one[:1200].reshape(600, 2)
    xs[:] = x
    with pytest.raises(tsconv.ShapeError, match="shares memory"):
        tsconv.features(xs, out=one[1000:].reshape(600, d))
    with pytest.raises(tsconv.ShapeError, match="frame"):
        tsconv.features(pl.DataFrame({"a": x[:, 0]}), out=np.empty((600, 5), np.float32))


def test_features_refusals_of_an_array_carry_a_hint() -> None:
    # names of the wrong length and a non-numeric dtype were refused without the hint every error carries
    x = price_series(300, 2, seed=2)
    with pytest.raises(tsconv.ShapeError, match=r"1 names given for the 2 columns of x") as seen:
        tsconv.features(x, names=["AAPL"])
    assert seen.value.hint and "one name per column" in seen.value.hint
    with pytest.raises(tsconv.ShapeError, match="real numeric array, got dtype bool") as seen:
        tsconv.features(x > 100)
    assert seen.value.hint and "float or integer" in seen.value.hint


def test_load_pipeline_takes_the_dict_features_takes() -> None:
    pipe = {"conv": [{"filters": ["diff:1", "ma:4"]}]}
    x = price_series(300, 2, seed=2)
    np.testing.assert_array_equal(tsconv.features(x, tsconv.load_pipeline(pipe)), tsconv.features(x, pipe))


def test_features_returns_the_output_names_when_asked() -> None:
    import polars as pl

    x = price_series(600, 2, seed=2)
    pipe = {"conv": [{"filters": ["diff:1", "ma:4"]}]}
    plain = tsconv.features(x, pipe, names=["AAPL", "MSFT"])
    assert isinstance(plain, np.ndarray)  # a bare array unless asked
    y, cols = tsconv.features(x, pipe, names=["AAPL", "MSFT"], return_names=True)
    assert cols == ("AAPL.diff1", "AAPL.ma4", "MSFT.diff1", "MSFT.ma4")
    np.testing.assert_array_equal(y, plain)
    # the names say what the columns hold: MSFT's one-step difference is the third (after 3 warm-up rows)
    np.testing.assert_allclose(y[3:, cols.index("MSFT.diff1")], np.diff(x[:, 1])[2:], atol=1e-4)
    t, t_cols = tsconv.features(torch.from_numpy(x), pipe, return_names=True)
    assert isinstance(t, torch.Tensor) and t_cols == ("f0.diff1", "f0.ma4", "f1.diff1", "f1.ma4")
    frame, f_cols = tsconv.features(pl.DataFrame({"AAPL": x[:, 0], "MSFT": x[:, 1]}), pipe, return_names=True)
    assert f_cols == cols and frame.columns == list(cols)
    with pytest.raises(TypeError, match="positional"):
        tsconv.features(x, pipe, None, "nan")  # options are keyword-only


@pytest.mark.parametrize(
    "filters",
    [
        [{"filters": ["diff:1", "diff:32", "diff:256", "dev:32", "dev:256"]}],
        [{"filters": ["ema:8", "std:20", "zscore:16", "ret:3"]}, {"filters": ["id", "ma:4"], "dilation": 4}],
    ],
)
def test_bank_pipelines_take_several_chunks_a_call_with_the_same_bits(monkeypatch, filters) -> None:
    from tsconv.engine import chunked
    from tsconv.engine.compute import Backend
    from tsconv.io.readers.blocks import ArraySource
    from tsconv.pipeline.spec import pipeline_from_dict

    x = price_series(5_000, 5, seed=7, nan_fraction=0.01)
    x[:1_300, 1] = np.nan  # a symbol that starts late
    x[2_000:2_600, 3] = np.nan  # and a gap
    plan = resolve(pipeline_from_dict({"conv": filters}), list("abcde"))

    def run(per_call: int | None, start: int) -> tuple[np.ndarray, list[int]]:
        if per_call is not None:
            monkeypatch.setattr(chunked, "_chunks_per_call", lambda backend, chunk: per_call)
        backend = Backend(plan, torch.device("cpu"))
        rows: list[int] = []
        real = backend.run
        monkeypatch.setattr(backend, "run", lambda x, *a, **k: rows.append(x.shape[0]) or real(x, *a, **k))
        out: list[np.ndarray] = []
        chunked.run_chunked(ArraySource(x), plan, backend, lambda b: out.append(b.copy()), start=start,
                            chunk=64, warmup="nan", emit_copies=True)  # fmt: skip
        monkeypatch.undo()
        return np.concatenate(out), rows

    assert Backend(plan, torch.device("cpu")).call_invariant
    assert chunked._chunks_per_call(Backend(plan, torch.device("cpu")), 64) == chunked._MAX_CHUNKS_PER_CALL
    one, calls_one = run(1, 0)
    many, calls_many = run(None, 0)
    assert len(calls_one) == -(-5_000 // 64)
    assert len(calls_many) == -(-5_000 // (64 * chunked._MAX_CHUNKS_PER_CALL))
    assert np.array_equal(one.view(np.uint32), many.view(np.uint32))
    # a resumed run (any chunk-aligned start) is the tail of the whole one, bit for bit
    tail, _ = run(None, 64 * 37)
    assert np.array_equal(tail.view(np.uint32), one[64 * 37 :].view(np.uint32))
    assert_matches_reference(one, x, plan, warmup="nan")


def test_pipelines_whose_outputs_depend_on_the_call_run_one_chunk_a_call() -> None:
    from tsconv.engine.chunked import _CALL_BYTES, _chunks_per_call
    from tsconv.engine.compute import Backend
    from tsconv.pipeline.spec import pipeline_from_dict

    cpu = torch.device("cpu")
    rng = np.random.default_rng(0)
    dense = {"conv": [{"weights": rng.normal(size=(4, 3, 3)), "weight_dtype": "float32"}]}
    zscored = {"preprocess": {"transform": "log_return", "zscore": 16}, "conv": [{"filters": ["ma:4"]}]}
    headed = {"conv": [{"filters": ["diff:1"]}], "head": {"weights": rng.normal(size=(3, 2))}}
    for spec in (dense, zscored, headed):
        backend = Backend(resolve(pipeline_from_dict(spec), list("abc")), cpu)
        assert not backend.call_invariant
        assert _chunks_per_call(backend, 1024) == 1
    # the built-in pipelines: the bank-only ones take several chunks a call, the others one
    from tsconv.pipeline.spec import load_pipeline

    names = [f"px_{i}" for i in range(64)]
    invariant = {
        name: Backend(resolve(load_pipeline(name), names), cpu).call_invariant
        for name in ("default", "multiscale", "trend_ema", "returns_zscore", "dense_head")
    }
    assert invariant == {"default": True, "multiscale": True, "trend_ema": True, "returns_zscore": False,
                         "dense_head": False}  # fmt: skip
    # a wide bank's call stays within the output bound: 2,048 features x 5 filters at 1,024 rows is 40 MiB
    wide = Backend(resolve(default_pipeline(), [f"f{i}" for i in range(2_048)]), cpu)
    assert wide.call_invariant and _chunks_per_call(wide, 1024) == 1
    narrow = Backend(resolve(default_pipeline(), [f"f{i}" for i in range(64)]), cpu)
    assert 1024 * narrow.out_width * 4 * _chunks_per_call(narrow, 1024) <= _CALL_BYTES
    assert _chunks_per_call(narrow, 1024) > 1


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux's /proc")
def test_the_reported_peak_rss_is_the_process_own_not_its_parents() -> None:
    """A run started from a large process (a benchmark driver, a notebook's subprocess) reports its own peak:
    ``ru_maxrss`` keeps the RSS of the process it was forked from."""
    import subprocess
    import sys

    held = np.ones(1_000_000_000, dtype=np.uint8)  # touched: 1 GB resident in this process
    code = "from tsconv.engine.report import peak_rss; print(peak_rss())"
    child = int(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )
    assert 0 < child < held.nbytes // 2


def test_an_output_wider_than_a_store_may_be_is_refused_before_it_is_written(
    tmp_path: Path, monkeypatch
) -> None:
    """262,144 features through the default bank wrote 1,310,720 outputs that inspect (and a run on them) then
    refused: the bound is the one on any store tsconv reads (here lowered to 10: 3 features give 15)."""
    import tsconv.engine.outputs as outputs

    monkeypatch.setattr(outputs, "MAX_FEATURES", 10)
    src = write_store(tmp_path / "in.zarr", price_series(500, 3, seed=1), chunks=(100, 3))
    out = tmp_path / "out.zarr"
    with pytest.raises(tsconv.TsconvError, match="the pipeline gives 15 outputs .* at most 10 features"):
        tsconv.process(src, out)
    assert not out.exists()


def test_features_into_a_tensor_that_requires_grad_is_refused_as_torchs_out_ops_refuse_it() -> None:
    # it was written silently through numpy, outside autograd's view of a leaf that records its uses
    x = torch.from_numpy(price_series(300, 2, seed=3))
    out = torch.empty((300, 10), requires_grad=True)
    with pytest.raises(tsconv.TsconvError, match="out= requires grad"):
        tsconv.features(x, out=out)
    with torch.no_grad():  # torch's out= ops take it there too
        assert tsconv.features(x, out=out) is out
    np.testing.assert_array_equal(out.detach().numpy(), tsconv.features(x).numpy())


def test_a_cache_directory_inside_the_input_or_output_is_refused(tmp_path: Path) -> None:
    """TSCONV_CACHE_DIR inside the input store: the run wrote its native libraries and build folders among the
    input's files; inside the output, among the output's (and --overwrite removed the cache). Both are refused
    before anything is written."""
    from tsconv import config

    src = write_store(tmp_path / "in.zarr", price_series(400, 2, seed=1))
    before = sorted(p.name for p in src.rglob("*"))
    for cache, out in (
        (src / "cache", tmp_path / "out.zarr"),
        (tmp_path / "out.zarr" / "c", tmp_path / "out.zarr"),
    ):
        with (
            config.override(cache_dir=cache),
            pytest.raises(tsconv.TsconvError, match="cache directory.*lies inside"),
        ):
            tsconv.process(src, out, device="cpu")
    assert sorted(p.name for p in src.rglob("*")) == before and not (tmp_path / "out.zarr").exists()
