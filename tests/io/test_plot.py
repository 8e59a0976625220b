"""``tsconv plot``: a figure of chosen features (with their inputs for an output), and one-line errors."""

from __future__ import annotations

import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner, Result

import tsconv
from tsconv.cli import main
from tsconv.errors import TsconvError, TsconvWarning
from tsconv.io.plot import MAX_POINTS, parse_rows, plot_store

from ..helpers import T0, price_series, write_store

pytest.importorskip("matplotlib")

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("plot")
    src = write_store(root / "in.zarr", price_series(300, 2))
    out = root / "out.zarr"
    tsconv.process(str(src), str(out), progress=False)
    return src, out


def _plot(*args: object) -> Result:
    return CliRunner().invoke(main, ["plot", *map(str, args)])


def _error_line(res: Result) -> str:
    assert res.exit_code != 0
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tsconv: error: "), res.output
    return lines[0]


def test_output_with_inputs_writes_png(stores: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = stores
    fig = tmp_path / "fig.png"
    res = _plot(out, "-f", "x0.diff*", "-f", "x1.dev32", "--rows", "100:", "-o", fig)
    assert res.exit_code == 0, res.output
    assert "plotted 4 features with their inputs (x0, x1), rows 100..300" in res.output
    data = fig.read_bytes()
    assert data.startswith(PNG) and len(data) > 1000


def test_input_store_and_result(stores: tuple[Path, Path], tmp_path: Path) -> None:
    src, _ = stores
    result = plot_store(src, features=["x1"], output=tmp_path / "in.png", rows=slice(-50, None))
    assert (result.features, result.inputs, result.start, result.stop, result.every) == (
        ("x1",),
        (),
        250,
        300,
        1,
    )
    assert (tmp_path / "in.png").read_bytes().startswith(PNG)


def test_a_dense_stage_named_as_an_input_is_drawn_without_inputs(
    stores: tuple[Path, Path], tmp_path: Path
) -> None:
    # its outputs mix every input: each had been drawn beside the input feature its name begins with
    src, _ = stores
    out = tmp_path / "dense.zarr"
    tsconv.process(src, out, pipeline={"conv": [{"name": "x0", "weights": np.ones((3, 2, 2))}]}, device="cpu")
    result = plot_store(out, features=["x0.*"], output=tmp_path / "d.png")
    assert len(result.features) == 3 and result.inputs == ()


def test_a_two_stage_bank_pairs_each_output_with_its_own_input(tmp_path: Path) -> None:
    # a.diff1.ma8 is a's diff:1 then ma:8; it had been drawn beside the input named a.diff1 (longest prefix)
    src = write_store(tmp_path / "in.zarr", price_series(300, 2))
    zarr.open_group(str(src), mode="r+").attrs["features"] = ["a", "a.diff1"]
    out = tmp_path / "ms.zarr"
    tsconv.process(src, out, pipeline="multiscale", device="cpu", progress=False)
    for feature, parent in [("a.diff1.ma8", "a"), ("a.diff1.diff1.ma8", "a.diff1")]:
        result = plot_store(out, features=[feature], output=tmp_path / "ms.png")
        assert result.inputs == (parent,), feature


def test_unreachable_input_draws_features_alone(stores: tuple[Path, Path], tmp_path: Path) -> None:
    moved_out = tmp_path / "out.zarr"
    shutil.copytree(stores[1], moved_out)
    zarr.open_group(str(moved_out), mode="r+").attrs["source"] = str(tmp_path / "gone.zarr")
    fig = tmp_path / "alone.png"
    res = _plot(moved_out, "-f", "x0.diff1", "-o", fig)
    assert res.exit_code == 0, res.output
    warning = [line for line in res.output.splitlines() if line.startswith("tsconv: warning: ")]
    assert len(warning) == 1 and "drawing the features alone" in warning[0]
    assert "plotted 1 feature, rows 0..300" in res.output
    assert fig.read_bytes().startswith(PNG)


def test_long_range_is_thinned(tmp_path: Path) -> None:
    src = write_store(tmp_path / "long.zarr", price_series(MAX_POINTS * 2 + 10, 1))
    result = plot_store(src, features=["x0"], output=tmp_path / "long.png")
    assert result.every == 3 and result.stop == MAX_POINTS * 2 + 10


def test_bad_pattern_is_one_line(stores: tuple[Path, Path], tmp_path: Path) -> None:
    line = _error_line(_plot(stores[1], "-f", "nope*", "-o", tmp_path / "f.png"))
    assert "no feature matches 'nope*'" in line and "x0.diff1" in line
    assert not (tmp_path / "f.png").exists()


@pytest.mark.parametrize(("rows", "words"), [("5", "is not a row range"), ("a:b", "is not a row range"),
                                             ("200:100", "select nothing"), ("1:2:3", "is not a row range")])  # fmt: skip
def test_bad_rows_is_one_line(stores: tuple[Path, Path], tmp_path: Path, rows: str, words: str) -> None:
    line = _error_line(_plot(stores[0], "-f", "x0", "--rows", rows, "-o", tmp_path / "f.png"))
    assert words in line


def test_bad_figure_suffix_is_one_line(stores: tuple[Path, Path], tmp_path: Path) -> None:
    assert "format" in _error_line(_plot(stores[0], "-f", "x0", "-o", tmp_path / "f.txt"))


def test_missing_matplotlib_is_one_line(
    stores: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    line = _error_line(_plot(stores[0], "-f", "x0", "-o", tmp_path / "f.png"))
    assert "needs matplotlib" in line and "tsconv-features[plot]" in line


def test_parse_rows() -> None:
    assert parse_rows("10:20") == slice(10, 20)
    assert parse_rows(":-5") == slice(None, -5)
    assert parse_rows(":") == slice(None, None)
    with pytest.raises(TsconvError):
        parse_rows("10")
    assert np.arange(10)[parse_rows("-3:")].tolist() == [7, 8, 9]


def test_a_figure_inside_the_store_is_refused(stores: tuple[Path, Path]) -> None:
    """`plot in.zarr -o in.zarr/p.png` had added a file among the input store's own."""
    src, out = stores
    for store in (src, out):
        before = sorted(p.name for p in store.rglob("*"))
        line = _error_line(_plot(store, "-f", "x*", "-o", store / "values" / "p.png"))
        assert "lies inside the input store" in line and "never writes among a store's files" in line
        assert sorted(p.name for p in store.rglob("*")) == before
    # the store as a file:// URL, and an output's figure inside the input store it draws beside it: both written
    before = sorted(p.name for p in src.rglob("*"))
    for store in (f"file://{src}", out):
        line = _error_line(_plot(store, "-f", "x*", "-o", src / "p.png"))
        assert "lies inside the input store" in line and str(src) in line
    assert sorted(p.name for p in src.rglob("*")) == before


def test_a_feature_named_like_a_glob_is_picked_by_its_own_name() -> None:
    from tsconv.io.plot import match_features

    names = ["px1", "px[1]", "px?", "py"]
    assert match_features(names, ["px[1]"]) == ["px[1]"]  # not px1, which the glob matches
    assert match_features(names, ["px?"]) == ["px?"]
    assert match_features(names, ["px*"]) == ["px1", "px[1]", "px?"]


def _drawn(monkeypatch: pytest.MonkeyPatch) -> dict[str, np.ndarray]:
    """Each line plot draws, by its label: the y values."""
    import matplotlib.axes

    lines: dict[str, np.ndarray] = {}
    draw = matplotlib.axes.Axes.plot

    def record(self: object, x: object, y: object, *args: object, **kw: object) -> object:
        lines[str(kw.get("label"))] = np.asarray(y)
        return draw(self, x, y, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", record)
    return lines


def test_a_rewritten_input_is_not_drawn_on_the_outputs_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the input re-written with 50 earlier rows in front: read by row number, rows 50 earlier were drawn
    x = price_series(300, 1)
    src = write_store(tmp_path / "in.zarr", x)
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, device="cpu", progress=False)
    g = zarr.open_group(str(src), mode="w")
    g.create_array("values", data=np.concatenate([np.zeros((50, 1), np.float32), x]))
    g.create_array("time", data=T0 + np.arange(-50, 300, dtype=np.int64) * 1_000_000)
    g.attrs["features"] = ["x0"]
    lines = _drawn(monkeypatch)
    with pytest.warns(TsconvWarning) as caught:
        result = plot_store(out, features=["x0.diff1"], output=tmp_path / "p.png", rows="100:200")
    assert result.inputs == () and list(lines) == ["x0.diff1"]
    [message] = [str(w.message) for w in caught]
    assert f"the input store {src} no longer matches the output's rows" in message
    assert (
        "output row 100 is 2026-01-02T09:30:00.05+00:00, the output's 2026-01-02T09:30:00.1+00:00" in message
    )
    assert "drawing the features alone" in message


def test_a_time_range_output_is_drawn_beside_its_own_input_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = price_series(300, 1)
    src = write_store(tmp_path / "in.zarr", x)
    out = tmp_path / "out.zarr"
    start, stop = (str(np.datetime64(T0 + r * 1_000_000, "ns")) for r in (120, 280))
    pipe = {"preprocess": {"time_range": [start, stop]}, "conv": [{"filters": ["diff:1"]}]}
    tsconv.process(src, out, pipeline=pipe, device="cpu", progress=False)
    lines = _drawn(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TsconvWarning)
        result = plot_store(out, features=["x0.diff1"], output=tmp_path / "p.png", rows="10:20")
    assert result.inputs == ("x0",)
    np.testing.assert_array_equal(lines["x0"], x[130:140, 0])


@pytest.mark.parametrize("fill", ["ffill", "none"])
def test_an_input_is_drawn_as_the_pipeline_read_it_forward_filled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fill: str
) -> None:
    # ticks of 10 symbols in one store, a row each (ingest's long layout): drawn as stored, a symbol's values
    # were points between NaNs, which a line does not draw, beside features computed from the filled series
    rng = np.random.default_rng(0)
    rows, n = 3000, 10
    prices = price_series(rows, n)
    x = np.full((rows, n), np.nan, np.float32)
    sym = rng.integers(0, n, rows)
    x[np.arange(rows), sym] = prices[np.arange(rows), sym]
    x[:, 2] = np.nan
    x[2000, 2] = 7.0  # one value, after the rows drawn: NaN before it, as the features
    src = write_store(tmp_path / "in.zarr", x, chunks=(256, n))
    out = tmp_path / "out.zarr"
    pipe = {"preprocess": {"fill": fill}, "conv": [{"filters": ["id"]}]}
    tsconv.process(src, out, pipeline=pipe, device="cpu", progress=False)
    lines = _drawn(monkeypatch)
    monkeypatch.setattr("tsconv.io.plot._FILL_BAND_ROWS", 500)  # bands and the walk back over several
    plot_store(out, features=["x3.id", "x2.id"], output=tmp_path / "p.png", rows="1100:1900")
    want = x[1100:1900].astype(np.float64)
    if fill == "ffill":
        last = np.full(n, np.nan)
        for row in x[:1100]:
            last = np.where(np.isnan(row), last, row)
        for i, row in enumerate(want):
            want[i] = last = np.where(np.isnan(row), last, row)
        assert np.isfinite(lines["x3"]).all()
    np.testing.assert_array_equal(lines["x3"], want[:, 3])
    np.testing.assert_array_equal(lines["x2"], want[:, 2])
    np.testing.assert_array_equal(
        lines["x3.id"], np.asarray(zarr.open_group(str(out))["values"][1100:1900, 3])
    )
