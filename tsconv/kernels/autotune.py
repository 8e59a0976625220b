"""Config spaces and a small disk-cached autotuner for the Triton kernels (conv1d now, the GEMM head later).

A kernel launcher names a :class:`ConfigSpace` (candidate block shapes, warps and stages), a key that
identifies its shape class (e.g. precision, layout and bucketed sizes) and a ``bench`` callable that launches
the kernel once with a given :class:`Config`. :func:`select` returns the config to use:

- not on a CUDA device (the Triton interpreter on CPU tensors): the space's fixed ``interpreter`` config;
- otherwise the winner cached in memory, else the winner in the user's disk cache, else
- with the ``autotune`` setting off (the default) the winner shipped with tsconv for its GPU model
  (``tsconv/kernels/tuned/``), else the space's ``default`` config: a batch job's first run of a
  new shape class costs what later runs cost (tuning a bank's candidates took 70 s of an 80 s first run on
  the H200, and untuned defaults ran within the run-to-run spread of tuned ones in a fresh process:
  benchmarks/NOTES.md, "A fresh `tsconv process` per run");
- with it on, it times every candidate on this machine (the shipped winners were measured on another)
  (:func:`calls_ms`: the median of event-timed calls, the L2 cache flushed before each), keeps the fastest
  and writes it to the disk cache, so later calls and later processes (a batch job) reuse it without
  tuning; one log line (WARNING, logger ``tsconv.autotune``) says that it is tuning. Per-call timing measures the host whenever a launch takes longer to issue than the kernel runs;
  ranking by GPU time from a CUDA graph instead picked configs within 5% of these on every GEMM row and was
  removed (benchmarks/NOTES.md, "Autotuning").

The disk cache is one JSON file per GPU model: ``autotune-<gpu name>.json`` in the ``cache_dir`` setting's
folder (by default ``~/.cache/tsconv``); the shipped one has the same name and form and is never written. Keys carry the Triton version, so a Triton upgrade re-tunes. Writes merge with
what another process may have written meanwhile (one at a time: an flock on ``.autotune-<gpu name>.json.lock``
beside it) and replace the file atomically.

:func:`cached_record` / :func:`store_record` keep other measured decisions (the engine's head path,
:mod:`tsconv.engine.head`) in the same memory and disk caches.

Tuning launches the kernel several times into the caller's output buffer: it must not run inside CUDA
graph capture (call once before capturing), and inputs must not alias outputs (the launchers check this).
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import math
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch

from tsconv import config

__all__ = [
    "Config",
    "ConfigSpace",
    "TuneEvent",
    "cache_path",
    "cached_record",
    "clear_memory_cache",
    "conv1d_dense_space",
    "conv1d_direct_space",
    "conv1d_bank_configs",
    "conv1d_window_configs",
    "device_label",
    "events",
    "pow2_bucket",
    "select",
    "store_record",
    "tuning_enabled",
]

log = logging.getLogger("tsconv.autotune")
SHIPPED = Path(__file__).resolve().parent / "tuned"  # tuned winners shipped for common GPU models

_SCHEMA = 1


@dataclass(frozen=True)
class Config:
    """One launch configuration: constexpr block sizes plus warps and stages; ``name`` is unique in a space."""

    name: str
    meta: Mapping[str, int]
    num_warps: int = 4
    num_stages: int = 2
    maxnreg: int | None = None  # a register cap per thread (ptxas .maxnreg): more programs per SM

    def launch_kwargs(self) -> dict[str, int]:
        """Keyword arguments for ``kernel[grid](..., **cfg.launch_kwargs())``."""
        kw = {**self.meta, "num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.maxnreg is not None:
            kw["maxnreg"] = self.maxnreg
        return kw


@dataclass(frozen=True)
class ConfigSpace:
    """Named candidates for one kernel and shape class, plus the fixed configs used when not tuning."""

    name: str
    configs: tuple[Config, ...]
    default: Config
    interpreter: Config

    def by_name(self, name: str) -> Config | None:
        for cfg in self.configs:
            if cfg.name == name:
                return cfg
        return None


@dataclass(frozen=True)
class TuneEvent:
    """A config chosen by tuning or read from the disk cache (memory-cache hits are not recorded)."""

    space: str
    key: str
    config: str
    source: str  # "tuned", "disk" (the user's cache), "shipped" or "default" (untuned: autotune off)
    seconds: float  # time spent tuning (0 for disk hits)
    timings_ms: Mapping[str, float] = field(default_factory=dict)


_events: list[TuneEvent] = []
_memory: dict[tuple[str, str], Config] = {}
_records: dict[tuple[str, str], dict] = {}  # cached_record / store_record: (device, full key) -> record
_disk: dict[str, dict] = {}  # cache file path -> loaded entries
_lock = threading.Lock()


def events() -> list[TuneEvent]:
    """Tuning decisions made in this process so far, oldest first (benchmarks print them)."""
    return list(_events)


def clear_memory_cache() -> None:
    """Forget in-process winners and the loaded disk files (the next call reads the disk cache again).

    Launchers that keep decisions derived from the winners (launch plans) register a hook with
    :func:`on_clear` and forget them too.
    """
    with _lock:
        _memory.clear()
        _records.clear()
        _disk.clear()
    for hook in _clear_hooks:
        hook()


_clear_hooks: list[Callable[[], None]] = []


def on_clear(hook: Callable[[], None]) -> None:
    """Call ``hook`` whenever :func:`clear_memory_cache` runs."""
    _clear_hooks.append(hook)


def pow2_bucket(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1): sizes in a bucket share one tuning entry."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def _gpu_name(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"  # cached_record / store_record on CPU tensors (tests): autotune-cpu.json
    name = torch.cuda.get_device_name(device)
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "gpu"


def cache_path(device: torch.device | int | str | None = None) -> Path:
    """The JSON file holding the tuned winners for the GPU model of ``device``."""
    root = config.cache_dir()
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return Path(root) / f"autotune-{_gpu_name(dev)}.json"


def _read_file(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested past Python's stack
        log.warning("ignoring unreadable autotune cache %s: %s", path, exc)
        return {}
    if (
        not isinstance(data, dict)
        or data.get("schema") != _SCHEMA
        or not isinstance(data.get("entries"), dict)
    ):
        return {}
    return data["entries"]


def _write_file(path: Path, gpu: str, key: str, record: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # One writer at a time (an flock on a file beside it): two processes that each read the file,
        # then replaced it with what they read and their own entry, lost the other's entry (1,390 of 3,000 in
        # two processes writing at once), so a winner tuned for minutes was tuned again by the next run.
        # opened for reading: another user of a shared cache may have made it (0644), and flock takes any fd
        lock = os.open(path.parent / f".{path.name}.lock", os.O_RDONLY | os.O_CREAT, 0o666)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = _read_file(path)  # merge with what other processes wrote meanwhile
            entries[key] = record
            payload = {"schema": _SCHEMA, "gpu": gpu, "entries": dict(sorted(entries.items()))}
            fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
            try:
                # mkstemp's 0600 kept the file from the other users of a shared cache: the modes open() gives
                os.fchmod(fd, 0o666 & ~_umask())
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(payload, fh, indent=1)
                os.replace(tmp, path)  # atomic: readers see the old or the new file, never half of one
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        finally:
            os.close(lock)
    except OSError as exc:
        log.warning("could not write autotune cache %s: %s (the winner is kept in memory)", path, exc)


@functools.cache
def _umask() -> int:
    """The process's umask (read by setting it and back, once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@functools.cache
def _triton_version() -> str:
    """Triton's version, imported only here (a CPU run that never tunes may lack Triton), once: every
    lookup's key carries it."""
    import triton

    return triton.__version__


def _full_key(space: ConfigSpace, key: str) -> str:
    return f"{space.name}|{key}|triton={_triton_version()}"


def tuning_enabled() -> bool:
    """The ``autotune`` setting: off, :func:`select` takes a cached winner or the space's default config."""
    return config.current().autotune


def select(
    space: ConfigSpace,
    key: str,
    bench: Callable[[Config], object],
    *,
    device: torch.device,
    interpreted: bool = False,
    warmup_ms: int = 10,
    rep_ms: int = 40,
) -> Config:
    """The config to launch ``space``'s kernel with for the shape class ``key`` on ``device``.

    ``bench(cfg)`` must launch the kernel once with ``cfg`` (asynchronously, as a normal launch). It is called
    only when tuning; a config that fails to compile or launch (e.g. too much shared memory) is skipped.
    ``interpreted``: the kernel runs in the Triton interpreter (even on CUDA tensors): no tuning.
    """
    if interpreted or device.type != "cuda":
        return space.interpreter
    full = _full_key(space, key)
    mkey = (str(device), full)
    cfg = _memory.get(mkey)
    if cfg is not None:
        return cfg
    with _lock:
        cfg = _memory.get(mkey)
        if cfg is not None:
            return cfg
        path = cache_path(device)
        entries = _entries(path)
        sources = [("disk", entries)]
        if not tuning_enabled():
            sources.append(("shipped", _entries(SHIPPED / path.name)))
        for source, found in sources:
            record = found.get(full)
            cfg = space.by_name(str(record.get("config"))) if isinstance(record, dict) else None
            if cfg is not None:
                _memory[mkey] = cfg
                _events.append(TuneEvent(space.name, key, cfg.name, source, 0.0))
                return cfg
        if not tuning_enabled():
            _memory[mkey] = space.default
            _events.append(TuneEvent(space.name, key, space.default.name, "default", 0.0))
            return space.default
        log.warning(
            "tsconv: tuning %s for a new shape class (%d candidates; once per GPU model, kept in %s)",
            space.name, len(space.configs), path,
        )  # fmt: skip
        cfg, record = _tune(space, bench, device, warmup_ms=warmup_ms, rep_ms=rep_ms)
        entries[full] = record
        _write_file(path, torch.cuda.get_device_name(device), full, record)
        _memory[mkey] = cfg
        _events.append(
            TuneEvent(space.name, key, cfg.name, "tuned", record["tune_s"], dict(record["timings_ms"]))
        )
        log.info("tuned %s [%s]: %s in %.1f s", space.name, key, cfg.name, record["tune_s"])
        return cfg


def device_label(device: torch.device) -> str:
    """The GPU model's name (the disk cache is kept per model), or "cpu"."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _entries(path: Path) -> dict:
    """The loaded entries of a cache file (read once per process; call with ``_lock`` held)."""
    entries = _disk.get(str(path))
    if entries is None:
        entries = _read_file(path)
        _disk[str(path)] = entries
    return entries


def cached_record(space: str, key: str, *, device: torch.device) -> dict | None:
    """A decision stored by :func:`store_record` for ``space`` and ``key`` on ``device``'s GPU model, or None.

    For choices that are not block shapes (e.g. which path computes the engine's head, see
    :mod:`tsconv.engine.head`): the record is the caller's dict, kept in memory and in the same disk cache
    file as the tuned configs (under ``space|key|triton=<version>``, so a Triton upgrade decides again).
    ``record["config"]`` names the choice. A hit from disk is listed in :func:`events` (source "disk").
    """
    full = f"{space}|{key}|triton={_triton_version()}"
    mkey = (str(device), full)
    rec = _records.get(mkey)
    if rec is not None:
        return rec
    with _lock:
        rec = _entries(cache_path(device)).get(full)
        if not isinstance(rec, dict) or "config" not in rec:
            return None
        _records[mkey] = rec
        _events.append(TuneEvent(space, key, str(rec["config"]), "disk", 0.0))
        return rec


def store_record(space: str, key: str, record: dict, *, device: torch.device) -> None:
    """Keep ``record`` (a JSON-able dict with a ``"config"`` entry naming the choice) for :func:`cached_record`.

    Written to memory and merged into the disk cache file of ``device``'s GPU model (atomically, as tuned
    configs are); listed in :func:`events` as "tuned" with ``record["tune_s"]`` and ``record["timings_ms"]``.
    """
    full = f"{space}|{key}|triton={_triton_version()}"
    record = {**record, "torch": torch.__version__, "when": datetime.now(UTC).isoformat(timespec="seconds")}
    with _lock:
        path = cache_path(device)
        _entries(path)[full] = record
        _write_file(path, device_label(device), full, record)
        _records[(str(device), full)] = record
        timings = {k: float(v) for k, v in (record.get("timings_ms") or {}).items() if v is not None}
        _events.append(
            TuneEvent(space, key, str(record["config"]), "tuned", float(record.get("tune_s", 0.0)), timings)
        )


def gpu_ms(fn: Callable[[], object], *, warmup_ms: float = 10.0, rep_ms: float = 40.0) -> float:
    """Median GPU milliseconds per ``fn()`` call (``fn`` launches work on the current device's current stream).

    The calls are captured in a CUDA graph and replayed, so the host's launch cost is left out: timing each
    call with events, as ``triton.testing.do_bench`` does, measures the host whenever a launch takes longer to
    issue than the kernel takes to run (a [65536, 256] x [256, 64] head: ~0.03 ms of kernel against
    0.06-0.11 ms of un-replayed launch), and the tuner then picked among configs at random
    (benchmarks/NOTES.md, "Autotuning"). Written here rather than ``triton.testing.do_bench_cudagraph`` for
    ``capture_error_mode="thread_local"``: the engine's reader and writer threads may use CUDA while a first
    step tunes, which a global-mode capture would turn into errors. Raises whatever the capture raises (``fn``
    synchronizing, say); callers fall back.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(side):
        fn()
        start.record()
        for _ in range(5):
            fn()
        end.record()
        end.synchronize()
        # The estimate includes host time, so it can only make the graph shorter than rep_ms, never longer.
        estimate = max(start.elapsed_time(end) / 5, 1e-3)
        calls = max(1, min(1000, int(max(rep_ms, warmup_ms) / estimate)))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
            for _ in range(calls):
                fn()
        graph.replay()  # warm
        times = []
        for _ in range(7):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / calls)
    torch.cuda.current_stream().wait_stream(side)
    del graph
    return sorted(times)[len(times) // 2]


def _flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer the size of the GPU's L2 cache (50 MB on the H100, 60 MB on the H200), zeroed before each
    timed call so no candidate finds its inputs cached. ``triton.testing.do_bench`` allocates 256 MB per
    call for this: inside the engine's first step that took a 4096-feature run to 1.31 GB allocated against
    its 1.2 GB budget (benchmarks/NOTES.md, "Autotuning")."""
    size = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)) or (64 << 20)
    return torch.empty(size // 4, dtype=torch.int32, device=device)


def calls_ms(fn: Callable[[], object], flush: torch.Tensor, *, warmup_ms: float, rep_ms: float) -> float:
    """Median milliseconds of one ``fn()`` call between CUDA events, the L2 cache flushed before each (what
    ``triton.testing.do_bench(..., return_mode="median")`` measures, with the caller's ``flush`` buffer)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(5):
        flush.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    pairs = []
    for _ in range(max(1, min(1000, int(rep_ms / estimate)))):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        flush.zero_()
        a.record()
        fn()
        b.record()
        pairs.append((a, b))
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in pairs)
    return times[len(times) // 2]


_CHECK_MAX_BYTES = 256 << 20  # outputs larger than this are not copied for the cross-check


def _cross_check(
    bench: Callable[[Config], object], cfg: Config, ret: object, reference: torch.Tensor | None
) -> tuple[torch.Tensor | None, str | None]:
    """Run ``cfg`` once more into a NaN-poisoned output and compare it with the first candidate's output.

    Why: the tuner ranks candidates by time only, and a candidate that miscompiles (on the H200, a fused TMA
    tile left its outputs unwritten and was the fastest: benchmarks/NOTES.md, "Autotuning") would otherwise
    win. The check is loose on purpose (configs legitimately round differently): the same NaN pattern and a
    max difference within 1% of the output's scale. ``ret``: what ``bench`` returned (the launch's output
    tensor; anything else skips the check). Returns (the reference, None when ``cfg`` agrees, else why not).
    """
    if (
        not isinstance(ret, torch.Tensor)
        or not ret.is_floating_point()
        or ret.numel() * ret.element_size() > _CHECK_MAX_BYTES
    ):
        return reference, None
    ret.fill_(math.nan)
    got = bench(cfg)
    if not isinstance(got, torch.Tensor) or got.data_ptr() != ret.data_ptr():
        return reference, None
    got = got.detach().to(torch.float32)
    if reference is None:
        return got.clone(), None
    if got.shape != reference.shape:
        return reference, None
    nan_ref, nan_got = torch.isnan(reference), torch.isnan(got)
    if not torch.equal(nan_ref, nan_got):
        extra = int((nan_got & ~nan_ref).sum())
        return reference, f"{extra} outputs NaN (unwritten or wrong) where the first candidate's are not"
    fin = torch.isfinite(reference) & torch.isfinite(got)
    if not fin.any():
        return reference, None
    scale = float(reference[fin].abs().max())
    diff = float((reference[fin] - got[fin]).abs().max())
    if diff > 1e-2 * scale + 1e-6:
        return reference, f"max difference {diff:.3g} against the output's scale {scale:.3g}"
    return reference, None


def _tune(
    space: ConfigSpace,
    bench: Callable[[Config], object],
    device: torch.device,
    *,
    warmup_ms: int,
    rep_ms: int,
) -> tuple[Config, dict]:
    start = time.perf_counter()
    timings: dict[str, float] = {}
    with torch.cuda.device(device):
        reference: torch.Tensor | None = None
        for cfg in space.configs:
            try:
                ret = bench(cfg)  # compile outside the timed region
                torch.cuda.synchronize(device)
                timings[cfg.name] = math.nan
                reference, why = _cross_check(bench, cfg, ret, reference)
                if why is not None:
                    log.warning("autotune %s: config %s disagrees with %s: %s; skipped",
                                space.name, cfg.name, space.configs[0].name, why)  # fmt: skip
                    timings[cfg.name] = math.inf
            except Exception as exc:  # noqa: BLE001 - any failing candidate is skipped (OutOfResources, ...)
                log.info("autotune %s: config %s failed: %s", space.name, cfg.name, exc)
                timings[cfg.name] = math.inf
        flush = _flush_buffer(device)
        for cfg in space.configs:
            if math.isinf(timings[cfg.name]):
                continue
            try:
                timings[cfg.name] = calls_ms(
                    lambda cfg=cfg: bench(cfg), flush, warmup_ms=warmup_ms, rep_ms=rep_ms
                )
            except Exception as exc:  # noqa: BLE001
                log.info("autotune %s: config %s failed: %s", space.name, cfg.name, exc)
                timings[cfg.name] = math.inf
        del flush
    finite = {name: ms for name, ms in timings.items() if math.isfinite(ms)}
    if not finite:
        msg = f"every candidate config of {space.name} failed to run on {torch.cuda.get_device_name(device)}"
        raise RuntimeError(msg)
    best = min(finite, key=finite.__getitem__)
    cfg = space.by_name(best)
    assert cfg is not None
    record = {
        "config": best,
        "ms": finite[best],
        "timings_ms": {name: (ms if math.isfinite(ms) else None) for name, ms in timings.items()},
        "tune_s": round(time.perf_counter() - start, 3),
        "timing": "calls",
        "torch": torch.__version__,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    return cfg, record


# --------------------------------------------------------------------------------------------------------
# conv1d spaces
# --------------------------------------------------------------------------------------------------------


def _dense(
    bt: int, bo: int, bc: int, warps: int, stages: int, group: int = 1, a16: int = 0, tma: int = 0
) -> Config:
    """``tma``: 1 = x tiles by the TMA, 2 = x and weight tiles by the TMA."""
    meta = {"BLOCK_T": bt, "BLOCK_O": bo, "BLOCK_C": bc}
    name = f"t{bt}_o{bo}_c{bc}_w{warps}_s{stages}"
    if group > 1:
        meta["GROUP_T"] = group  # grouped program ordering (see the kernel); absent means 1
        name += f"_g{group}"
    if a16:
        meta["A16"] = 1  # launcher-level ("fp16" only): cast float32 x to a float16 copy before the kernel
        name += "_a16"
    if tma:
        meta["TMA"] = 1  # launcher-level: the TMA kernel (Hopper, dense, time-major x)
        name += "_tma"
    if tma == 2:
        meta["W_TMA"] = 1
        name += "w"
    return Config(name, meta, num_warps=warps, num_stages=stages)


def _clamped(cfgs: list[Config], Cg: int, Og: int) -> list[Config]:
    """Shrink BLOCK_O / BLOCK_C to the group's channel counts (at least 16, tl.dot's minimum); dedupe."""
    max_o, max_c = max(16, pow2_bucket(Og)), max(16, pow2_bucket(Cg))
    out: list[Config] = []
    for cfg in cfgs:
        m = cfg.meta
        c = _dense(
            m["BLOCK_T"],
            min(m["BLOCK_O"], max_o),
            min(m["BLOCK_C"], max_c),
            cfg.num_warps,
            cfg.num_stages,
            m.get("GROUP_T", 1),
            m.get("A16", 0),
            m.get("TMA", 0) + m.get("W_TMA", 0),
        )
        if all(o.name != c.name for o in out):
            out.append(c)
    return out


# cached: built on every call, a space took half the launcher's host time (benchmarks/NOTES.md, "Kernels: the
# GEMM head")
@functools.lru_cache(maxsize=256)
def conv1d_dense_space(precision: str, K: int, Cg: int, Og: int, *, tma: bool = False) -> ConfigSpace:
    """Implicit-GEMM conv1d: output tile [BLOCK_T steps, BLOCK_O channels], reduction chunk BLOCK_C.

    Shape classes: short K (<= 8) and long K, per precision. "tf32" feeds float32 x to the tensor cores as
    loaded (4-byte operands: BLOCK_C 32 keeps a 128x256 stage at 48 KiB, four stages fit the 227 KiB of
    shared memory). "fp16": the ``_a16`` candidates cast float32 x once to a float16 copy in the launcher
    (both operands 2 bytes in shared memory, BLOCK_C 64), the others convert in registers; the tuner times the
    cast with the kernel. ``_gN``: grouped program ordering, N time blocks per sweep of the output blocks.
    Block sizes are clamped to the per-group channel counts ``Cg`` (reduction) and ``Og`` (outputs).
    ``tma``: the call can use the TMA kernel (``conv1d.dense._dense_tma_ok``): "tf32" / "fp16" add ``_tma``
    candidates (x tiles loaded by the copy engine, which rounds float32 x to TF32 for "tf32": no pre-pass).
    """
    long_k = K > 8
    if precision == "fp16":
        configs = [
            _dense(128, 256, 64, 8, 3, a16=1),
            _dense(128, 256, 64, 8, 4, a16=1),
            _dense(256, 128, 64, 8, 3, a16=1),
            _dense(256, 128, 64, 8, 4, a16=1),
            _dense(128, 128, 64, 8, 4, group=8, a16=1),
            _dense(128, 128, 64, 4, 4, a16=1),
            _dense(128, 256, 64, 8, 3),  # the previous winners (conversion in registers)
            _dense(128, 256, 64, 8, 4),
        ]
    elif precision == "tf32":
        configs = [
            _dense(128, 128, 32, 8, 4),
            _dense(128, 256, 32, 8, 3),
            _dense(128, 256, 32, 8, 4),
            _dense(256, 128, 32, 8, 3),
            _dense(256, 128, 32, 8, 4),
            _dense(128, 128, 32, 4, 4),
            _dense(128, 128, 64, 8, 3),
            _dense(128, 128, 32, 8, 5, group=8),
        ]
    else:
        # "fp32": three products per step (3xTF32) and two [BLOCK_T, BLOCK_O] float32 accumulators (the
        # running sum and the step's tensor-core partial): tiles keep <= 64 accumulator values per thread so
        # the pair fits in registers without spills (checked with ptxas for sm_90).
        configs = [
            _dense(128, 128, 32, 8, 3),
            _dense(128, 128, 32, 8, 4),
            _dense(64, 128, 32, 4, 3),
            _dense(64, 128, 32, 4, 4),
            _dense(128, 128, 16, 8, 4),
            _dense(64, 64, 32, 4, 4),
        ]
    if tma and precision == "tf32":
        configs += [
            _dense(128, 256, 32, 8, 4, tma=1),
            _dense(128, 256, 32, 8, 3, tma=1),
            _dense(256, 128, 32, 8, 4, tma=1),
            _dense(128, 256, 32, 8, 4, tma=2),
            _dense(128, 256, 32, 8, 3, tma=2),
            _dense(256, 128, 32, 8, 4, tma=2),
        ]
    elif tma and precision == "fp16":
        configs += [
            _dense(128, 256, 64, 8, 4, a16=1, tma=1),
            _dense(128, 256, 64, 8, 3, a16=1, tma=1),
            _dense(128, 256, 64, 8, 3, tma=1),
            _dense(128, 256, 64, 8, 4, a16=1, tma=2),
            _dense(128, 256, 64, 8, 3, a16=1, tma=2),
            _dense(256, 128, 64, 8, 3, a16=1, tma=2),
        ]
    configs = _clamped(configs, Cg, Og)
    interp = _clamped([_dense(64, 32, 32, 4, 1, a16=int(precision == "fp16"))], Cg, Og)[0]
    version = "v2" if precision == "fp32" else "v3"
    name = f"conv1d_dense_{version}_{'long' if long_k else 'short'}_k_{precision}{'_tma' if tma else ''}"
    return ConfigSpace(name, tuple(configs), configs[0], interp)


def _direct(bt: int, bg: int, warps: int, stages: int, unroll: int = 1) -> Config:
    meta = {"BLOCK_T": bt, "BLOCK_G": bg}
    name = f"t{bt}_g{bg}_w{warps}_s{stages}"
    if unroll > 1:
        meta["UNROLL"] = unroll  # taps per unrolled chunk of the tap loop; absent means 1
        name += f"_u{unroll}"
    return Config(name, meta, warps, stages)


@functools.lru_cache(maxsize=256)
def conv1d_direct_space(
    block_m: int, groups: int, *, one_channel: bool = False, filters: int | None = None
) -> ConfigSpace:
    """Direct (FMA) conv1d for depthwise and few-channels-per-group convs: a [BLOCK_T, BLOCK_G, BLOCK_M] tile.

    Candidates keep 16 to 64 float32 accumulators per thread, no more groups per tile than there are, and a
    [BLOCK_G, BLOCK_M] weight tile smaller than the thread count (so the compiler reloads it in the
    accumulator's layout rather than shuffling it through shared memory on every tap). The first candidate
    is the one-tap loop; the others unroll the tap loop (``_uN``: N taps' loads in flight per chunk) on the
    same tile, on smaller-footprint tiles (more programs per SM, 2 or 4 warps) and on wider channel tiles.
    ``one_channel`` (one input channel per group): the register-window kernel's candidates
    (:func:`conv1d_window_configs`, for ``filters`` per channel), then the bank kernel's, then the direct
    kernel's best four, so the tuner picks the kernel too.
    """
    max_g = pow2_bucket(groups)

    def fits(bt: int, bg: int, warps: int) -> bool:
        threads = 32 * warps
        return 16 <= bt * bg * block_m / threads <= 64 and bg * block_m < threads

    base: list[tuple[int, int, int]] = []
    pairs = (
        (128, 16),
        (64, 32),
        (256, 8),
        (64, 16),
        (128, 32),
        (256, 16),
        (128, 8),
        (512, 4),
        (512, 2),
        (512, 1),
    )
    for bt, bg in pairs:
        bg = min(bg, max_g)
        for warps in (4, 8):
            if fits(bt, bg, warps) and (bt, bg, warps) not in base:
                base.append((bt, bg, warps))
    if not base:
        bg = max(1, min(max_g, 128 // block_m // 2))
        only = _direct(max(16, min(1024, 2048 // (bg * block_m))), bg, 4, 2)
        if one_channel:
            return _with_bank(block_m, groups, [only], filters)
        return ConfigSpace(f"conv1d_direct_v2_m{block_m}", (only,), only, _direct(64, min(max_g, 32), 4, 1))
    cands = [(*base[0], 1), (*base[0], 4), (*base[0], 8)]
    if len(base) > 1:
        cands.append((*base[1], 4))
    extra = ((64, 16, 4), (64, 8, 2), (128, 8, 2), (32, 32, 8), (64, 32, 8), (32, 16, 4))
    for bt, bg, warps in extra:
        bg = min(bg, max_g)
        if fits(bt, bg, warps):
            cands.append((bt, bg, warps, 4))
    configs: list[Config] = []
    for bt, bg, warps, unroll in cands:
        cfg = _direct(bt, bg, warps, 2, unroll)
        if all(c.name != cfg.name for c in configs):
            configs.append(cfg)
    configs = configs[:8]
    if one_channel:
        return _with_bank(block_m, groups, configs[:4], filters)
    interp = _direct(64, min(max_g, 32), 4, 1, 4)
    return ConfigSpace(f"conv1d_direct_v2_m{block_m}", tuple(configs), configs[0], interp)


def _with_bank(block_m: int, groups: int, direct: list[Config], filters: int | None) -> ConfigSpace:
    """The window kernel's candidates (its first is the default), then the bank kernel's, then the direct
    kernel's best ones."""
    bank = conv1d_bank_configs(block_m, groups)
    win = conv1d_window_configs(filters) if filters is not None else []
    if win:
        # On the H200 the window kernel beat every bank and direct config by 3-5x on the time-major banks
        # (benchmarks/NOTES.md, "Kernels: depthwise banks"), and each generated kernel takes ~10 s to compile:
        # the bank and direct kernels keep one candidate each (channel-major or strided x, where the window's
        # loads do not coalesce).
        # The interpreter config: small rows and taps, so the CPU tests run it quickly.
        interp = _window(min(4, max(1, 64 // filters)), 4, 1)
        return ConfigSpace(f"conv1d_bank_v3_m{filters}", (*win, bank[0], direct[-1]), win[0], interp)
    interp = _bank(32, min(pow2_bucket(groups), 16), 4, 2, 4, None)  # two time blocks a program, a tap tail
    return ConfigSpace(f"conv1d_bank_v1_m{block_m}", (*bank, *direct), bank[0], interp)


def _window(rows: int, taps: int, warps: int, maxnreg: int | None = None) -> Config:
    meta = {"WINDOW": 1, "ROWS": rows, "TAPS": taps, "BLOCK_G": 32 * warps}
    name = f"win_r{rows}_k{taps}_w{warps}" + (f"_r{maxnreg}" if maxnreg else "")
    return Config(name, meta, warps, 1, maxnreg)


# Filters per channel up to which the window kernel is a candidate (two rows a thread at 64 accumulators).
WINDOW_MAX_FILTERS = 32


def conv1d_window_configs(filters: int) -> list[Config]:
    """Candidates for the register-window kernel (:mod:`tsconv.kernels.conv1d.window`) with ``filters`` (M)
    per channel: one channel a thread, R rows x M filters of accumulators (64 or 128), KB taps per step.

    Compiled for sm_90 (Triton's ptxas): at 64 accumulators about 130-150 registers and 82% of the tap loop's
    instructions FMAs; at 128 accumulators 226-254 registers (no spills). Tuned on the H200 (896b9dd,
    benchmarks/NOTES.md, "Kernels: depthwise banks"), 8 taps a step won everywhere; 4 taps and 96 accumulators
    never did (dropped).
    """
    if not 1 <= filters <= WINDOW_MAX_FILTERS:
        return []
    r64, r128 = max(2, 64 // filters), max(2, 128 // filters)
    cands = [_window(r64, 8, 4), _window(r64, 8, 2)]
    if r128 <= 32:  # more rows take minutes to compile (Triton's coalescing pass) and never won
        cands.append(_window(r128, 8, 4))
    out: list[Config] = []
    for cfg in cands:
        if all(c.name != cfg.name for c in out):
            out.append(cfg)
    return out


def _bank(bt: int, bg: int, warps: int, t_iters: int, unroll: int, maxnreg: int | None) -> Config:
    meta = {"BANK": 1, "BLOCK_T": bt, "BLOCK_G": bg, "T_ITERS": t_iters, "UNROLL": unroll}
    name = f"bank_t{bt}_g{bg}_w{warps}_i{t_iters}_u{unroll}" + (f"_r{maxnreg}" if maxnreg else "")
    return Config(name, meta, warps, 1, maxnreg)


def conv1d_bank_configs(block_m: int, groups: int) -> list[Config]:
    """Candidates for ``_conv1d_bank_kernel`` (one input channel per group: depthwise filter banks).

    Measured on the H200 (``benchmarks/depthwise_probe.py``; benchmarks/NOTES.md, "Kernels: depthwise banks"):
    the tap loop is bound by the L1 data path (each 128-bit load delivers 512 bytes to registers, weights
    included, broadcast or not), so the tiles that win keep 4 channels x all filters per thread with 8 taps'
    loads in flight and as many rows as the registers allow: 16 channels x 128 steps on 4 warps (64
    accumulators at 4 filters, 128 at 8), whatever the weight tile's size. ``_iN``: N time blocks per program;
    ``_uN``: taps per unrolled chunk; ``_rN``: a register cap per thread.
    """
    bg = max(1, min(pow2_bucket(groups), 16))
    acc = 64 if block_m <= 4 else 128  # float32 accumulators per thread on 4 warps
    bt = max(16, min(4096, acc * 128 // (bg * block_m)))
    cands = [
        _bank(bt, bg, 4, 1, 8, None),
        _bank(bt, bg, 4, 2, 8, None),
        _bank(bt, bg, 4, 1, 4, None),
        _bank(max(16, bt // 2), bg, 4, 2, 8, None),
        _bank(bt, bg, 8, 1, 8, None),
        _bank(bt, bg, 4, 4, 2, 128),
    ]
    out: list[Config] = []
    for cfg in cands:
        if all(c.name != cfg.name for c in out):
            out.append(cfg)
    return out
