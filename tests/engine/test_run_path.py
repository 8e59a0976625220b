"""One run path: every entry runs the engine the device calls for, with the reader a single process would use.

On the CPU the batched (CUDA) engine runs through the Triton interpreter when the ``engine`` setting asks
for it, which stands in for a CUDA device here: the same entries then must take the batched engine,
report its stages, and (for dask) decode on the GPU reader exactly where a single process does. The GPU
tests at the end check the same on CUDA with the default settings.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import zarr
from zarr.codecs import BloscCodec

import tsconv
from tsconv import config
from tsconv.engine.run import batched_on

from ..helpers import price_series, read_output, write_store

BANK = {"conv": [{"name": "bank", "filters": ["diff:1", "ma:4"], "weight_dtype": "float32"}]}
INTERPRETED = config.interpreted()
batched_cpu = pytest.mark.skipif(not INTERPRETED, reason="the batched engine runs on CPU only interpreted")


@pytest.fixture
def lz4_store(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A Blosc-LZ4 store (what the GPU reader decodes) with time."""
    x = price_series(1200, 5, seed=3, nan_fraction=0.02)
    src = write_store(tmp_path / "in.zarr", x, chunks=(200, 5))
    g = zarr.open_group(str(src), mode="a")
    del g["values"]
    g.create_array("values", data=x, chunks=(200, 5), compressors=BloscCodec(cname="lz4", shuffle="shuffle"))
    return src, x


def test_the_engine_follows_the_device_and_the_setting():
    assert batched_on(torch.device("cuda")) and not batched_on(torch.device("cpu"))
    with config.override(engine="batched"):
        assert batched_on(torch.device("cpu"))
    with config.override(engine="chunked"):
        assert not batched_on(torch.device("cuda"))


@batched_cpu
def test_parquet_output_runs_the_batched_engine_and_takes_its_options(lz4_store, tmp_path):
    src, _ = lz4_store
    plain = tsconv.process(src, tmp_path / "a.parquet", pipeline=BANK, device="cpu")
    assert plain.step_rows is None and plain.transfer is None  # the chunked engine
    with config.override(engine="batched"):
        r = tsconv.process(src, tmp_path / "b.parquet", pipeline=BANK, device="cpu", gpu_mem="64MB",
                           transfer="pageable")  # fmt: skip
    assert r.step_rows is not None and r.transfer == "pageable" and "compute" in r.stage_seconds
    a, b = pl.read_parquet(tmp_path / "a.parquet"), pl.read_parquet(tmp_path / "b.parquet")
    assert a.columns == b.columns
    np.testing.assert_allclose(b.drop("time").to_numpy(), a.drop("time").to_numpy(), rtol=1e-6, atol=1e-5)


@batched_cpu
def test_polars_frames_run_the_batched_engine(lz4_store):
    _, x = lz4_store
    frame = pl.DataFrame({"time": np.arange(x.shape[0]), **{f"x{j}": x[:, j] for j in range(x.shape[1])}})
    chunked = tsconv.features(frame, BANK, device="cpu", chunk=256)
    arrays = tsconv.features(x, BANK, device="cpu", chunk=256, names=[f"x{j}" for j in range(x.shape[1])])
    calls = []
    from tsconv.engine import run as run_module

    real = run_module.run_batched

    def spy(*args, **kw):
        calls.append(kw["step_rows"])
        return real(*args, **kw)

    with pytest.MonkeyPatch.context() as mp, config.override(engine="batched"):
        mp.setattr(run_module, "run_batched", spy)
        batched = tsconv.features(frame, BANK, device="cpu", gpu_mem="64MB")
    assert calls and calls[0] >= 1024
    assert batched.columns == chunked.columns and batched["time"].equals(chunked["time"])
    np.testing.assert_allclose(batched.drop("time").to_numpy(), chunked.drop("time").to_numpy(), rtol=1e-6,
                               atol=1e-5)  # fmt: skip
    np.testing.assert_array_equal(chunked.drop("time").to_numpy(), arrays)


@batched_cpu
@pytest.mark.slow
def test_dask_workers_decode_on_the_gpu_where_a_single_process_does(lz4_store, tmp_path):
    distributed = pytest.importorskip("distributed")
    src, _ = lz4_store
    with config.override(engine="batched"):
        single = tsconv.process(src, tmp_path / "single.zarr", pipeline=BANK, device="cpu", decode="gpu")
        cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                           dashboard_address=None)  # fmt: skip
        try:
            with distributed.Client(cluster) as client:
                dask = tsconv.process(src, tmp_path / "dask.zarr", pipeline=BANK, device="cpu", decode="gpu",
                                      client=client)  # fmt: skip
        finally:
            cluster.close()
    assert single.reader == "gpu" and dask.reader == "gpu"  # the workers got the option and the settings
    np.testing.assert_allclose(read_output(tmp_path / "dask.zarr"), read_output(tmp_path / "single.zarr"),
                               rtol=1e-6, atol=1e-5)  # fmt: skip


@pytest.mark.gpu
def test_on_cuda_parquet_frames_and_dask_take_the_batched_engine_and_the_gpu_reader(lz4_store, tmp_path):
    src, x = lz4_store
    r = tsconv.process(src, tmp_path / "a.parquet", pipeline=BANK)
    assert r.step_rows is not None and r.reader == "gpu"
    frame = pl.DataFrame({f"x{j}": x[:, j] for j in range(x.shape[1])})
    y = tsconv.features(frame, BANK)
    np.testing.assert_allclose(y.to_numpy(), pl.read_parquet(tmp_path / "a.parquet").drop("time").to_numpy(),
                               rtol=1e-6, atol=1e-5)  # fmt: skip
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cl:  # fmt: skip
        with distributed.Client(cl) as client:
            d = tsconv.process(src, tmp_path / "d.zarr", pipeline=BANK, client=client)
    assert d.reader == "gpu"


def test_the_in_memory_entries_import_no_store_code() -> None:
    """A script on in-memory data does not pay for zarr, fsspec or the output writers (about 0.2 s of a
    fresh process on the 2-core VM)."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, tsconv\n"
        "x = np.cumsum(np.ones((600, 4), np.float32), axis=0)\n"
        "tsconv.features(x, device='cpu')\n"
        "tsconv.Stream('default', features=4, device='cpu').push(x[:300])\n"
        "print(sorted(m for m in ('zarr', 'fsspec', 'polars', 'tsconv.engine.outputs', 'tsconv.io.store',\n"
        "                         'tsconv.io.writers.zarr_writer') if m in sys.modules))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"


class _LzStore:
    """A source whose GPU reader's rings are given per batch (the planner's only view of them)."""

    rows, n_features, dtype, where, band_rows = 1 << 20, 64, np.dtype(np.float32), "the store", 16384

    def __init__(self, sizes: dict[int, int]) -> None:
        self.sizes = sizes

    def gpu_reader(self) -> tuple[dict[int, int], str | None]:
        return self.sizes, None


@pytest.mark.skipif(not INTERPRETED, reason="the batched engine's planner on the CPU needs the interpreter")
def test_the_gpu_reader_takes_the_largest_batch_whose_steps_keep_half_the_cpu_decoders_rows() -> None:
    from tsconv.engine.batched import plan_step_rows
    from tsconv.engine.run import CudaOptions, plan_run
    from tsconv.pipeline.spec import default_pipeline, resolve

    plan = resolve(default_pipeline(), [f"x{j}" for j in range(64)])
    budget = 300_000_000

    def steps(reader_bytes: int | None) -> int:
        return plan_step_rows(plan, src_features=64, src_itemsize=4, budget=budget, chunk=1024,
                              transfer="pinned", rows=1 << 20, reader_bytes=reader_bytes)  # fmt: skip

    cpu = steps(None)
    sizes = {8: 10**12, 4: 150_000_000, 2: 40_000_000, 1: 20_000_000}  # 8: does not fit at all
    assert steps(sizes[4]) * 2 < cpu <= steps(sizes[2]) * 2  # 4 fits, with too short steps; 2 keeps half
    with config.override(engine="batched"):
        rp = plan_run(_LzStore(sizes), plan, device=torch.device("cpu"), chunk=1024, warmup="nan",
                      cuda=CudaOptions("pinned", budget, "gpu"))  # fmt: skip
        assert (rp.gpu_reader, rp.gpu_batch, rp.step_rows) == (True, 2, steps(sizes[2]))
        assert rp.decode_note == "2 bands a launch"
        none_fit = plan_run(_LzStore({2: 10**12, 1: 150_000_000}), plan, device=torch.device("cpu"), chunk=1024,
                            warmup="nan", cuda=CudaOptions("pinned", budget, "gpu"))  # fmt: skip
        assert (none_fit.gpu_reader, none_fit.step_rows) == (False, cpu)
        assert "leave too little of --gpu-mem 0.30 GB" in none_fit.decode_note
