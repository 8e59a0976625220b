"""CPU work cut into fixed tiles, each computed by torch ops on one thread, the tiles spread over persistent
threads.

Why one thread per op: torch's CPU convolution and matrix product pick their algorithm and split their sums by
the thread count. ``F.conv1d`` of [1, 6, 1030] by [6, 6, 7] gave other bits on 2 threads than on 1, 3 or 4,
other again on 8 and 16, and a 7-row matmul ([7, 100] @ [100, 16]) on 2, 8 and 16 threads than on 1, 3 and 4
(torch 2.13, MKL 2024.2, oneDNN 3.12): a process with another thread count (a dask worker, a job under
``OMP_NUM_THREADS=1``) computed other bits. A tile's shape fixes its algorithm when one thread runs it, so
the same tiles give the same bits on any number of threads; the tiles, not torch, spread the work.

:func:`one_thread` holds torch on one thread for a whole call, so that none of torch's OpenMP threads spins
beside the tiles' threads after a parallel element-wise op (they spin a while after each): the engine holds it
for a call of a pipeline with a dense stage, whose element-wise ops are small beside its convolutions
(benchmarks/NOTES.md, section 18).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from contextlib import contextmanager

import torch

__all__ = ["one_thread", "run_parts", "run_tiles"]

_LOCK = threading.RLock()  # torch's thread count is the process's: one caller at a time changes it
_STATE = threading.local()  # ``workers`` on a thread inside one_thread; ``tile`` on the tiles' threads
_POOLS: dict[int, ThreadPoolExecutor] = {}  # by thread count; used under _LOCK only
_GIVEN_BACK: int | None = None  # the count the last block gave torch back; used under _LOCK only


def _after_fork_in_child() -> None:
    """A forked child (a dask worker, say) has none of the parent's threads: its own pools, a lock no thread
    of the parent holds, no block of the parent's."""
    global _LOCK, _STATE, _GIVEN_BACK
    _POOLS.clear()
    _GIVEN_BACK = None
    _LOCK = threading.RLock()
    _STATE = threading.local()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def one_thread() -> Iterator[int]:
    """Hold torch on one thread until the block ends (then the caller's count again); yields the count the
    tiles of :func:`run_tiles` spread over. Nested blocks keep the outer one's count.

    torch reads the process's count once per thread, at the thread's first parallel op: a thread that first
    ran one while another thread's block held the process at one thread keeps 1 (a research script's
    ThreadPoolExecutor over symbols). Where the caller's count is not the one the last block gave back, the
    process's own count is read in a fresh thread, and the block gives that back: the caller's 1 would have
    held every thread started afterwards, tsconv's tiles included, at one thread."""
    global _GIVEN_BACK
    if getattr(_STATE, "tile", False):
        yield 1
        return
    with _LOCK:
        outer = getattr(_STATE, "workers", None)
        if outer is not None:
            yield outer
            return
        # read under the lock: another caller's block holds torch at one thread until it ends
        before = torch.get_num_threads()
        if before != _GIVEN_BACK:  # this thread's count may be one another block held the process at
            before = _process_count()
        torch.set_num_threads(1)
        _STATE.workers = before
        try:
            yield before
        finally:
            _STATE.workers = None
            torch.set_num_threads(before)
            _GIVEN_BACK = before


def _process_count() -> int:
    """torch's thread count for the process: what a thread that has run no torch op yet reads (0.3 ms)."""
    seen: list[int] = []
    probe = threading.Thread(target=lambda: seen.append(torch.get_num_threads()), name="tsconv-threads")
    probe.start()
    probe.join()
    return seen[0]


def run_tiles(run: Callable[..., None], tiles: Sequence[tuple], *, workers: int | None = None) -> None:
    """``run(*tile)`` for each tile, every torch op in it on one thread; the tiles spread over ``workers``
    persistent threads (default: torch's thread count outside :func:`one_thread`) when there are several of
    each. torch's thread count is the caller's again afterwards.

    Persistent threads, the caller's among them, each taking every ``workers``-th tile: with a pool made per
    call (a 65,536-row chunk of 22 bank tiles) the default bank took 18.6-19.1 ms a chunk on the 2-core VM,
    with persistent threads 15.0 ms, on one thread 17.8 ms (benchmarks/NOTES.md, section 20); torch's own
    parallel ops on tiles of this size ran 10x slower than one thread on the loaded VM (spinning workers).
    Returns once every tile is done, a failed one included (the first failure is raised)."""
    with one_thread() as count:
        workers = count if workers is None else workers
        if workers <= 1 or len(tiles) <= 1:
            _in_turn(run, tiles)
            return
        pool = _POOLS.get(workers)
        if pool is None:
            pool = _POOLS[workers] = ThreadPoolExecutor(
                max_workers=workers - 1, thread_name_prefix="tsconv-cpu", initializer=_mark_tile_thread
            )
        # the caller's thread takes the first share: ``workers`` threads in all, none of them waiting
        parts = [pool.submit(_in_turn, run, tiles[i::workers]) for i in range(1, workers)]
        try:
            _in_turn(run, tiles[::workers])
        finally:
            wait_futures(parts)
        for f in parts:
            f.result()


def run_parts(part: Callable[[int, int], None], count: int) -> None:
    """``part(k, count)`` for k < count, on the persistent threads when count > 1."""
    run_tiles(part, [(k, count) for k in range(count)], workers=count)


def _mark_tile_thread() -> None:
    _STATE.tile = True


def _in_turn(run: Callable[..., None], tiles: Sequence[tuple]) -> None:
    for tile in tiles:
        run(*tile)
