"""Decoding one zarr chunk file into a caller's buffer: shared by the decode threads and the writer."""

from __future__ import annotations

import mmap
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np

from tsconv import config

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_MMAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # populate: one fault-in per file


def use_mmap() -> bool:
    """Decode straight from a mapping of the file (the ``mmap`` setting, on by default), else read it."""
    return config.current().mmap


def zstd_content_size(data: np.ndarray) -> int | None:
    """The decompressed size a single zstd frame declares, or None when it does not say."""
    if data.size < 6 or bytes(data[:4]) != _ZSTD_MAGIC:
        return None
    fhd = int(data[4])
    fcs_flag, single, did_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[did_flag]
    size = (1 if single else 0) if fcs_flag == 0 else (2, 4, 8)[fcs_flag - 1]
    if size == 0 or data.size < pos + size:
        return None
    value = int.from_bytes(bytes(data[pos : pos + size]), "little")
    return value + 256 if size == 2 else value


def decode_file(path: Path, dest: np.ndarray, codec: Any, scratch: Callable[[int], np.ndarray]) -> bool:
    """Decode one chunk file into ``dest`` (C-contiguous, the chunk's full shape); False if it is missing.

    ``codec``: None (raw bytes), a numcodecs Blosc or Zstd. ``scratch(nbytes)``: a reusable uint8 buffer
    for the compressed bytes when the file is read rather than mapped.
    """
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below)
    except FileNotFoundError:
        return False
    expected = dest.nbytes
    flat = dest.reshape(-1).view(np.uint8)
    with f:
        size = os.fstat(f.fileno()).st_size
        if codec is None:
            if size != expected:
                msg = f"chunk file {path.name} holds {size} bytes, expected {expected}"
                raise ValueError(msg)
            got = f.readinto(flat)
            if got != size:
                msg = f"short read of {path.name}: {got} of {size} bytes"
                raise OSError(msg)
            return True
        if size > 0 and use_mmap():
            # Decoding straight from the page cache through a mapping saves copying the compressed bytes
            # into a scratch buffer: 1.72 -> 1.95 GB/s per thread for 16 MB Blosc-lz4 chunks on the CPU
            # VM (benchmarks/NOTES.md). Caveat: a chunk file truncated by another process while mapped
            # raises SIGBUS; TSCONV_MMAP=0 reads with read() instead.
            mapped = mmap.mmap(f.fileno(), 0, flags=_MMAP_FLAGS, prot=mmap.PROT_READ)
        else:
            mapped = None
            data = scratch(size)
            got = f.readinto(data)
            if got != size:
                msg = f"short read of {path.name}: {got} of {size} bytes"
                raise OSError(msg)
    if mapped is None:
        return decode_bytes(codec, data, flat, expected)
    try:
        data = np.frombuffer(mapped, dtype=np.uint8)
        ok = decode_bytes(codec, data, flat, expected)
        del data  # the mapping cannot close while an array views it
        return ok
    finally:
        try:
            mapped.close()
        except BufferError:  # an exception still holds a view: the GC closes the mapping later
            pass


def decode_bytes(codec: Any, data: np.ndarray, flat: np.ndarray, expected: int) -> bool:
    """Decode the compressed ``data`` into ``flat`` (uint8, ``expected`` bytes); raises if sizes differ, or
    if a Blosc frame says it is longer than ``data``."""
    size = data.size
    if isinstance(codec, numcodecs.Blosc):
        declared = int.from_bytes(bytes(data[4:8]), "little") if size >= 16 else -1
    else:
        declared = zstd_content_size(data)
    if declared == expected:
        stored = int.from_bytes(bytes(data[12:16]), "little")
        if isinstance(codec, numcodecs.Blosc) and stored > size:  # c-blosc would read on past ``data``
            msg = f"the Blosc frame declares {stored} stored bytes, the chunk holds {size} (cut short)"
            raise ValueError(msg)
        codec.decode(data, out=flat)
        return True
    if isinstance(codec, numcodecs.Blosc):
        msg = f"chunk decodes to {declared} bytes, expected {expected}"
        raise ValueError(msg)
    raw = np.frombuffer(codec.decode(data), dtype=np.uint8)  # a frame that does not say its size
    if raw.size != expected:
        msg = f"chunk decodes to {raw.size} bytes, expected {expected}"
        raise ValueError(msg)
    flat[:] = raw
    return True


def decode_chunk_into(
    path: Path,
    band: np.ndarray,
    *,
    n: int,
    cols: tuple[int, int],
    chunk_shape: tuple[int, int],
    whole: bool,
    fill: Any,
    codec: Any,
    scratch: Callable[[str, int], np.ndarray],
) -> None:
    """Chunk file ``path`` into its place in ``band`` [band_rows, F]: rows [0, n), columns ``cols``.

    ``whole``: the chunk spans every feature and is decoded straight into ``band``; otherwise into a
    scratch buffer and copied into its column slice. A missing file is ``fill``. ``scratch(name, nbytes)``:
    reusable uint8 buffers, one per name ("chunk": a partial chunk; "file": compressed bytes).
    """
    c0, c1 = cols
    if whole:
        dest = band
    else:
        nbytes = chunk_shape[0] * chunk_shape[1] * band.dtype.itemsize
        dest = scratch("chunk", nbytes).view(band.dtype).reshape(chunk_shape)
    if not decode_file(path, dest, codec, lambda nb: scratch("file", nb)):
        band[:n, c0:c1] = fill
    elif not whole:
        band[:n, c0:c1] = dest[:n, : c1 - c0]


class ChunkLayout:
    """Where an array's chunk files are and how each decodes: what reading them directly needs."""

    def __init__(self, root: Path, dtype: np.dtype, chunks: tuple[int, int], codec: Any, fill: Any, key) -> None:  # fmt: skip
        self.root, self.dtype, self.chunks, self.codec, self.fill, self.key = (
            root,
            dtype,
            chunks,
            codec,
            fill,
            key,
        )


def chunk_layout(array: Any, *, ndim: int = 2) -> tuple[ChunkLayout | None, str | None]:
    """(layout, None) when ``array``'s (an ``ndim``-D zarr array's) chunk files can be read and decoded
    directly, else (None, why not): format 3, a regular grid, local files, bytes then Blosc or Zstd.

    A 1-D array's layout has chunks (rows, 1) and a key function taking (band, 0), like a one-column
    2-D array's."""
    meta = getattr(array, "metadata", None)
    if meta is None or not hasattr(array, "store_path"):
        return None, "not a zarr array"
    if getattr(meta, "zarr_format", None) != 3:
        return None, f"zarr format {getattr(meta, 'zarr_format', '?')}"
    if array.ndim != ndim:
        return None, f"{array.ndim}-D array"
    from zarr.codecs import BloscCodec, BytesCodec, ZstdCodec
    from zarr.core.chunk_grids import RegularChunkGrid
    from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding
    from zarr.storage import LocalStore

    if getattr(array, "shards", None) is not None:
        return None, "sharded array"
    if not isinstance(meta.chunk_grid, RegularChunkGrid):
        return None, f"chunk grid {type(meta.chunk_grid).__name__}"
    if not isinstance(meta.chunk_key_encoding, DefaultChunkKeyEncoding):
        return None, f"chunk key encoding {type(meta.chunk_key_encoding).__name__}"
    if meta.storage_transformers:
        return None, "storage transformers"
    dtype = np.dtype(array.dtype)
    if dtype.kind not in "fiu" or sys.byteorder != "little":
        return None, f"dtype {dtype} on a {sys.byteorder}-endian machine"
    codecs = tuple(meta.codecs)
    names = ", ".join(type(c).__name__ for c in codecs)
    if not codecs or not isinstance(codecs[0], BytesCodec) or len(codecs) > 2:
        return None, f"codecs {names}"
    endian = codecs[0].endian
    if (endian.value if endian is not None else None) != "little" and not (
        endian is None and dtype.itemsize == 1
    ):
        return None, f"bytes codec endian {endian}"
    codec: Any = None
    if len(codecs) == 2:
        if isinstance(codecs[1], BloscCodec):
            codec = numcodecs.Blosc()  # the blosc header says how to decode (cname, shuffle, typesize)
        elif isinstance(codecs[1], ZstdCodec):
            codec = numcodecs.Zstd()
        else:
            return None, f"codecs {names}"
    store = array.store_path.store
    if not isinstance(store, LocalStore):
        return None, f"{type(store).__name__} (not a local directory)"
    root = Path(store.root)
    if array.store_path.path:
        root = root / array.store_path.path
    fill = meta.fill_value if meta.fill_value is not None else 0
    key = meta.chunk_key_encoding.encode_chunk_key
    if ndim == 1:
        return ChunkLayout(
            root, dtype, (int(array.chunks[0]), 1), codec, fill, lambda idx: key(idx[:1])
        ), None
    chunks = (int(array.chunks[0]), int(array.chunks[1]))
    return ChunkLayout(root, dtype, chunks, codec, fill, key), None


def chunk_cut_short(array: Any, a: int, b: int) -> str | None:
    """Where zarr itself reads rows [a, b) of ``array`` (a local zarr array, format 2 or 3): the first of
    their chunk files cut short, in words (its name and rows); else None.

    c-blosc trusts the frame's header for its stored size, so zarr decodes a file that lost its last bytes
    from whatever memory follows them (every byte of a level-0 frame, the last literals of an LZ4 one),
    without a word; a shard file whose index comes first gives zarr its inner chunks' byte ranges as the
    index says, the last of them reaching past the file's end. :func:`decode_bytes` checks the files the
    native readers decode; this checks those zarr decodes (zarr 2 stores, sharded arrays, layouts the native
    readers do not take), with one small read per Blosc chunk file or shard file."""
    from zarr.codecs import BloscCodec
    from zarr.storage import LocalStore

    meta = getattr(array, "metadata", None)
    store = getattr(getattr(array, "store_path", None), "store", None)
    if meta is None or not isinstance(store, LocalStore) or b <= a:
        return None
    shards = getattr(array, "shards", None)
    index = shard_index(array) if shards is not None else None
    if shards is not None and index is None:
        return None
    if shards is None:
        compressors = tuple(getattr(array, "compressors", None) or ())
        if not compressors or not isinstance(compressors[-1], BloscCodec | numcodecs.Blosc):
            return None
    root = Path(store.root) / array.store_path.path if array.store_path.path else Path(store.root)
    grid = tuple(int(c) for c in (shards or array.chunks))
    shape = tuple(int(s) for s in array.shape)
    bands = range(a // grid[0], -(-min(b, shape[0]) // grid[0]))
    across = [range(-(-n // c)) for n, c in zip(shape[1:], grid[1:], strict=True)]
    key = meta.encode_chunk_key
    for band in bands:
        for rest in np.ndindex(*(len(r) for r in across)) if across else [()]:
            name = key((band, *rest))
            try:
                fd = os.open(root / name, os.O_RDONLY)
            except FileNotFoundError:  # never written: the fill value
                continue
            try:
                size = os.fstat(fd).st_size
                why = _shard_cut_short(fd, size, index) if index is not None else _blosc_cut_short(fd, size)
            finally:
                os.close(fd)
            if why is not None:
                rows = f"rows {band * grid[0]:,}..{min((band + 1) * grid[0], shape[0]) - 1:,}"
                return f"{'shard' if index is not None else 'chunk'} file {name} ({rows}){why} (cut short)"
    return None


def _blosc_cut_short(fd: int, size: int) -> str | None:
    if size < 16:
        return f" holds {size} bytes, less than a Blosc header"
    stored = int.from_bytes(os.pread(fd, 16, 0)[12:16], "little")
    return (
        f": the Blosc frame declares {stored} stored bytes, the file holds {size}" if stored > size else None
    )


def shard_index(array: Any) -> tuple[int, np.dtype, bool, int] | None:
    """(entries, dtype, at_start, bytes) of a sharded array's shard index where it is the spec's plain one
    (little- or big-endian uint64 pairs, with or without a crc32c), else None."""
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

    codecs = array.metadata.codecs
    if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
        return None
    sharding = codecs[0]
    kinds = tuple(type(c) for c in sharding.index_codecs)
    if kinds not in ((BytesCodec,), (BytesCodec, Crc32cCodec)):
        return None
    inner = tuple(int(c) for c in sharding.chunk_shape)
    shard = tuple(int(s) for s in array.shards)
    if len(inner) != len(shard) or any(s % c for s, c in zip(shard, inner, strict=True)):
        return None
    n = 1
    for s, c in zip(shard, inner, strict=True):
        n *= s // c
    endian = getattr(sharding.index_codecs[0].endian, "value", None)
    at_start = getattr(sharding.index_location, "value", sharding.index_location) == "start"
    return n, np.dtype(">u8" if endian == "big" else "<u8"), at_start, 16 * n + 4 * (len(kinds) - 1)


def _shard_cut_short(fd: int, size: int, index: tuple[int, np.dtype, bool, int]) -> str | None:
    n, dtype, at_start, nbytes = index
    if size < nbytes:
        return f" holds {size} bytes, less than its index of {nbytes}"
    raw = os.pread(fd, nbytes, 0 if at_start else size - nbytes)
    pairs = np.frombuffer(raw, dtype, count=2 * n).reshape(n, 2)
    written = pairs[:, 0] != np.iinfo(np.uint64).max
    if not written.any():
        return None
    off, length = pairs[written, 0], pairs[written, 1]
    limit = np.uint64(size if at_start else size - nbytes)
    past = (off > limit) | (length > limit - np.minimum(off, limit))  # not off + length: a garbage one wraps
    return f" holds {size} bytes, less than its index says its chunks take" if past.any() else None
