"""A/B of conv1d's weight cache on one case, same process: do_bench medians with the cache and without it.

python benchmarks/weight_cache_ab.py                # chunk batch [64, 1024, 1028] -> 256, K = 5, fp16 + tf32
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch
    from triton.testing import do_bench

    from tsconv.kernels import conv1d as c
    from tsconv.kernels.weight_cache import WeightCache

    x = torch.randn(64, 1028, 1024, device="cuda").transpose(1, 2)
    w = (torch.randn(256, 1024, 5, device="cuda") / 70).half()
    out = torch.empty(64, 1024, 256, device="cuda").transpose(1, 2)
    res = {}
    real_get = WeightCache.get
    for prec in ("fp16", "tf32"):
        c.conv1d(x, w, precision=prec, padding="valid", out=out)  # tune
        for mode in ("cache", "nocache", "cache2", "nocache2"):
            if mode.startswith("nocache"):
                WeightCache.get = lambda self, v, tag, build: build(v)
            else:
                WeightCache.get = real_get
            ms = do_bench(
                lambda p=prec: c.conv1d(x, w, precision=p, padding="valid", out=out), return_mode="median"
            )
            res[f"{prec}_{mode}"] = round(float(ms), 4)
            res[f"{prec}_config"] = c.last_launch.get("config")
    WeightCache.get = real_get
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
