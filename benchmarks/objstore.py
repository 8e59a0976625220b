"""Read throughput from an object store, one band at a time vs bands fetched ahead in threads; and a run.

Claim measured: remote inputs are read concurrently (``TSCONV_REMOTE_READS`` bands at once, default 16),
which beats reading band after band (benchmarks/NOTES.md, "Object storage"). The store is served by
moto's S3 server on localhost, started here: its figures say how much the concurrency hides per-request
latency and serial work, not what S3 delivers (see the notes).

The input: ``rows`` x 128 float32 random walks on a 0.01 tick grid (default 262,144 rows, 134 MB),
written with plain zarr to ``s3://bench/ticks.zarr``, chunks of 8,192 rows x 128 (4 MB) compressed with
zstd (level 3). Read: every band through :class:`tsconv.io.readers.prefetch.PrefetchReader` with 1
band at a time and with the default, and zarr's own ``values[:]`` (one call; zarr fetches up to its
``async.concurrency`` chunks at once) for reference; best of ``repeats``, GB/s of decoded bytes (and of
stored bytes). Then ``tsconv.process`` of the store from S3 to S3 and from a local copy to a local output,
a one-filter pipeline (``diff:1``, one output per feature, so the output is as large as the input).

    python benchmarks/objstore.py                  # writes benchmarks/results/objstore.json and objstore.md
    python benchmarks/objstore.py --rows 65536     # a quick run
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE.parent))

from provenance import commit, machine  # noqa: E402

FEATURES = 128
CHUNK_ROWS = 8192
PIPELINE = {"conv": [{"filters": ["diff:1"]}]}


def _server() -> tuple[subprocess.Popen, str]:
    """moto's S3 server in its own process (in a thread of this one it would share the reader's GIL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    for _ in range(300):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1",
                      AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")  # fmt: skip
    return server, f"http://127.0.0.1:{port}"


def _add_latency(ms: float) -> None:
    """Make every object GET wait ``ms`` before it is sent: a model of S3's first-byte latency, which
    localhost does not have. The wait is asynchronous, so concurrent GETs wait together, as on S3."""
    import asyncio

    import s3fs

    original = s3fs.S3FileSystem._cat_file

    async def delayed(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        await asyncio.sleep(ms / 1000)
        return await original(self, *args, **kwargs)

    s3fs.S3FileSystem._cat_file = delayed


def _series(rows: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    steps = rng.choice([-1, 0, 0, 0, 1], size=(rows, FEATURES)).astype(np.float32) * 0.01
    return (100.0 + rng.uniform(-20, 20, size=FEATURES) + np.cumsum(steps, axis=0)).astype(np.float32)


def _write(target: str, x: np.ndarray) -> None:
    import zarr
    from zarr.codecs import ZstdCodec

    g = zarr.open_group(target, mode="w")
    g.create_array("values", data=x, chunks=(CHUNK_ROWS, FEATURES), compressors=[ZstdCodec(level=3)])
    g.attrs["features"] = [f"x{j}" for j in range(FEATURES)]


def _read_all(values: object, ahead: int) -> float:
    from tsconv.io.readers.prefetch import PrefetchReader

    t0 = time.perf_counter()
    with PrefetchReader(values, where="bench", ahead=ahead) as reader:
        for a in range(0, reader.rows, reader.band_rows):
            reader.read(a, min(a + reader.band_rows, reader.rows))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=131072)
    ap.add_argument("--latency-ms", type=float, default=20.0, help="modelled first-byte latency per GET")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS / "objstore.json")
    args = ap.parse_args()

    server, endpoint = _server()
    import fsspec
    import zarr

    import tsconv
    from tsconv.io.readers.prefetch import default_ahead

    load_before = os.getloadavg()[0]
    fsspec.filesystem("s3").mkdir("bench")
    x = _series(args.rows)
    url = "s3://bench/ticks.zarr"
    t0 = time.perf_counter()
    _write(url, x)
    upload_s = time.perf_counter() - t0
    fs = fsspec.filesystem("s3")
    stored = sum(fs.du("bench/ticks.zarr", total=False).values())
    values = zarr.open_group(url, mode="r")["values"]
    nbytes = x.nbytes
    ahead = default_ahead()
    variants = {}
    cases = [
        ("1 band at a time", lambda: _read_all(values, 1)),
        (f"{ahead} bands ahead (default)", lambda: _read_all(values, ahead)),
        ("zarr values[:] (one call)", lambda: _timed(lambda: np.asarray(values[:]))),
    ]
    for (name, fn), latency in [(c, 0.0) for c in cases] + [(c, args.latency_ms) for c in cases[:2]]:
        if latency:
            _add_latency(latency)
            name = f"{name}, +{latency:g} ms per GET"
        secs = [fn() for _ in range(args.repeats)]
        best = min(secs)
        variants[name] = {"seconds": [round(s, 3) for s in secs], "best_s": round(best, 3),
                          "gb_per_s": round(nbytes / best / 1e9, 3),
                          "stored_gb_per_s": round(stored / best / 1e9, 3)}  # fmt: skip
    # one run each way: S3 -> S3 and local -> local
    tmp = Path(tempfile.mkdtemp(prefix="tsconv-objstore-"))
    try:
        _write(str(tmp / "ticks.zarr"), x)
        runs = {}
        for name, src, dst in (
            ("local -> local", str(tmp / "ticks.zarr"), str(tmp / "feats.zarr")),
            (f"s3 -> s3, +{args.latency_ms:g} ms per GET", url, "s3://bench/feats.zarr"),
        ):
            tsconv.process(src, dst, pipeline=PIPELINE, device="cpu")  # a first run: warm caches, tuning
            rep = tsconv.process(src, dst, pipeline=PIPELINE, device="cpu", overwrite=True)
            runs[name] = {"seconds": round(rep.seconds, 3), "rows_per_s": round(rep.rows_per_s),
                          "input_gb_per_s": round(nbytes / rep.seconds / 1e9, 3)}  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        server.terminate()
        server.wait()
    base = variants["1 band at a time"]["best_s"]
    for v in variants.values():
        v["vs_one_at_a_time"] = round(base / v["best_s"], 2)
    result = {
        "benchmark": "objstore",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": machine(),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "server": f"moto {__import__('moto').__version__} server, its own process on localhost ({endpoint})",
        "latency_ms": args.latency_ms,
        "store": {
            "rows": args.rows,
            "features": FEATURES,
            "chunk_rows": CHUNK_ROWS,
            "codec": "zstd level 3",
            "bytes": nbytes,
            "stored_bytes": stored,
            "chunks": -(-args.rows // CHUNK_ROWS),
            "upload_s": round(upload_s, 3),
        },  # fmt: skip
        "read": variants,
        "process": {"pipeline": PIPELINE, "runs": runs},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(_markdown(result))
    print(_markdown(result))


def _timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _markdown(r: dict) -> str:
    m, s = r["machine"], r["store"]
    lines = [
        "# Object storage: read throughput from a local S3 server",
        "",
        f"{r['date']}, commit {r['commit']}, {m['cpu']} ({m['cores']} cores, {m['ram_gib']} GiB), Python "
        f"{m['python']}; load average {r['load_average'][0]} before, {r['load_average'][1]} after. Server: "
        f"{r['server']}, sharing the cores with the reader.",
        "",
        f"Store: {s['rows']:,} x {s['features']} float32 ({s['bytes'] / 1e6:.0f} MB, {s['stored_bytes'] / 1e6:.0f} MB "
        f"stored), {s['chunks']} chunks of {s['chunk_rows']:,} rows ({s['codec']}), uploaded by zarr in "
        f"{s['upload_s']} s. GB/s of decoded bytes, best of the runs listed.",
        "",
        "| read | GB/s | stored GB/s | vs 1 at a time | seconds |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, v in r["read"].items():
        lines.append(f"| {name} | {v['gb_per_s']} | {v['stored_gb_per_s']} | {v['vs_one_at_a_time']}x | "
                     f"{', '.join(map(str, v['seconds']))} |")  # fmt: skip
    lines += ["", f"`tsconv.process`, pipeline {json.dumps(r['process']['pipeline'])}, CPU:", "",
              "| run | seconds | rows/s | input GB/s |", "| --- | --- | --- | --- |"]  # fmt: skip
    for name, v in r["process"]["runs"].items():
        lines.append(f"| {name} | {v['seconds']} | {v['rows_per_s']:,} | {v['input_gb_per_s']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
