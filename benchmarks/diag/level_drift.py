"""A first stage of weights on drifting float32 prices and late listings, against float64 (GPU or CPU).

Claim measured: a first stage of weights keeps a difference's digits when a price moves far from the chunk's
or step's level within it, and where a symbol lists late (benchmarks/NOTES.md, "Precision", "Rows as they
are"). Run with another tree first on PYTHONPATH for its figures:

    python benchmarks/diag/level_drift.py OUT.json [cuda|cpu]
"""

import json
import sys
import time

import numpy as np

import tsconv

rng = np.random.default_rng(7)
rows, feats = 400_000, 16
lp = np.log(1e-4) + np.cumsum(rng.normal(scale=1e-3, size=(rows, feats)), axis=0)
lp[rows // 2 :] += np.linspace(0.0, np.log(3.0), rows - rows // 2)[:, None]
drift = (np.round(np.exp(lp) / 1e-9) * 1e-9).astype(np.float32)
lp2 = np.log(100) + np.cumsum(rng.normal(scale=1e-4, size=(rows, feats)), axis=0)
calm = (np.round(np.exp(lp2) / 0.01) * 0.01).astype(np.float32)
for x in (drift, calm):
    for j in range(0, feats, 3):
        x[: 777 + 9_011 * j, j] = np.nan


def ref(x, w):
    xd = x.astype(np.float64)
    o, c, k = w.shape
    out = np.zeros((rows, o))
    for j in range(k):
        sh = k - 1 - j
        xs = np.concatenate([np.full((sh, c), np.nan), xd[: rows - sh]])
        out += xs @ w[:, :, j].T
    return out


def rel(y, r):
    ok = ~np.isnan(r)
    scale = np.nanmax(np.abs(r), axis=0, keepdims=True) + 1e-30
    return float(np.max(np.where(ok, np.abs(y.astype(np.float64) - r) / scale, 0.0)))


wd = rng.normal(size=(16, feats, 5))
wd -= wd.mean(axis=(1, 2), keepdims=True)
wdiff = np.zeros((feats, 1, 3))
wdiff[:, 0] = [-0.5, 0.0, 0.5]
cases = {
    "dense_zero_sum_K5": {"weight_dtype": "float32", "conv": [{"weights": wd}]},
    "depthwise_diff2": {"weight_dtype": "float32", "conv": [{"weights": wdiff, "groups": feats}]},
}
device = sys.argv[2] if len(sys.argv) > 2 else "cuda"
res = {"tsconv": tsconv.__file__, "device": device, "results": []}
for data_name, x in (("coin_tripling", drift), ("calm_100", calm)):
    for name, pipe in cases.items():
        w = pipe["conv"][0]["weights"]
        if w.shape[1] == feats:
            r = ref(x, w)
        else:  # depthwise: each channel by its own taps
            r = np.concatenate([ref(x[:, [c]], w[[c]]) for c in range(feats)], axis=1)
        t = time.perf_counter()
        y = tsconv.features(x, pipe, device=device)
        s = time.perf_counter() - t
        nan_eq = bool((np.isnan(y) == np.isnan(r)).all())
        e = rel(y, r)
        res["results"].append(
            {"data": data_name, "pipeline": name, "rel_err": e, "nan_pattern_equal": nan_eq, "s": s}
        )
        print(data_name, name, f"{e:.3e}", nan_eq, f"{s:.2f}s", flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
