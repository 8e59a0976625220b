"""``process(..., update=True)``: rows appended to the input extend the output, computing only the new
rows, and the result is a full run over the grown input bit for bit; an input whose rows already
computed changed, or that lost rows, is refused; a run killed at any point is finished by the next one."""

from __future__ import annotations

import io
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import zarr

import tsconv
from tsconv.io.digest import read_digest, write_digest
from tsconv.io.tail import TAIL_FILE, InputTail, tail_digest

from ..helpers import T0, spy_fill_walks, write_store

CHUNK = 128


def ticks(rows: int, features: int, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Prices at levels 20..500 on a 0.01 grid, symbols starting late (NaN before), gaps (NaN runs) and
    missing prints; irregular, strictly increasing times."""
    rng = np.random.default_rng(seed)
    level = rng.uniform(20, 500, size=features)
    steps = rng.choice([-2, -1, 0, 0, 0, 1, 2], size=(rows, features)) * 0.01
    x = (level + np.cumsum(steps, axis=0)).astype(np.float32)
    x[rng.random(x.shape) < 0.02] = np.nan
    for j in range(1, features, 2):  # every other symbol starts late
        x[: int(rng.integers(rows // 10, rows // 2)), j] = np.nan
    a = int(rng.integers(rows // 3, rows // 2))
    x[a : a + 150, 0] = np.nan  # a gap longer than the halo
    t = T0 + np.cumsum(rng.integers(1, 5_000_000, size=rows)).astype(np.int64)
    return x, t


def grow(src: Path, x: np.ndarray, t: np.ndarray, rows: int) -> None:
    """Append the input's rows up to ``rows`` as a writer would: resize, then write the new rows."""
    g = zarr.open_group(str(src), mode="r+")
    old = int(g["values"].shape[0])
    g["values"].resize((rows, x.shape[1]))
    g["values"][old:rows] = x[old:rows]
    g["time"].resize((rows,))
    g["time"][old:rows] = t[old:rows]


def make_input(path: Path, x: np.ndarray, t: np.ndarray, rows: int, chunks: tuple[int, int]) -> Path:
    """A store of the first ``rows`` rows, features px_0, sz_1, px_2, ... (returns_zscore takes the px_*)."""
    write_store(path, x[:rows], chunks=chunks)
    g = zarr.open_group(str(path), mode="r+")
    g["time"][:] = t[:rows]
    g.attrs["features"] = [f"{'sz' if j % 2 else 'px'}_{j}" for j in range(x.shape[1])]
    return path


def assert_same(got: Path, want: Path) -> None:
    a, b = zarr.open_group(str(want), mode="r"), zarr.open_group(str(got), mode="r")
    ma, mb = a.attrs["tsconv"], b.attrs["tsconv"]
    assert mb["complete"] is True and mb["rows"] == ma["rows"] == mb["rows_done"]
    assert mb["fingerprint"] == ma["fingerprint"]
    va, vb = np.asarray(a["values"][:]), np.asarray(b["values"][:])
    assert va.shape == vb.shape
    assert va.tobytes() == vb.tobytes()  # bit for bit, NaN payloads included
    assert np.asarray(a["time"][:]).tobytes() == np.asarray(b["time"][:]).tobytes()
    assert a.attrs["features"] == b.attrs["features"]
    assert (want / "values" / ".tsconv-input.json").read_bytes() == (
        got / "values" / ".tsconv-input.json"
    ).read_bytes()


@pytest.fixture
def out_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Output chunks of 3 engine chunks (384 rows), so small stores have many and updates land inside one."""
    import tsconv.engine.outputs

    monkeypatch.setattr(tsconv.engine.outputs, "output_chunk_rows", lambda chunk, n_outputs: 3 * chunk)


# Updates of 1 row, less than a chunk, a chunk's worth not on its boundary, several output chunks.
SIZES = (2000, 2001, 2057, 2185, 3300, 3301)


@pytest.mark.parametrize(
    "pipeline, chunk, store_chunks",
    [
        (None, CHUNK, (700, 3)),
        ("trend_ema", CHUNK, (500, 5)),
        ("multiscale", 96, (333, 2)),
        ("returns_zscore", CHUNK, (1000, 5)),
        ("dense_head", 64, (256, 40)),  # 64 features
        ({"conv": [{"filters": ["ma:64", "diff:32"]}, {"filters": ["ema:8"], "dilation": 2}]}, 100, (777, 4)),
    ],
    ids=["default", "trend_ema", "multiscale", "returns_zscore", "dense_head", "dilated"],
)
def test_updates_equal_a_full_run_on_the_grown_input(
    tmp_path: Path, out_chunks: None, pipeline: object, chunk: int, store_chunks: tuple[int, int]
) -> None:
    x, t = ticks(SIZES[-1], 64 if pipeline == "dense_head" else 5, seed=11)
    src = make_input(tmp_path / "in.zarr", x, t, SIZES[0], store_chunks)
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline=pipeline, chunk=chunk, device="cpu")
    for before, rows in zip(SIZES, SIZES[1:], strict=False):
        grow(src, x, t, rows)
        report = tsconv.process(src, out, pipeline=pipeline, chunk=chunk, device="cpu", update=True)
        assert report.updated_from == before and report.total_rows == rows
        assert report.resumed_from == before // chunk * chunk  # from the engine chunk holding the old end
        assert report.rows == rows - report.resumed_from
        want = tmp_path / f"want-{rows}.zarr"
        tsconv.process(src, want, pipeline=pipeline, chunk=chunk, device="cpu")
        assert_same(out, want)
        shutil.rmtree(want)


def test_the_batched_engine_updates_within_the_fp32_bound(tmp_path: Path, out_chunks: None) -> None:
    # The CUDA engine, through the Triton interpreter here: its steps start at the update's first row, not
    # where a whole run's fall, so each step's centring level may differ; values agree to float32.
    from ..helpers import process_batched

    pipe = {"conv": [{"filters": ["diff:1", "ma:16", "dev:8"]}]}
    x, t = ticks(1000, 3, seed=12)
    src = make_input(tmp_path / "in.zarr", x, t, 700, (250, 3))
    out, want = tmp_path / "out.zarr", tmp_path / "want.zarr"
    process_batched(src, out, pipeline=pipe, device="cpu", chunk=CHUNK, gpu_mem="80MB")
    grow(src, x, t, 1000)
    report = process_batched(src, out, pipeline=pipe, device="cpu", chunk=CHUNK, gpu_mem="80MB", update=True)
    assert (report.updated_from, report.resumed_from) == (700, 640) and report.step_rows
    process_batched(src, want, pipeline=pipe, device="cpu", chunk=CHUNK, gpu_mem="80MB")
    a, b = (np.asarray(zarr.open_group(str(p), mode="r")["values"][:]) for p in (want, out))
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-4)
    assert zarr.open_group(str(out), mode="r").attrs["tsconv"]["complete"] is True
    # the batched engine records the fill state at its last row as the chunked one does
    import json

    cpu = tmp_path / "cpu.zarr"
    tsconv.process(src, cpu, pipeline=pipe, chunk=CHUNK, device="cpu")
    recs = [json.loads((p / "values" / ".tsconv-input.json").read_text())["fill"] for p in (out, want, cpu)]
    assert recs[0] == recs[1] == recs[2] and recs[0]["row"] == 1000


def test_warmup_zero_and_a_time_range(tmp_path: Path, out_chunks: None) -> None:
    x, t = ticks(3000, 3, seed=2)
    src = make_input(tmp_path / "in.zarr", x, t, 1900, (600, 3))
    end = np.datetime64(int(t[2700]), "ns")
    pipe = {"preprocess": {"time_range": [str(np.datetime64(int(t[150]), "ns")), str(end)]},
            "conv": [{"filters": ["ma:16", "diff:4"]}]}  # fmt: skip
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline=pipe, chunk=CHUNK, warmup="zero")
    for rows in (2300, 3000):  # the time range ends inside the second update
        grow(src, x, t, rows)
        tsconv.process(src, out, pipeline=pipe, chunk=CHUNK, warmup="zero", update=True)
        want = tmp_path / f"want-{rows}.zarr"
        tsconv.process(src, want, pipeline=pipe, chunk=CHUNK, warmup="zero")
        assert_same(out, want)
    assert zarr.open_group(str(out)).attrs["tsconv"]["input_rows"] == [150, 2700]


def test_a_small_output_is_rebuilt_chunked_as_a_full_run_would(tmp_path: Path) -> None:
    # Stores smaller than one output chunk are chunked by their rows, not on the engine's chunks.
    x, t = ticks(2500, 4, seed=3)
    src = make_input(tmp_path / "in.zarr", x, t, 1000, (300, 4))
    out, want = tmp_path / "out.zarr", tmp_path / "want.zarr"
    tsconv.process(src, out, chunk=CHUNK)
    grow(src, x, t, 2500)
    report = tsconv.process(src, out, chunk=CHUNK, update=True)
    assert (report.updated_from, report.resumed_from, report.rows) == (1000, 0, 2500)
    tsconv.process(src, want, chunk=CHUNK)
    assert_same(out, want)
    assert zarr.open_group(str(out))["values"].chunks == zarr.open_group(str(want))["values"].chunks


def test_a_small_output_of_whole_engine_chunks_is_rebuilt_too(tmp_path: Path) -> None:
    # 1,024 rows are 8 engine chunks: the output's one chunk of 1,024 rows is still smaller than a full
    # run's, and updates kept writing 1,024-row chunks (the same values, another store).
    x, t = ticks(3000, 4, seed=3)
    src = make_input(tmp_path / "in.zarr", x, t, 1024, (300, 4))
    out, want = tmp_path / "out.zarr", tmp_path / "want.zarr"
    tsconv.process(src, out, chunk=CHUNK, device="cpu")
    for rows in (1100, 3000):
        grow(src, x, t, rows)
        tsconv.process(src, out, chunk=CHUNK, device="cpu", update=True)
    tsconv.process(src, want, chunk=CHUNK, device="cpu")
    assert_same(out, want)
    assert (
        zarr.open_group(str(out))["values"].chunks
        == zarr.open_group(str(want))["values"].chunks
        == (3000, 20)
    )


def test_a_small_output_holding_other_files_is_not_rebuilt(tmp_path: Path) -> None:
    x, t = ticks(1500, 2, seed=3)
    src = make_input(tmp_path / "in.zarr", x, t, 1000, (300, 2))
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK)
    (out / "notes.txt").write_text("mine")
    grow(src, x, t, 1500)
    with pytest.raises(
        tsconv.TsconvError, match="refusing to rebuild for --update .* not zarr data \\(notes.txt\\)"
    ):
        tsconv.process(src, out, chunk=CHUNK, update=True)
    assert (out / "notes.txt").read_text() == "mine"
    assert zarr.open_group(str(out)).attrs["tsconv"]["rows"] == 1000


def test_nothing_new_is_a_no_op_and_a_missing_output_is_created(tmp_path: Path, out_chunks: None) -> None:
    x, t = ticks(2000, 3, seed=4)
    src = make_input(tmp_path / "in.zarr", x, t, 2000, (500, 3))
    out = tmp_path / "out.zarr"
    first = tsconv.process(src, out, chunk=CHUNK, update=True)
    assert first.rows == 2000 and first.updated_from is None
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    again = tsconv.process(src, out, chunk=CHUNK, update=True)
    assert (again.rows, again.updated_from, again.total_rows) == (0, 2000, 2000)
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before


def test_nothing_new_reads_no_input_rows_unless_the_last_bands_files_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An input whose files are as recorded is not read at all by a no-op update (its partial last band's
    hash is the recorded one); files rewritten with the same rows are re-read and still nothing to do."""
    import tsconv.io.readers.threads as threads

    x, t = ticks(2050, 3, seed=7)
    src = make_input(tmp_path / "in.zarr", x, t, 2050, (500, 3))  # band 4 (2000..2050) partial
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK)
    reads: list[str] = []
    real_decode, real_get = threads.decode_chunk_into, zarr.Array.__getitem__

    def counting(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        reads.append(str(path))
        return real_decode(path, *args, **kwargs)

    def spy_get(self, key):  # noqa: ANN001, ANN202
        if str(self.store_path).startswith(f"file://{src}"):
            reads.append(f"{self.path}[{key!r}]")
        return real_get(self, key)

    monkeypatch.setattr(threads, "decode_chunk_into", counting)
    monkeypatch.setattr(zarr.Array, "__getitem__", spy_get)
    assert tsconv.process(src, out, chunk=CHUNK, update=True).rows == 0
    assert reads == []
    monkeypatch.undo()
    g = zarr.open_group(str(src), mode="r+")
    g["values"][2000:2050] = x[2000:2050]  # the same rows, new files
    monkeypatch.setattr(threads, "decode_chunk_into", counting)
    monkeypatch.setattr(zarr.Array, "__getitem__", spy_get)
    assert tsconv.process(src, out, chunk=CHUNK, update=True).rows == 0
    assert any("values" in r for r in reads)  # the band's hash taken again from its rows


def test_an_output_whose_tail_hash_is_blake2b_still_updates_and_still_refuses_a_change(
    tmp_path: Path, out_chunks: None
) -> None:
    """Digests record the partial last band's hash with its algorithm; one recorded without (blake2b, as
    earlier outputs have it) is checked as blake2b: an append passes, a changed row is refused."""
    import hashlib
    import json

    x, t = ticks(3000, 3, seed=9)
    src = make_input(tmp_path / "in.zarr", x, t, 2050, (500, 3))  # band 4 (2000..2050) partial
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK)
    path = out / "values" / ".tsconv-input.json"
    doc = json.loads(path.read_text())
    assert doc["arrays"]["values"]["tail"]["algo"] == "sha256"
    rows = np.ascontiguousarray(zarr.open_group(str(src), mode="r")["values"][2000:2050])
    blake = hashlib.blake2b(rows.tobytes(), digest_size=16).hexdigest()
    doc["arrays"]["values"]["tail"] = {"start": 2000, "hash": blake}
    path.write_text(json.dumps(doc))
    old = tmp_path / "old.zarr"
    shutil.copytree(out, old)
    grow(src, x, t, 3000)
    assert tsconv.process(src, out, chunk=CHUNK, update=True).updated_from == 2050
    full = tmp_path / "full.zarr"
    tsconv.process(src, full, chunk=CHUNK)
    assert_same(out, full)
    g = zarr.open_group(str(src), mode="r+")
    g["values"][2049:2050] = np.asarray(g["values"][2049:2050]) + 1
    with pytest.raises(
        tsconv.TsconvError, match=re.escape("first at rows 2,000..2,500 (values chunk files)")
    ):
        tsconv.process(src, old, chunk=CHUNK, update=True)


# ------------------------------------------------------------------------------------- refusals


def _updated_once(tmp_path: Path) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    x, t = ticks(3000, 3, seed=5)
    src = make_input(tmp_path / "in.zarr", x, t, 2050, (500, 3))  # input band 4 (2000..2500) partial
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK)
    return src, out, x, t


def _snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "array, rows, refused",
    [
        ("values", (1200, 1201), "rows 1,000..1,500 (values chunk files)"),
        ("values", (2049, 2050), "rows 2,000..2,500 (values chunk files)"),  # in the partial band
        ("time", (10, 20), "rows 0..500 (time chunk files)"),
    ],
)
def test_update_refuses_a_change_in_rows_already_computed(
    tmp_path: Path, out_chunks: None, array: str, rows: tuple[int, int], refused: str
) -> None:
    src, out, x, t = _updated_once(tmp_path)
    grow(src, x, t, 3000)
    g = zarr.open_group(str(src), mode="r+")
    g[array][rows[0] : rows[1]] = np.asarray(g[array][rows[0] : rows[1]]) - 1
    before = _snapshot(out)
    with pytest.raises(tsconv.TsconvError) as err:
        tsconv.process(src, out, chunk=CHUNK, update=True)
    msg = str(err.value)
    assert f"cannot update {str(out)!r}: its input" in msg and f"first at {refused}" in msg
    assert "(up to row 2,050)" in msg and "hint: use --overwrite" in msg
    assert _snapshot(out) == before  # refused before anything was written


@pytest.mark.parametrize("damage", ["removed", "garbled", "emptied", "another document"])
def test_an_output_whose_input_digest_is_gone_is_refused_not_continued(
    tmp_path: Path, out_chunks: None, damage: str
) -> None:
    # its attributes say a digest was kept: without it a changed input row would be mixed in unnoticed
    src, out, x, t = _updated_once(tmp_path)
    digest = out / "values" / ".tsconv-input.json"
    if damage == "removed":
        digest.unlink()
    elif damage == "garbled":
        digest.write_text("{not json")
    else:  # JSON without the chunk files' digest: it was taken as "unchanged", mixing in a changed row
        digest.write_text("{}" if damage == "emptied" else '{"version": "1", "arrays": []}')
    grow(src, x, t, 3000)
    g = zarr.open_group(str(src), mode="r+")
    g["values"][2040:2041] = np.asarray(g["values"][2040:2041]) + 1  # a row the output holds
    before = _snapshot(out)
    for flags in ({"update": True}, {"resume": True}):
        with pytest.raises(tsconv.TsconvError) as err:
            tsconv.process(src, out, chunk=CHUNK, **flags)
        msg = str(err.value)
        assert "input digest (values/.tsconv-input.json) is missing or unreadable" in msg
        assert "first 2,050 rows" in msg and "hint: use --overwrite" in msg
    assert _snapshot(out) == before


def test_an_output_without_its_values_array_is_refused_in_one_line(tmp_path: Path, out_chunks: None) -> None:
    # a KeyError traceback at the CLI before
    src, out, _, _ = _updated_once(tmp_path)
    shutil.rmtree(out / "values")
    for flags in ({"update": True}, {"resume": True}):
        with pytest.raises(tsconv.StoreError, match="has no 'values' array: it cannot be continued"):
            tsconv.process(src, out, chunk=CHUNK, **flags)


def test_a_directory_where_the_kept_rows_go_leaves_the_run_whole(tmp_path: Path, out_chunks: None) -> None:
    # the kept rows are a shortcut for the next update: where they cannot be written the run still completes,
    # records no hash of them, and the update reads the input
    src, out, x, t = _updated_once(tmp_path)
    (out / "values" / TAIL_FILE).unlink()
    (out / "values" / TAIL_FILE).mkdir()
    grow(src, x, t, 2800)
    tsconv.process(src, out, chunk=CHUNK, update=True)
    assert "tail" not in read_digest(out)
    grow(src, x, t, 3000)
    tsconv.process(src, out, chunk=CHUNK, update=True)
    full = tmp_path / "full.zarr"
    tsconv.process(src, full, chunk=CHUNK)
    (full / "values" / TAIL_FILE).unlink()  # the full run kept its rows (and their hash): this one could not
    doc = read_digest(full)
    doc.pop("tail")
    write_digest(full, doc)
    assert_same(out, full)


def test_update_refuses_a_shrunken_input_and_another_pipeline_chunk_or_warmup(
    tmp_path: Path, out_chunks: None
) -> None:
    src, out, x, t = _updated_once(tmp_path)
    before = _snapshot(out)
    for kw in ({"chunk": 64}, {"warmup": "zero"}, {"pipeline": {"conv": [{"filters": ["ma:4"]}]}}):
        with pytest.raises(tsconv.TsconvError, match="different input, pipeline or chunk size"):
            tsconv.process(src, out, **{"chunk": CHUNK, **kw}, update=True)
    g = zarr.open_group(str(src), mode="r+")
    g["values"].resize((2000, 3))
    g["time"].resize((2000,))
    with pytest.raises(tsconv.TsconvError, match=re.escape("it holds 2,050 rows but its input")):
        tsconv.process(src, out, chunk=CHUNK, update=True)
    with pytest.raises(tsconv.TsconvError, match="now has 2,000: rows were removed"):
        tsconv.process(src, out, chunk=CHUNK, resume=True)
    assert _snapshot(out) == before


def test_an_update_refusal_names_what_differs(tmp_path: Path, out_chunks: None) -> None:
    # it said "a different input, pipeline or chunk size (or warm-up)" whatever changed
    x, t = ticks(3000, 3, seed=5)
    src = make_input(tmp_path / "in.zarr", x, t, 2050, (500, 3))
    a = tmp_path / "a.toml"
    a.write_text('[preprocess]\nzscore = 20\n\n[[conv]]\nfilters = ["id"]\n')
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline=a, chunk=CHUNK)
    grow(src, x, t, 2200)
    z30 = tmp_path / "z30.toml"
    z30.write_text(a.read_text().replace("zscore = 20", "zscore = 30"))
    other = shutil.copytree(src, tmp_path / "other.zarr")
    b = tmp_path / "b.toml"
    b.write_text(a.read_text())  # the same pipeline, under another file name
    for kw, said in (
        (
            {"chunk": 64},
            "what differs: chunk: 128 then, 64 now; hint: pass --chunk 128 as the output was written",
        ),
        ({"warmup": "zero"}, "what differs: warm-up: 'nan' then, 'zero' now;"),
        (
            {"pipeline": z30},
            "what differs: the pipeline's name: 'a' then, 'z30' now (the file's name unless the pipeline "
            'sets name = "..."); the pipeline\'s [preprocess] zscore: 20 then, 30 now; hint: use --overwrite',
        ),
        ({"src": other}, f"what differs: input: {str(src)!r} then, {str(other)!r} now;"),
        (
            {"pipeline": b},
            "what differs: the pipeline's name: 'a' then, 'b' now (the file's name unless the pipeline sets "
            'name = "..."); hint: if it computes the same, set name = "a" in the pipeline to continue it',
        ),
    ):
        kw = {"src": src, "pipeline": a, "chunk": CHUNK, **kw}
        with pytest.raises(tsconv.TsconvError, match="different input, pipeline or chunk size") as info:
            tsconv.process(kw.pop("src"), out, **kw, update=True)
        assert said in str(info.value)
    b.write_text('name = "a"\n' + a.read_text())
    assert tsconv.process(src, out, pipeline=b, chunk=CHUNK, update=True).updated_from == 2050
    # a refusal whose record holds no difference says what it said
    g = zarr.open_group(str(out), mode="r+")
    g.attrs["tsconv"] = {**g.attrs["tsconv"], "fingerprint": "0" * 64}
    with pytest.raises(tsconv.TsconvError) as info:
        tsconv.process(src, out, pipeline=a, chunk=CHUNK, update=True)
    assert str(info.value).endswith(
        "it was written by a different input, pipeline or chunk size (or warm-up); hint: use --overwrite to start "
        "again."
    )


def test_an_update_refusal_names_the_inputs_features_or_dtype(tmp_path: Path, out_chunks: None) -> None:
    """An append that renamed, added or retyped the input's features: the refusal named nothing, or blamed the
    pipeline's shape and weights (a bank's follow from the input's width)."""
    x, t = ticks(3000, 3, seed=6)
    out = tmp_path / "out.zarr"
    for change, said in (
        ("names", "what differs: the input's feature names (content): "),
        (
            "width",
            "what differs: the input's feature count: 3 then, 4 now; the input's feature names (content)",
        ),
        ("dtype", "what differs: the input's dtype: 'float32' then, 'float64' now; hint"),
    ):
        src = make_input(tmp_path / f"{change}.zarr", x, t, 2050, (500, 3))
        tsconv.process(src, out, chunk=CHUNK, overwrite=True)
        g = zarr.open_group(str(src), mode="r+")
        if change == "names":
            g.attrs["features"] = ["f1", "f0", "f2"]
        elif change == "width":
            g["values"].resize((2050, 4))
            g.attrs["features"] = ["f0", "f1", "f2", "f3"]
        else:
            v = g["values"][:]
            del g["values"]
            g.create_array("values", shape=v.shape, chunks=(500, 3), dtype="float64")[:] = v
        with pytest.raises(tsconv.TsconvError, match="different input, pipeline or chunk size") as info:
            tsconv.process(src, out, chunk=CHUNK, update=True)
        assert said in str(info.value) and "[[conv]]" not in str(info.value), str(info.value)


def test_resume_of_a_grown_input_finishes_the_rows_it_started_with_and_says_update_adds_the_rest(
    tmp_path: Path, out_chunks: None
) -> None:
    src, out, x, t = _updated_once(tmp_path)
    grow(src, x, t, 2400)
    with pytest.warns(tsconv.TsconvWarning, match="complete with the 2,050 rows .* 350 more since: --update"):
        assert tsconv.process(src, out, chunk=CHUNK, resume=True).rows == 0
    g = zarr.open_group(str(out), mode="r+")
    g.attrs["tsconv"] = {**g.attrs["tsconv"], "complete": False, "rows_done": 1152}  # an interrupted run
    with pytest.warns(tsconv.TsconvWarning, match="finished to the 2,050 rows"):
        assert tsconv.process(src, out, chunk=CHUNK, resume=True).total_rows == 2050
    assert tsconv.process(src, out, chunk=CHUNK, update=True).total_rows == 2400
    want = tmp_path / "want.zarr"
    tsconv.process(src, want, chunk=CHUNK)
    assert_same(out, want)


def test_update_refuses_parquet_and_combined_flags(tmp_path: Path) -> None:
    src, out, _, _ = _updated_once(tmp_path)
    with pytest.raises(tsconv.TsconvError, match="--update is not supported for Parquet output"):
        tsconv.process(src, tmp_path / "out.parquet", update=True)
    with pytest.raises(tsconv.TsconvError, match="resume=True and update=True exclude each other"):
        tsconv.process(src, out, resume=True, update=True)
    assert not (tmp_path / "out.parquet").exists()


def test_outputs_fingerprinted_with_the_input_rows_still_resume_and_update(
    tmp_path: Path, out_chunks: None
) -> None:
    # Outputs written before fingerprints left the input's rows out carry the older fingerprint.
    import tsconv.engine.outputs as outputs
    from tsconv.pipeline.spec import as_pipeline, resolve

    src, out, x, t = _updated_once(tmp_path)
    store = tsconv.open_input(src)
    old = outputs._fingerprint(store, resolve(as_pipeline(None), store.features), CHUNK, "nan", rows=2050)
    g = zarr.open_group(str(out), mode="r+")
    g.attrs["tsconv"] = {**g.attrs["tsconv"], "fingerprint": old}
    assert tsconv.process(src, out, chunk=CHUNK, resume=True).rows == 0
    grow(src, x, t, 3000)
    assert tsconv.process(src, out, chunk=CHUNK, update=True).updated_from == 2050
    want = tmp_path / "want.zarr"
    tsconv.process(src, want, chunk=CHUNK)
    assert_same(out, want)


def test_ingest_append_then_update(tmp_path: Path, out_chunks: None) -> None:
    pl = pytest.importorskip("polars")
    x, t = ticks(2600, 3, seed=6)
    names = ["AAA", "BBB", "CCC"]

    def day(a: int, b: int, name: str) -> str:
        frame = pl.DataFrame({"time": t[a:b], **{n: x[a:b, j] for j, n in enumerate(names)}})
        frame.write_parquet(tmp_path / name)
        return str(tmp_path / name)

    src, out, want = tmp_path / "ticks.zarr", tmp_path / "out.zarr", tmp_path / "want.zarr"
    tsconv.ingest([day(0, 1703, "d1.parquet")], src, layout="wide")
    tsconv.process(src, out, chunk=CHUNK)
    tsconv.ingest([day(1703, 2600, "d2.parquet")], src, layout="wide", append=True)
    assert tsconv.process(src, out, chunk=CHUNK, update=True).updated_from == 1703
    tsconv.process(src, want, chunk=CHUNK)
    assert_same(out, want)


# ------------------------------------------------------------------------------------ crashes


def test_an_update_stopped_at_every_change_is_finished_by_the_next(tmp_path: Path, out_chunks: None) -> None:
    """A kill at each file-system change of an update (the run raising there, in-process), then ``--update``
    or ``--resume`` again: the output never reads as complete with rows missing, and ends as a full run's."""
    from tests.io import crashpoints
    from tsconv import config

    class Stop(BaseException):
        """The run dying here (no ``except Exception`` handles it)."""

    x, t = ticks(3000, 3, seed=8)
    src = make_input(tmp_path / "in.zarr", x, t, 2050, (500, 3))
    first, out, want = tmp_path / "first.zarr", tmp_path / "out.zarr", tmp_path / "want.zarr"
    tsconv.process(src, first, chunk=CHUNK)  # the output before the update, restored for each kill
    grow(src, x, t, 2900)
    tsconv.process(src, want, chunk=CHUNK)
    with config.override(write_threads=0):
        shutil.copytree(first, out)
        log, undo = crashpoints.install_fs(10**9, lambda what: None)
        try:
            tsconv.process(src, out, chunk=CHUNK, update=True)
        finally:
            undo()
        changes = len(log)
        assert changes > 8
        # after the digest, the mark (incomplete, new rows), each array's new shape, the first chunks, and
        # the complete mark (the slow kill -9 test below lands anywhere)
        for at in (0, 1, 2, 3, 5, 6, changes - 2):
            shutil.rmtree(out)
            shutil.copytree(first, out)

            def stop(what: str) -> None:
                raise Stop

            _, undo = crashpoints.install_fs(at, stop)
            try:
                with pytest.raises(Stop):
                    tsconv.process(src, out, chunk=CHUNK, update=True)
            finally:
                undo()
            meta = zarr.open_group(str(out), mode="r").attrs["tsconv"]
            if meta["complete"]:  # the old output untouched, or the update's last change made
                rows = int(zarr.open_group(str(out), mode="r")["values"].shape[0])
                assert meta["rows"] == meta["rows_done"] == rows and rows in (2050, 2900), at
            else:  # refused as an input: it never reads as complete
                with pytest.raises(tsconv.TsconvError, match="unfinished"):
                    tsconv.open_input(out)
            report = tsconv.process(src, out, chunk=CHUNK, resume=at % 2 == 1, update=at % 2 == 0)
            if at % 2 == 0 and not meta["complete"]:
                # an update finishing one that grew the output says where its rows were done, not the grown
                # size (it said "updated from 2,900 rows")
                assert report.updated_from == (meta["rows_done"] if meta["rows"] == 2900 else 2050), (
                    at,
                    meta,
                )
            if at % 2:  # a resume finishes the rows the update set out to write; an update adds the rest
                tsconv.process(src, out, chunk=CHUNK, update=True)
            assert_same(out, want)


def _killed_midway(args: list[str], out: Path) -> int | None:
    """Run the CLI and kill it (SIGKILL, its whole process group) once the output is marked incomplete and
    its ``rows_done`` has advanced past the first value seen; the rows_done then, or None if it finished."""
    import os
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    first, deadline = None, time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            meta = zarr.open_group(str(out), mode="r").attrs["tsconv"]
        except Exception:  # being replaced this instant
            meta = None
        if meta is not None and not meta["complete"]:
            first = meta["rows_done"] if first is None else first
            if meta["rows_done"] > first:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return int(zarr.open_group(str(out), mode="r").attrs["tsconv"]["rows_done"])
        time.sleep(0.002)
    _, err = proc.communicate()
    assert proc.returncode == 0, err.decode()
    return None


@pytest.mark.slow
def test_kill_9_during_updates_then_update_or_resume_gives_a_full_runs_output(tmp_path: Path) -> None:
    """The CLI killed with SIGKILL mid-update, then a ``--resume`` killed mid-way, then ``--update``, as
    the input grows twice: the end is the full run's output, and nothing is left beside it."""
    import subprocess
    import sys

    # 48 features: output chunks of 17,408 rows, so rows_done moves several times in each run, which the kills
    # wait for (with 24, a run of banks, several chunks a backend call, often finished before a second move)
    x, t = ticks(160_000, 48, seed=9)
    src = make_input(tmp_path / "in.zarr", x, t, 40_000, (5000, 48))
    out, want = tmp_path / "out.zarr", tmp_path / "want.zarr"
    cli = [sys.executable, "-m", "tsconv", "process", "--input", str(src), "--output", str(out), "-q"]
    cli += ["--chunk", "512"]
    subprocess.run(cli, check=True, capture_output=True)
    seen = []
    for rows in (100_001, 160_000):
        grow(src, x, t, rows)
        seen += [_killed_midway([*cli, "--update"], out), _killed_midway([*cli, "--resume"], out)]
        subprocess.run([*cli, "--update"], check=True, capture_output=True)
    assert sum(r is not None for r in seen) >= 3, f"kills did not land mid-run often enough: {seen}"
    tsconv.process(src, want, chunk=512)
    assert_same(out, want)
    assert not list(tmp_path.glob(".*.tsconv-*"))  # no store being created, no lock file


# ------------------------------------------------------------------------------------------ the CLI


def test_cli_update_says_so_on_one_line_and_refuses_on_one(tmp_path: Path, out_chunks: None) -> None:
    from click.testing import CliRunner

    from tsconv.cli import main

    src, out, x, t = _updated_once(tmp_path)

    def run(*flags: str) -> object:
        return CliRunner().invoke(
            main, ["process", "-i", str(src), "-o", str(out), "--chunk", str(CHUNK), "-q", *flags]
        )

    res = run("--update")
    assert res.exit_code == 0, res.output
    assert res.stdout == f"{out} is up to date with its input (2,050 rows); nothing to do.\n"
    grow(src, x, t, 2500)
    res = run("--update")
    assert res.exit_code == 0 and "(updated from 2,050 rows, computed from row 2,048)" in res.stdout
    g = zarr.open_group(str(src), mode="r+")
    g["values"][5:6] = 1.0
    res = run("--update")
    assert res.exit_code == 2 and res.stdout == "" and len(res.stderr.splitlines()) == 1
    assert res.stderr.startswith(f"tsconv: error: cannot update {str(out)!r}: its input ")
    assert (
        "first at rows 0..500 (values chunk files)" in res.stderr and "; hint: use --overwrite" in res.stderr
    )
    res = run("--update", "--resume")
    assert res.exit_code == 2 and "--resume and --update exclude each other" in res.stderr
    assert "--update" in CliRunner().invoke(main, ["process", "--help"]).stdout


def test_an_input_written_again_whole_is_refused_saying_how_to_grow_it_instead(tmp_path: Path) -> None:
    """A store written again whole each day (the same rows and more) reads as changed, as the digest holds its
    chunk files' stats: the refusal said only that the input changed, which the user knew it had not; it says
    why such a store counts as changed and how to grow one that --update continues."""
    from click.testing import CliRunner

    from tsconv.cli import main

    x, t = ticks(700, 3, seed=6)
    src, out = make_input(tmp_path / "in.zarr", x, t, 600, (100, 3)), tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK, device="cpu")
    shutil.rmtree(src)
    make_input(src, x, t, 700, (100, 3))  # the same 600 rows, then 100 more
    res = CliRunner().invoke(
        main, ["process", "-i", str(src), "-o", str(out), "--chunk", str(CHUNK), "-q", "--update"]
    )
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1, res.output
    assert "first at rows 0..100 (values chunk files)" in res.stderr
    assert (
        "; hint: use --overwrite to compute the output again from the current input; chunk files written again "
        in res.stderr
    )
    assert "grow the input in place instead" in res.stderr and 'append_dim="time"' in res.stderr


@pytest.mark.parametrize("verb", ["--update", "--resume"])
def test_an_output_path_naming_a_store_tsconv_did_not_write_is_refused_as_such(
    tmp_path: Path, verb: str
) -> None:
    """--output naming another zarr store (a typo, another input) was refused as "written by a different input,
    pipeline or chunk size", with the hint --overwrite that deletes that store (a bare array: zarr's "An array
    already exists in store"); the refusal says the store is not tsconv's and names --output."""
    from click.testing import CliRunner

    from tsconv.cli import main

    x, t = ticks(300, 3, seed=5)
    src = make_input(tmp_path / "in.zarr", x, t, 300, (100, 3))
    other = make_input(tmp_path / "other.zarr", x, t, 300, (100, 3))
    bare = tmp_path / "bare.zarr"
    zarr.create_array(str(bare), shape=(10, 3), dtype="f4")
    for out, why in ((other, "its attributes hold no 'tsconv' record"), (bare, "a zarr array, not a group")):
        before = sorted(p.relative_to(out) for p in out.rglob("*"))
        res = CliRunner().invoke(main, ["process", "-i", str(src), "-o", str(out), "-q", verb])
        assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1, res.output
        assert res.stderr.startswith(
            f"tsconv: error: cannot {verb[2:].replace('resume', 'resume into')} {str(out)!r}: "
        )
        assert f": it is not an output of tsconv ({why}); hint: check --output" in res.stderr, res.stderr
        assert "different input" not in res.stderr and "check --output" in res.stderr
        assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # untouched


@pytest.mark.parametrize("kept", [True, False], ids=["input-rows-kept", "no-input-rows-kept"])
def test_an_update_starts_from_the_recorded_fill_state_not_from_row_0(
    tmp_path: Path, out_chunks: None, monkeypatch: pytest.MonkeyPatch, kept: bool
) -> None:
    """A run records the fill state at its last row beside the input digest; an update of an input with a
    symbol not listed yet reads no rows far before its restart (without the record its walk went back to
    row 0 every update), and still equals a full run bit for bit. With the input rows kept with the output
    (and the fill state at their first row) it walks back through no rows at all."""
    import json

    x, t = ticks(6000, 4, seed=41)
    x[:, 3] = np.nan  # not listed yet
    x[:5900, 1] = np.nan  # listed in the appended rows
    src = make_input(tmp_path / "in.zarr", x, t, 5000, chunks=(500, 2))
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline="default", chunk=CHUNK, device="cpu")
    rec = json.loads((out / "values" / ".tsconv-input.json").read_text())["fill"]
    assert rec["row"] == 5000 and rec["state"][3] is None and rec["state"][1] is None
    assert rec["state"][0] == float(x[:5000, 0][~np.isnan(x[:5000, 0])][-1])
    grow(src, x, t, 6000)
    if not kept:
        (out / "values" / TAIL_FILE).unlink()
    lowest = spy_fill_walks(monkeypatch)
    tsconv.process(src, out, pipeline="default", chunk=CHUNK, device="cpu", update=True)
    restart = 5000 // (3 * CHUNK) * (3 * CHUNK)
    if kept:
        assert not lowest, lowest
    else:
        assert lowest and min(lowest) >= restart - 1000, min(lowest)
    monkeypatch.undo()
    full = tmp_path / "full.zarr"
    tsconv.process(src, full, pipeline="default", chunk=CHUNK, device="cpu")
    assert_same(out, full)
    assert json.loads((out / "values" / ".tsconv-input.json").read_text())["fill"]["row"] == 6000


def test_an_update_of_a_few_rows_counts_as_small_for_cuda_and_a_wide_one_does_not():
    """device auto sends an update's or resume's rows to the CPU only where they are few and cheap."""
    from tsconv.engine.run import SMALL_ROWS, small_for_cuda
    from tsconv.pipeline.spec import as_pipeline, pipeline_from_dict, resolve

    narrow = resolve(as_pipeline("default"), tuple(f"x{j}" for j in range(32)))
    assert small_for_cuda(narrow, 23_200)
    assert not small_for_cuda(narrow, SMALL_ROWS + 1)
    wide = resolve(as_pipeline("default"), tuple(f"x{j}" for j in range(1024)))
    assert not small_for_cuda(wide, 23_200)  # 5,120 outputs a row: the GPU
    rng = np.random.default_rng(0)
    dense = {
        "conv": [{"weights": rng.normal(size=(256, 64, 5))}],
        "head": {"weights": rng.normal(size=(256, 64))},
    }
    plan = resolve(pipeline_from_dict(dense), tuple(f"x{j}" for j in range(64)))
    assert small_for_cuda(plan, 1000) and not small_for_cuda(plan, 2000)  # 98,304 multiply-adds a row


def test_a_few_rows_under_device_auto_on_a_gpu_host_load_nothing_of_the_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An update of a few rows with device auto on a GPU host runs on the CPU from the start: no GPU
    start-up, not even CUDA's initialisation (torch.cuda.is_available), no Triton import, no CUDA plan (each
    cost a fresh process time the rows do not need); a wide update there still goes to the GPU, and where
    the driver lists a GPU that CUDA cannot start, to the CPU."""
    import torch

    from tsconv.engine import outputs, run
    from tsconv.kernels import early

    x, t = ticks(3200, 4, seed=5)
    src, out = make_input(tmp_path / "in.zarr", x, t, 2600, (256, 4)), tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline="default", chunk=CHUNK, device="cpu")
    grow(src, x, t, 3000)
    began: list[str] = []
    planned: list[str] = []
    asked: list[bool] = []
    real_plan = outputs.plan_run
    available = [True]
    monkeypatch.setattr(early, "gpu_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(True) or available[0])
    monkeypatch.setattr(run, "require_triton", lambda what: began.append(what))
    monkeypatch.setattr(outputs, "begin_cuda", lambda dev, **kw: began.append(str(dev)) or dev)
    monkeypatch.setattr(
        outputs, "plan_run", lambda *a, **kw: planned.append(str(kw["device"])) or real_plan(*a, **kw)
    )
    report = tsconv.process(src, out, pipeline="default", chunk=CHUNK, device="auto", update=True)
    assert (report.device, began, planned, asked) == ("cpu", [], ["cpu"], [])
    full = tmp_path / "full.zarr"
    tsconv.process(src, full, pipeline="default", chunk=CHUNK, device="cpu")
    assert_same(out, full)
    # many rows left, and CUDA does not start: the CPU computes them
    monkeypatch.setattr(outputs, "small_for_cuda", lambda plan, rows: False)
    available[0] = False
    grow(src, x, t, 3100)
    report = tsconv.process(src, out, pipeline="default", chunk=CHUNK, device="auto", update=True)
    assert (report.device, began, asked) == ("cpu", [], [True])
    tsconv.process(src, full, pipeline="default", chunk=CHUNK, device="cpu", overwrite=True)
    assert_same(out, full)
    # many rows left: the GPU's start-up begins before the plan (stopped there: this host has no GPU)
    available[0] = True
    monkeypatch.setattr(outputs, "plan_run", lambda *a, **kw: planned.append(str(kw["device"])) or 1 / 0)
    grow(src, x, t, 3200)
    with pytest.raises(ZeroDivisionError):
        tsconv.process(src, out, pipeline="default", chunk=CHUNK, device="auto", update=True)
    assert (began, planned[-1]) == (["cuda"], "cuda")


@pytest.mark.parametrize("kept", [True, False], ids=["input-rows-kept", "no-input-rows-kept"])
@pytest.mark.parametrize(
    "old, new",
    [(2300, 2450), (2300, 2750), (2500, 2620)],
    ids=["within-the-last-band", "into-the-next-band", "from-a-band-boundary"],
)
def test_an_update_decodes_each_input_chunk_once(
    tmp_path: Path, out_chunks: None, monkeypatch: pytest.MonkeyPatch, old: int, new: int, kept: bool
) -> None:
    """The checks of an update (the hash of the old last band's rows, which an append rewrites, and of the
    new last band's) read through the run's own reader, which then starts from the bands they decoded:
    each input chunk file is decoded once, none through zarr, and the output is a full run's. The input
    rows before the old end that the update reads (its restart's halo) come from the output, where the run
    before kept them: then no band before the old end's is decoded."""
    import collections

    import tsconv.io.readers.threads as threads

    x, t = ticks(new, 6, seed=43)
    src = make_input(tmp_path / "in.zarr", x, t, old, chunks=(500, 4))  # two chunk files per band
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline="default", chunk=CHUNK, device="cpu")
    grow(src, x, t, new)
    if not kept:
        (out / "values" / TAIL_FILE).unlink()
    decoded: collections.Counter[str] = collections.Counter()
    real_decode = threads.decode_chunk_into

    def counting(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        decoded[str(path)] += 1
        return real_decode(path, *args, **kwargs)

    through_zarr: list[str] = []
    real_get = zarr.Array.__getitem__

    def spy_get(self, key):  # noqa: ANN001, ANN202
        if self.path.endswith("values") and str(self.store_path).startswith(f"file://{src}"):
            through_zarr.append(repr(key))
        return real_get(self, key)

    monkeypatch.setattr(threads, "decode_chunk_into", counting)
    monkeypatch.setattr(zarr.Array, "__getitem__", spy_get)
    tsconv.process(src, out, pipeline="default", chunk=CHUNK, device="cpu", update=True)
    monkeypatch.undo()
    assert decoded and max(decoded.values()) == 1, decoded
    assert not through_zarr, through_zarr
    restart = old // (3 * CHUNK) * (3 * CHUNK)
    first = old // 500 if kept else (restart - 256) // 500  # the old end's band, or the restart's halo's
    assert len(decoded) == 2 * (new // 500 - first + 1)
    full = tmp_path / "full.zarr"
    tsconv.process(src, full, pipeline="default", chunk=CHUNK, device="cpu")
    assert_same(out, full)


def test_input_rows_kept_with_the_output_are_read_only_where_they_are_sound(
    tmp_path: Path, out_chunks: None
) -> None:
    """A CPU run keeps the input rows its next update reads before the output's end, and the fill state at
    the first of them, in the output (``values/.tsconv-tail.npz``); the update reads them from there (kept
    rows made wrong change its output), and where the file is damaged, holds a pickled object, ends elsewhere
    than the output's end, or was kept for another output, reads the input instead: a full run's output bit
    for bit each time."""
    x, t = ticks(3400, 4, seed=44)
    x[:, 2] = np.nan  # not listed yet
    src = make_input(tmp_path / "in.zarr", x, t, 3000, chunks=(700, 2))
    base = tmp_path / "base.zarr"
    tsconv.process(src, base, pipeline="default", chunk=CHUNK, device="cpu")
    kept = np.load(base / "values" / TAIL_FILE, allow_pickle=False)
    start = int(kept["start"])
    assert 3000 - 3 * CHUNK - 256 <= start < 3000 - 256
    np.testing.assert_array_equal(kept["rows"], x[start:3000])
    before = x[:start]
    last = [
        before[~np.isnan(before[:, j]), j][-1] if (~np.isnan(before[:, j])).any() else np.nan
        for j in range(4)
    ]
    np.testing.assert_array_equal(kept["state"], np.array(last, dtype=np.float64))
    grow(src, x, t, 3400)
    full = tmp_path / "full.zarr"
    tsconv.process(src, full, pipeline="default", chunk=CHUNK, device="cpu")

    def update_with(
        name: str, tail: bytes | None, *, hashed: InputTail | None = None, unhashed: bool = False
    ) -> Path:
        out = tmp_path / f"{name}.zarr"
        shutil.copytree(base, out)
        if tail is not None:
            (out / "values" / TAIL_FILE).write_bytes(tail)
        if hashed is not None or unhashed:
            doc = read_digest(out)
            doc.pop("tail")
            write_digest(out, doc if unhashed else {**doc, "tail": tail_digest(hashed)})
        tsconv.process(src, out, pipeline="default", chunk=CHUNK, device="cpu", update=True)
        return out

    def npz(**arrays: np.ndarray) -> bytes:
        import io

        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    assert_same(update_with("as_kept", None), full)
    owner = kept["fingerprint"]
    wrong = npz(
        start=np.int64(start), rows=kept["rows"] + np.float32(1), state=kept["state"], fingerprint=owner
    )
    made = InputTail(start, kept["rows"] + np.float32(1), kept["state"], str(owner))
    out = update_with("wrong_rows", wrong, hashed=made)
    assert (
        np.asarray(zarr.open_group(str(out))["values"][:]).tobytes()
        != np.asarray(zarr.open_group(str(full))["values"][:]).tobytes()
    )  # the kept rows are what the update read, where their hash is the one recorded
    pickled = npz(
        start=np.int64(start),
        rows=np.array([object()] * 4, dtype=object),
        state=kept["state"],
        fingerprint=owner,
    )
    elsewhere = npz(start=np.int64(start - 1), rows=kept["rows"], state=kept["state"], fingerprint=owner)
    # another output's file (another pipeline over the same input: its own fingerprint), rows and state made wrong
    other = tmp_path / "other.zarr"
    tsconv.process(src, other, pipeline="trend_ema", chunk=CHUNK, device="cpu")
    theirs = np.load(other / "values" / TAIL_FILE, allow_pickle=False)
    foreign = npz(
        start=np.int64(start),
        rows=kept["rows"] + np.float32(1),
        state=kept["state"],
        fingerprint=theirs["fingerprint"],
    )
    huge = io.BytesIO()  # a header declaring 10^12 rows (12 TB), followed by a few bytes
    with zipfile.ZipFile(huge, "w") as zf:
        for key, value in (("start", np.int64(start)), ("state", kept["state"]), ("fingerprint", owner)):
            part = io.BytesIO()
            np.save(part, value)
            zf.writestr(f"{key}.npy", part.getvalue())
        part = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            part, {"descr": "<f4", "fortran_order": False, "shape": (10**12, 4)}
        )
        zf.writestr("rows.npy", part.getvalue() + bytes(64))
    cases = (
        ("damaged", b"PK\x03\x04 not a zip"),
        ("huge", huge.getvalue()),  # was an 'out of host memory' error, its hint to lower --chunk
        ("pickled", pickled),
        ("elsewhere", elsewhere),
        ("foreign", foreign),
        ("rewritten", wrong),  # its metadata right, its rows not those whose hash was recorded
    )
    for name, tail in cases:
        assert_same(update_with(name, tail), full)
    assert_same(update_with("no_hash", None, unhashed=True), full)
    assert (full / "values" / TAIL_FILE).exists()  # every CPU run keeps its own


def test_an_output_of_the_old_zscore_arithmetic_is_not_continued(
    tmp_path: Path, out_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A [preprocess] z-score's arithmetic is part of the pipeline's fingerprint: rows computed by another
    arithmetic would differ in the last bits from this one's, so such an output is refused, not extended."""
    import tsconv.pipeline.spec as spec
    from tsconv.errors import StoreError

    x, t = ticks(1200, 4, seed=45)
    src = make_input(tmp_path / "in.zarr", x, t, 1000, chunks=(500, 2))
    old, plain = tmp_path / "old.zarr", tmp_path / "plain.zarr"
    monkeypatch.setattr(spec, "ZSCORE_ARITHMETIC", 1)
    tsconv.process(src, old, pipeline="returns_zscore", chunk=CHUNK, device="cpu")
    tsconv.process(src, plain, pipeline="default", chunk=CHUNK, device="cpu")
    monkeypatch.undo()
    grow(src, x, t, 1200)
    with pytest.raises(StoreError, match="overwrite"):
        tsconv.process(src, old, pipeline="returns_zscore", chunk=CHUNK, device="cpu", update=True)
    tsconv.process(
        src, plain, pipeline="default", chunk=CHUNK, device="cpu", update=True
    )  # no z-score: continued


def test_an_output_of_log_levels_rounded_before_the_stages_is_not_continued(
    tmp_path: Path, out_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """How log levels reach the first stage is part of the fingerprint: rows of the other arithmetic differ
    by up to 2.5e-3 of a difference's scale, so such an output is refused, not extended with mixed rows."""
    import tsconv.pipeline.spec as spec
    from tsconv.errors import StoreError

    x, t = ticks(1200, 4, seed=47)
    src = make_input(tmp_path / "in.zarr", x, t, 1000, chunks=(500, 2))
    log = {"preprocess": {"transform": "log"}, "conv": [{"filters": ["diff:1", "ma:8"]}]}
    returns = {"preprocess": {"transform": "log_return"}, "conv": [{"filters": ["diff:1", "ma:8"]}]}
    old, other = tmp_path / "old.zarr", tmp_path / "other.zarr"
    monkeypatch.setattr(spec, "LOG_ARITHMETIC", 1)
    tsconv.process(src, old, pipeline=log, chunk=CHUNK, device="cpu")
    tsconv.process(src, other, pipeline=returns, chunk=CHUNK, device="cpu")
    monkeypatch.undo()
    grow(src, x, t, 1200)
    with pytest.raises(StoreError, match="overwrite"):
        tsconv.process(src, old, pipeline=log, chunk=CHUNK, device="cpu", update=True)
    tsconv.process(src, other, pipeline=returns, chunk=CHUNK, device="cpu", update=True)  # continued


@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part")
@pytest.mark.parametrize("zarr_format", [3, 2])
def test_rows_appended_to_a_consolidated_store_without_consolidating_again_are_seen(
    tmp_path: Path, out_chunks: None, zarr_format: int
) -> None:
    # zarr's open reads a consolidated copy of the arrays' metadata; a writer that resizes and writes (and does
    # not consolidate again) left it stale, and --update said "up to date" with the new rows unread
    x, t = ticks(3000, 4, seed=46)
    src = tmp_path / "in.zarr"
    g = zarr.open_group(str(src), mode="w", zarr_format=zarr_format)
    g.create_array("values", data=x[:2500], chunks=(500, 4))
    g.create_array("time", data=t[:2500], chunks=(500,))
    g.attrs["features"] = [f"px_{j}" for j in range(4)]
    zarr.consolidate_metadata(str(src))
    out, full = tmp_path / "out.zarr", tmp_path / "full.zarr"
    tsconv.process(src, out, chunk=CHUNK, device="cpu")
    g = zarr.open_group(str(src), mode="r+", use_consolidated=False)
    g["values"].resize((3000, 4))
    g["values"][2500:] = x[2500:]
    g["time"].resize((3000,))
    g["time"][2500:] = t[2500:]
    assert zarr.open_group(str(src), mode="r")["values"].shape[0] == 2500  # the stale consolidated copy
    report = tsconv.process(src, out, chunk=CHUNK, device="cpu", update=True)
    assert report.total_rows == 3000 and report.rows > 500
    tsconv.process(src, full, chunk=CHUNK, device="cpu")
    assert_same(out, full)


def test_a_codec_other_than_the_outputs_is_refused_not_ignored(tmp_path: Path) -> None:
    # --update --compression lz4 on an output stored uncompressed ran, kept none and said nothing
    x, t = ticks(3000, 3, seed=5)
    src = make_input(tmp_path / "in.zarr", x, t, 2050, (500, 3))
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK, compression="none")
    grow(src, x, t, 3000)
    before = _snapshot(out)
    for flags in ({"update": True}, {"resume": True}):
        with pytest.raises(tsconv.TsconvError, match="--compression lz4: the output .* is stored with none"):
            tsconv.process(src, out, chunk=CHUNK, compression="lz4", **flags)
    assert _snapshot(out) == before
    for same in ("none", "auto", None):  # the output's own codec, or none asked: the update runs
        tsconv.process(src, out, chunk=CHUNK, compression=same, update=True)
    # an output smaller than one output chunk is built again by an update: with the codec it had (it came out
    # lz4, auto's choice, while the README says an update keeps the codec)
    small = tmp_path / "small.zarr"
    src2 = make_input(tmp_path / "in2.zarr", x, t, 2050, (500, 3))
    tsconv.process(src2, small, chunk=CHUNK, compression="none")
    grow(src2, x, t, 3000)
    report = tsconv.process(src2, small, chunk=CHUNK, update=True)
    assert report.compression == "none"


def _undecided_codec_case(tmp_path: Path) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    """A pipeline whose outputs lz4 does not compress (auto stores them uncompressed) over an input whose
    first 1,500 rows are all NaN (every output chunk before them is all NaN, so not stored): (input,
    pipeline file, x, t)."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "w.npy", rng.normal(size=(6, 4, 5)).astype(np.float32))
    np.save(tmp_path / "h.npy", rng.normal(size=(6, 3)).astype(np.float32))
    pipe = tmp_path / "zs.toml"
    pipe.write_text(
        '[preprocess]\nzscore = 20\n[[conv]]\nweights = "w.npy"\nactivation = "relu"\n'
        '[head]\nweights = "h.npy"\n'
    )
    x = rng.normal(size=(3000, 4)).astype(np.float32)
    x[:1500] = np.nan
    t = T0 + np.cumsum(rng.integers(1, 1000, size=3000)).astype(np.int64)
    return make_input(tmp_path / "in.zarr", x, t, 1000, (500, 4)), pipe, x, t


@pytest.mark.parametrize("how", ["update", "resume"])
def test_auto_compression_undecided_before_a_value_is_decided_as_one_run_decides_it(
    tmp_path: Path, out_chunks: None, how: str
) -> None:
    # auto chooses the codec at the first chunk holding a value; an output continued before one was stored
    # kept Blosc-LZ4 (-10% saved here) where one run over the same rows stores them uncompressed
    src, pipe, x, t = _undecided_codec_case(tmp_path)
    out, want = tmp_path / "out.zarr", tmp_path / "want.zarr"
    if how == "update":
        tsconv.process(src, out, pipeline=pipe, chunk=CHUNK, device="cpu")
        assert not (out / "values" / "c").exists()  # nothing stored, nothing chosen
        grow(src, x, t, 3000)
        report = tsconv.process(src, out, pipeline=pipe, chunk=CHUNK, device="cpu", update=True)
    else:  # a run stopped after its first three output chunks, all NaN
        grow(src, x, t, 3000)
        tsconv.process(src, out, pipeline=pipe, chunk=CHUNK, device="cpu")
        shutil.rmtree(out / "values" / "c")
        for f in (out / "time" / "c").iterdir():
            if int(f.name) >= 3:
                f.unlink()
        doc = out / "values" / "zarr.json"
        doc.write_text(re.sub(r'"clevel": 0', '"clevel": 5', doc.read_text()))
        g = zarr.open_group(str(out), mode="r+")
        g.attrs["tsconv"] = {**g.attrs["tsconv"], "complete": False, "rows_done": 3 * 3 * CHUNK}
        report = tsconv.process(src, out, pipeline=pipe, chunk=CHUNK, device="cpu", resume=True)
    full = tsconv.process(src, want, pipeline=pipe, chunk=CHUNK, device="cpu")
    assert full.compression.startswith("none (auto")
    assert report.compression == full.compression
    assert_same(out, want)
    assert (out / "values" / "zarr.json").read_bytes() == (want / "values" / "zarr.json").read_bytes()
    assert _snapshot(out / "values") == _snapshot(want / "values")


@pytest.mark.parametrize("flags", [{}, {"update": True}])
def test_an_input_changed_during_the_run_leaves_the_output_incomplete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out_chunks: None, flags: dict
) -> None:
    """`ingest --overwrite` of the input while `process` ran: the output was marked complete with values from
    the old store and time from the new. The input's digest is taken again before the output is marked."""
    import tsconv.engine.outputs as outputs

    x, t = ticks(3000, 3, seed=5)
    src = make_input(tmp_path / "in.zarr", x, t, 2050 if flags else 3000, (500, 3))
    out = tmp_path / "out.zarr"
    if flags:
        tsconv.process(src, out, chunk=CHUNK)
        grow(src, x, t, 3000)
    record_end = outputs._record_end

    def changing(*args, **kw):  # the rows are computed; the writer may still be writing
        g = zarr.open_group(str(src), mode="r+")
        g["values"][10:11] = np.asarray(g["values"][10:11]) + 1
        return record_end(*args, **kw)

    monkeypatch.setattr(outputs, "_record_end", changing)
    with pytest.raises(
        tsconv.TsconvError, match="changed while the output was computed, first at rows 0..500"
    ):
        tsconv.process(src, out, chunk=CHUNK, overwrite=not flags, **flags)
    assert not zarr.open_group(str(out), mode="r").attrs["tsconv"]["complete"]
    monkeypatch.setattr(outputs, "_record_end", record_end)
    tsconv.process(src, out, chunk=CHUNK, overwrite=True)  # computed again from the settled input
    assert zarr.open_group(str(out), mode="r").attrs["tsconv"]["complete"]


@pytest.mark.parametrize("output", ["out.zarr", "kept.zarr", "out.parquet"])
def test_an_input_replaced_between_its_opening_and_its_digest_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    """`ingest --overwrite` of the input landing after the run opened it (its features, rows and chunks read)
    but before the digest was taken: the output was marked complete, every column the new store's values
    under the old store's names (the digest, of the new files, matched again at the end)."""
    import os

    import tsconv.engine.outputs as outputs

    x, t = ticks(1000, 4, seed=5)
    src = make_input(tmp_path / "in.zarr", x, t, 1000, (500, 4))
    new = make_input(tmp_path / ".in.zarr.new", x[:, ::-1].copy(), t, 1000, (500, 4))
    zarr.open_group(str(new), mode="r+").attrs["features"] = ["sz_3", "px_2", "sz_1", "px_0"]
    out = tmp_path / output
    if output == "kept.zarr":
        tsconv.process(src, out, chunk=CHUNK, device="cpu")
    before = (out / "zarr.json").read_bytes() if output == "kept.zarr" else None
    digest = outputs.input_digest

    def swapped(store, **kw):  # the other process's renames, at this instant
        if new.exists():
            os.replace(src, tmp_path / ".in.zarr.old")
            os.replace(new, src)
        return digest(store, **kw)

    monkeypatch.setattr(outputs, "input_digest", swapped)
    with pytest.raises(tsconv.TsconvError, match="was replaced by another store after this run opened it"):
        tsconv.process(src, out, chunk=CHUNK, device="cpu", overwrite=output == "kept.zarr")
    if before is None:
        assert not out.exists()
    else:  # --overwrite's old output is kept
        assert (out / "zarr.json").read_bytes() == before


def test_a_datetime64_time_whose_last_chunk_is_partial_is_read_updated_and_guarded(tmp_path: Path) -> None:
    """Every run on a store whose time array is datetime64 with rows not a multiple of its chunk failed with
    a traceback (its last rows' hash asked numpy for a buffer datetime64 does not give)."""
    x, _ = ticks(1500, 2, seed=5)
    t = np.datetime64("2026-01-02T09:30", "ms") + np.arange(1500).astype("timedelta64[ms]") * 7
    src = tmp_path / "in.zarr"
    g = zarr.open_group(str(src), mode="w", zarr_format=3)
    g.create_array("values", data=x[:1001], chunks=(1001, 2))
    g.create_array("time", data=t[:1001], chunks=(1000,))
    g.attrs["features"] = ["a", "b"]
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK, device="cpu")
    tsconv.process(src, tmp_path / "out.parquet", chunk=CHUNK, device="cpu")
    grow(src, x, t, 1500)
    assert tsconv.process(src, out, chunk=CHUNK, device="cpu", update=True).updated_from == 1001
    want = tmp_path / "want.zarr"
    tsconv.process(src, want, chunk=CHUNK, device="cpu")
    assert_same(out, want)
    # no new rows, and the time of a row already computed moves
    g = zarr.open_group(str(src), mode="r+")
    g["time"][1400:1401] = g["time"][1400:1401] - np.timedelta64(1, "ms")
    with pytest.raises(tsconv.TsconvError, match="its input"):
        tsconv.process(src, out, chunk=CHUNK, device="cpu", update=True)


def test_an_update_tells_apart_weight_files_that_round_alike_and_continues_outputs_written_before(
    tmp_path: Path,
) -> None:
    # The level term uses the first stage's tap sums of the weights as given: a file swapped for one storing the
    # same float16 values computed other old rows, and --update mixed the two under one fingerprint.
    from tsconv.engine import outputs
    from tsconv.io.store import open_input
    from tsconv.pipeline.spec import load_pipeline, resolve

    x, t = ticks(3000, 3, seed=11)
    src = make_input(tmp_path / "in.zarr", x, t, 2000, chunks=(500, 3))
    w = np.random.default_rng(2).normal(size=(2, 3, 4)).astype(np.float32) * 0.3
    (tmp_path / "p.toml").write_text('[[conv]]\nweights = "w.npy"\n')
    np.save(tmp_path / "w.npy", w)
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline=tmp_path / "p.toml", chunk=CHUNK)
    before = out.with_name("before.zarr")
    shutil.copytree(out, before)
    grow(src, x, t, 2600)
    nudged = w.copy()
    nudged[0, 0, 0] = np.nextafter(w[0, 0, 0], np.float32(10))
    assert np.array_equal(nudged.astype(np.float16), w.astype(np.float16))
    np.save(tmp_path / "w.npy", nudged)
    with pytest.raises(tsconv.TsconvError, match="different input, pipeline"):
        tsconv.process(src, out, pipeline=tmp_path / "p.toml", chunk=CHUNK, update=True)
    # an output written before the tap sums entered the fingerprint is continued as it was
    np.save(tmp_path / "w.npy", w)
    plan = resolve(load_pipeline(tmp_path / "p.toml"), open_input(src).features)
    g = zarr.open_group(str(before), mode="r+")
    old = outputs._fingerprint(open_input(src), plan, CHUNK, "nan", with_sums=False)
    assert old != g.attrs["tsconv"]["fingerprint"]
    g.attrs["tsconv"] = {**g.attrs["tsconv"], "fingerprint": old}
    report = tsconv.process(src, before, pipeline=tmp_path / "p.toml", chunk=CHUNK, update=True)
    assert report.updated_from == 2000


def test_a_big_endian_stores_update_reads_the_rows_kept_with_the_output(
    tmp_path: Path, out_chunks: None
) -> None:
    """zarr 2 reads a big-endian store's rows in their stored order and the run kept them in native order, so the
    kept rows' check (same dtype as the input's) never passed there: every update decoded the input's old chunks
    again, the shortcut silently lost. The byte order is not a difference of values."""
    from tsconv.engine import outputs

    x, t = ticks(3400, 4, seed=45)
    src = tmp_path / "in.zarr"
    g = zarr.open_group(str(src), mode="w", zarr_format=2)
    g.create_array("values", data=x[:3000].astype(">f4"), chunks=(700, 2))
    g.create_array("time", data=t[:3000], chunks=(700,))
    g.attrs["features"] = [f"px_{j}" for j in range(4)]
    base = tmp_path / "base.zarr"
    tsconv.process(src, base, pipeline="default", chunk=CHUNK, device="cpu")
    g["values"].resize((3400, 4))
    g["values"][3000:] = x[3000:].astype(">f4")
    g["time"].resize((3400,))
    g["time"][3000:] = t[3000:]
    got: list[object] = []
    real = outputs.read_tail

    def spy(*args: object, **kwargs: object) -> object:
        got.append(real(*args, **kwargs))
        return got[-1]

    out = tmp_path / "out.zarr"
    shutil.copytree(base, out)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(outputs, "read_tail", spy)
        tsconv.process(src, out, pipeline="default", chunk=CHUNK, device="cpu", update=True)
    assert len(got) == 1 and got[0] is not None
    full = tmp_path / "full.zarr"
    tsconv.process(src, full, pipeline="default", chunk=CHUNK, device="cpu")
    assert_same(out, full)


def test_an_update_refusal_after_another_select_does_not_blame_the_inputs_names(
    tmp_path: Path, out_chunks: None
) -> None:
    """A pipeline whose [preprocess] select changed: the refusal said the input's feature names changed (the
    record hashes the names the pipeline reads, which follow the selection), while the store was as before."""
    x, t = ticks(3000, 3, seed=7)
    src = make_input(tmp_path / "in.zarr", x, t, 2050, (500, 3))
    out = tmp_path / "out.zarr"
    a = tmp_path / "a.toml"
    a.write_text('[[conv]]\nfilters = ["id"]\n')
    tsconv.process(src, out, pipeline=a, chunk=CHUNK)
    grow(src, x, t, 2200)
    a.write_text('[preprocess]\nselect = ["px_*"]\n\n[[conv]]\nfilters = ["id"]\n')
    with pytest.raises(tsconv.TsconvError, match="different input, pipeline or chunk size") as info:
        tsconv.process(src, out, pipeline=a, chunk=CHUNK, update=True)
    said = str(info.value)
    assert "what differs: the pipeline's [preprocess]: none then" in said, said
    assert "feature names" not in said, said


def test_an_update_refusal_shows_long_input_paths_whole(tmp_path: Path, out_chunks: None) -> None:
    # paths over 80 characters were cut at their end ("'/tmp/.../deep/other.… now"), where two inputs differ
    x, t = ticks(1200, 2, seed=3)
    deep = tmp_path / ("d" * 70)
    src = make_input(deep / "in.zarr", x, t, 1100, (500, 2))
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline="default", chunk=CHUNK)
    other = shutil.copytree(src, deep / "other.zarr")
    with pytest.raises(tsconv.TsconvError) as info:
        tsconv.process(other, out, pipeline="default", chunk=CHUNK, update=True)
    assert f"what differs: input: {str(src)!r} then, {str(other)!r} now;" in str(info.value)


@pytest.mark.parametrize("asked", [{}, {"chunk": 1024, "warmup": "zero"}])
def test_an_update_that_leaves_out_the_chunk_it_was_written_with_is_told_to_give_it(
    tmp_path: Path, out_chunks: None, asked: dict
) -> None:
    """An output written with --chunk 128 and updated without it was told only to use --overwrite (compute all of
    history again); the way on is the setting as written."""
    src, out, x, t = _updated_once(tmp_path)
    grow(src, x, t, 2300)
    with pytest.raises(tsconv.TsconvError) as err:
        tsconv.process(src, out, update=True, **asked)
    msg = str(err.value)
    assert "chunk: 128 then, 1024 now" in msg
    if asked:
        assert "hint: pass --chunk 128 --warmup nan as the output was written" in msg
        assert "(chunk=128, warmup='nan' in Python)" in msg
    else:
        assert "hint: pass --chunk 128 as the output was written (chunk=128 in Python) to continue it" in msg
    tsconv.process(src, out, update=True, chunk=CHUNK)  # as told: it continues
