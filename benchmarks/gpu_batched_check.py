"""GPU check of the batched engine, piece by piece: prepare kernel, conv, whole engine, memory.

    python benchmarks/gpu_batched_check.py --out $OUT/gpu_batched_check.json [--rows 131072 --features 1024]

On a synthetic tick store (prices, heavy-tailed volumes, spreads, NaN gaps, late listings):
1. the prepare kernel on the GPU equals the chunked engine's numpy arithmetic bit for bit;
2. the first stage's conv (Triton "fp32") against float64 on the prepared input, per output channel;
3. the batched engine, the chunk-by-chunk GPU engine and the CPU engine against the float64 reference on
   a prefix, as the largest error relative to each output column's scale;
4. GPU memory: what each step holds (allocated after each stage of the first steps).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import zarr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from e2e import write_pipeline  # noqa: E402
from provenance import commit  # noqa: E402

import tsconv  # noqa: E402
from tsconv.engine.fill import forward_fill  # noqa: E402
from tsconv.kernels.prepare import prepare  # noqa: E402
from tsconv.kernels.reference import pipeline_reference  # noqa: E402
from tsconv.pipeline.spec import load_pipeline, resolve  # noqa: E402
from tsconv.synth import make_ticks  # noqa: E402

warnings.simplefilter("ignore")


def col_rel(y: np.ndarray, ref: np.ndarray) -> tuple[float, list[int]]:
    """max over elements of |y - ref| / max|ref column|, and where."""
    ok = ~np.isnan(ref)
    scale = np.nanmax(np.abs(ref), axis=0, keepdims=True) + 1e-30
    rel = np.where(ok, np.abs(y.astype(np.float64) - ref) / scale, 0.0)
    i = np.unravel_index(int(np.argmax(rel)), rel.shape)
    return float(rel[i]), [int(v) for v in i]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_batched_check.json")
    ap.add_argument("--rows", type=int, default=131072)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--prefix", type=int, default=20480)
    ap.add_argument("--work", default="/tmp/tsconv-bcheck")
    args = ap.parse_args()
    work = Path(args.work)
    src = work / f"ticks_{args.rows}x{args.features}.zarr"
    if not src.exists():
        make_ticks(src, rows=args.rows, features=args.features, seed=3)
    pipe = write_pipeline(work / "pipe", args.features)
    g = zarr.open_group(str(src), mode="r")
    names = list(g.attrs["features"])
    plan = resolve(load_pipeline(pipe), names)
    x = np.asarray(g["values"][: args.prefix])
    doc: dict = {"gpu": torch.cuda.get_device_name(0), "commit": commit(), "rows": args.rows,
                 "features": args.features, "prefix": args.prefix}  # fmt: skip
    dev = torch.device("cuda")

    # 1. prepare on the GPU vs numpy, two pieces, with a carry and a half-known state
    n, halo = 5000, 4
    raw = x[1000 : 1000 + n]
    state0 = x[999].copy()
    state0[::7] = np.nan
    carry = x[995:999]
    filled, st = forward_fill(raw, state0.copy())
    lvl = state0.copy()
    for j in np.flatnonzero(np.isnan(lvl)):
        v = filled[~np.isnan(filled[:, j]), j]
        lvl[j] = v[0] if v.size else 0.0
    want = np.concatenate([carry, filled]) - lvl
    xc = torch.full((halo + n, raw.shape[1]), 123.0, device=dev)
    s_t, l_t = torch.from_numpy(state0.copy()).to(dev), torch.from_numpy(state0.copy()).to(dev)
    cin, cout = torch.from_numpy(carry.copy()).to(dev), torch.zeros((halo, raw.shape[1]), device=dev)
    r_t = torch.from_numpy(raw).to(dev)
    prepare(
        r_t[:1717], xc=xc, state=s_t, level=l_t, carry_in=cin, carry_out=cout, off=0, n_step=n, last=False
    )
    prepare(r_t[1717:], xc=xc, state=s_t, level=l_t, carry_in=cin, carry_out=cout, off=1717, n_step=n)
    got = xc.cpu().numpy()
    doc["prepare"] = {
        "xc_equal": bool(np.array_equal(got, want, equal_nan=True)),
        "xc_max_abs_diff": float(np.nanmax(np.abs(got - want))),
        "state_equal": bool(np.array_equal(s_t.cpu().numpy(), st, equal_nan=True)),
        "level_equal": bool(np.array_equal(l_t.cpu().numpy(), lvl)),
        "carry_equal": bool(np.array_equal(cout.cpu().numpy(), filled[-halo:], equal_nan=True)),
    }
    print("prepare", doc["prepare"], flush=True)

    # 2. the conv alone on the prepared input (finite rows only)
    from tsconv.kernels.conv1d import conv1d

    layer = plan.layers[0]
    xin = torch.from_numpy(np.nan_to_num(want)).to(dev)
    w16 = torch.from_numpy(layer.weight).to(dev).half()
    y = conv1d(xin.T[None], w16, None, padding="valid", precision="fp32")[0].T
    y64 = torch.nn.functional.conv1d(xin.double().T[None], w16.double())[0].T
    y32 = torch.nn.functional.conv1d(xin.T[None], w16.float())[0].T
    e, where = col_rel(y.cpu().numpy(), y64.cpu().numpy())
    e32, _ = col_rel(y32.cpu().numpy(), y64.cpu().numpy())
    doc["conv"] = {"triton_fp32_col_rel": e, "where": where, "cudnn_fp32_col_rel": e32,
                   "abs_max": float((y.double() - y64).abs().max())}  # fmt: skip
    print("conv", doc["conv"], flush=True)

    # 3. engines on the store, against the float64 reference on the prefix
    ref = pipeline_reference(x, plan)
    res = {}
    for name, kw in (("batched", {}), ("batched_small_steps", {"gpu_mem": "200MB"}),
                     ("gpu_chunked", {"batched": False})):  # fmt: skip
        out = work / f"out_{name}.zarr"
        t0 = time.perf_counter()
        rep = tsconv.process(src, out, pipeline=pipe, device="cuda", overwrite=True, **kw)
        yv = np.asarray(zarr.open_group(str(out), mode="r")["values"][: args.prefix])
        e, where = col_rel(yv, ref)
        res[name] = {"col_rel": e, "where": where, "nan_equal": bool(np.array_equal(np.isnan(yv), np.isnan(ref))),
                     "seconds": time.perf_counter() - t0, "step_rows": rep.step_rows,
                     "peak_gpu": rep.peak_gpu_allocated_bytes}  # fmt: skip
        print(name, res[name], flush=True)
    yc = tsconv.features(x, load_pipeline(pipe), names=names, device="cpu")
    e, where = col_rel(yc, ref)
    res["cpu"] = {"col_rel": e, "where": where}
    print("cpu", res["cpu"], flush=True)
    doc["engines"] = res
    if res["batched"]["col_rel"] > 1e-3:
        i, j = res["batched"]["where"]
        doc["worst"] = {"row": i, "col": j, "ref": float(ref[i, j]), "cpu": float(yc[i, j])}

    # 4. memory per stage over the first steps
    from tsconv.engine import compute as be_mod

    marks: list = []
    orig = be_mod.Backend._conv

    def traced(self, x, layer, bias, **kw):  # noqa: ANN001, ANN202
        a = torch.cuda.memory_allocated()
        y = orig(self, x, layer, bias, **kw)
        torch.cuda.synchronize()
        marks.append({"before_conv": a, "after_conv": torch.cuda.memory_allocated(),
                      "peak": torch.cuda.max_memory_allocated(), "x_shape": list(x.shape)})  # fmt: skip
        return y

    be_mod.Backend._conv = traced
    try:
        rep = tsconv.process(src, work / "out_mem.zarr", pipeline=pipe, device="cuda", overwrite=True)
    finally:
        be_mod.Backend._conv = orig
    doc["memory"] = {"marks": marks[:4], "peak": rep.peak_gpu_allocated_bytes, "reserved": rep.peak_gpu_reserved_bytes,
                     "stage_seconds": rep.stage_seconds}  # fmt: skip
    print("memory", json.dumps(doc["memory"]), flush=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    ok = doc["prepare"]["xc_equal"] and res["batched"]["col_rel"] < 1e-4
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
