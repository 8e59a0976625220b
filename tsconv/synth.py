"""Synthetic tick stores: realistic-looking, seeded, written block by block in bounded memory.

The output follows the store convention read by :mod:`tsconv.io`: a zarr group holding ``values``
[T, F] (time-major), ``time`` [T] int64 nanoseconds since the epoch (strictly increasing) and the
group attribute ``features`` (F names).

Features come in groups of three per instrument, named cyclically so that any F works:
``px_i`` (price on a 0.01 tick grid, integer-tick random walk), ``vol_i`` (heavy-tailed, integer-valued
volume, often 0) and ``spread_i`` (bid-ask spread, a positive multiple of 0.01, mostly 1-3 ticks).
Cells go missing in runs of a few to a few hundred steps (``nan_fraction`` of all cells, roughly),
sometimes for a whole instrument at once, and some instruments list late (NaN for their first few
hundred rows).

Determinism: the output is a function of (seed, rows, features) and does not depend on chunking,
the zarr format or the thread timing; the dtype only changes the rounding of the same numbers
(float16 also clips volumes at 65504).
"""

from __future__ import annotations

import math
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numcodecs
import numpy as np
import zarr
import zarr.codecs

from tsconv.errors import StoreError
from tsconv.io.store import is_zarr_store
from tsconv.progress import progress_bar

__all__ = ["make_ticks", "feature_names", "default_chunk_rows", "START_NS"]

#: First timestamp: 2026-01-02 09:30:00 UTC, in nanoseconds since the epoch.
START_NS: int = int(np.datetime64("2026-01-02T09:30:00", "ns").astype(np.int64))

_KINDS = ("px", "vol", "spread")
_DTYPES = ("float32", "float64", "float16")
_CHUNK_BYTES = 16 * 1024 * 1024

# Random integers are drawn as uint16 and mapped through thresholds or lookup tables: one cheap draw per
# cell instead of normals or power laws keeps generation at a few ns per cell.
_U16 = 1 << 16
# NaN runs: lengths log-uniform on [3, 300] steps; 30 % of runs blank the whole instrument (a halt).
_GAP_MIN, _GAP_MAX, _GAP_WIDE = 3, 300, 0.3
# Late listings: 10 % of instruments (never instrument 0) start 100..1000 rows in.
_LATE_P, _LATE_MIN, _LATE_MAX = 0.1, 100, 1000
# Chunk rows compressed concurrently while the main thread generates the next one.
_WRITERS = 2


def feature_names(features: int) -> list[str]:
    """Names of ``features`` columns: px_0, vol_0, spread_0, px_1, ... (cyclic, so any count works)."""
    return [f"{_KINDS[j % 3]}_{j // 3}" for j in range(features)]


def default_chunk_rows(features: int, itemsize: int) -> int:
    """Rows per chunk so that one chunk of all features holds about 16 MiB (multiple of 1024 when >= 1024)."""
    rows = max(1, _CHUNK_BYTES // (features * itemsize))
    return rows // 1024 * 1024 if rows >= 1024 else rows


def _block_rows(features: int) -> int:
    # The generation block depends on F only (not on chunking), which keeps the output independent of
    # chunk_rows; about 1M cells per block keeps temporaries a few MB while numpy call overhead stays small.
    rows = 1 << max(0, int(math.log2(max(1, (1 << 20) // features))))
    return min(max(rows, 1024), 1 << 16)


def _vol_table() -> np.ndarray:
    # Quantiles of a zero-inflated discrete Pareto (alpha 1.5): 30 % of ticks are quote updates without
    # volume, the rest have a power-law size; indexed by a uniform uint16.
    p = (np.arange(_U16, dtype=np.float64) + 0.5) / _U16
    q = np.clip((p - 0.3) / 0.7, 0.0, None)
    vol = np.floor((1.0 - q) ** (-1.0 / 1.5))
    vol[p < 0.3] = 0.0
    return vol


def _spread_table() -> np.ndarray:
    # Spread in ticks: 1: 55 %, 2: 27 %, 3: 12 %, 4: 4 %, 5: 1.5 %, 6..10: 0.5 %.
    probs = np.array([0.55, 0.27, 0.12, 0.04, 0.015, 0.001, 0.001, 0.001, 0.001, 0.001])
    edges = np.round(np.cumsum(probs) / probs.sum() * _U16).astype(np.int64)
    return np.searchsorted(edges, np.arange(_U16), side="right").astype(np.float64) + 1.0


class _TickGenerator:
    """Produces the series one generation block at a time, carrying walks, gaps and time across blocks."""

    def __init__(self, *, seed: int, rows: int, features: int, dtype: np.dtype, nan_fraction: float) -> None:
        self.seed, self.rows, self.features, self.dtype = seed, rows, features, dtype
        self.nan_fraction = nan_fraction
        self.block_rows = _block_rows(features)
        self.pos = 0
        self._block = 0
        # float16 cannot hold integer ticks or big volumes exactly, so its numbers are made in float32.
        self._ct = np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)

        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(0,))))
        n_inst = -(-features // 3)
        self._n = (len(range(0, features, 3)), len(range(1, features, 3)), len(range(2, features, 3)))
        self._ticks = rng.integers(5_000, 20_001, size=n_inst).astype(np.int32)  # 50.00 .. 200.00
        self._p_move = np.exp(rng.uniform(np.log(0.02), np.log(0.3), size=n_inst))  # P(price moves) per step
        self._activity = np.zeros(n_inst)  # log multiplier of p_move, AR(1) over blocks: volatility clusters
        lot = rng.choice(np.array([1.0, 10.0, 100.0]), size=n_inst, p=[0.3, 0.4, 0.3])
        self._lot = lot[: self._n[1]].astype(self._ct)
        extra = rng.choice(np.array([0.0, 1.0]), size=n_inst, p=[0.8, 0.2])  # illiquid: one tick wider
        self._spread_extra = extra[: self._n[2]].astype(self._ct)
        late = (rng.random(n_inst) < _LATE_P) & (np.arange(n_inst) > 0)
        listing = rng.integers(_LATE_MIN, _LATE_MAX + 1, size=n_inst)
        # A late listing never blanks more than a quarter of a short series.
        listing = np.where(late & (nan_fraction > 0), np.minimum(listing, rows // 4), 0)
        self._listing = np.repeat(listing, 3)[:features]
        self._late_cols = np.flatnonzero(self._listing > 0)

        self._vol_tab = _vol_table().astype(self._ct)
        self._spread_tab = _spread_table().astype(self._ct)
        widths = np.repeat(np.minimum(3, features - 3 * np.arange(n_inst)), 3)[:features]
        self._group_width = widths
        # Mean run length of floor(log-uniform) lengths, times the mean number of columns a run covers.
        mean_len = (_GAP_MAX - _GAP_MIN) / math.log(_GAP_MAX / _GAP_MIN) - 0.5
        self._mean_run_cells = mean_len * ((1 - _GAP_WIDE) + _GAP_WIDE * float(widths.mean()))
        self._nan_debt = 0.0  # NaN cells owed so far, so the fraction stays close to nan_fraction
        self._pending = np.zeros(features, dtype=np.int64)  # rows of a gap still to blank in later blocks
        self._last_ns = START_NS

    def next_rows(self) -> int:
        return min(self.block_rows, self.rows - self.pos)

    def fill(self, out: np.ndarray, time_out: np.ndarray) -> None:
        """Write the next ``next_rows()`` rows into ``out`` [n, F] and ``time_out`` [n]."""
        n = out.shape[0]
        assert n == self.next_rows() and n > 0
        # One stream per block: order and chunking of the writes cannot change the numbers.
        rng = np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=(1, self._block)))
        )
        u = rng.integers(0, _U16, size=(n, self.features), dtype=np.uint16)
        self._fill_prices(out, u[:, 0::3], rng)
        if self._n[1]:
            v = np.take(self._vol_tab, u[:, 1::3])  # take beats fancy indexing by ~2x here
            v *= self._lot
            if out.dtype == np.float16:
                np.minimum(v, np.finfo(np.float16).max, out=v)  # clip instead of overflowing to inf
            out[:, 1::3] = v
        if self._n[2]:
            s = np.take(self._spread_tab, u[:, 2::3])
            s += self._spread_extra
            s /= self._ct.type(100)  # integer / 100 is correctly rounded: the nearest value to the grid
            out[:, 2::3] = s
        self._fill_time(time_out, rng)
        if self.nan_fraction > 0:
            self._apply_gaps(out, rng)
            self._apply_listing(out)
        self.pos += n
        self._block += 1

    def _fill_prices(self, out: np.ndarray, u: np.ndarray, rng: np.random.Generator) -> None:
        self._activity = 0.8 * self._activity + 0.3 * rng.standard_normal(self._activity.shape)
        half = np.clip(self._p_move * np.exp(self._activity), 0.0, 0.8) / 2 * _U16
        t1 = np.round(half).astype(np.uint16)  # P(step >= +1) = P(step <= -1) = p/2
        t2 = np.round(half * 0.1).astype(np.uint16)  # one move in ten jumps two ticks
        steps = (u < t1).view(np.int8)
        steps += (u < t2).view(np.int8)
        steps -= (u > np.uint16(_U16 - 1) - t1).view(np.int8)
        steps -= (u > np.uint16(_U16 - 1) - t2).view(np.int8)
        ticks = np.cumsum(steps, axis=0, dtype=np.int32)
        ticks += self._ticks
        np.maximum(ticks, 1, out=ticks)  # a price floor of one tick keeps prices positive
        self._ticks = ticks[-1].copy()
        px = ticks.astype(self._ct)
        px /= self._ct.type(100)
        out[:, 0::3] = px

    def _fill_time(self, time_out: np.ndarray, rng: np.random.Generator) -> None:
        # Bursty arrivals: exponential gaps whose mean (20 us .. 5 ms) changes from block to block, plus
        # 1 us so that timestamps stay strictly increasing.
        mean_ns = math.exp(rng.uniform(math.log(2e4), math.log(5e6)))
        gaps = rng.exponential(mean_ns, size=time_out.shape[0]).astype(np.int64)
        gaps += 1000
        if self.pos == 0:
            gaps[0] = 0  # the series starts exactly at START_NS
        np.cumsum(gaps, out=time_out)
        time_out += self._last_ns
        self._last_ns = int(time_out[-1])

    def _apply_gaps(self, out: np.ndarray, rng: np.random.Generator) -> None:
        n, f = out.shape
        for c in np.flatnonzero(self._pending):
            out[: self._pending[c], c] = np.nan
        self._pending = np.maximum(self._pending - n, 0)

        # Draw enough candidate runs in one go and keep a prefix that pays the debt, so the realised
        # fraction tracks nan_fraction instead of varying like a Poisson count.
        self._nan_debt += self.nan_fraction * n * f
        if self._nan_debt <= 0:
            return
        k = int(self._nan_debt / self._mean_run_cells * 1.5) + 4
        starts = rng.integers(0, n, size=k)
        lengths = np.exp(rng.uniform(np.log(_GAP_MIN), np.log(_GAP_MAX), size=k)).astype(np.int64)
        cols = rng.integers(0, f, size=k)
        wide = rng.random(k) < _GAP_WIDE
        c0 = np.where(wide, cols - cols % 3, cols)
        c1 = np.where(wide, c0 + self._group_width[cols], cols + 1)
        run_cells = lengths * (c1 - c0)
        cells = np.cumsum(run_cells)
        # Keep a run when its midpoint falls within the debt: unbiased, and a tiny store gets no gap at all
        # rather than one gap that would blank most of it.
        m = int(np.searchsorted(cells - run_cells / 2, self._nan_debt, side="left"))
        if m == 0:
            return
        self._nan_debt -= float(cells[m - 1])
        for s, ln, a, b in zip(
            starts[:m].tolist(), lengths[:m].tolist(), c0[:m].tolist(), c1[:m].tolist(), strict=True
        ):
            out[s : s + ln, a:b] = np.nan
            if s + ln > n:
                self._pending[a:b] = np.maximum(self._pending[a:b], s + ln - n)

    def _apply_listing(self, out: np.ndarray) -> None:
        for c in self._late_cols:
            blank = int(self._listing[c]) - self.pos
            if blank > 0:
                out[:blank, c] = np.nan


class _RowStream:
    """Fills buffers of any row count from the generator, generating in place when blocks line up."""

    def __init__(self, gen: _TickGenerator) -> None:
        self.gen = gen
        g = gen.block_rows
        self._scratch = np.empty((g, gen.features), dtype=gen.dtype)
        self._tscratch = np.empty(g, dtype=np.int64)
        self._left = 0  # rows generated into the scratch but not handed out yet
        self._left_at = 0

    def read_into(self, out: np.ndarray, time_out: np.ndarray) -> None:
        n, done = out.shape[0], 0
        while done < n:
            if self._left:
                take = min(self._left, n - done)
                a = self._left_at
                out[done : done + take] = self._scratch[a : a + take]
                time_out[done : done + take] = self._tscratch[a : a + take]
                self._left -= take
                self._left_at += take
                done += take
                continue
            m = self.gen.next_rows()
            if m <= n - done:
                self.gen.fill(out[done : done + m], time_out[done : done + m])
                done += m
            else:
                self.gen.fill(self._scratch[:m], self._tscratch[:m])
                self._left, self._left_at = m, 0


def _codec(zarr_format: int) -> object:
    if zarr_format == 3:
        return zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")
    return numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)


def _check_int(name: str, value: object, minimum: int, flag: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise StoreError(
            f"{name} must be an integer >= {minimum}, got {value!r}",
            hint=f"pass {flag} as a whole number of at least {minimum}.",
        )
    return int(value)


def _is_removable(path: Path) -> bool:
    # Overwrite deletes a tree: only allow it for a zarr store or an empty directory, so that a mistyped
    # --output cannot wipe an unrelated directory.
    if not path.is_dir() or path.is_symlink():
        return False
    return is_zarr_store(path) or not any(path.iterdir())


def make_ticks(
    path: str | os.PathLike[str],
    *,
    rows: int,
    features: int,
    seed: int = 0,
    dtype: str = "float32",
    chunk_rows: int | None = None,
    chunk_features: int | None = None,
    nan_fraction: float = 0.01,
    zarr_format: int = 3,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Write a synthetic tick store of ``rows`` x ``features`` at ``path`` and return its path.

    Memory stays at about three chunk rows of all features (two being written while the next is
    generated), ~48 MiB with the default chunks; an explicit large ``chunk_rows`` raises it. The store
    is written beside ``path`` and renamed into place when complete, so a failed run leaves nothing behind.
    ``nan_fraction=0`` gives a dense store (no gaps and no late listings). float16 cannot hold the 0.01
    grid (prices are the nearest float16) and volumes clip at 65504.
    """
    rows = _check_int("rows", rows, 1, "--rows")
    features = _check_int("features", features, 1, "--features")
    seed = _check_int("seed", seed, 0, "--seed")
    try:
        dt = np.dtype(dtype) if dtype is not None else None
    except TypeError:
        dt = None
    if dt is None or dt.name not in _DTYPES:
        raise StoreError(
            f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}", hint="use --dtype float32."
        )
    if chunk_rows is not None:
        chunk_rows = _check_int("chunk_rows", chunk_rows, 1, "--chunk-rows")
    if chunk_features is not None:
        chunk_features = _check_int("chunk_features", chunk_features, 1, "--chunk-features")
    if (
        isinstance(nan_fraction, bool)
        or not isinstance(nan_fraction, int | float)
        or not 0 <= nan_fraction < 1
    ):
        raise StoreError(
            f"nan_fraction must be a number in [0, 1), got {nan_fraction!r}",
            hint="pass e.g. --nan-fraction 0.01, or 0 for a store without gaps.",
        )
    if zarr_format not in (2, 3):
        raise StoreError(f"zarr_format must be 2 or 3, got {zarr_format!r}", hint="use --zarr-format 3.")

    target = Path(path).expanduser().absolute()
    if target.exists() or target.is_symlink():
        if not overwrite:
            raise StoreError(
                f"output {str(target)!r} already exists",
                hint="pass overwrite=True (--overwrite) to replace it, or choose another path.",
            )
        if not _is_removable(target):
            raise StoreError(
                f"refusing to overwrite {str(target)!r}: it is not a zarr store or an empty directory",
                hint="remove it yourself or choose another path.",
            )
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)

    crows = chunk_rows if chunk_rows is not None else default_chunk_rows(features, dt.itemsize)
    cfeat = min(chunk_features, features) if chunk_features is not None else features
    try:
        _write(
            partial,
            rows=rows,
            features=features,
            seed=seed,
            dtype=dt,
            chunks=(crows, cfeat),
            nan_fraction=float(nan_fraction),
            zarr_format=zarr_format,
            progress=progress,
        )
        if target.exists() or target.is_symlink():
            shutil.rmtree(target)
        os.replace(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return target


def _write(
    path: Path,
    *,
    rows: int,
    features: int,
    seed: int,
    dtype: np.dtype,
    chunks: tuple[int, int],
    nan_fraction: float,
    zarr_format: int,
    progress: bool,
) -> None:
    codec = _codec(zarr_format)
    group = zarr.open_group(zarr.storage.LocalStore(path), mode="w-", zarr_format=zarr_format)
    group.attrs.update(
        {
            "features": feature_names(features),
            "synth": {"generator": "tsconv.synth", "seed": seed, "nan_fraction": nan_fraction},
        }
    )
    v3 = zarr_format == 3
    values = group.create_array(
        "values",
        shape=(rows, features),
        dtype=dtype,
        chunks=chunks,
        compressors=codec,
        fill_value=np.nan,  # a chunk that was never written reads as missing, not as zeros
        # Every chunk gets written anyway; skipping the all-fill check saves a pass over the data (~20 %).
        config={"write_empty_chunks": True},
        dimension_names=("time", "feature") if v3 else None,
    )
    times = group.create_array(
        "time",
        shape=(rows,),
        dtype=np.int64,
        chunks=(chunks[0],),
        compressors=codec,
        fill_value=0,
        config={"write_empty_chunks": True},
        dimension_names=("time",) if v3 else None,
    )

    gen = _TickGenerator(seed=seed, rows=rows, features=features, dtype=dtype, nan_fraction=nan_fraction)
    stream = _RowStream(gen)
    buf_rows = min(chunks[0], rows)
    # Whole chunk rows per write avoid read-modify-write of compressed chunks. Compression costs more
    # than generation, so two writer threads compress two chunk rows while the next one is generated
    # (numpy and blosc release the GIL); each in-flight write owns its buffer.
    n_slots = _WRITERS + 1
    bufs = [
        (np.empty((buf_rows, features), dtype=dtype), np.empty(buf_rows, dtype=np.int64))
        for _ in range(n_slots)
    ]
    pending: list[Future[None] | None] = [None] * n_slots

    def write_rows(r0: int, v: np.ndarray, t: np.ndarray) -> None:
        values[r0 : r0 + v.shape[0]] = v
        times[r0 : r0 + t.shape[0]] = t

    with (
        ThreadPoolExecutor(max_workers=_WRITERS, thread_name_prefix="tsconv-synth") as pool,
        progress_bar(total=rows, unit="rows", enabled=progress, desc="ticks") as bar,
    ):
        for i, r0 in enumerate(range(0, rows, buf_rows)):
            slot = i % n_slots
            prev = pending[slot]
            if prev is not None:
                prev.result()  # the buffer is free again only once its write finished
                bar.update(buf_rows)
            n = min(buf_rows, rows - r0)
            v, t = bufs[slot]
            stream.read_into(v[:n], t[:n])
            pending[slot] = pool.submit(write_rows, r0, v[:n], t[:n])
        for fut in pending:
            if fut is not None:
                fut.result()
        bar.update(rows - bar.n)
