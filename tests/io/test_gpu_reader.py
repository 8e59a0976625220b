"""The GPU reader (tsconv.io.readers.gpu), run on CPU tensors through the Triton interpreter: bands decoded
"on the device" equal zarr's reads (whole and feature-split chunks, missing chunks, chunks the GPU does not
decode), damaged chunks raise, and the batched engine reading through it equals the chunked engine."""

from __future__ import annotations

import os
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import torch
import zarr
from zarr.codecs import BloscCodec

import tsconv
from tsconv.errors import StoreError
from tsconv.io.readers import gpu as gpudecode
from tsconv.io.readers.threads import ParallelBandReader

from ..helpers import mostly_slow, price_series, process_batched, read_output, write_store

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="the decode kernel runs on CPU only under the interpreter",
)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
LZ4 = BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")
BANK = {"conv": [{"name": "bank", "filters": ["diff:1", "diff:4", "dev:8"]}]}


def _store(path: Path, x: np.ndarray, chunks: tuple[int, int], **kw) -> zarr.Array:
    a = zarr.create_array(str(path), shape=x.shape, chunks=chunks, dtype=x.dtype, compressors=LZ4, **kw)
    a[:] = x
    return zarr.open_array(str(path), mode="r")


def _all_bands(r: gpudecode.GpuBandReader, *, bands: int = 1) -> np.ndarray:
    """Every row, read ``bands`` bands at a time (pieces never cross a batch's end, as the engine cuts them)."""
    parts = []
    b = 0
    n_bands = -(-r.rows // r.band_rows)
    while b < n_bands:
        e = min(b + bands, (b // r.batch + 1) * r.batch, n_bands)
        lo, hi = b * r.band_rows, min(r.rows, e * r.band_rows)
        view, ready = r.read_device(lo, hi)
        if ready is not None:
            ready.synchronize()
        parts.append(view.cpu().numpy().copy())
        r.release(b, None)
        b = e
    r.finish()
    return np.concatenate(parts)


@pytest.mark.parametrize("chunks", [(150, 6), (150, 4)], ids=["whole-rows", "features-split"])
@pytest.mark.slow
def test_bands_decoded_on_the_device_equal_zarr(tmp_path: Path, monkeypatch, chunks, file_reads) -> None:
    monkeypatch.setattr(gpudecode, "TARGET_WARPS", 8)  # small batches: the halves are reused
    x = price_series(700, 6, seed=1, nan_fraction=0.02).astype(np.float32)
    a = _store(tmp_path / "a.zarr", x, chunks)
    assert gpudecode.unsupported_reason(a) is None
    from tsconv.io.inspect import inspect_store

    assert inspect_store(tmp_path / "a.zarr", count_nans=False)["gpu_decoding"].startswith("yes: ")
    with gpudecode.GpuBandReader(a, device=DEVICE) as r:
        assert r.file_reads.startswith(file_reads)
        assert r.batch < 5  # several batches over the 5 bands
        got = _all_bands(r)
        np.testing.assert_array_equal(got, np.asarray(a[:]))
    with gpudecode.GpuBandReader(a, device=DEVICE) as r:  # whole batches per read (the engine's pieces)
        assert r.piece_bands == r.batch
        assert r.batch > 1 or chunks[1] < 6  # (whole rows: two bands per batch)
        np.testing.assert_array_equal(_all_bands(r, bands=r.batch), np.asarray(a[:]))
        with pytest.raises(ValueError, match="span batches"):
            r.read_device(0, (r.batch + 1) * r.band_rows)
        np.testing.assert_array_equal(r.read(140, 460), x[140:460])  # host reads for the start state


@pytest.mark.slow
def test_missing_chunks_and_chunks_the_gpu_does_not_decode(tmp_path: Path, monkeypatch, file_reads) -> None:
    monkeypatch.setattr(gpudecode, "TARGET_WARPS", 8)
    x = price_series(600, 6, seed=2).astype(np.float32)
    a = _store(tmp_path / "a.zarr", x, (150, 4), fill_value=np.nan)
    root = tmp_path / "a.zarr"
    (root / "c" / "1" / "0").unlink()  # missing: the fill value
    # band 2, columns 4..5: Blosc-zstd (decoded on the CPU, in the reading thread)
    chunk = np.full((150, 4), np.nan, dtype=np.float32)
    chunk[:, :2] = x[300:450, 4:6]
    (root / "c" / "2" / "1").write_bytes(numcodecs.Blosc(cname="zstd", shuffle=1).encode(chunk))
    want = np.asarray(zarr.open_array(str(root), mode="r")[:])
    assert np.isnan(want[150:300, :4]).all()
    with gpudecode.GpuBandReader(a, device=DEVICE) as r:
        np.testing.assert_array_equal(_all_bands(r), want)


def test_absent_chunks_of_a_uint64_array_whose_fill_value_is_above_int64(tmp_path: Path) -> None:
    """A uint64 store with fill value 2**64 - 1 and an absent chunk: the fill went to torch as a Python int,
    which it cannot take above 2**63 - 1 (ValueError: Overflow when unpacking long long)."""
    fill = np.iinfo(np.uint64).max
    # one band of two chunks of 32 x 4 values (the kernel decodes the first: interpreted, 8 programs a chunk)
    x = np.arange(32 * 6, dtype=np.uint64).reshape(32, 6)
    a = _store(tmp_path / "a.zarr", x, (32, 4), fill_value=fill)
    (tmp_path / "a.zarr" / "c" / "0" / "1").unlink()  # columns 4..5: the fill value
    want = np.asarray(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[:])
    assert (want[:, 4:] == fill).all() and (want[:, :4] == x[:, :4]).all()
    with gpudecode.GpuBandReader(a, device=DEVICE) as r:
        np.testing.assert_array_equal(_all_bands(r), want)


def test_a_damaged_chunk_raises_a_store_error(tmp_path: Path, file_reads) -> None:
    x = price_series(600, 6, seed=3).astype(np.float32)
    a = _store(tmp_path / "a.zarr", x, (150, 6))
    f = tmp_path / "a.zarr" / "c" / "2" / "0"
    data = bytearray(f.read_bytes())
    data[60:] = bytes(b ^ 0x5A for b in data[60:])  # the LZ4 streams scrambled, the header intact
    f.write_bytes(bytes(data))
    with gpudecode.GpuBandReader(a, device=DEVICE, where="ticks.zarr") as r:
        with pytest.raises(StoreError, match=r"rows 300..450 of ticks.zarr"):
            _all_bands(r)


@pytest.mark.parametrize("columns", [6, 4], ids=["whole-rows", "features-split"])
def test_an_empty_chunk_file_is_a_store_error_not_the_fill_value(tmp_path: Path, file_reads, columns) -> None:
    # a chunk file cut to 0 bytes (a crash before its data reached the disk) was taken for a missing chunk:
    # its rows read as the fill value (NaN), silently, where zarr and the CPU reader refuse it
    x = price_series(600, 6, seed=3).astype(np.float32)
    a = _store(tmp_path / "a.zarr", x, (150, columns))
    (tmp_path / "a.zarr" / "c" / "2" / "0").write_bytes(b"")
    with pytest.raises(StoreError, match=r"rows 300..450 of ticks.zarr"):
        ParallelBandReader(a, where="ticks.zarr").read(300, 450)
    with gpudecode.GpuBandReader(a, device=DEVICE, where="ticks.zarr") as r:
        with pytest.raises(
            StoreError, match=r"rows 300..450 of ticks.zarr: chunk file c/2/0 is empty \(0 bytes\)"
        ):
            _all_bands(r)


@pytest.mark.parametrize("change", mostly_slow(["shrinks", "vanishes"], fast=(0,)))
def test_a_chunk_file_that_changes_after_the_reader_opened(
    tmp_path: Path, monkeypatch, file_reads, change
) -> None:
    monkeypatch.setattr(gpudecode, "TARGET_WARPS", 8)  # batches of 2 bands: band 2's file is read later
    x = price_series(600, 6, seed=5).astype(np.float32)
    a = _store(tmp_path / "a.zarr", x, (150, 6))
    f = tmp_path / "a.zarr" / "c" / "2" / "0"
    with gpudecode.GpuBandReader(a, device=DEVICE, where="ticks.zarr") as r:
        assert r.batch == 2
        if change == "shrinks":
            f.write_bytes(f.read_bytes()[:-10])
            why = r"rows 300..450 of ticks.zarr: chunk file 0 changed size while read"
        else:
            f.unlink()
            why = r"rows 300..450 of ticks.zarr: FileNotFoundError: \[Errno 2\] No such file"
        with pytest.raises(StoreError, match=why):
            _all_bands(r)


def test_what_the_gpu_reader_does_not_take(tmp_path: Path, monkeypatch) -> None:
    x = price_series(300, 4, seed=4).astype(np.float32)
    z = zarr.create_array(str(tmp_path / "z.zarr"), shape=x.shape, chunks=(100, 4), dtype=x.dtype)
    z[:] = x  # zarr's default codec: zstd
    assert "not Blosc" in gpudecode.unsupported_reason(zarr.open_array(str(tmp_path / "z.zarr"), mode="r"))
    b = zarr.create_array(str(tmp_path / "b.zarr"), shape=x.shape, chunks=(100, 4), dtype=x.dtype,
                          compressors=BloscCodec(cname="zstd", shuffle="shuffle"))  # fmt: skip
    b[:] = x
    assert "compressor code" in gpudecode.unsupported_reason(
        zarr.open_array(str(tmp_path / "b.zarr"), mode="r")
    )


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU engine run needs the interpreter"
)
@pytest.mark.slow
def test_the_batched_engine_through_the_gpu_reader_equals_the_chunked_engine(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(gpudecode, "TARGET_WARPS", 8)
    x = price_series(900, 6, seed=7, nan_fraction=0.03)
    src = write_store(tmp_path / "in.zarr", x, chunks=(150, 6))
    values = tmp_path / "in.zarr" / "values"
    g = zarr.open_group(str(tmp_path / "in.zarr"), mode="a")
    del g["values"]
    g.create_array("values", data=x.astype(np.float32), chunks=(150, 6), compressors=LZ4)
    assert values.exists()
    tsconv.process(src, tmp_path / "a.zarr", pipeline=BANK, device="cpu", chunk=128)
    opened = []
    real = gpudecode.GpuBandReader

    class Spy(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kw) -> None:
            super().__init__(*args, **kw)
            opened.append(self)

    monkeypatch.setattr(gpudecode, "GpuBandReader", Spy)
    c = process_batched(src, tmp_path / "c.zarr", pipeline=BANK, device="cpu", chunk=128, gpu_mem="80MB")
    assert not opened and c.reader == "threads"  # not asked for on the CPU: the CPU reader
    b = process_batched(src, tmp_path / "b.zarr", pipeline=BANK, device="cpu", chunk=128, gpu_mem="80MB",
                        decode="gpu")  # fmt: skip
    assert len(opened) == 1 and opened[0].bands_decoded == 6
    assert b.reader == "gpu" and b.stage_seconds["decode"] >= 0 and "decoded by gpu" in b.summary()
    with pytest.raises(tsconv.errors.TsconvError, match="decode must be one of gpu, cpu"):
        process_batched(src, tmp_path / "d.zarr", pipeline=BANK, device="cpu", decode="fpga")
    with pytest.raises(tsconv.errors.TsconvError, match="decode='gpu' does not apply to a run on the CPU"):
        tsconv.process(src, tmp_path / "d.zarr", pipeline=BANK, device="cpu", decode="gpu")
    ya, yb = read_output(tmp_path / "a.zarr"), read_output(tmp_path / "b.zarr")
    np.testing.assert_array_equal(np.isnan(ya), np.isnan(yb))
    np.testing.assert_allclose(yb, ya, rtol=1e-5, atol=1e-5)


def test_a_first_read_past_the_start_and_a_read_behind(tmp_path: Path, monkeypatch) -> None:
    """Resume starts the engine mid-store: the batch read at construction must not race the first batch
    asked for (same half of the ring); reading behind the decoded batches is refused."""
    monkeypatch.setattr(gpudecode, "TARGET_WARPS", 8)
    x = price_series(1200, 6, seed=9).astype(np.float32)
    a = _store(tmp_path / "a.zarr", x, (100, 6))
    with gpudecode.GpuBandReader(a, device=DEVICE) as r:
        assert r.batch == 2  # batches of bands {0, 1}, {2, 3}, ...: band 6 is in batch 3, whose host third is
        for b in (6, 7, 8, 9, 10, 11):  # batch 0's, read when the reader was made
            view, ready = r.read_device(b * 100, b * 100 + 100)
            if ready is not None:
                ready.synchronize()
            np.testing.assert_array_equal(view.cpu().numpy(), x[b * 100 : b * 100 + 100])
            r.release(b, None)
        with pytest.raises(ValueError, match="reads forward"):
            r.read_device(0, 100)
        r.finish()


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU engine run needs the interpreter"
)
@pytest.mark.slow
def test_a_budget_too_small_for_the_gpu_readers_rings_falls_back_to_the_cpu_reader(
    tmp_path: Path, monkeypatch
) -> None:
    x = price_series(900, 6, seed=8)
    g = zarr.open_group(str(tmp_path / "in.zarr"), mode="w")
    g.create_array("values", data=x.astype(np.float32), chunks=(150, 6), compressors=LZ4)
    g.attrs["features"] = [f"x{j}" for j in range(6)]
    kw = dict(pipeline=BANK, device="cpu", chunk=128, gpu_mem="80MB", overwrite=True, decode="gpu")
    assert process_batched(tmp_path / "in.zarr", tmp_path / "out.zarr", **kw).reader == "gpu"
    monkeypatch.setattr(gpudecode, "device_bytes", lambda array: {2: 2 * 10**12, 1: 10**12})
    report = process_batched(tmp_path / "in.zarr", tmp_path / "out.zarr", **kw)
    assert report.reader == "threads"
    assert "too little of --gpu-mem 0.08 GB" in report.decode_note


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU engine run needs the interpreter"
)
@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 2, 4])
def test_a_budget_too_small_for_the_largest_batch_decodes_fewer_bands_a_launch_on_the_gpu(
    tmp_path: Path, monkeypatch, batch: int
) -> None:
    """Rings that fit only at a smaller batch keep the GPU decoder (it used to hand the store to the CPU
    decoder), and the rows are those of the CPU decoder."""
    x = price_series(900, 6, seed=9)
    g = zarr.open_group(str(tmp_path / "in.zarr"), mode="w")
    g.create_array("values", data=x.astype(np.float32), chunks=(150, 6), compressors=LZ4)
    g.attrs["features"] = [f"x{j}" for j in range(6)]
    kw = dict(pipeline=BANK, device="cpu", chunk=128, gpu_mem="80MB", overwrite=True)
    cpu = process_batched(tmp_path / "in.zarr", tmp_path / "cpu.zarr", decode="cpu", **kw)
    assert cpu.reader == "threads" and cpu.decode_note is None
    real = gpudecode.device_bytes
    monkeypatch.setattr(
        gpudecode,
        "device_bytes",
        lambda array: {b: n if b <= batch else 10**12 for b, n in real(array).items()},
    )
    gpu = process_batched(tmp_path / "in.zarr", tmp_path / "gpu.zarr", decode="gpu", **kw)
    assert gpu.reader == "gpu" and gpu.decode_note == f"{batch} bands a launch"
    np.testing.assert_array_equal(read_output(tmp_path / "gpu.zarr"), read_output(tmp_path / "cpu.zarr"))


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU engine run needs the interpreter"
)
@pytest.mark.slow
def test_rows_from_a_damaged_chunk_never_reach_the_output(tmp_path: Path, monkeypatch) -> None:
    """The engine stops at a chunk that does not decode, and no row computed from it is written: the
    output thread checks the decode of a step's input before it hands the step's rows to the writer."""
    from tsconv.engine import batched
    from tsconv.io.writers import zarr_writer as writer_mod

    monkeypatch.setattr(gpudecode, "TARGET_WARPS", 8)  # batches of two 150-row bands
    monkeypatch.setattr(batched, "MAX_STEP_ROWS", 256)  # steps [0, 256), [256, 512), [512, 768), ...
    monkeypatch.setattr(writer_mod, "_TARGET_CHUNK_BYTES", 128 * 3 * 4)  # 128-row output chunks
    # On the CPU every decode has ended when it is launched, so the engine thread's own non-blocking checks
    # would catch the chunk before its rows are computed; on a GPU they usually find it still running.
    real_check = gpudecode.GpuBandReader._check_errors

    def as_on_a_gpu(self, *, wait_upto: float = -1) -> None:  # noqa: ANN001
        if wait_upto >= 0:
            real_check(self, wait_upto=wait_upto)

    monkeypatch.setattr(gpudecode.GpuBandReader, "_check_errors", as_on_a_gpu)
    x = price_series(900, 6, seed=8)
    src = write_store(tmp_path / "in.zarr", x, chunks=(150, 6))
    g = zarr.open_group(str(tmp_path / "in.zarr"), mode="a")
    del g["values"]
    g.create_array("values", data=x.astype(np.float32), chunks=(150, 6), compressors=LZ4)
    f = tmp_path / "in.zarr" / "values" / "c" / "4" / "0"  # rows 600..750, read by the third step
    data = bytearray(f.read_bytes())
    data[60:] = bytes(b ^ 0x5A for b in data[60:])
    f.write_bytes(bytes(data))
    out = tmp_path / "out.zarr"
    with pytest.raises(StoreError, match=r"rows 600..750"):
        process_batched(src, out, pipeline=BANK, device="cpu", chunk=128, decode="gpu")
    meta = zarr.open_group(str(out), mode="r").attrs["tsconv"]
    assert meta["complete"] is False and meta["rows_done"] <= 600
    stored = sorted(int(p.name) for p in (out / "values" / "c").iterdir())
    assert stored and max(stored) * 128 < 600  # no output chunk holding rows from 600 on was written


def test_a_blosc_typesize_other_than_the_values_is_decoded_on_the_cpu(tmp_path: Path) -> None:
    """zarr's BloscCodec(typesize=8) over float32 values: c-blosc splits each block into 8 streams, which the
    kernel (splitting by the values' 4 bytes) flagged as a damaged chunk: the run failed on a sound store."""
    x = price_series(600, 4, seed=11).astype(np.float32)
    codec = BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", typesize=8)
    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, chunks=(150, 4), dtype=x.dtype,
                          compressors=codec)  # fmt: skip
    a[:] = x
    a = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
    assert gpudecode.unsupported_reason(a) == "Blosc typesize 8 for 4-byte values"
    with gpudecode.GpuBandReader(a, device=DEVICE) as r:  # asked for anyway: each chunk decoded on the CPU
        np.testing.assert_array_equal(_all_bands(r), x)
