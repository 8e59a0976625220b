"""`tsconv inspect` in plain words: codecs, chunking, readers, warm-up NaNs and unfinished outputs."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

import tsconv
from tsconv.cli import main
from tsconv.io.codecs import codec_words
from tsconv.io.inspect import inspect_store

from ..helpers import T0, price_series, write_store

PIPE = '[[conv]]\nfilters = ["diff:1", "diff:16"]\n'  # halo 16
HALO = 16
WARM = (1, 16)  # each filter's own warm-up rows


def _text(path: Path) -> str:
    res = CliRunner().invoke(main, ["inspect", str(path)])
    assert res.exit_code == 0, res.output
    return res.output


def _store(path: Path, x: np.ndarray, *, zarr_format: int = 3, **codecs: object) -> Path:
    g = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    g.create_array("values", data=x, chunks=(100, 2), **codecs)
    g.attrs["features"] = [f"x{j}" for j in range(x.shape[1])]
    return path


def _no_internals(text: str) -> None:
    for word in ("fast_reader", "gpu_decode", "tsconv_output", "nan_total", "Codec(", "<", "None"):
        assert word not in text, (word, text)


@pytest.mark.parametrize(
    ("zarr_format", "codecs", "words"),
    [
        (3, {"compressors": BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")}, "Blosc LZ4 level 5 + shuffle"),
        (3, {"compressors": BloscCodec(cname="zstd", clevel=2, shuffle="bitshuffle")}, "Blosc Zstd level 2 + bitshuffle"),
        (3, {"compressors": ZstdCodec(level=3)}, "zstd level 3"),
        (3, {"compressors": GzipCodec(level=6)}, "gzip level 6"),
        (3, {"compressors": None}, "none (stored uncompressed)"),
        (2, {"compressors": numcodecs.Blosc("lz4", 5, numcodecs.Blosc.NOSHUFFLE)}, "Blosc LZ4 level 5"),
        (3, {"compressors": BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", typesize=8)},
         "Blosc LZ4 level 5 + shuffle (typesize 8 for 4-byte values)"),
        (2, {"compressors": numcodecs.Zstd(level=3), "filters": [numcodecs.Delta("<f4")]}, "delta + zstd level 3"),
        (2, {"compressors": None}, "none (stored uncompressed)"),
    ],
)  # fmt: skip
def test_codecs_are_named_in_words(tmp_path: Path, zarr_format: int, codecs: dict, words: str) -> None:
    src = _store(tmp_path / "s.zarr", price_series(300, 5), zarr_format=zarr_format, **codecs)
    text = _text(src)
    assert f"codecs: {words}\n" in text
    _no_internals(text)


def test_zarrs_default_zstd_names_its_level() -> None:
    assert codec_words(ZstdCodec(level=0)) == "zstd level 3 (the default)"
    assert codec_words(ZstdCodec(level=1, checksum=True)) == "zstd level 1 with checksum"


def test_chunking_in_words_rows_by_features_and_how_many(tmp_path: Path) -> None:
    src = _store(tmp_path / "s.zarr", price_series(250, 5))  # chunks of 100 x 2: 3 x 3
    info = inspect_store(src, count_nans=False)
    assert info["chunks"] == [100, 2]
    want = "100 rows x 2 features per chunk; 9 chunks (3 along time x 3 across features)"
    assert info["chunking"] == want
    assert f"chunks: {want}\n" in _text(src)
    g = zarr.open_group(str(tmp_path / "sh.zarr"), mode="w")
    g.create_array("values", data=price_series(400, 4), chunks=(100, 4), shards=(200, 4))
    assert inspect_store(tmp_path / "sh.zarr", count_nans=False)["chunking"] == (
        "100 rows x 4 features per chunk; 4 chunks (4 along time x 1 across features), stored in 2 shard files "
        "of 200 rows x 4 features"
    )


def test_readers_are_described_by_what_they_mean(tmp_path: Path) -> None:
    lz4 = _store(tmp_path / "lz4.zarr", price_series(300, 4), compressors=BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"))  # fmt: skip
    text = _text(lz4)
    assert "reading: tsconv's native reader (chunk files decoded in threads)" in text
    assert "GPU decoding: yes: on CUDA, chunks are decoded on the GPU" in text
    _no_internals(text)
    g = zarr.open_group(str(tmp_path / "sh.zarr"), mode="w")
    g.create_array("values", data=price_series(400, 4), chunks=(100, 4), shards=(200, 4))
    text = _text(tmp_path / "sh.zarr")
    assert (
        "reading: zarr's reader, slower; tsconv's native reader does not read this layout: sharded array"
        in text
    )
    assert "GPU decoding: no: on CUDA, chunks are decoded on the CPU" in text
    _no_internals(text)


def _output(tmp_path: Path, x: np.ndarray, *, warmup: str = "nan") -> Path:
    src = write_store(tmp_path / "in.zarr", x, chunks=(256, x.shape[1]))
    pipe = tmp_path / "p.toml"
    pipe.write_text(PIPE)
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline=pipe, chunk=256, device="cpu", warmup=warmup)
    return out


def test_warmup_nans_are_counted_apart_from_data_nans(tmp_path: Path) -> None:
    x = price_series(1000, 2, seed=3)
    x[:100, 0] = np.nan  # before x0's first value: its outputs stay NaN past the warm-up
    out = _output(tmp_path, x)
    y = np.asarray(zarr.open_group(str(out), mode="r")["values"][:])
    info = inspect_store(out)
    assert info["warmup_rows"] == HALO
    warm = [WARM[j % 2] for j in range(y.shape[1])]  # each output's own warm-up
    assert info["warmup_nans"] == sum(warm) == sum(int(np.isnan(y[:w, j]).sum()) for j, w in enumerate(warm))
    assert info["nan_total"] == sum(int(np.isnan(y[w:, j]).sum()) for j, w in enumerate(warm)) > 0
    assert info["nan_counts"]["x0.diff1"] == int(np.isnan(y[1:, 0]).sum())
    assert info["nan_counts"]["x1.diff1"] == 0
    text = _text(out)
    assert f"NaNs: {info['nan_total']:,} in the data; 2 of 4 features have NaNs" in text
    assert f"warm-up NaNs: {2 * sum(WARM)} in the first {HALO} rows" in text
    _no_internals(text)


def test_zero_warmup_has_no_warmup_nans(tmp_path: Path) -> None:
    out = _output(tmp_path, price_series(600, 2), warmup="zero")
    info = inspect_store(out)
    assert info["warmup_rows"] == 0 and info["warmup_nans"] == 0 and info["nan_total"] == 0
    assert "warm-up NaNs: none (the run computed the first rows with zero history)" in _text(out)


def test_zero_warmup_counts_the_preprocess_nans_as_warmup(tmp_path: Path) -> None:
    # a [preprocess]'s first steps are NaN whatever --warmup, and reach every output: they were counted as
    # NaNs "in the data", beside "warm-up NaNs: none (... zero history)"
    src = write_store(tmp_path / "in.zarr", price_series(1000, 2, seed=4), chunks=(256, 2))
    out = tmp_path / "out.zarr"
    pipe = tmp_path / "p.toml"
    pipe.write_text(
        '[preprocess]\ntransform = "log_return"\nzscore = 256\n\n[[conv]]\nfilters = ["id", "ma:4", "ma:16"]\n'
    )
    tsconv.process(src, out, pipeline=pipe, chunk=256, device="cpu", warmup="zero")
    y = np.asarray(zarr.open_group(str(out), mode="r")["values"][:])
    lead = [int(np.argmax(~np.isnan(y[:, j]))) for j in range(y.shape[1])]
    assert min(lead) > 0 and np.isfinite(y[max(lead) :]).all()
    info = inspect_store(out)
    assert info["nan_total"] == 0 and info["warmup_nans"] == sum(lead) and info["warmup_rows"] == max(lead)
    text = _text(out)
    assert f"warm-up NaNs: {sum(lead):,} in the first {max(lead)} rows (the [preprocess] leaves" in text
    _no_internals(text)


def test_an_input_store_has_no_warmup_line(tmp_path: Path) -> None:
    x = price_series(300, 2, nan_fraction=0.1)
    src = write_store(tmp_path / "in.zarr", x)
    info = inspect_store(src)
    assert "warmup_nans" not in info and info["nan_total"] == int(np.isnan(x).sum())
    text = _text(src)
    assert f"NaNs: {int(np.isnan(x).sum()):,}; 2 of 2 features have NaNs" in text and "warm-up" not in text


def test_an_unfinished_output_is_named_with_the_resume_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tsconv.engine.outputs

    monkeypatch.setattr(tsconv.engine.outputs, "output_chunk_rows", lambda chunk, n_outputs: chunk)
    out = _output(tmp_path, price_series(1000, 2, seed=1))
    g = zarr.open_group(str(out), mode="r+")
    assert g["values"].chunks[0] == 256
    done = 512
    for name in ("values", "time"):  # a run killed after two chunks: the later chunk files are missing
        for f in (out / name / "c").rglob("*"):
            if f.is_file() and int(f.relative_to(out / name / "c").parts[0]) >= done // 256:
                f.unlink()
    g.attrs["tsconv"] = {**g.attrs["tsconv"], "complete": False, "rows_done": done}
    text = _text(out)
    assert "sort the series" not in text
    src = tmp_path / "in.zarr"
    pipe = (tmp_path / "p.toml").resolve()
    resume = f"`tsconv process -i {src.resolve()} -o {out.resolve()} --pipeline {pipe} --chunk 256 --resume`"
    assert f"tsconv output: unfinished: 512 of 1,000 rows written; finish it with {resume}" in text
    assert "(counted over the 512 rows written)" in text
    info = json.loads(CliRunner().invoke(main, ["inspect", str(out), "--json"]).output)
    assert info["rows_written"] == done
    assert info["time_span"] == "2026-01-02T09:30:00+00:00 .. 2026-01-02T09:30:00.511+00:00"
    from tsconv.io.timecoding import iso_utc

    # to the nanosecond, never rounded up past the year's end (or back before the epoch)
    assert iso_utc(1_798_761_599_999_999_700) == "2026-12-31T23:59:59.9999997+00:00"
    assert iso_utc(-1) == "1969-12-31T23:59:59.999999999+00:00"
    assert info["warmup_nans"] == 2 * sum(WARM) and info["nan_total"] == 0  # the missing rows are not NaNs
    _no_internals(re.sub(r"`[^`]*`", "", text))


@pytest.mark.parametrize(("first", "warm"), [(10, HALO - 10), (100, 0)])  # diff16's warm-up rows
def test_a_time_range_output_counts_only_its_own_warmup_rows(tmp_path: Path, first: int, warm: int) -> None:
    x = price_series(400, 2, seed=4)
    src = write_store(tmp_path / "in.zarr", x)
    at = [str(np.datetime64(T0 + r * 1_000_000, "ns")) for r in (first, 300)]
    pipe = {"preprocess": {"time_range": at}, "conv": [{"filters": ["diff:1", "diff:16"]}]}
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline=pipe, device="cpu", progress=False)
    y = np.asarray(zarr.open_group(str(out), mode="r")["values"][:])
    info = inspect_store(out)
    assert info["rows"] == 300 - first and info["warmup_rows"] == warm
    # diff1 is warm from row 1, so inside the span only diff16 has warm-up rows
    assert info["warmup_nans"] == int(np.isnan(y[:warm]).sum()) == warm * 2
    assert info["nan_total"] == int(np.isnan(y[warm:]).sum()) == 0


def test_a_sliced_resave_of_an_output_is_not_called_complete(tmp_path: Path) -> None:
    # xarray's to_zarr of rows 595:1000 kept the tsconv attributes: inspect said "complete", and counted the
    # data NaNs in the slice's first rows as warm-up
    out = _output(tmp_path, price_series(1000, 2, seed=5))
    g = zarr.open_group(str(out), mode="r")
    part = np.asarray(g["values"][595:])
    part[3:8, :] = np.nan  # in the rows the recorded warm-up (16) would cover
    cut = zarr.open_group(str(tmp_path / "cut.zarr"), mode="w")
    cut.create_array("values", data=part, chunks=(128, part.shape[1]))
    cut.create_array("time", data=np.asarray(g["time"][595:]), chunks=(128,))
    cut.attrs.update(dict(g.attrs))
    info = inspect_store(tmp_path / "cut.zarr")
    assert "warmup_nans" not in info and info["nan_total"] == int(np.isnan(part).sum()) > 0
    text = _text(tmp_path / "cut.zarr")
    assert (
        "tsconv output: tsconv attributes record 1,000 rows, the array holds 405: re-saved or sliced since "
        "tsconv wrote it" in text
    )
    assert "complete" not in text and "warm-up" not in text


def test_a_damaged_chunk_names_the_store_and_the_file_to_restore(tmp_path: Path) -> None:
    # it had said "of the store" and hinted to check the store with `tsconv inspect`, the command that failed
    src = _store(tmp_path / "s.zarr", price_series(300, 4))
    # chunks of 100 rows x 2 features: the second file of rows 100..200, so not the first one the band reads
    (src / "values" / "c" / "1" / "1").write_bytes(b"garbage")
    res = CliRunner().invoke(main, ["inspect", str(src)])
    assert res.exit_code != 0
    [line] = res.output.strip().splitlines()
    assert line.startswith(f"tsconv: error: cannot read rows 100..200 of {src}: ")
    assert f"the chunk file {src / 'values' / 'c' / '1' / '1'} (rows 100..199) is damaged" in line
    assert "restore it from a copy" in line and "tsconv inspect" not in line


def test_the_commands_it_names_quote_paths_with_spaces(tmp_path: Path) -> None:
    """The resume command named `-i /data/my ticks.zarr -o ...` unquoted: run as shown, the shell split the
    paths (click: 'Got unexpected extra argument'); likewise the repair command of an unfinished append."""
    where = tmp_path / "my runs"
    where.mkdir()
    out = _output(where, price_series(1000, 2, seed=1))
    g = zarr.open_group(str(out), mode="r+")
    g.attrs["tsconv"] = {**g.attrs["tsconv"], "complete": False, "rows_done": 0}
    command = re.search(r"finish it with `([^`]*)`", _text(out)).group(1)
    args = shlex.split(command)
    assert args[args.index("-i") + 1] == str((where / "in.zarr").resolve())
    assert args[args.index("-o") + 1] == str(out.resolve())
    assert args[args.index("--pipeline") + 1] == str((where / "p.toml").resolve())
    res = CliRunner().invoke(main, args[1:])  # as printed: the pipeline's file named too
    assert res.exit_code == 0, res.output
    assert zarr.open_group(str(out), mode="r").attrs["tsconv"]["complete"] is True

    src = where / "in.zarr"
    zarr.open_group(str(src), mode="r+").attrs["ingest"] = {"complete": False, "rows_before": 500}
    res = CliRunner().invoke(main, ["inspect", str(src)])
    repair = re.search(r"`(tsconv repair [^`]*)`", res.output).group(1)
    assert shlex.split(repair)[2:] == [str(src.resolve())]


def test_the_resume_command_names_a_relative_pipeline_file_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run given `--pipeline p.toml` recorded 'p.toml': the resume command, run from another folder, named
    no file there ('pipeline file 'p.toml' does not exist'), or another pipeline of that name."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "p.toml").write_text('[[conv]]\nfilters = ["diff:1", "ma:8"]\n')
    src = write_store(tmp_path / "in.zarr", price_series(1500, 2, seed=4), chunks=(256, 2))
    out = tmp_path / "out.zarr"
    monkeypatch.chdir(job)
    res = CliRunner().invoke(main, ["process", "-i", str(src), "-o", str(out), "--pipeline", "p.toml", "--chunk", "256", "-q", "--device", "cpu"])  # fmt: skip
    assert res.exit_code == 0, res.output
    want = np.asarray(zarr.open_group(str(out), mode="r")["values"][:])
    g = zarr.open_group(str(out), mode="r+")
    g.attrs["tsconv"] = {**g.attrs["tsconv"], "complete": False, "rows_done": 0}
    monkeypatch.chdir(tmp_path)
    args = shlex.split(re.search(r"finish it with `([^`]*)`", _text(out)).group(1))
    assert args[args.index("--pipeline") + 1] == str(job / "p.toml")
    res = CliRunner().invoke(main, args[1:])
    assert res.exit_code == 0, res.output
    np.testing.assert_array_equal(np.asarray(zarr.open_group(str(out), mode="r")["values"][:]), want)


@pytest.mark.parametrize("pipeline", ["trend_ema", None, "dict"])
def test_the_resume_command_names_the_pipeline_the_output_records(
    tmp_path: Path, pipeline: str | None
) -> None:
    """The command named no --pipeline, only "(with the --pipeline of the run that started it, if it had
    one)": run as shown for a built-in's output, it was refused as another pipeline."""
    src = write_store(tmp_path / "in.zarr", price_series(1500, 2, seed=4), chunks=(256, 2))
    out = tmp_path / "out.zarr"
    given = {"conv": [{"filters": ["diff:1", "ma:8"]}]} if pipeline == "dict" else pipeline
    tsconv.process(src, out, pipeline=given, chunk=256, device="cpu")
    want = np.asarray(zarr.open_group(str(out), mode="r")["values"][:])
    g = zarr.open_group(str(out), mode="r+")
    g.attrs["tsconv"] = {**g.attrs["tsconv"], "complete": False, "rows_done": 0}
    text = _text(out)
    args = shlex.split(re.search(r"finish it with `([^`]*)`", text).group(1))
    if pipeline == "dict":  # no file to name: a placeholder, said what it stands for
        assert args[args.index("--pipeline") + 1] == "PIPELINE" and "given as a dict" in text
        return
    assert ("--pipeline" in args) == (pipeline is not None)
    if pipeline is not None:
        assert args[args.index("--pipeline") + 1] == pipeline
    res = CliRunner().invoke(main, args[1:])
    assert res.exit_code == 0, res.output
    np.testing.assert_array_equal(np.asarray(zarr.open_group(str(out), mode="r")["values"][:]), want)
