"""Store c's output encoded on the GPU against c-blosc on the host, in the same call: fresh `tsconv process`
runs taking turns (``TSCONV_GPU_ENCODE=1`` / ``0``), each with a bare start-up measured beside it, the two
outputs compared bit for bit (their first and last 131,072 rows), and polars' same features once.

Claim measured: encoding the default bank's 4 GB of LZ4 output on the GPU takes the run off the host's CPU
(benchmarks/NOTES.md, "Chunks encoded on the GPU"). A diagnostic beside benchmarks/cli.py, not its record.

    python benchmarks/diag/gpu_encode_ab.py   # writes $OUT/ab.json
"""

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import zarr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402

work = Path("/tmp/w")
work.mkdir(exist_ok=True)
stores = cli.write_stores(work, ["c"])
src, cache = stores["c"], work / "cache"
res = {"runs": []}
out = Path(os.environ["OUT"], "ab.json")
for pipe in ("default", "trend_ema"):
    os.environ["TSCONV_GPU_ENCODE"] = "1"
    r = cli.tsconv_run(src, work / "warm.zarr", pipe, work, cache)
    print("warm", pipe, round(r["wall_s"], 2), round(r["report_s"], 3), r["step_rows"], flush=True)
    for name in ("gpu", "cpu", "gpu", "cpu"):
        os.environ["TSCONV_GPU_ENCODE"] = "1" if name == "gpu" else "0"
        t0 = time.perf_counter()
        s = cli.startup_s(n=1)
        r = cli.tsconv_run(src, work / f"{pipe}-{name}.zarr", pipe, work, cache)
        r.update(pipeline=pipe, variant=name, run_startup_s=s)
        res["runs"].append(r)
        st = r["stage_seconds"] or {}
        print(
            pipe,
            name,
            round(r["wall_s"], 2),
            round(s, 2),
            round(r["report_s"], 3),
            r["step_rows"],
            r["smi_peak_bytes"],
            {
                k: round(st[k], 3)
                for k in ("compute", "d2h", "write", "decode_busy", "write_busy", "loop")
                if k in st
            },
            flush=True,
        )
        out.write_text(json.dumps(res, indent=1, default=str))
    a = zarr.open_group(str(work / f"{pipe}-gpu.zarr"), mode="r")["values"]
    b = zarr.open_group(str(work / f"{pipe}-cpu.zarr"), mode="r")["values"]
    n = a.shape[0]
    same = all(
        np.array_equal(np.asarray(a[i:j]).view(np.uint32), np.asarray(b[i:j]).view(np.uint32))
        for i, j in ((0, 131072), (n - 131072, n))
    )
    res[f"{pipe}_bitwise_equal_head_tail"] = same
    print(pipe, "gpu == cpu (first and last 131,072 rows):", same, flush=True)
    res[f"{pipe}_polars_s"] = cli.polars_run(src, work / "pl.parquet", pipe)
    print(pipe, "polars", round(res[f"{pipe}_polars_s"], 2), flush=True)
    out.write_text(json.dumps(res, indent=1, default=str))
