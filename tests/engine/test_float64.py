"""Inputs float32 does not hold (float64, wide integers): the CPU reads them as float64 (every pipeline,
streams, frames, updates, dask), exact against a float64 reference; the GPU's engine reads float32 and warns
where that rounding moves values by more than WARN_AT of their typical step; an output keeps one read."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import tsconv
from tsconv.errors import TsconvWarning
from tsconv.io.precision import WARN_AT, float32_loss
from tsconv.kernels.reference import pipeline_reference
from tsconv.pipeline.spec import as_pipeline, resolve

from ..helpers import process_batched, read_output, write_store

NAMES = ("a", "b", "c")


def prices(level: float, rows: int = 3000, seed: int = 0) -> np.ndarray:
    """float64 random walks with steps of about 0.01 that float32 does not hold exactly."""
    rng = np.random.default_rng(seed)
    return level + np.cumsum(rng.normal(0, 0.01, size=(rows, len(NAMES))), axis=0)


@pytest.mark.parametrize(
    "x, expect",
    [
        (prices(400.0), "moves them by up to 1.5e-05"),  # up to 1.5e-5 against steps of about 0.008
        (prices(20.0), None),  # up to 9.5e-7: 1.2e-4 of a step
        (prices(400.0).astype(np.float32), None),
        (np.round(prices(400.0) * 100).astype(np.int64), None),  # ticks: exact in float32 below 2^24
        (np.round(prices(400.0) * 100).astype(np.int64) + (1 << 26), "rounding the values of"),
        (np.round(prices(400.0) * 100).astype(np.int16), None),
        (np.r_[prices(1.0)[:10], [[1e39, 0.0, 0.0]]], "'a' holds values beyond float32's range"),
        (np.full((50, 3), 400.01), None),  # no step to compare with
    ],
    ids=["f64-400", "f64-20", "f32", "i64-ticks", "i64-beyond-2^24", "i16", "f64-beyond-range", "flat"],
)
def test_the_loss_is_named_where_it_exceeds_the_threshold(x: np.ndarray, expect: str | None) -> None:
    message = float32_loss(x, NAMES)
    if expect is None:
        assert message is None
    else:
        assert message is not None and expect in message and str(x.dtype) in message


def test_the_threshold_is_the_share_of_the_typical_step() -> None:
    # one feature exactly at the threshold's edge either way: steps of s, values moved by WARN_AT * s * (1 +- 10%)
    base = np.float64(np.float32(300.0))
    ulp = np.spacing(np.float32(300.0)).astype(np.float64)
    for factor, warns in ((0.9, False), (1.1, True)):
        moved = 0.25 * ulp  # each value sits a quarter ulp off a float32
        step = moved / (WARN_AT * factor)
        k = np.arange(400, dtype=np.float64)
        x = (base + np.round(k * step / ulp) * ulp + moved)[:, None]
        assert (float32_loss(x, ("p",)) is not None) is warns


def test_infinities_are_judged_without_a_numpy_warning() -> None:
    # inf - inf in the moved values printed "invalid value encountered in subtract" at every such ingest
    x = 100 + np.cumsum(np.random.default_rng(1).normal(size=(300, 2)), 0)
    x[10, 0], x[20, 1] = np.inf, -np.inf
    x[:, 1] = 1e6 + np.round(x[:, 1] * 100) / 3000  # b's values sit between float32's: a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        message = float32_loss(x, ("a", "b"))
    assert message is not None and "b" in message and "'a'" not in message


@pytest.fixture
def no_tsconv_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", TsconvWarning)
        yield


def test_the_batched_engine_reads_float32_and_warns_once(tmp_path: Path) -> None:
    # the GPU's engine (here through the Triton interpreter) reads float32: its host rows are checked
    src = write_store(tmp_path / "in.zarr", prices(400.0, rows=1500), chunks=(500, 3))
    pipe = {"conv": [{"filters": ["diff:1", "ma:8"]}]}
    with pytest.warns(TsconvWarning, match="float64.*rounding the values of") as seen:
        process_batched(src, tmp_path / "out.zarr", pipeline=pipe, device="cpu", chunk=128, gpu_mem="80MB")
    assert sum("rounding the values" in str(w.message) for w in seen) == 1
    src32 = write_store(tmp_path / "in32.zarr", prices(400.0, rows=1500).astype(np.float32), chunks=(500, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TsconvWarning)
        process_batched(src32, tmp_path / "o32.zarr", pipeline=pipe, device="cpu", chunk=128, gpu_mem="80MB")


@pytest.mark.parametrize("pipeline", [None, "dense"], ids=["default", "dense"])
def test_a_stream_given_float32_then_float64_rows_reads_float64_from_then_on(
    no_tsconv_warnings: None, pipeline: str | None
) -> None:
    pipe = DENSE if pipeline == "dense" else None
    x = prices(400.0, rows=900)
    first = x[:300].astype(np.float32)
    stream = tsconv.Stream(pipe, features=3, chunk=256, device="cpu")
    got = np.concatenate([stream.push(first), stream.push(x[300:301]), stream.push(x[301:900])])
    want = tsconv.features(np.concatenate([first, x[300:]]), pipe, chunk=256, device="cpu")
    assert got.tobytes() == want.tobytes()


def test_a_stream_reading_float32_judges_one_row_pushes_with_the_row_before() -> None:
    stream = tsconv.Stream(features=3, device="cpu")
    stream._backend.reads_float64 = False  # as on CUDA, where a stream reads float32
    x = prices(400.0, rows=40)
    with pytest.warns(TsconvWarning, match="rounding the values of 'f[012]'") as seen:
        for k in range(40):
            stream.push(x[k : k + 1])
    assert sum("rounding" in str(w.message) for w in seen) == 1


def test_a_symbol_that_starts_late_is_judged_when_it_moves() -> None:
    # f0 and f2 hold float32 values exactly; f1 starts after the first read, with values float32 does not hold:
    # the check waits for it, and stops once every feature is judged
    from tsconv.io.precision import Float32Check

    x = prices(400.0, rows=2000)
    x[:, [0, 2]] = x[:, [0, 2]].astype(np.float32)
    x[:1200, 1] = np.nan
    check = Float32Check(("f0", "f1", "f2"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TsconvWarning)
        check.see(x[:500])  # f1 has not moved yet: not judged
        check.see(x[500:1000])  # nothing but f1 left to judge, and no value of it in this read
        check.see(x[1000:1201])  # one value of f1: no step yet
    assert not check.done
    with pytest.warns(TsconvWarning, match="rounding the values of 'f1'"):
        check.see(x[1201:2000])
    assert check.done
    quiet = Float32Check(("f0", "f1", "f2"))
    quiet.see(x[:1000])
    quiet.see(
        x[1000:2000].astype(np.float32).astype(np.float64)
    )  # f1 float32-exact too: judged, nothing said
    assert quiet.done


# A stage of weights (float32 storage) with zero-sum taps, so its outputs are moves, not levels, and a head.
_W = np.random.default_rng(5).normal(size=(4, 3, 5))
DENSE = {
    "weight_dtype": "float32",
    "conv": [{"weights": _W - _W.mean(axis=2, keepdims=True), "activation": "none"}],
    "head": {"weights": np.random.default_rng(6).normal(size=(4, 2))},
}
RETURNS = {"preprocess": {"transform": "diff"}, "conv": [{"filters": ["ma:4", "diff:1"]}]}
PIPELINES = [
    None,
    "trend_ema",
    "multiscale",
    {"conv": [{"filters": ["lag:3", "ret:2", "std:20", "zscore:9", "id"]}]},
    RETURNS,
    DENSE,
]
IDS = ["default", "trend_ema", "multiscale", "moments", "returns", "dense"]


@pytest.mark.parametrize("pipeline", PIPELINES, ids=IDS)
def test_a_float64_series_is_computed_from_its_own_values_on_the_cpu(
    no_tsconv_warnings: None, pipeline: object
) -> None:
    x = prices(400.0, rows=3000)
    x[:700, 1] = np.nan  # a symbol that starts late
    x[1500:1540, 2] = np.nan  # a gap
    plan = resolve(as_pipeline(pipeline), ("f0", "f1", "f2"))
    ref = pipeline_reference(x, plan)

    def err(y: np.ndarray) -> float:
        assert np.array_equal(np.isnan(y), np.isnan(ref))
        return float((np.nanmax(np.abs(y - ref), axis=0) / np.nanmax(np.abs(ref), axis=0)).max())

    y = tsconv.features(x, pipeline, device="cpu", chunk=256)
    read32 = err(tsconv.features(x.astype(np.float32), pipeline, device="cpu", chunk=256))
    assert err(y) < 2e-6 < read32 / 10  # read as float32: 3e-5 to 1e-3 of the scale off
    if pipeline is not DENSE:  # a stage of weights is re-centred per chunk: equal at the same chunk only
        assert tsconv.features(x, pipeline, device="cpu", chunk=4096).tobytes() == y.tobytes()
    stream = tsconv.Stream(pipeline, features=3, chunk=256, device="cpu")
    pushes = [stream.push(x[a:b]) for a, b in ((0, 1), (1, 700), (700, 2999), (2999, 3000))]
    assert np.concatenate(pushes).tobytes() == y.tobytes()


def test_a_first_stage_of_weights_on_float64_rows_keeps_its_digits_at_any_chunk(
    no_tsconv_warnings: None,
) -> None:
    # a zero-sum dense conv over float64 prices: the rows are rounded to float32 only after each re-centring
    # block's level is off, so the error does not grow with the drift inside a long chunk (rounded after one
    # level per chunk: 1.9e-6 of the output's scale at chunk 20,000, 4.5e-7 for float32 rows)
    rows, feats = 20_000, 4
    rng = np.random.default_rng(0)
    x = (
        rng.uniform(20, 500, feats)
        + np.cumsum(rng.choice([-2, -1, 0, 1, 2], size=(rows, feats)), axis=0) * 0.01
    )
    w = rng.normal(size=(3, feats, 5))
    w -= w.mean(-1, keepdims=True)
    pipe = {"conv": [{"weights": w, "weight_dtype": "float32"}]}
    xl = x.astype(np.longdouble)
    ref = sum(xl[k : rows - 4 + k] @ w[:, :, k].T.astype(np.longdouble) for k in range(5)).astype(np.float64)
    for chunk in (1024, rows):
        y = tsconv.features(x, pipe, chunk=chunk, device="cpu")[4:]
        assert (np.abs(y - ref).max(0) / np.abs(ref).max(0)).max() < 1e-6


def test_wide_integers_frames_and_arrays_read_alike_on_the_cpu(no_tsconv_warnings: None) -> None:
    import polars as pl

    ticks = np.round(prices(400.0, rows=2000) * 100).astype(np.int64) + (1 << 26)  # beyond float32's 2^24
    want = tsconv.features(ticks.astype(np.float64), device="cpu")
    assert tsconv.features(ticks, device="cpu").tobytes() == want.tobytes()
    frame = pl.DataFrame({f"f{j}": ticks[:, j].astype(np.float64) for j in range(3)})
    got = tsconv.features(frame, device="cpu").to_numpy().astype(np.float32)
    assert np.ascontiguousarray(got).tobytes() == want.tobytes()


def test_updates_of_a_float64_store_equal_a_full_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_tsconv_warnings: None
) -> None:
    import zarr

    import tsconv.engine.outputs

    monkeypatch.setattr(tsconv.engine.outputs, "output_chunk_rows", lambda chunk, n_outputs: 3 * chunk)
    x = prices(400.0, rows=4000)
    x[:900, 1] = np.nan
    x[2400:3100, 0] = np.nan  # a gap over the restart and the old end: filled from the recorded float64 state
    src = write_store(tmp_path / "in.zarr", x[:3000], chunks=(700, 2), time=False)
    out, want = tmp_path / "out.zarr", tmp_path / "want.zarr"
    tsconv.process(src, out, device="cpu", chunk=128)
    g = zarr.open_group(str(src), mode="r+")
    g["values"].resize(x.shape)
    g["values"][3000:] = x[3000:]
    report = tsconv.process(src, out, device="cpu", chunk=128, update=True)
    assert report.resumed_from == 2944
    tsconv.process(src, want, device="cpu", chunk=128)
    assert read_output(out).tobytes() == read_output(want).tobytes()


@pytest.mark.gpu
def test_the_cuda_engine_warns_of_a_float64_array_and_stays_quiet_for_float32() -> None:
    x = prices(400.0, rows=5000)
    with pytest.warns(TsconvWarning, match="rounding the values of 'f[012]'"):
        tsconv.features(x, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TsconvWarning)
        tsconv.features(x.astype(np.float32), device="cuda")


@contextlib.contextmanager
def _reading_float32_as_before() -> Iterator[None]:
    """Runs as every run was before the CPU read float64: float32 reads, no ``tsconv.read`` recorded."""
    import tsconv.engine.chunked as chunked
    import tsconv.engine.outputs as outputs

    with pytest.MonkeyPatch.context() as m:
        m.setattr(chunked, "exact_in_float32", lambda dtype: True)
        m.setattr(outputs, "_input_read", lambda *a: None)
        yield


def test_an_output_written_when_every_run_read_float32_is_updated_reading_float32(tmp_path: Path) -> None:
    src, out, want = _grown_float64_store(tmp_path), tmp_path / "out.zarr", tmp_path / "want.zarr"
    with _reading_float32_as_before():
        tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=128)
    assert _read_attr(out) is None
    _grow(src)
    report = tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=128, update=True)
    assert report.rows > 0
    with _reading_float32_as_before():
        tsconv.process(src, want, pipeline=PIPE, device="cpu", chunk=128)
    assert read_output(out).tobytes() == read_output(want).tobytes()  # float32 reads throughout, as it began


def _grown_float64_store(tmp_path: Path) -> Path:
    x = prices(400.0, rows=3000)
    return write_store(tmp_path / "in.zarr", x[:2600], chunks=(256, 3), time=False)  # _grow: to 3,000 rows


def _grow(src: Path) -> None:
    import zarr

    x = prices(400.0, rows=3000)
    g = zarr.open_group(str(src), mode="r+")
    g["values"].resize(x.shape)
    g["values"][2600:] = x[2600:]


PIPE = {"conv": [{"filters": ["diff:1", "ma:8"]}]}


def test_an_output_read_as_float64_is_updated_on_the_cpu_under_device_auto(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its rows were read as float64 on the CPU: a GPU host's auto computes the rest there too, however many
    from tsconv.engine import outputs
    from tsconv.kernels import early

    src, out = _grown_float64_store(tmp_path), tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=128)
    assert read_output(out).dtype == np.float32 and _read_attr(out) == "float64"
    _grow(src)
    monkeypatch.setattr(early, "gpu_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        outputs, "small_for_cuda", lambda plan, rows: False
    )  # many rows: the GPU, were it not
    report = tsconv.process(src, out, pipeline=PIPE, device="auto", chunk=128, update=True)
    assert report.device == "cpu"
    monkeypatch.undo()
    tsconv.process(src, tmp_path / "full.zarr", pipeline=PIPE, device="cpu", chunk=128)
    assert read_output(out).tobytes() == read_output(tmp_path / "full.zarr").tobytes()


def test_rows_read_as_float32_are_extended_reading_float32_and_float64_ones_refuse_the_gpu(
    tmp_path: Path,
) -> None:
    # the GPU's engine (here through the interpreter) read the output's rows as float32: a CPU update reads
    # float32 too; an output the CPU read as float64 refuses the GPU's engine, unless nothing is left to do
    src, out = _grown_float64_store(tmp_path), tmp_path / "out.zarr"
    with pytest.warns(TsconvWarning, match="rounding"):
        process_batched(src, out, pipeline=PIPE, device="cpu", chunk=128, gpu_mem="80MB")
    assert _read_attr(out) == "float32"
    _grow(src)
    report = tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=128, update=True)
    with _reading_float32_as_before():
        tsconv.process(src, tmp_path / "f32.zarr", pipeline=PIPE, device="cpu", chunk=128)
    new = slice(report.resumed_from, None)
    assert read_output(out)[new].tobytes() == read_output(tmp_path / "f32.zarr")[new].tobytes()
    cpu = tmp_path / "cpu.zarr"
    tsconv.process(src, cpu, pipeline=PIPE, device="cpu", chunk=128)
    assert _read_attr(cpu) == "float64"
    assert (
        process_batched(src, cpu, pipeline=PIPE, device="cpu", chunk=128, gpu_mem="80MB", update=True).rows
        == 0
    )
    import zarr

    g = zarr.open_group(str(src), mode="r+")
    g["values"].resize((3100, 3))
    g["values"][3000:] = prices(400.0, rows=3100)[3000:]
    with pytest.raises(tsconv.TsconvError, match="read as float64 .* reads the input .* as float32") as err:
        process_batched(src, cpu, pipeline=PIPE, device="cpu", chunk=128, gpu_mem="80MB", update=True)
    assert "--device cpu" in err.value.hint


def _read_attr(out: Path) -> str | None:
    import zarr

    return zarr.open_group(str(out), mode="r").attrs["tsconv"].get("read")


def test_a_parquet_output_says_how_its_input_was_read(tmp_path: Path, no_tsconv_warnings: None) -> None:
    import json

    import pyarrow.parquet as pq

    x = prices(400.0, rows=1200)
    for dtype, read in ((np.float64, "float64"), (np.float32, None)):
        src = write_store(tmp_path / f"in-{read}.zarr", x.astype(dtype), chunks=(500, 3), time=False)
        out = tmp_path / f"out-{read}.parquet"
        tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=128)
        meta = json.loads(pq.read_schema(out).metadata[b"tsconv"])
        assert meta["tsconv"].get("read") == read


@pytest.mark.parametrize("route", ["features", "stream"])
def test_int64_values_beyond_2_53_warn_that_float64_rounds_them(route: str) -> None:
    """Nanosecond timestamps as a feature: the CPU reads int64 as float64, which rounds them to multiples of
    256; their differences of 100 / 150 / 750 came out as 0 / 256 / 768 and nothing was said."""
    x = (1_700_000_000_000_000_000 + np.cumsum(np.tile([0, 100, 150, 750, 100], 60))).astype(np.int64)[
        :, None
    ]
    pipe = {"conv": [{"filters": ["diff:1"]}]}
    with pytest.warns(
        tsconv.TsconvWarning, match=r"feature 'f0' holds integers beyond 2\^53 .* multiple of 256"
    ):
        if route == "features":
            tsconv.features(x, pipe, device="cpu")
        else:
            tsconv.Stream(pipe, features=1, device="cpu").push(x)
    small = np.arange(300, dtype=np.int64)[:, None] * 1_000_000  # within 2^53: exact, nothing to say
    with warnings.catch_warnings():
        warnings.simplefilter("error", tsconv.TsconvWarning)
        tsconv.features(small, pipe, device="cpu")


def test_the_wide_integer_warning_counts_the_other_features_only() -> None:
    """One feature beyond 2^53 was said to have "1 feature(s) like it"; three were "3 feature(s) like it"."""
    base = (1 << 60) + np.arange(300, dtype=np.int64)[:, None] * 100
    small = np.arange(300, dtype=np.int64)[:, None]
    pipe = {"conv": [{"filters": ["diff:1"]}]}
    for x, tail in ((np.hstack([base, small]), "lose those low digits; subtract"),
                    (np.hstack([base, base, small, base]), "lose those low digits (and 2 more features); subtract")):  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tsconv.features(x, pipe, device="cpu")
        said = [str(w.message) for w in caught if "beyond 2^53" in str(w.message)]
        assert len(said) == 1 and said[0].startswith("feature 'f0' holds") and tail in said[0], said
