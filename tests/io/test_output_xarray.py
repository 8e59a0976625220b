"""Output stores open with xarray: a Dataset with ``values`` (time, feature), ``time`` decoded to datetime64[ns]
from its CF attributes, the output names as the ``feature`` coordinate, and consolidated metadata written when
the run completes (refreshed after a resume, never read stale by one)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr

import tsconv
from tsconv.io.inspect import inspect_store

from ..helpers import price_series, read_output

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")

ROWS, FEATURES, CHUNK = 1200, 3, 256
PIPE = {"conv": [{"filters": ["ma:8", "diff:1"]}]}
NAMES = [f"s{j}.{f}" for j in range(FEATURES) for f in ("ma8", "diff1")]
TIMES = pd.date_range("2026-01-02 09:30", periods=ROWS, freq="s")


def _input(tmp_path: Path) -> Path:
    """An input written by xarray: datetime time coordinate, string feature coordinate, zarr format 3."""
    x = price_series(ROWS, FEATURES, seed=7, nan_fraction=0.01)
    ds = xr.Dataset(
        {"values": (("time", "feature"), x)}, coords={"time": TIMES, "feature": ["s0", "s1", "s2"]}
    )
    path = tmp_path / "in.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr: strings and consolidated metadata in format 3
        ds.to_zarr(str(path), zarr_format=3)
    return path


def _open(path: Path, **kw) -> object:  # noqa: ANN003
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback from missing consolidated metadata would warn
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        return xr.open_zarr(str(path), **kw)


def _check_dataset(out: Path) -> None:
    want = read_output(out)
    assert np.isnan(want[:1]).all() and not np.isnan(want[100:]).all()  # warm-up rows are NaN, kept
    for kw in ({}, {"consolidated": None}, {"consolidated": True}):
        ds = _open(out, **kw)
        assert ds["values"].dims == ("time", "feature") and ds["values"].shape == (ROWS, len(NAMES))
        assert ds["time"].dtype == np.dtype("datetime64[ns]")
        np.testing.assert_array_equal(ds["time"].values, TIMES.values.astype("datetime64[ns]"))
        assert [str(n) for n in ds["feature"].values] == NAMES
        np.testing.assert_array_equal(ds["values"].values, want)
    # plain zarr and tsconv's own readers see the same store
    g = zarr.open_group(str(out), mode="r")
    assert g.attrs["features"] == NAMES and g.attrs["tsconv"]["complete"]
    assert g["time"].attrs["units"] == "nanoseconds since 1970-01-01"
    np.testing.assert_array_equal(
        np.asarray(g["time"][:]), TIMES.values.astype("datetime64[ns]").view(np.int64)
    )
    store = tsconv.open_input(out)
    assert list(store.features) == NAMES
    np.testing.assert_array_equal(store.time[:], np.asarray(g["time"][:]))
    info = inspect_store(out, count_nans=False)
    assert info["tsconv_output"] == "complete" and info["features"] == NAMES


def _consolidation_matches_zarrs(out: Path, tmp_path: Path) -> None:
    """The consolidated metadata in the store equals what zarr.consolidate_metadata writes for it now."""
    fresh = tmp_path / "fresh.zarr"
    shutil.rmtree(fresh, ignore_errors=True)
    shutil.copytree(out, fresh)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(fresh), zarr_format=3)
    ours = json.loads((out / "zarr.json").read_text())
    assert (
        ours["consolidated_metadata"]
        == json.loads((fresh / "zarr.json").read_text())["consolidated_metadata"]
    )
    assert set(ours["consolidated_metadata"]["metadata"]) == {"values", "time", "feature"}


def test_an_output_opens_with_xarray_with_decoded_time_and_feature_names(tmp_path: Path) -> None:
    src = _input(tmp_path)
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=CHUNK)
    _check_dataset(out)
    _consolidation_matches_zarrs(out, tmp_path)


def test_an_output_without_time_opens_with_xarray(tmp_path: Path) -> None:
    src = tmp_path / "in.zarr"
    g = zarr.open_group(str(src), mode="w", zarr_format=3)
    g.create_array("values", data=price_series(600, 2, seed=1), chunks=(256, 2))
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=CHUNK)
    ds = _open(out)
    assert ds["values"].dims == ("time", "feature") and "time" not in ds.coords
    assert [str(n) for n in ds["feature"].values] == ["f0.ma8", "f0.diff1", "f1.ma8", "f1.diff1"]
    np.testing.assert_array_equal(ds["values"].values, read_output(out))


@pytest.fixture
def one_chunk_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Output chunks of one engine chunk, so a small store can be interrupted between chunks."""
    import tsconv.engine.outputs

    monkeypatch.setattr(tsconv.engine.outputs, "output_chunk_rows", lambda chunk, n_outputs: chunk)


def test_a_resumed_output_opens_with_xarray_and_never_reads_stale_consolidated_metadata(
    tmp_path: Path, one_chunk_per_step: None
) -> None:
    src = _input(tmp_path)
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=CHUNK)
    want = read_output(out)
    # What a killed run leaves (garbage after rows_done), with consolidated metadata that no longer holds:
    # it says the values are chunked 512 x 6 and carry an attribute the store does not have.
    g = zarr.open_group(str(out), mode="r+", use_consolidated=False)
    done = 2 * CHUNK
    g["values"][done:] = 12345.0
    root = json.loads((out / "zarr.json").read_text())
    root["attributes"]["tsconv"].update(complete=False, rows_done=done)
    stale = root["consolidated_metadata"]["metadata"]["values"]
    stale["chunk_grid"]["configuration"]["chunk_shape"] = [512, len(NAMES)]
    stale["attributes"] = {"stale": True}
    (out / "zarr.json").write_text(json.dumps(root))
    report = tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=CHUNK, resume=True)
    assert report.resumed_from == done and report.rows == ROWS - done
    np.testing.assert_array_equal(read_output(out), want)
    _check_dataset(out)
    _consolidation_matches_zarrs(out, tmp_path)
    assert _open(out)["values"].attrs.get("stale") is None


def test_a_resumed_run_removes_consolidated_metadata_until_it_completes(
    tmp_path: Path, one_chunk_per_step: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tsconv.io.writers.zarr_writer import OutputWriter

    src = _input(tmp_path)
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=CHUNK)
    root = json.loads((out / "zarr.json").read_text())
    root["attributes"]["tsconv"].update(complete=False, rows_done=CHUNK)
    (out / "zarr.json").write_text(json.dumps(root))
    seen = []

    def failing_finish(self: OutputWriter) -> None:
        seen.append("consolidated_metadata" in json.loads((out / "zarr.json").read_text()))
        raise tsconv.TsconvError("stopped before the end")

    finish = OutputWriter.finish
    monkeypatch.setattr(OutputWriter, "finish", failing_finish)
    with pytest.raises(tsconv.TsconvError, match="stopped"):
        tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=CHUNK, resume=True)
    assert seen == [False] and "consolidated_metadata" not in json.loads((out / "zarr.json").read_text())
    monkeypatch.setattr(OutputWriter, "finish", finish)
    tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=CHUNK, resume=True)
    _check_dataset(out)
