"""Scale out on dask.distributed: one task per time partition, each writing its own region of the output.

The series is cut into partitions of whole output chunks (the output's chunk rows are a multiple of the
engine chunk, so chunk boundaries, and therefore every computed byte, are those of a single-process run).
Each task opens the input read-only and the output ``r+``, rebuilds the halo and the forward-fill state
before its first row from the input (exactly as a resume does), streams rows [start, stop) through the
single-node engine and writes them as whole chunks. Tasks never touch the store's attributes: the client
alone records finished partitions (``tsconv.partitions_done``, merged [start, stop) intervals, and
``tsconv.rows_done``, the finished prefix) as futures complete, and marks the store complete at the end
and consolidates its metadata (a resumed store's is removed before any task runs).
A task that is rerun (its worker died, or the run is resumed) writes the same bytes to the same chunks.

Nothing here imports dask at module level; tasks receive paths and the resolved pipeline (numpy arrays,
pickled by value), never open zarr handles.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

import numpy as np

from tsconv import config
from tsconv.engine.cluster import local_cluster
from tsconv.engine.fill import FillCarry, fill_record, first_values, parse_fill_record
from tsconv.engine.run import CudaOptions
from tsconv.errors import TsconvError, TsconvWarning, first_line
from tsconv.io.contracts import BandReader
from tsconv.io.store import InputStore, store_identity
from tsconv.io.writers.zarr_writer import (
    OutputWriter,
    PinnedAttrs,
    check_owner,
    drop_consolidated,
    finish_grow,
    output_chunk_rows,
    remove_temporaries,
    write_consolidated,
)
from tsconv.pipeline.spec import ResolvedPipeline

__all__ = ["first_values_task", "missing", "partitions", "run_distributed"]

_MAX_TASK_OUTPUT_BYTES = 256 << 20  # at most this much output per task (resume granularity)
_HALO_FACTOR = 16  # a partition is at least 16 halos long: recomputed halo rows cost <= 1/16
_GPU_TASK_INPUT_BYTES = 8 << 30  # ~1 s of work per task at the engine's GB/s: fixed costs stay near 10 %
_GPU_MAX_TASK_OUTPUT_BYTES = 4 << 30


def partitions(rows: int, chunk_rows: int, per_partition: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of ``per_partition`` whole output chunks each (the last one may be shorter)."""
    step = chunk_rows * per_partition
    return [(a, min(a + step, rows)) for a in range(0, rows, step)]


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def missing(parts: list[tuple[int, int]], done: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The rows of ``parts`` not in ``done`` (merged, sorted), partition by partition: a partition an
    earlier run did in part (an update's first, up to the old end) computes only the rest. Both are
    whole output chunks, so the rest is too."""
    out: list[tuple[int, int]] = []
    for a, b in parts:
        pos = a
        for x, y in done:
            if y <= pos or x >= b:
                continue
            if x > pos:
                out.append((pos, x))
            pos = max(pos, y)
        if pos < b:
            out.append((pos, b))
    return out


def _rows_per_partition(
    rows: int, chunk_rows: int, halo: int, n_outputs: int, n_workers: int, requested: int | None,
    *, gpu: bool = False, row_bytes: int = 0,
) -> int:  # fmt: skip
    """Output chunks per partition: ``requested`` rows rounded up, else about 8 tasks per worker.

    With GPUs a task streams at several GB/s and its fixed cost (opening the store, the pinned ring, the
    weights, the first steps) is about 0.1 s, so tasks get at least ``_GPU_TASK_INPUT_BYTES`` of input
    and about 2 per worker: a small job is one task.
    """
    if requested is not None:
        return max(1, math.ceil(requested / chunk_rows))
    lo = max(_HALO_FACTOR * halo, 1)
    if gpu:
        lo = max(lo, _GPU_TASK_INPUT_BYTES // max(row_bytes, 1))
        hi = max(lo, _GPU_MAX_TASK_OUTPUT_BYTES // (4 * n_outputs))
        target = min(max(math.ceil(rows / (2 * max(n_workers, 1))), lo), hi)
        return max(1, math.ceil(min(target, rows) / chunk_rows))
    hi = max(lo, _MAX_TASK_OUTPUT_BYTES // (4 * n_outputs))
    target = min(max(math.ceil(rows / (8 * max(n_workers, 1))), lo), hi)
    return max(1, math.ceil(target / chunk_rows))


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
_MMAP_THRESHOLD = 32 << 20  # glibc's own dynamic maximum on 64-bit
_TRIM_THRESHOLD = 256 << 20


def _reuse_freed_memory() -> bool:
    """Let glibc keep freed buffers for reuse in this worker process; whether it was done.

    dask's nannies start workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which also freezes glibc's mmap
    threshold at 128 KiB: every large buffer the engine allocates is then a fresh mmap, faulted in page
    by page and unmapped on free. Measured on the 2-core VM (CPU engine, 200k x 64 store): 2.57 s with that
    variable against 1.95 s without or with these two mallopt calls.
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )


def run_partition(
    input_path: str,
    output_path: str,
    plan: ResolvedPipeline,
    *,
    start: int,
    stop: int,
    chunk: int,
    warmup: str,
    device: str,
    cuda: CudaOptions,
    settings: config.Settings,
    threads: int | None = None,
    fill: dict[str, Any] | None = None,
    first: list[int] | None = None,
    read_float64: bool = True,
    run_id: str | None = None,
    identity: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """One dask task: compute rows [start, stop) and write them into the output store (no attributes).

    It runs exactly as a single process would (:func:`tsconv.engine.run.run`: on CUDA the batched engine,
    with the GPU reader where the store allows it), under the client's ``settings``. ``fill``: a fill
    state an earlier run recorded (:func:`tsconv.engine.fill.fill_record`) for input rows the run's checks
    cover, where the task's walk back for its start's fill state may stop; ``first``: each selected
    feature's first row with a value (:func:`tsconv.engine.fill.first_values`), which bounds that walk too.
    The result's ``fill_end``: the fill state after the task's last row, where that is the input's last.
    ``run_id``, ``identity``: the run's and its output's (:func:`tsconv.io.store.store_identity`):
    the task stores a chunk only while the output is still that run's (it outlives a client stopped meanwhile).
    """
    import socket

    import torch

    from tsconv.engine.report import peak_rss
    from tsconv.engine.run import plan_run, reset_device, resolve_device, run
    from tsconv.io.source import StoreSource
    from tsconv.io.store import open_input

    started_at, t0 = time.time(), time.perf_counter()
    _reuse_freed_memory()
    if threads is not None:
        torch.set_num_threads(threads)
    with config.override(**dataclasses.asdict(settings)):
        store = open_input(input_path)
        dev = resolve_device(device)
        source = StoreSource(store)
        rp = plan_run(source, plan, device=dev, chunk=chunk, warmup=warmup, start=start, stop=stop, cuda=cuda)
        rp = dataclasses.replace(rp, read_float64=read_float64)
        # the worker's share of the cores (threads) for writing too, not the default per process
        writer = OutputWriter.region(Path(output_path), time_source=store.time, start=start, stop=stop,
                                     threads=threads, run_id=run_id, identity=identity)  # fmt: skip
        reset_device(dev)
        carry = FillCarry(known=parse_fill_record(fill, len(plan.input_names)))
        if first is not None and len(first) == len(plan.input_names):
            carry.first = np.asarray(first, dtype=np.int64)
        t1 = time.perf_counter()
        notes: list[tuple[str, float, str]] = []
        read_notes: list[str] = []
        stages = run(rp, source, plan, writer, threads=threads, fill_carry=carry, storage_notes=notes,
                     read_notes=read_notes)  # fmt: skip
        t2 = time.perf_counter()
    cuda_dev = dev.type == "cuda"
    return {
        "start": start,
        "stop": stop,
        "seconds": t2 - t0,
        # where a task's time goes, and when it ran on the wall clock (the client's dispatch and collect)
        "phases": {
            "setup": t1 - t0,
            "compute": t2 - t1,
            "finish": stages.get("stage_seconds", {}).get("finish", 0.0),
        },
        "engine_stages": stages.get("stage_seconds"),  # the batched engine's, on CUDA
        "reader": stages.get("reader"),
        "head_path": stages.get("head_path"),
        "decode_note": stages.get("decode_note"),
        "step_rows": stages.get("step_rows"),  # the batched engine's rows per launch
        "started_at": started_at,
        "ended_at": started_at + (t2 - t0),
        "device": str(dev),
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        "peak_rss_bytes": peak_rss(),
        "peak_gpu_allocated_bytes": int(torch.cuda.max_memory_allocated(dev)) if cuda_dev else None,
        "peak_gpu_reserved_bytes": int(torch.cuda.max_memory_reserved(dev)) if cuda_dev else None,
        "fill_end": fill_record(*carry.end) if carry.end is not None and stop >= store.rows else None,
        "storage_notes": notes,
        "read_notes": read_notes,
    }


def _warn_once_a_stage(notes: list[tuple[str, float, str]]) -> None:
    """The tasks' FP16-storage warnings, one a stage: the largest move any task's sample saw (each task checks
    its own rows; a warning from each was dozens of near-copies, on workers' terminals the client may not see)."""
    worst: dict[str, tuple[float, str]] = {}
    for stage, move, message in notes:
        if stage not in worst or move > worst[stage][0]:
            worst[stage] = (move, message)
    for _, message in worst.values():
        warnings.warn(message, TsconvWarning, stacklevel=3)


def _warn_first_read_note(results: list[dict[str, Any]]) -> None:
    """The tasks' read warnings (int64 beyond 2^53), once: the one of the task of the first rows that gave one,
    as a single process gives it at its first read of such values (in a task it stayed in the worker's log)."""
    for res in sorted(results, key=lambda r: r["start"]):
        if res.get("read_notes"):
            warnings.warn(res["read_notes"][0], TsconvWarning, stacklevel=3)
            return


def _uses_gpu(device: str) -> bool:
    """Whether the tasks will run on GPUs (the client's workers are assumed to look like this machine)."""
    if device == "cpu":
        return False
    import torch

    return torch.cuda.is_available()


# A symbol with no value yet sends every task's walk for its start's fill state back to row 0: P tasks read
# about P^2 / 2 partitions' worth of input. One forward scan first, a task of its own (one band where every
# symbol trades from the start, the whole input where one never does), bounds each walk instead; it pays from
# 4 tasks on (P (P - 1) / 2 > P).
_FIRST_SCAN_TASKS = 4


def first_values_task(
    input_path: str, plan: ResolvedPipeline, *, rows: int, settings: config.Settings
) -> list[int]:
    """One dask task: each selected feature's first row with a value (``rows`` for none), read on a worker
    (for a symbol with no value yet, the whole input: kept off the client, which may be a small machine)."""
    from tsconv.io.readers.blocks import ColumnSource
    from tsconv.io.source import StoreSource
    from tsconv.io.store import open_input

    with config.override(**dataclasses.asdict(settings)):
        store = open_input(input_path)
        with StoreSource(store).open(device=None, pinned=False, hold=1, gpu=False, threads=None) as reader:
            sel = ColumnSource(reader, plan.columns) if plan.columns is not None else reader
            return first_values(sel, stop=rows).tolist()


def _n_workers(client: Any) -> int:
    try:
        return max(1, len(client.scheduler_info()["workers"]))
    except Exception:
        return 1


_NO_WORKERS_HINT = (
    "start workers with `dask worker ADDRESS` (or dask-cuda-worker), or use --workers N for a local cluster."
)
_WORKERS_WAIT_S = 10.0  # for a cluster whose workers are still connecting
# for a killed worker's replacement, which its nanny starts: a new process importing torch, which took more than
# 10 s on a loaded 2-core machine, and the run then failed as if the cluster had no workers
_RESTART_WAIT_S = 60.0


# dask's own timeout covers opening the connection, not the handshake after it: a port that accepts and never
# answers (another service) held `Client(address)` for good
CONNECT_TIMEOUT_S = 40.0


def _connect(client_cls: Any, address: str) -> Any:
    """A client of the scheduler at ``address``, or a one-line error within CONNECT_TIMEOUT_S."""
    made: list[Any] = []
    failed: list[BaseException] = []

    def connect() -> None:
        try:
            made.append(client_cls(address, timeout="30s"))
        except BaseException as exc:  # noqa: BLE001 - reported by the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=connect, name="tsconv-dask-connect", daemon=True)
    thread.start()
    thread.join(CONNECT_TIMEOUT_S)
    hint = "start one with `dask scheduler` and workers with `dask worker ADDRESS` (or dask-cuda-worker)."
    if thread.is_alive():
        raise TsconvError(
            f"cannot reach the dask scheduler at {address!r}: no answer within {CONNECT_TIMEOUT_S:g} s (a port "
            "that accepts connections but is not a dask scheduler's?)",
            hint=hint,
        )
    if failed:
        exc = failed[0]
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise exc
        # ValueError: an address dask cannot parse ("missing port number"); MemoryError: a port that is not a
        # scheduler's (an HTTP server's reply read as a frame length of exabytes); TypeError: a scheme dask
        # lists without its library (ucx:// without ucx-py)
        why = "it does not answer as a dask scheduler" if isinstance(exc, MemoryError) else first_line(exc)
        raise TsconvError(f"cannot reach the dask scheduler at {address!r}: {why}", hint=hint) from None
    return made[0]


def _paused(client: Any) -> list[dict[str, Any]]:
    """The scheduler's records of the workers dask has paused (a worker's process past its memory limit's
    ``distributed.worker.memory.pause`` fraction, 0.8 by default, takes no task until its memory falls)."""
    try:
        workers = client.scheduler_info()["workers"].values()
    except Exception:  # noqa: BLE001 - only to say more in an error raised anyway
        return []
    return [w for w in workers if w.get("status") == "paused"]


def _mib(n: Any) -> str:
    return f"{n / 2**20:,.0f} MiB" if isinstance(n, int | float) else "?"


def _wait_for_workers(client: Any, timeout: float | None = None) -> None:
    """At least one worker (waiting up to ``timeout`` seconds, default :data:`_WORKERS_WAIT_S`), before the
    output is made: a scheduler without any left an empty output."""
    timeout = _WORKERS_WAIT_S if timeout is None else timeout
    try:
        client.wait_for_workers(1, timeout=timeout)
    except TimeoutError:
        paused = _paused(client)
        if paused:
            # dask's wait counts running workers only: workers paused for memory read as "none connected",
            # whose hint (start workers) does not help
            w = max(paused, key=lambda w: w.get("metrics", {}).get("memory") or 0)
            raise TsconvError(
                f"the dask cluster's {len(paused)} worker{'s are' if len(paused) > 1 else ' is'} paused for lack "
                f"of memory, and none runs tasks (one process holds {_mib(w.get('metrics', {}).get('memory'))} of "
                f"its {_mib(w.get('memory_limit'))} limit: dask pauses a worker past the distributed.worker.memory.pause "
                "fraction of its limit, 0.8 by default)",
                hint="give each worker more memory (`dask worker --memory-limit`), or start fewer workers on the "
                "host (a smaller --workers N), so that each gets a larger share.",
            ) from None
        raise TsconvError(
            f"the dask cluster has no workers (none connected within {timeout:.0f} s)",
            hint=_NO_WORKERS_HINT,
        ) from None


def _scatter(client: Any, plan: ResolvedPipeline) -> Any:
    """``plan`` scattered to every worker (a future), or a one-line error where the cluster has none.

    Each scatter has a key of its own: under the key hashed from the plan, the same in every attempt, a plan
    scattered again after dask lost it could be listed on a worker that had dropped it, and the tasks waited
    for it for good."""
    try:
        return client.scatter(plan, broadcast=True, hash=False)
    except ValueError as exc:  # distributed raises "No valid workers found"
        if "no valid workers" not in str(exc).lower():
            raise
        raise TsconvError("the dask cluster has no workers left", hint=_NO_WORKERS_HINT) from None


def run_distributed(
    store: InputStore,
    plan: ResolvedPipeline,
    out_path: Path,
    *,
    action: str,
    rows_done: int,
    chunk: int,
    device: str,
    warmup: str,
    attrs: dict[str, Any],
    progress: bool,
    workers: int | None,
    client: Any,
    partition_rows: int | None,
    retries: int = 2,
    cuda: CudaOptions | None = None,
    compression: str = "lz4",
    run_id: str | None = None,
    input_digest: dict[str, Any] | None = None,
    rows: int | None = None,
    fill_carry: FillCarry | None = None,
    before_finish: Callable[[BandReader | None], None] | None = None,
    read_float64: bool = True,
) -> Any:
    """Create (or reopen) the output, run the missing partitions on dask, mark it complete; a Report.

    The caller holds the output's lock (:class:`tsconv.io.lock.OutputLock`) and has cleared an old store
    (``action`` "replace"). ``compression``: the new output's codec, ``lz4`` or ``none`` (the tasks write
    their chunks with the array's codec, so no task chooses one from the data). ``run_id``: recorded in
    a resumed output and checked before marking it complete (``attrs`` carries it for a new one);
    ``input_digest``: recorded in a new output; ``rows``: the output's rows (default: the input's; a
    resumed output keeps its own, an updated one has been extended to them). ``fill_carry``, ``before_finish``:
    as for :func:`tsconv.engine.run.run` (``before_finish`` gets None: the client has no reader) (the known state goes to every task, which stops its walk back
    there: an update's tasks read back to the old end at most, not to row 0 for a symbol with no value yet;
    the end state comes from the task of the input's last rows, where this run computed them).
    ``read_float64``: as :class:`tsconv.engine.run.RunPlan`'s, for every task."""
    import zarr

    from tsconv.engine.report import Report, peak_rss
    from tsconv.progress import progress_bar

    try:
        from distributed import Client, as_completed
    except ImportError as exc:
        raise TsconvError(
            f"dask.distributed is not available ({exc})",
            hint="pip install 'tsconv[distributed]' (and dask-cuda for one worker per GPU).",
        ) from None
    if workers is not None and client is not None:
        raise TsconvError(
            "workers and client (or --workers and --scheduler) exclude each other",
            hint="--workers N starts a local cluster; --scheduler ADDRESS uses an existing one.",
        )
    if partition_rows is not None and (
        isinstance(partition_rows, bool) or not isinstance(partition_rows, int) or partition_rows < 1
    ):
        raise TsconvError(f"partition_rows must be a positive integer, got {partition_rows!r}")

    cluster = threads = None
    own_client = False
    if client is None:
        cluster, threads = local_cluster(workers, device)  # type: ignore[arg-type]
        client, own_client = Client(cluster), True
    elif isinstance(client, str):
        client, own_client = _connect(Client, client), True
    try:
        _wait_for_workers(client)
        n_workers = _n_workers(client)
        rows = store.rows if rows is None else rows
        if action in ("create", "replace"):
            chunk_rows = output_chunk_rows(chunk, plan.n_outputs)
            if partition_rows is not None:  # small partitions: chunk the output by them
                chunk_rows = min(chunk_rows, chunk * math.ceil(partition_rows / chunk))
            writer = OutputWriter.create(
                out_path,
                rows=rows,
                names=plan.output_names,
                chunk_rows=chunk_rows,
                time_source=store.time,
                attrs=attrs,
                compression=compression,
                input_digest=input_digest,
            )
            group = writer.group
            done: list[tuple[int, int]] = []
        else:
            drop_consolidated(out_path)  # refreshed when the run completes
            finish_grow(out_path)  # an update killed between marking its new rows and extending the arrays
            group = zarr.open_group(str(out_path), mode="r+", use_consolidated=False)
            # a killed run's workers left their chunk files half written; none of this run's has started
            remove_temporaries(out_path, group, start=rows_done)
            meta = dict(group.attrs.get("tsconv", {}))
            done = _merge([(0, rows_done), *(tuple(p) for p in meta.get("partitions_done", []))])
            if run_id is not None:
                group.attrs["tsconv"] = {**meta, "run_id": run_id}
        identity = store_identity(out_path)
        attrs_of_run = PinnedAttrs(group)  # the run's records, into the directory checked here only
        chunk_rows = int(group["values"].chunks[0])
        gpu = _uses_gpu(device)
        per = _rows_per_partition(rows, chunk_rows, plan.halo, plan.n_outputs, n_workers, partition_rows,
                                  gpu=gpu, row_bytes=store.n_features * store.dtype.itemsize)  # fmt: skip
        parts = partitions(rows, chunk_rows, per)
        todo = missing(parts, done)
        already = rows - sum(b - a for a, b in todo)

        own = run_id if run_id is not None else dict(group.attrs.get("tsconv", {})).get("run_id")

        def record(done: list[tuple[int, int]], **extra: Any) -> None:
            # Progress goes only into this run's store: one renamed in over it (another run's --overwrite)
            # is refused before the write, and a rename during zarr's own write reads as the same refusal.
            check_owner(out_path, run_id=own, identity=identity)
            meta = attrs_of_run.get()
            prefix = done[0][1] if done and done[0][0] == 0 else 0
            meta.update(rows_done=prefix, partitions_done=[list(p) for p in done], **extra)
            try:
                attrs_of_run.set(meta)
            except OSError:
                check_owner(out_path, run_id=own, identity=identity)
                raise

        token = uuid.uuid4().hex[:8]
        t0, t0_wall = time.perf_counter(), time.time()
        results: list[dict[str, Any]] = []
        known = fill_carry.known if fill_carry is not None else None
        fill = fill_record(*known) if known is not None else None

        def submit(parts: list[tuple[int, int]], attempt: int) -> tuple[dict[Any, tuple[int, int]], Any]:
            """The tasks of ``parts``, and the first-values task they wait for (or None)."""
            # the plan (its weights: 17 MB for a 1024-feature dense pipeline) sent to each worker once, not in
            # every task of the graph (dask warned of a "large graph" on every such run)
            if attempt:
                _wait_for_workers(client, _RESTART_WAIT_S)  # a local cluster's nanny restarts a killed worker
            plan_ref = _scatter(client, plan)
            tag = token if attempt == 0 else f"{token}-{attempt}"
            first = None  # a future the partition tasks wait for (dask hands them its result)
            if known is None and len(parts) >= _FIRST_SCAN_TASKS:
                first = client.submit(first_values_task, str(store.path), plan_ref, rows=rows,
                                      settings=config.current(), key=f"tsconv-first-{tag}", pure=False)  # fmt: skip
            futures = {
                client.submit(
                    run_partition,
                    str(store.path),
                    str(out_path),
                    plan_ref,
                    start=a,
                    stop=b,
                    chunk=chunk,
                    warmup=warmup,
                    device=device,
                    cuda=cuda if cuda is not None else CudaOptions(),
                    settings=config.current(),
                    threads=threads,
                    fill=fill,
                    first=first,
                    read_float64=read_float64,
                    run_id=own,
                    identity=identity,
                    key=f"tsconv-{a}-{b}-{tag}",
                    retries=retries,
                    pure=False,
                ): (a, b)
                for a, b in parts
            }
            return futures, first

        pending, attempt = todo, 0
        with progress_bar(
            total=rows, initial=already, enabled=progress, desc=f"{store.path.name} ({n_workers} workers)"
        ) as bar:
            while pending:
                futures, first = submit(pending, attempt)
                lost: list[tuple[int, int]] = []
                try:
                    for fut in as_completed(list(futures)):
                        try:
                            res = fut.result()
                        except CancelledError:
                            # Every worker holding the scattered plan died (a worker killed, e.g. for memory):
                            # dask then forgets the tasks that need it and retries none of them. Their rows
                            # are sent again with the plan scattered afresh (a rerun writes the same bytes).
                            if attempt >= retries:
                                raise TsconvError(
                                    f"dask lost the workers running {store.path.name}'s partitions "
                                    f"{attempt + 1} times; the output holds the partitions finished",
                                    hint="see why the workers died (memory?), then rerun with --resume.",
                                ) from None
                            lost.append(futures[fut])
                            continue
                        fut.release()
                        results.append(res)
                        if res.get("fill_end") is not None and fill_carry is not None:
                            fill_carry.end = parse_fill_record(res["fill_end"], len(plan.input_names))
                        done = _merge([*done, (res["start"], res["stop"])])
                        record(done)
                        bar.update(res["stop"] - res["start"])
                except BaseException:
                    client.cancel([*futures, *([first] if first is not None else [])])
                    raise
                pending, attempt = sorted(lost), attempt + 1
        seconds = time.perf_counter() - t0
        end_wall = t0_wall + seconds
        if done != [(0, rows)]:
            msg = f"internal error: partitions done {done} do not cover [0, {rows})"
            raise RuntimeError(msg)
        if before_finish is not None:
            before_finish(None)  # the client reads no rows
        check_owner(out_path, run_id=own, identity=identity)
        shapes = {name: int(group[name].shape[0]) for name in ("values", "time") if name in group}
        if any(n != rows for n in shapes.values()):
            msg = f"internal error: the output's arrays hold {shapes} rows, not {rows}: not marked complete"
            raise RuntimeError(msg)
        meta = attrs_of_run.get()
        meta.pop("partitions_done", None)
        meta.update(complete=True, rows_done=rows)
        attrs_of_run.set(meta)
        check_owner(out_path, run_id=own, identity=identity)  # write_consolidated() writes by the path
        write_consolidated(out_path)
    finally:
        if own_client:
            client.close()
        if cluster is not None:
            cluster.close()

    _warn_once_a_stage([n for r in results for n in r.get("storage_notes", ())])
    _warn_first_read_note(results)
    computed = sum(r["stop"] - r["start"] for r in results)
    stage_seconds = None
    if (
        results
    ):  # task phases summed over tasks; dispatch: submit -> first task start; collect: last end -> done
        stage_seconds = {
            f"task_{k}": sum(r["phases"][k] for r in results) for k in ("setup", "compute", "finish")
        }
        stage_seconds["dispatch"] = max(0.0, min(r["started_at"] for r in results) - t0_wall)
        stage_seconds["collect"] = max(0.0, end_wall - max(r["ended_at"] for r in results))
        # the GPU engine's stages, the slowest task's value for each (what bounds a run of parallel tasks)
        engine = [r["engine_stages"] for r in results if r.get("engine_stages")]
        # every stage the engine reports, as a single process's report has them (open, setup, drain, finish...)
        for k in sorted({k for e in engine for k, v in e.items() if isinstance(v, (int, float))}):
            stage_seconds[f"engine_{k}"] = max(e.get(k, 0.0) for e in engine)
    gpu_alloc = [r["peak_gpu_allocated_bytes"] for r in results if r["peak_gpu_allocated_bytes"] is not None]
    gpu_res = [r["peak_gpu_reserved_bytes"] for r in results if r["peak_gpu_reserved_bytes"] is not None]
    dev = results[0]["device"] if results else device
    # the path of most rows, as a single process names it (tsconv.engine.head.HeadPaths.path); None: no head
    head_rows: dict[str, int] = {}
    for r in results:
        if r.get("head_path"):
            head_rows[r["head_path"]] = head_rows.get(r["head_path"], 0) + r["stop"] - r["start"]
    return Report(
        input=str(store.path),
        output=str(out_path),
        device=f"{dev} x {n_workers} dask workers",
        rows=computed,
        total_rows=rows,
        features_in=len(plan.input_names),
        features_out=plan.n_outputs,
        halo=plan.halo,
        chunk=chunk,
        # the first row not done (a killed run's finished partitions need not be one prefix)
        resumed_from=(todo[0][0] if todo else rows) if action not in ("create", "replace") else 0,
        seconds=seconds,
        rows_per_s=computed / seconds if seconds > 0 else 0.0,
        input_gbps=computed * store.n_features * store.dtype.itemsize / seconds / 1e9 if seconds > 0 else 0.0,
        peak_rss_bytes=max([r["peak_rss_bytes"] for r in results], default=peak_rss()),
        peak_gpu_allocated_bytes=max(gpu_alloc) if gpu_alloc else None,
        peak_gpu_reserved_bytes=max(gpu_res) if gpu_res else None,
        stage_seconds=stage_seconds,
        reader=results[0]["reader"] if results else None,
        decode_note=results[0]["decode_note"] if results else None,
        # the shortest task's steps: where a worker plans shorter steps than one process would
        step_rows=min((r["step_rows"] for r in results if r.get("step_rows")), default=None),
        pipeline=plan.pipeline.name,
        head_path=max(head_rows, key=head_rows.__getitem__) if head_rows else None,
        compression=compression,  # dask runs do not choose from the data ("auto" is lz4)
    )
