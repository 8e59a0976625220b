"""The synthetic tick-store generator: layout, data realism, NaN gaps, determinism, errors and CLI."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
import zarr.codecs

from tsconv.errors import StoreError
from tsconv.synth import START_NS, default_chunk_rows, feature_names, make_ticks

REPO = Path(__file__).resolve().parents[1]


def _load(path: Path) -> tuple[zarr.Group, np.ndarray, np.ndarray]:
    g = zarr.open_group(str(path), mode="r")
    return g, g["values"][:], g["time"][:]


@pytest.fixture(scope="module")
def medium(tmp_path_factory: pytest.TempPathFactory) -> tuple[zarr.Group, np.ndarray, np.ndarray]:
    # 100k rows x 16 features spans two generation blocks (65536 rows at F=16), so carries are exercised.
    path = make_ticks(tmp_path_factory.mktemp("synth") / "m.zarr", rows=100_000, features=16, seed=7)
    return _load(path)


def test_layout_v3(tmp_path: Path) -> None:
    path = make_ticks(tmp_path / "t.zarr", rows=3000, features=7, seed=1)
    assert path == (tmp_path / "t.zarr").absolute()
    g, v, t = _load(path)
    assert g.metadata.zarr_format == 3
    assert g.attrs["features"] == ["px_0", "vol_0", "spread_0", "px_1", "vol_1", "spread_1", "px_2"]
    arr = g["values"]
    assert arr.shape == (3000, 7) and arr.dtype == np.float32
    assert arr.chunks == (default_chunk_rows(7, 4), 7)
    assert g["time"].chunks == (default_chunk_rows(7, 4),)
    for a in (arr, g["time"]):
        (codec,) = a.compressors
        assert isinstance(codec, zarr.codecs.BloscCodec)
        assert (codec.cname.value, codec.clevel, codec.shuffle.value) == ("lz4", 5, "shuffle")
    assert t.dtype == np.int64 and t.shape == (3000,)
    assert t[0] == START_NS == np.datetime64("2026-01-02T09:30:00", "ns").astype(np.int64)
    assert np.all(np.diff(t) >= 1000)  # strictly increasing by at least 1 us
    assert len(np.unique(np.diff(t))) > 100  # irregular arrivals
    assert not list(tmp_path.glob(".*partial*"))


def test_layout_v2_and_explicit_chunks(tmp_path: Path) -> None:
    path = make_ticks(
        tmp_path / "t2.zarr", rows=2500, features=5, zarr_format=2, chunk_rows=1000, chunk_features=2
    )
    assert (path / ".zgroup").is_file() and not (path / "zarr.json").exists()
    g, v, t = _load(path)
    assert g.metadata.zarr_format == 2
    assert g["values"].chunks == (1000, 2) and g["time"].chunks == (1000,)
    (codec,) = g["values"].compressors
    assert codec == numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    assert v.shape == (2500, 5) and g.attrs["features"] == feature_names(5)
    assert np.all(np.diff(t) > 0)


def test_default_chunk_rows() -> None:
    assert default_chunk_rows(1024, 4) == 4096
    assert default_chunk_rows(64, 4) == 65536
    assert default_chunk_rows(1024, 8) == 2048
    assert default_chunk_rows(3000, 4) == 1024  # 1398 rounded down to a multiple of 1024
    assert default_chunk_rows(100_000, 4) == 41  # below 1024: not rounded
    assert default_chunk_rows(10**8, 8) == 1


def test_feature_names_cycle() -> None:
    assert feature_names(1) == ["px_0"]
    assert feature_names(4) == ["px_0", "vol_0", "spread_0", "px_1"]


def test_prices_on_grid_positive_and_walk(medium: tuple[zarr.Group, np.ndarray, np.ndarray]) -> None:
    _, v, _ = medium
    px = v[:, 0::3]
    ok = ~np.isnan(px)
    assert np.all(px[ok] > 0)
    grid = (np.round(px[ok].astype(np.float64) * 100) / 100).astype(np.float32)
    assert np.array_equal(px[ok], grid)  # the nearest float32 to a multiple of 0.01
    # A walk in ticks: at most 2 ticks per step, also across the generation-block boundary at row 65536.
    d = np.abs(np.diff(px, axis=0))
    assert np.nanmax(d) <= 0.02 + 1e-4
    moved = np.nanmean(d > 0)
    assert 0.01 < moved < 0.5
    first = px[np.argmax(ok, axis=0), np.arange(px.shape[1])]
    assert np.all((first >= 50) & (first <= 200))


def test_volume_and_spread(medium: tuple[zarr.Group, np.ndarray, np.ndarray]) -> None:
    _, v, _ = medium
    vol = v[:, 1::3][~np.isnan(v[:, 1::3])]
    assert np.all(vol >= 0) and np.array_equal(vol, np.round(vol))
    assert 0.15 < np.mean(vol == 0) < 0.45  # quote updates without trades
    pos = vol[vol > 0]
    assert np.max(pos) > 50 * np.median(pos)  # heavy tail
    sp = v[:, 2::3][~np.isnan(v[:, 2::3])]
    ticks = np.round(sp.astype(np.float64) * 100)
    assert np.array_equal(sp, (ticks / 100).astype(np.float32))
    assert ticks.min() >= 1
    assert np.mean(ticks <= 3) > 0.8


def test_nan_gaps(medium: tuple[zarr.Group, np.ndarray, np.ndarray]) -> None:
    _, v, _ = medium
    nan = np.isnan(v)
    first = np.argmax(~nan, axis=0)
    listed = np.arange(v.shape[0])[:, None] >= first[None, :]
    frac = nan[listed].mean()
    assert 0.007 < frac < 0.013, frac  # nan_fraction=0.01, late listings excluded
    # Gaps come in runs, not as isolated cells.
    col = nan[:, 0].astype(np.int8)
    starts = np.count_nonzero(np.diff(col) == 1)
    assert starts > 0 and col.sum() / starts >= 3
    # Whole-instrument halts: rows where px, vol and spread of instrument 0 are all missing.
    assert np.count_nonzero(nan[:, 0:3].all(axis=1)) > 10


def test_late_listing(tmp_path: Path) -> None:
    _, v, _ = _load(make_ticks(tmp_path / "l.zarr", rows=5000, features=60, seed=0))
    first = np.argmax(~np.isnan(v), axis=0)
    late = first >= 100
    assert late.any() and not late[:3].any()  # instrument 0 is listed from the start
    assert np.all(first <= 5000 // 4)
    # A late instrument lists all three of its features at once.
    lead = first.reshape(-1, 3)[late.reshape(-1, 3).any(axis=1)]
    assert np.all(lead == lead[:, :1])


@pytest.mark.parametrize("fraction", [0.0, 0.05])
def test_nan_fraction_option(tmp_path: Path, fraction: float) -> None:
    _, v, _ = _load(make_ticks(tmp_path / "f.zarr", rows=50_000, features=3, nan_fraction=fraction, seed=2))
    frac = np.isnan(v).mean()
    if fraction == 0:
        assert frac == 0
    else:
        assert 0.7 * fraction < frac < 1.3 * fraction


def test_tiny_store_has_values(tmp_path: Path) -> None:
    _, v, t = _load(make_ticks(tmp_path / "one.zarr", rows=1, features=1))
    assert v.shape == (1, 1) and not np.isnan(v).any() and t.tolist() == [START_NS]


def test_deterministic_and_chunking_independent(tmp_path: Path) -> None:
    kw = {"rows": 9000, "features": 10, "seed": 3}
    _, a, ta = _load(make_ticks(tmp_path / "a.zarr", **kw))
    _, b, tb = _load(make_ticks(tmp_path / "b.zarr", **kw))
    _, c, tc = _load(make_ticks(tmp_path / "c.zarr", chunk_rows=777, chunk_features=4, zarr_format=2, **kw))
    _, d, td = _load(make_ticks(tmp_path / "d.zarr", dtype="float64", **kw))
    _, e, _ = _load(make_ticks(tmp_path / "e.zarr", **{**kw, "seed": 4}))
    assert np.array_equal(a, b, equal_nan=True) and np.array_equal(ta, tb)
    assert np.array_equal(a, c, equal_nan=True) and np.array_equal(ta, tc)
    assert d.dtype == np.float64 and np.array_equal(a, d.astype(np.float32), equal_nan=True)
    assert np.array_equal(ta, td)
    assert not np.array_equal(a, e, equal_nan=True)


def test_float16(tmp_path: Path) -> None:
    g, v, _ = _load(make_ticks(tmp_path / "h.zarr", rows=50_000, features=30, dtype="float16", seed=1))
    assert g["values"].dtype == np.float16
    assert g["values"].chunks == (default_chunk_rows(30, 2), 30)
    assert not np.isinf(v).any() and np.nanmin(v[:, 0::3]) > 0
    assert np.nanmax(v[:, 1::3]) == np.finfo(np.float16).max  # big volumes clip instead of becoming inf


def test_refuses_existing_path(tmp_path: Path) -> None:
    path = make_ticks(tmp_path / "x.zarr", rows=100, features=2, seed=1)
    _, before, _ = _load(path)
    with pytest.raises(StoreError, match="already exists") as info:
        make_ticks(path, rows=100, features=2, seed=2)
    assert "overwrite" in (info.value.hint or "")
    _, still, _ = _load(path)
    assert np.array_equal(before, still, equal_nan=True)
    make_ticks(path, rows=50, features=3, seed=2, overwrite=True)
    g, after, _ = _load(path)
    assert after.shape == (50, 3)


def test_overwrite_refuses_non_store(tmp_path: Path) -> None:
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "notes.txt").write_text("precious")
    with pytest.raises(StoreError, match="not a zarr store"):
        make_ticks(tmp_path / "keep", rows=10, features=1, overwrite=True)
    assert (tmp_path / "keep" / "notes.txt").read_text() == "precious"
    (tmp_path / "empty").mkdir()
    make_ticks(tmp_path / "empty", rows=10, features=1, overwrite=True)
    assert (tmp_path / "empty" / "zarr.json").is_file()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rows": 0}, "rows must be"),
        ({"features": 0}, "features must be"),
        ({"rows": 2.5}, "rows must be"),
        ({"features": True}, "features must be"),
        ({"seed": -1}, "seed must be"),
        ({"dtype": "int32"}, "dtype must be"),
        ({"dtype": "bogus"}, "dtype must be"),
        ({"chunk_rows": 0}, "chunk_rows must be"),
        ({"chunk_features": -3}, "chunk_features must be"),
        ({"nan_fraction": 1.0}, "nan_fraction must be"),
        ({"nan_fraction": -0.1}, "nan_fraction must be"),
        ({"zarr_format": 4}, "zarr_format must be"),
    ],
)
def test_bad_arguments(tmp_path: Path, kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"rows": 10, "features": 2, **kwargs}
    with pytest.raises(StoreError, match=match) as info:
        make_ticks(tmp_path / "bad.zarr", **args)  # type: ignore[arg-type]
    assert info.value.hint
    assert not (tmp_path / "bad.zarr").exists()


def _cli() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("make_ticks_cli", REPO / "data" / "make_ticks.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli = _cli()
    out = tmp_path / "cli.zarr"
    argv = ["--output", str(out), "--rows", "2000", "--features", "4", "--seed", "9", "--chunk-rows", "512"]
    assert cli.main(argv) == 0
    g, v, _ = _load(out)
    assert v.shape == (2000, 4) and g["values"].chunks == (512, 4)
    _, ref, _ = _load(make_ticks(tmp_path / "ref.zarr", rows=2000, features=4, seed=9))
    assert np.array_equal(v, ref, equal_nan=True)
    capsys.readouterr()
    assert cli.main([*argv, "--quiet"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert cli.main([*argv, "--quiet", "--overwrite", "--zarr-format", "2", "--dtype", "float64"]) == 0
    g, _, _ = _load(out)
    assert g.metadata.zarr_format == 2 and g["values"].dtype == np.float64
