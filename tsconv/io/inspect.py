"""What ``tsconv inspect`` shows about a store, in plain words.

:func:`inspect_store` returns a JSON-able dict (numbers where a program wants numbers, words elsewhere);
:func:`inspect_lines` turns it into the lines the CLI prints.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import numpy as np

from tsconv.errors import StoreError
from tsconv.io.readers import gpu as gpudecode
from tsconv.io.readers.blocks import BlockReader
from tsconv.io.readers.prefetch import PrefetchReader
from tsconv.io.readers.threads import fast_path_reason
from tsconv.io.store import (
    InputStore,
    absent_chunks,
    check_time,
    group_attrs,
    open_input,
    unitless_early_time,
)
from tsconv.io.timecoding import iso_utc

__all__ = ["inspect_store", "inspect_lines"]


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'s' * (n != 1)}"


def _chunking(rows: int, features: int, chunks: list[int], shards: list[int] | None) -> str:
    along = -(-rows // chunks[0])
    across = -(-features // chunks[1])
    words = (
        f"{_plural(chunks[0], 'row')} x {_plural(chunks[1], 'feature')} per chunk; {_plural(along * across, 'chunk')}"
        f" ({along:,} along time x {across:,} across features)"
    )
    if shards:
        files = -(-rows // shards[0]) * -(-features // shards[1])
        words += f", stored in {_plural(files, 'shard file')} of {shards[0]:,} rows x {shards[1]:,} features"
    return words


# The built-in pipelines' files (tsconv/pipeline/builtin), which an output records as its pipeline's origin.
_BUILTIN_DIR = Path(__file__).resolve().parents[1] / "pipeline" / "builtin"


def _pipeline_option(pipeline: Any) -> str | None:
    """The ``--pipeline`` that runs the recorded pipeline again: a built-in's name, the TOML file's path, None
    for the default pipeline; "PIPELINE" for one given as a dict (a library call: no file to name)."""
    origin = pipeline.get("origin") if isinstance(pipeline, dict) else None
    if not isinstance(origin, str) or origin == "default":
        return None
    if origin == "<dict>":
        return "PIPELINE"
    path = Path(origin)
    if path.parent == _BUILTIN_DIR or (
        path.parent.name == "builtin" and path.parent.parent.name == "pipeline"
    ):
        return shlex.quote(path.stem)  # a built-in, wherever tsconv was installed when it ran
    return shlex.quote(origin)


def _resume_command(store: InputStore, meta: dict[str, Any], source: Any, pipeline: Any = None) -> str:
    """The command that finishes an unfinished output: the input, the output, the pipeline and the recorded
    settings; paths quoted for the shell (a space or a quote in them would split them)."""
    parts = [
        "tsconv process",
        "-i",
        shlex.quote(str(source)) if source else "INPUT",
        "-o",
        shlex.quote(str(store.path)),
    ]
    if (option := _pipeline_option(pipeline)) is not None:
        parts += ["--pipeline", option]
    if meta.get("chunk") is not None:
        parts += ["--chunk", str(meta["chunk"])]
    if meta.get("warmup") == "zero":
        parts += ["--warmup", "zero"]
    return " ".join(parts) + " --resume"


def _warmup_rows(meta: dict[str, Any], rows: int, n_features: int) -> np.ndarray:
    """Per output, the rows its warm-up left NaN: its own warm-up (``warmups``; older outputs record only
    the ``halo``, every output's then) less the input rows before a ``[preprocess] time_range``; none with
    ``--warmup zero``, unless a ``[preprocess]`` left its first steps NaN (``pre_halo``), which reach every
    output as with ``--warmup nan``."""
    if meta.get("warmup") != "nan" and not meta.get("pre_halo"):
        return np.zeros(n_features, dtype=np.int64)
    first = int((meta.get("input_rows") or [0])[0])
    warm = meta.get("warmups")
    if not isinstance(warm, list) or len(warm) != n_features:
        warm = [int(meta.get("halo") or 0)] * n_features
    return np.clip(np.asarray(warm, dtype=np.int64) - first, 0, rows)


def _damaged_hint(store: InputStore, start: int, stop: int) -> str:
    """What to do when the values' rows [start, stop) do not read: the chunk file to restore or rewrite,
    found by reading the chunk files of those rows one by one."""
    values = store.values
    grid = tuple(int(c) for c in (getattr(values, "shards", None) or values.chunks))
    # where every file reads alone (an object fetch that failed once), name the first
    bad = (start // grid[0], 0)
    cells = (
        (i, j)
        for i in range(start // grid[0], -(-stop // grid[0]))
        for j in range(-(-store.n_features // grid[1]))
    )
    for i, j in cells:
        try:
            values[i * grid[0] : (i + 1) * grid[0], j * grid[1] : (j + 1) * grid[1]]
        except Exception:
            bad = (i, j)
            break
    a, b = bad[0] * grid[0], min((bad[0] + 1) * grid[0], store.rows)
    file = values.metadata.encode_chunk_key(bad)
    where = values.store_path.store
    if store.remote or not hasattr(where, "root"):
        name = f"{str(values.store_path).rstrip('/')}/{file}"
    else:
        name = str(Path(where.root) / values.store_path.path / file)
    reach = " (or, in an object store, it was out of reach: try again)" if store.remote else ""
    return (
        f"the chunk file {name} (rows {a:,}..{b - 1:,}) is damaged or truncated{reach}: restore it from a "
        "copy, or write the store again (one made by `tsconv ingest`: `tsconv ingest FILES -o STORE --overwrite`)."
    )


def inspect_store(path: str | os.PathLike[str], *, count_nans: bool = True) -> dict[str, Any]:
    """Describe a store; with ``count_nans`` read it once, band by band, to count NaNs per feature.

    For a tsconv output, the NaNs of the warm-up rows (``warmup_nans``) are counted apart from the
    data's (``nan_total``, ``nan_counts``), and an unfinished output is described over the rows it has.
    """
    store = open_input(path, allow_incomplete=True)
    info = store.describe()
    info["chunking"] = _chunking(store.rows, store.n_features, info["chunks"], info["shards"])
    attrs = group_attrs(store)
    meta = attrs.get("tsconv")
    written = store.rows
    warmup = np.zeros(store.n_features, dtype=np.int64)
    recorded = meta.get("rows") if isinstance(meta, dict) else None
    # a complete output's attributes kept by a tool that re-saved a slice of it (xarray's to_zarr): its rows
    # are not the ones tsconv wrote, nor its first rows the warm-up
    resaved = isinstance(recorded, int) and bool(meta.get("complete")) and recorded != store.rows
    if resaved:
        info["tsconv_output"] = (
            f"tsconv attributes record {recorded:,} rows, the array holds {store.rows:,}: "
            "re-saved or sliced since tsconv wrote it"
        )
    elif isinstance(meta, dict):
        if meta.get("complete"):
            info["tsconv_output"] = "complete"
        else:
            written = min(store.rows, int(meta.get("rows_done") or 0))
            info["tsconv_output"] = (
                f"unfinished: {written:,} of {store.rows:,} rows written; finish it with "
                f"`{_resume_command(store, meta, attrs.get('source'), attrs.get('pipeline'))}`"
                + (
                    " (PIPELINE: the pipeline the run was given as a dict, written as a TOML file; or call "
                    "tsconv.process with it and resume=True)"
                    if _pipeline_option(attrs.get("pipeline")) == "PIPELINE"
                    else ""
                )
            )
        info["rows_written"] = written
        info["warmup"] = meta.get("warmup")
        info["pre_halo"] = int(meta.get("pre_halo") or 0)
        warmup = np.minimum(_warmup_rows(meta, store.rows, store.n_features), written)
        info["warmup_rows"] = int(warmup.max()) if warmup.size else 0
    if store.time is not None:
        span = check_time(store, stop=written)
        info["time_span"] = f"{iso_utc(span[0])} .. {iso_utc(span[1])}" if span else None
    fast = fast_path_reason(store.values)
    if store.remote:
        info["reader"] = f"zarr's reader, {store.path.protocol}:// objects fetched ahead in threads"
    elif fast is None:
        info["reader"] = "tsconv's native reader (chunk files decoded in threads)"
    else:
        info["reader"] = f"zarr's reader, slower; tsconv's native reader does not read this layout: {fast}"
    gpu = gpudecode.unsupported_reason(store.values)
    info["gpu_decoding"] = (
        "yes: on CUDA, chunks are decoded on the GPU"
        if gpu is None
        else f"no: on CUDA, chunks are decoded on the CPU; the GPU does not decode this store: {gpu}"
    )
    info["features"] = list(store.features)
    absent = absent_chunks(store)
    info["absent_chunks"] = absent.message() if absent is not None else None
    info["time_units"] = unitless_early_time(store)
    if count_nans:
        counts = np.zeros(store.n_features, dtype=np.int64)
        warm = 0
        if store.dtype.kind == "f":
            reader = (
                PrefetchReader(store.values, where=str(store.path))
                if store.remote
                else BlockReader(store.values, max_cached=1, where=str(store.path))
            )
            for a in range(0, written, reader.band_rows):
                b = min(a + reader.band_rows, written)
                try:
                    band = np.isnan(reader.read(a, b))
                except StoreError as exc:
                    # the readers' hint sends the user to `tsconv inspect`, the command that just failed
                    raise StoreError(exc.message, hint=_damaged_hint(store, a, b)) from None
                early = (a + np.arange(band.shape[0]))[:, None] < warmup[None, :]  # each output's own warm-up
                warm += int((band & early).sum())
                counts += (band & ~early).sum(axis=0)
            reader.close()
        info["nan_total"] = int(counts.sum())
        info["nan_counts"] = {n: int(c) for n, c in zip(store.features, counts, strict=True)}
        if isinstance(meta, dict) and not resaved:
            info["warmup_nans"] = warm
    return info


def inspect_lines(info: dict[str, Any]) -> list[str]:
    """The text ``tsconv inspect`` prints for an :func:`inspect_store` result."""
    names = info["features"]
    what = "a group" if info["layout"] == "group" else "a bare array: features f0, f1, ..., no time"
    rows = [
        ("store", f"{info['path']} (zarr format {info['zarr_format']}, {what})"),
        ("values", f"{_plural(info['rows'], 'row')} x {_plural(len(names), 'feature')}, {info['dtype']}"),
        ("chunks", info["chunking"]),
        ("codecs", " + ".join(info["codecs"]) or "none (stored uncompressed)"),
    ]
    if info["has_time"]:
        span = info.get("time_span") or "no rows written yet"
        rows.append(("time", f"{span} ({info['time_encoding']})"))
    else:
        rows.append(("time", "none (rows are numbered steps)"))
    if "tsconv_output" in info:
        rows.append(("tsconv output", info["tsconv_output"]))
    rows += [("reading", info["reader"]), ("GPU decoding", info["gpu_decoding"])]
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
    rows.append(("features", shown))
    if info.get("absent_chunks"):
        rows.append(("absent chunks", info["absent_chunks"]))
    if info.get("time_units"):
        rows.append(("time units", info["time_units"]))
    lines = [f"{k:>14}: {v}" for k, v in rows]
    if "nan_counts" in info:
        counts = info["nan_counts"]
        nz = sorted(((k, v) for k, v in counts.items() if v), key=lambda kv: -kv[1])
        output = "warmup_nans" in info
        where = " in the data" if output else ""
        if info["nan_total"]:
            lines.append(
                f"{'NaNs':>14}: {info['nan_total']:,}{where}; {len(nz)} of {len(counts)} features have NaNs"
            )
        else:
            lines.append(f"{'NaNs':>14}: none{where}")
        lines += [f"{'':>16}{name}: {count:,}" for name, count in nz[:10]]
        if output and info.get("warmup") == "zero" and not info.get("pre_halo"):
            lines.append(f"{'warm-up NaNs':>14}: none (the run computed the first rows with zero history)")
        elif output and info.get("warmup") == "zero":
            lines.append(
                f"{'warm-up NaNs':>14}: {info['warmup_nans']:,} in the first {_plural(info['warmup_rows'], 'row')}"
                f" (the [preprocess] leaves its first {info['pre_halo']} steps NaN, which --warmup zero does not"
                " compute)"
            )
        elif output:
            lines.append(
                f"{'warm-up NaNs':>14}: {info['warmup_nans']:,} in the first {_plural(info['warmup_rows'], 'row')}"
                " (their receptive field reaches before the first input row; --warmup zero computes them)"
            )
        if info.get("rows_written", info["rows"]) < info["rows"]:
            lines.append(f"{'':>16}(counted over the {info['rows_written']:,} rows written)")
    return lines
