"""The CUDA engine at real sizes: the prepare kernel, the engine against the CPU engine and float64, memory.

GPU only (``pytest -m gpu`` on a GPU machine); each test prints the figures it checked, so a run's log
records them.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

import tsconv
from tsconv.engine import devmem
from tsconv.engine.batched import parse_bytes
from tsconv.io.ffill import forward_fill
from tsconv.kernels.prepare import prepare
from tsconv.kernels.reference import pipeline_reference
from tsconv.pipeline.spec import BUILTIN_DIR, load_pipeline, resolve
from tsconv.synth import make_ticks

pytestmark = pytest.mark.gpu
PIPELINES = BUILTIN_DIR


def _col_rel(y: np.ndarray, ref: np.ndarray) -> float:
    """The largest |y - ref| relative to its column's largest |ref|."""
    ok = ~np.isnan(ref)
    scale = np.nanmax(np.abs(ref), axis=0, keepdims=True) + 1e-30
    return float(np.max(np.where(ok, np.abs(y.astype(np.float64) - ref) / scale, 0.0)))


@pytest.fixture(scope="module")
def ticks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ticks(tmp_path_factory.mktemp("gpu") / "ticks.zarr", rows=60_000, features=64, seed=0)


def test_the_prepare_kernel_equals_the_chunked_engines_arithmetic_bit_for_bit(ticks: Path) -> None:
    x = np.asarray(zarr.open_group(str(ticks), mode="r")["values"][:8000])
    dev = torch.device("cuda")
    n, halo = 5000, 4
    raw = x[1000 : 1000 + n]
    state0 = x[999].copy()
    state0[::7] = np.nan
    carry = x[995:999]
    filled, st = forward_fill(raw, state0.copy())
    lvl = state0.copy()
    for j in np.flatnonzero(np.isnan(lvl)):
        v = filled[np.isfinite(filled[:, j]), j]
        lvl[j] = v[0] if v.size else 0.0
    want = np.concatenate([carry, filled])  # the rows as they are: the level is the re-centring's fallback
    xc = torch.full((halo + n, raw.shape[1]), 123.0, device=dev)
    s_t, l_t = torch.from_numpy(state0.copy()).to(dev), torch.from_numpy(state0.copy()).to(dev)
    cin, cout = torch.from_numpy(carry.copy()).to(dev), torch.zeros((halo, raw.shape[1]), device=dev)
    r_t = torch.from_numpy(raw).to(dev)
    prepare(
        r_t[:1717], xc=xc, state=s_t, level=l_t, carry_in=cin, carry_out=cout, off=0, n_step=n, last=False
    )
    prepare(r_t[1717:], xc=xc, state=s_t, level=l_t, carry_in=cin, carry_out=cout, off=1717, n_step=n)
    np.testing.assert_array_equal(xc.cpu().numpy(), want)
    np.testing.assert_array_equal(s_t.cpu().numpy(), st)
    np.testing.assert_array_equal(l_t.cpu().numpy(), lvl)
    np.testing.assert_array_equal(cout.cpu().numpy(), filled[-halo:])


@pytest.mark.parametrize("name", ["default", "trend_ema", "multiscale", "dense_head", "returns_zscore"])
def test_the_cuda_engine_matches_the_cpu_engine_and_float64(ticks: Path, tmp_path: Path, name: str) -> None:
    g = zarr.open_group(str(ticks), mode="r")
    x, names = np.asarray(g["values"][:]), list(g.attrs["features"])
    pipe = load_pipeline(PIPELINES / f"{name}.toml")
    plan = resolve(pipe, names)
    ref = pipeline_reference(x, plan)
    errors = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for device, small in (("cpu", False), ("cuda", False), ("cuda", True)):
            label = device + ("_small_steps" if small else "")
            # small steps: 150 MB for torch beside what the process holds outside it now (--gpu-mem
            # counts both; the runs before loaded kernels the planning of this one sees)
            kw = {"gpu_mem": devmem.outside_torch(torch.device("cuda")) + 150_000_000} if small else {}
            out = tmp_path / f"{label}.zarr"
            report = tsconv.process(ticks, out, pipeline=pipe, device=device, **kw)
            y = np.asarray(zarr.open_group(str(out), mode="r")["values"][:])
            np.testing.assert_array_equal(np.isnan(y), np.isnan(ref), err_msg=f"{label}: NaN pattern")
            errors[label] = _col_rel(y, ref)
            if device == "cuda":
                held = (label, report.gpu_process_bytes, report.gpu_outside_torch_bytes,
                        report.peak_gpu_reserved_bytes)  # fmt: skip
                assert report.peak_gpu_reserved_bytes <= (150e6 if kw else 1.2e9), held
                assert report.gpu_process_bytes is None or report.gpu_process_bytes <= kw.get(
                    "gpu_mem", 1.2e9
                ), held
    print(f"{name}: error against float64, relative to each column's scale: {errors}")
    assert errors["cuda"] <= max(4 * errors["cpu"], 1e-6)
    assert errors["cuda_small_steps"] <= max(4 * errors["cpu"], 1e-6)


def test_a_wide_dense_job_matches_float64_within_its_budget(tmp_path: Path) -> None:
    """The e2e benchmark's kind of job, smaller: 65,536 x 1024 ticks, dense K=5 -> 256 (ReLU) -> head 64."""
    src = make_ticks(tmp_path / "wide.zarr", rows=65_536, features=1024, seed=3)
    rng = np.random.default_rng(5)
    np.save(
        tmp_path / "conv.npy", (rng.standard_normal((256, 1024, 5)) / np.sqrt(1024 * 5)).astype(np.float32)
    )
    np.save(tmp_path / "head.npy", (rng.standard_normal((256, 64)) / 16).astype(np.float32))
    pipe_path = tmp_path / "dense.toml"
    pipe_path.write_text(
        '[[conv]]\nweights = "conv.npy"\nactivation = "relu"\n[head]\nweights = "head.npy"\n'
    )
    pipe = load_pipeline(pipe_path)
    g = zarr.open_group(str(src), mode="r")
    prefix = 8192
    x = np.asarray(g["values"][:prefix])
    plan = resolve(pipe, list(g.attrs["features"]))
    ref = pipeline_reference(x, plan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = tsconv.process(src, tmp_path / "out.zarr", pipeline=pipe, device="cuda")
    y = np.asarray(zarr.open_group(str(tmp_path / "out.zarr"), mode="r")["values"][:prefix])
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    err = _col_rel(y, ref)
    print(f"wide dense: error {err:.2e}, reader {report.reader}, head {report.head_path}, "
          f"{report.peak_gpu_allocated_bytes / 1e6:.0f} / {report.peak_gpu_reserved_bytes / 1e6:.0f} MB")  # fmt: skip
    assert err < 1e-3  # FP16-stored weights as given: their rounding, not fp32's, bounds this
    assert report.peak_gpu_reserved_bytes <= 1.2e9


@pytest.mark.parametrize("share", ["250MB", "600MB"])
def test_a_cuda_run_keeps_allocated_and_reserved_memory_within_its_budget(tmp_path: Path, share: str) -> None:
    """--gpu-mem bounds the process: torch gets what its context and kernels leave (``share`` here)."""
    src = make_ticks(tmp_path / "in.zarr", rows=131072, features=512, seed=3)
    rng = np.random.default_rng(4)
    np.save(tmp_path / "conv.npy", (rng.standard_normal((128, 512, 5)) / 50).astype(np.float32))
    np.save(tmp_path / "head.npy", (rng.standard_normal((128, 32)) / 12).astype(np.float32))
    pipe = tmp_path / "p.toml"
    pipe.write_text('name = "p"\n\n[[conv]]\nname = "mix"\nweights = "conv.npy"\nactivation = "relu"\n\n'
                    '[head]\nweights = "head.npy"\n')  # fmt: skip
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()  # what other tests left in this process counts in the peaks
    budget = devmem.outside_torch(torch.device("cuda")) + parse_bytes(share)
    for _ in range(2):  # the second run finds the first one's cached blocks
        rep = tsconv.process(src, tmp_path / "o.zarr", pipeline=pipe, device="cuda", gpu_mem=budget,
                             overwrite=True)  # fmt: skip
        assert rep.peak_gpu_allocated_bytes - base <= parse_bytes(share), rep.peak_gpu_allocated_bytes
        assert rep.peak_gpu_reserved_bytes - base <= parse_bytes(share), rep.peak_gpu_reserved_bytes
        assert rep.gpu_outside_torch_bytes is not None and rep.gpu_outside_torch_bytes > 0
        assert rep.gpu_process_bytes is None or rep.gpu_process_bytes <= budget, (
            rep.gpu_process_bytes,
            budget,
        )
    assert rep.step_rows >= 1024


def test_features_on_cuda_writes_into_out() -> None:
    """``out=`` on the batched engine: its host blocks land in the caller's buffer, the same values as a new result."""
    rng = np.random.default_rng(8)
    x = (100 + np.cumsum(rng.integers(-1, 2, size=(40_000, 12)), axis=0) * 0.01).astype(np.float32)
    want = tsconv.features(x, device="cuda")
    buf = np.full(want.shape, 12345.0, np.float32)
    assert tsconv.features(x, device="cuda", out=buf) is buf
    np.testing.assert_array_equal(buf, want)


def test_a_big_endian_zarr_2_store_on_cuda_equals_the_cpu_engine(tmp_path: Path) -> None:
    """zarr 2 hands out '>f4' rows as stored; the CUDA run (batched engine, CPU reader: not Blosc-LZ4) swaps them
    to native order as it reads, and gives the CPU engine's values."""
    rng = np.random.default_rng(5)
    x = (100 + np.cumsum(rng.integers(-1, 2, size=(20_000, 6)), axis=0) * 0.01).astype(np.float32)
    x[:300, 2] = np.nan  # a symbol that starts late
    g = zarr.open_group(str(tmp_path / "in.zarr"), mode="w", zarr_format=2)
    g.create_array("values", data=x.astype(">f4"), chunks=(4096, 6))
    g.create_array("time", data=np.arange(20_000, dtype=np.int64) * 1_000_000_000, chunks=(4096,))
    g.attrs["features"] = [f"f{i}" for i in range(6)]
    cpu = tsconv.process(tmp_path / "in.zarr", tmp_path / "cpu.zarr", device="cpu")
    gpu = tsconv.process(tmp_path / "in.zarr", tmp_path / "gpu.zarr", device="cuda")
    assert cpu.rows == gpu.rows == 20_000
    yc = np.asarray(zarr.open_group(str(tmp_path / "cpu.zarr"), mode="r")["values"][:])
    yg = np.asarray(zarr.open_group(str(tmp_path / "gpu.zarr"), mode="r")["values"][:])
    np.testing.assert_array_equal(np.isnan(yc), np.isnan(yg))
    rel = _col_rel(yg, yc.astype(np.float64))
    print(f"big-endian store: cuda vs cpu max column-relative difference {rel:.2e}")
    assert rel < 1e-5


@pytest.mark.parametrize("taps", [[-0.5, 0.0, 0.5], [0.3, -0.1, -0.2]])
def test_prices_that_triple_within_a_step_and_symbols_listed_late_keep_their_digits_on_cuda(
    tmp_path: Path, taps: list[float]
) -> None:
    """A first stage of weights on float32 prices through the CUDA engine: a coin rising 4x within one step (its
    rows were centred in float32 on the step's level, 1.2e-5 of a difference's scale off on CPU tensors) and
    symbols listed inside a step (the blocks where they start fall back on the step's level) against float64."""
    rng = np.random.default_rng(7)
    rows, feats = 200_000, 8
    lp = np.log(1e-4) + np.cumsum(rng.normal(scale=2e-4, size=(rows, feats)), axis=0)
    lp[rows // 2 :] += np.linspace(0.0, np.log(9.0), rows - rows // 2)[:, None]  # 4x within a 65,536-row step
    x = (np.round(np.exp(lp) / 1e-9) * 1e-9).astype(np.float32)
    assert (x.max(axis=0) > 5 * x.min(axis=0)).all()  # the premise: far from any one level
    for j, start in enumerate([0, 0, 777, 5_000, 70_001, 100_003, 0, 0]):
        x[:start, j] = np.nan
    w = np.zeros((feats, 1, len(taps)))
    w[:, 0, :] = taps
    pipe = {"weight_dtype": "float32", "conv": [{"weights": w, "groups": feats}]}
    got = tsconv.features(x, pipe, device="cuda").astype(np.float64)
    xd, k = x.astype(np.float64), len(taps)
    want = sum(t * np.concatenate([np.full((k - 1 - j, feats), np.nan), xd[: rows - (k - 1 - j)]]) for j, t in
               enumerate(taps))  # fmt: skip
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    err = _col_rel(got, want)
    print(f"taps {taps}: worst column {err:.2e} of its scale")
    assert err < 2e-6, err  # 8.1e-6 before (centred on the step's level in float32), 5.7e-7 on an H100
