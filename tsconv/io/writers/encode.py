"""The fast write path: whole-row chunks encoded with numcodecs and written straight to their files.

zarr-python encodes at about 1 GB/s per call and runs its codecs on its own event loop; numcodecs'
Blosc releases the GIL, so several threads each encoding one chunk scale with the cores (the read side,
:mod:`tsconv.io.readers.threads`, does the same). :class:`ChunkFileWriter` does that for the layout tsconv
creates for its output:

* a local zarr format-3 array, 2-D (or 1-D: the time column), regular chunk grid, default chunk key encoding, no sharding and no
  storage transformers, C order;
* one chunk spans all columns (chunks[1] == shape[1]), so a chunk is a band of whole rows;
* codecs exactly ``bytes`` (little endian) then ``blosc`` (any cname, clevel, shuffle, blocksize).

The bytes written are those zarr would write: Blosc with the cname, clevel, shuffle, typesize and
blocksize of the array's BloscCodec, the edge chunk padded with the fill value, and a chunk that is all
fill value removed rather than written unless the array's ``write_empty_chunks`` says otherwise.
Each file is written under a temporary name in its own directory and renamed over the chunk key
(``os.replace``), so a kill at any moment leaves either the old file or the new one, never a torn chunk.
Everything else goes through zarr (:class:`~tsconv.io.writers.zarr_writer.OutputWriter` falls back itself);
:func:`fast_write_reason` says why.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np

from tsconv.io.readers.chunkfile import chunk_layout, decode_bytes

__all__ = ["ChunkFileWriter", "encode_in_parts", "fast_write_reason", "remove_partial_files"]

_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
PARTIAL_SUFFIX = ".partial"  # zarr's LocalStore names its temporary files the same way


def _blosc_of(array: Any) -> tuple[numcodecs.Blosc | None, str | None]:
    """numcodecs.Blosc configured as the array's (bytes, blosc) codecs encode, or (None, why not)."""
    from zarr.codecs import BloscCodec

    codecs = tuple(array.metadata.codecs)
    names = ", ".join(type(c).__name__ for c in codecs)
    if len(codecs) != 2 or not isinstance(codecs[1], BloscCodec):
        return None, f"codecs {names} (the fast path writes bytes + blosc only)"
    c = codecs[1]
    # The metadata holds the codec as evolved for the dtype (typesize, shuffle resolved); zarr's own
    # BloscCodec builds numcodecs.Blosc from exactly these fields.
    return numcodecs.Blosc(
        cname=c.cname.value,
        clevel=int(c.clevel),
        shuffle=_SHUFFLE[c.shuffle.value],
        blocksize=int(c.blocksize),
        typesize=int(c.typesize),
    ), None


def _inspect_rows(array: Any) -> tuple[Any, str | None]:
    """The fast path's layout of a 2-D array, or of a 1-D one (the time column)."""
    return chunk_layout(array, ndim=1 if getattr(array, "ndim", 2) == 1 else 2)


class ChunkFileWriter:
    """Encode and store whole-row chunks of one array; thread-safe (no state changes after creation)."""

    def __init__(self, array: Any) -> None:
        layout, reason = _inspect_rows(array)
        if layout is None:
            raise ValueError(reason)
        codec, reason = _blosc_of(array)
        if codec is None:
            raise ValueError(reason)
        self.root: Path = layout.root
        self.dtype: np.dtype = layout.dtype
        self.chunk_rows, self.n_features = layout.chunks
        self.codec = codec
        self.fill = self.dtype.type(layout.fill)
        self.write_empty = bool(array._async_array.config.write_empty_chunks)
        self._key = layout.key
        self._guard: Callable[[], None] | None = None
        self._dir_fd: int | None = None

    def pin(self, guard: Callable[[], None], *, dir_fd: int | None = None) -> None:
        """Call ``guard`` (which raises to refuse) before each chunk file is renamed into place or removed;
        with ``dir_fd``, this array's directory opened earlier (owned from now on, closed with this writer),
        write every file relative to it rather than to the path, wherever that directory is renamed to."""
        self._guard = guard
        if dir_fd is not None:
            self._dir_fd = dir_fd
            weakref.finalize(self, os.close, dir_fd)

    @classmethod
    def for_array(cls, array: Any) -> tuple[ChunkFileWriter | None, str | None]:
        """(writer, None) when the fast path can write ``array``, else (None, why not)."""
        reason = fast_write_reason(array)
        return (cls(array), None) if reason is None else (None, reason)

    def path(self, band: int) -> Path:
        """The chunk file of band ``band`` (rows band * chunk_rows ...)."""
        return self.root / self._key((band, 0))

    def write(self, band: int, chunk: np.ndarray, *, parts: int = 1) -> None:
        """Store ``chunk`` (the full chunk shape, C-contiguous, edge rows already padded) as band ``band``
        (for a 1-D array: ``chunk_rows`` values); ``parts``: threads that may encode it (the same bytes,
        :func:`encode_in_parts`)."""
        path = self.path(band)
        if not self.write_empty and self._all_fill(chunk):
            self._remove(path)  # what zarr does: an all-fill chunk is read as the fill value
            return
        self._store(path, *encode_in_parts(self.codec, chunk, parts))

    def read(self, band: int, out: np.ndarray) -> None:
        """Decode band ``band`` into ``out`` (the full chunk shape, C-contiguous); a chunk with no file holds
        the fill value, as zarr reads it."""
        try:
            data = self.path(band).read_bytes()
        except FileNotFoundError:
            out[...] = self.fill
            return
        decode_bytes(
            self.codec, np.frombuffer(data, dtype=np.uint8), out.reshape(-1).view(np.uint8), out.nbytes
        )

    def write_frame(self, band: int, frame: np.ndarray, *, empty: bool) -> None:
        """Store band ``band`` from ``frame``, a chunk already encoded as this array's codec encodes it
        (uint8; :mod:`tsconv.kernels.lz4_encode`'s Blosc-LZ4 frames): ``empty`` says the chunk is all fill
        value, removed as :meth:`write` removes it."""
        path = self.path(band)
        if empty and not self.write_empty:
            self._remove(path)
            return
        self._store(path, frame)

    def _store(self, path: Path, *data: Any) -> None:
        if self._dir_fd is not None:
            self._store_at(path.relative_to(self.root), data)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
        try:
            with open(tmp, "wb") as f:
                for piece in data:
                    f.write(piece)
            if self._guard is not None:
                self._guard()
            os.replace(tmp, path)  # atomic: readers and a resumed run see the old file or the new one
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _store_at(self, rel: Path, data: tuple[Any, ...]) -> None:
        """:meth:`_store` relative to the pinned directory: a store renamed aside after the guard's check
        gets the file in the renamed (discarded) directory, never in the store put at its path."""
        fd = self._dir_fd
        self._makedirs(rel.parent)
        tmp = rel.with_name(f"{rel.name}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666, dir_fd=fd), "wb") as f:
                for piece in data:
                    f.write(piece)
            assert self._guard is not None
            self._guard()
            os.replace(tmp, rel, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=fd)
            raise

    def _makedirs(self, rel: Path) -> None:
        """``rel`` and its parents below the pinned directory (``mkdir -p``)."""
        if rel == Path():
            return
        try:
            os.mkdir(rel, dir_fd=self._dir_fd)
        except FileExistsError:
            pass
        except FileNotFoundError:
            self._makedirs(rel.parent)
            with contextlib.suppress(FileExistsError):
                os.mkdir(rel, dir_fd=self._dir_fd)

    def _remove(self, path: Path) -> None:
        """Delete the chunk file ``path`` if there is one (past the guard, relative to a pinned directory)."""
        if self._guard is not None:
            self._guard()
        with contextlib.suppress(FileNotFoundError):
            if self._dir_fd is not None:
                os.unlink(path.relative_to(self.root), dir_fd=self._dir_fd)
            else:
                path.unlink()

    def _all_fill(self, chunk: np.ndarray) -> bool:
        first = chunk.flat[0]
        if np.isnan(self.fill):
            return bool(np.isnan(first)) and bool(np.isnan(chunk).all())
        if self.fill == 0 and self.dtype.kind == "f":
            # zarr compares bit patterns against 0.0, so -0.0 is data
            bits = chunk.view(f"u{self.dtype.itemsize}")
            return bool(bits.flat[0] == 0) and not bits.any()
        return bool(first == self.fill) and bool((chunk == self.fill).all())


# Pieces are cut at multiples of this: every block size c-blosc picks by itself divides it (powers of two up to
# 1 MiB times a power-of-two typesize); anything else falls back to one encode.
_PIECE_ALIGN = 1 << 20
_HEADER = struct.Struct("<BBBBIII")  # version, versionlz, flags, typesize, nbytes, blocksize, cbytes
_MEMCPYED = 0x02


def encode_in_parts(codec: numcodecs.Blosc, chunk: np.ndarray, parts: int) -> list[bytes | memoryview]:
    """``codec.encode(chunk)`` as one thread encodes it, from any calling thread, computed by up to ``parts``
    threads; returned as buffers to write in turn.

    Hand-written because neither c-blosc nor numcodecs has it: c-blosc's own threads place the blocks in
    the order they finish (another file each run, for the same values), while a chunk alone at the end of a
    run (an update's, a run's last) was encoded by one thread with the others idle (20 ms of a 0.1 s update
    on the 2-core VM; 13 ms in two parts). The buffer is cut at multiples of the block size, each piece
    encoded apart (blocks are compressed independently), and the frames joined: one header, the block
    offsets moved, the blocks in order. The result is c-blosc's single-thread frame byte for byte
    (tests/io/test_writer.py compares them over codecs, levels, shuffles and data); wherever it might not
    be (a block size that does not divide the cuts or that the codec sets above a piece's size, a piece
    stored uncompressed, output close to the input's size, where c-blosc's limit on the whole might act),
    one encode is made instead.
    """
    flat = np.ascontiguousarray(chunk).reshape(-1)
    n, size = flat.nbytes, flat.itemsize
    k = min(parts, n // _PIECE_ALIGN)
    if k < 2 or _PIECE_ALIGN % size:
        return _encode_apart(codec, [chunk])
    step = -(-(n // _PIECE_ALIGN) // k) * _PIECE_ALIGN
    cuts = [*range(0, n, step), n]
    if n - cuts[-2] < _PIECE_ALIGN:  # a last piece shorter than a block would get a block size of its own
        del cuts[-2]
    if len(cuts) < 3:
        return _encode_apart(codec, [chunk])
    frames = _encode_apart(codec, [flat[a // size : b // size] for a, b in zip(cuts, cuts[1:], strict=False)])
    heads = [_HEADER.unpack_from(f) for f in frames]
    version, lz, flags, typesize, _, block, _ = heads[0]
    if (
        block == 0
        or flags & _MEMCPYED
        or any(h[:4] != heads[0][:4] or h[5] != block for h in heads)
        or any(c % block for c in cuts[:-1])
        # a block size set in the codec is cut to a smaller piece's size (one encode keeps it; an automatic
        # one is at most 1 MiB, never above a piece)
        or (codec.blocksize and any(b - a < block + typesize for a, b in zip(cuts, cuts[1:], strict=False)))
    ):
        return _encode_apart(codec, [chunk])
    table = _HEADER.size + 4 * -(-n // block)
    starts, blocks, pos = [], [], table
    for f, a, b in zip(frames, cuts, cuts[1:], strict=False):
        count = -(-(b - a) // block)
        own = _HEADER.size + 4 * count
        starts.append(
            np.frombuffer(f, dtype="<u4", count=count, offset=_HEADER.size).astype(np.int64) + (pos - own)
        )
        blocks.append(memoryview(f)[own:])
        pos += len(f) - own
    if pos + block > n + _HEADER.size:  # near the input's size: c-blosc's limit on the whole might have acted
        return _encode_apart(codec, [chunk])
    head = _HEADER.pack(version, lz, flags, typesize, n, block, pos)
    return [head, np.concatenate(starts).astype("<u4").tobytes(), *blocks]


def _encode_apart(codec: numcodecs.Blosc, pieces: list[np.ndarray]) -> list[bytes]:
    """``codec.encode`` of each piece, each by one thread, none in the main thread: there numcodecs hands
    the call to c-blosc's own threads, which place the blocks in the order they finish (the same values, other
    bytes each run). A failure is raised here, as one encode would raise it."""
    frames: list[bytes] = [b""] * len(pieces)
    failed: list[BaseException] = []

    def encode(i: int) -> None:
        try:
            frames[i] = codec.encode(pieces[i])
        except BaseException as exc:
            failed.append(exc)

    first = 0 if threading.current_thread() is threading.main_thread() else 1
    helpers = [threading.Thread(target=encode, args=(i,), daemon=True) for i in range(first, len(pieces))]
    for t in helpers:
        t.start()
    if first:
        encode(0)
    for t in helpers:
        t.join()
    if failed:
        raise failed[0]
    return frames


def fast_write_reason(array: Any) -> str | None:
    """None when :class:`ChunkFileWriter` can write ``array`` itself, else why zarr writes it."""
    layout, reason = _inspect_rows(array)
    if layout is None:
        return reason
    if len(array.shape) == 2 and layout.chunks[1] != int(array.shape[1]):
        return (
            f"chunks of {layout.chunks[1]} of {int(array.shape[1])} columns (the fast path writes whole rows)"
        )
    config = getattr(getattr(array, "_async_array", None), "config", None)
    if config is None or getattr(config, "order", None) != "C":
        return f"array order {getattr(config, 'order', '?')}"
    return _blosc_of(array)[1]


def remove_partial_files(array: Any, *, from_row: int = 0) -> int:
    """Delete temporary chunk files a killed writer left in ``array``'s local directory; returns how many.

    Only for a store no one else is writing (a resumed single-process run): a region writer's
    temporary files would be in use by its siblings. ``from_row``: rows before it are stored whole (a
    chunk counts as stored only once its file is renamed in), so only the chunk directories of the rows
    from there on are searched: what a resume or an update costs then does not grow with the history.
    """
    from zarr.storage import LocalStore

    store_path = getattr(array, "store_path", None)
    if store_path is None or not isinstance(store_path.store, LocalStore):
        return 0
    root = Path(store_path.store.root) / store_path.path if store_path.path else Path(store_path.store.root)
    if not root.is_dir():
        return 0
    tops = [root]
    bands = root / "c"
    meta = getattr(array, "metadata", None)
    encoding = getattr(meta, "chunk_key_encoding", None)
    if from_row > 0 and getattr(encoding, "separator", None) == "/" and bands.is_dir():
        # the default key encoding: c/<band>/<column>...; the rest of the tree holds no chunk files
        first = from_row // int(array.chunks[0])
        tops = [Path(e.path) for e in os.scandir(bands) if not e.name.isdigit() or int(e.name) >= first]
        tops += [p for p in root.iterdir() if p.is_file()]
    n = 0
    for top in tops:
        found = [top] if top.is_file() else top.rglob(f"*{PARTIAL_SUFFIX}")
        for tmp in found:
            if tmp.name.endswith(PARTIAL_SUFFIX):
                tmp.unlink(missing_ok=True)
                n += 1
    return n
