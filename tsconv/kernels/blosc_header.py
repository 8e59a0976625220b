"""The header of a Blosc chunk, read on the host: what the GPU decoder (:mod:`tsconv.kernels.blosc_lz4`)
handles is decided here, before any kernel runs, so that checking a store (``tsconv inspect``, the reader's
choice) needs no Triton.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BloscHeader", "parse_header", "unsupported_reason"]

_HEADER = 16
_LZ4 = 1
# c-blosc decodes a block as typesize streams only where the split flag allows it and the block holds this
# many values or more (MIN_BUFFERSIZE; c-blosc before 1.5 wrote no flag and split by this rule alone)
_MIN_SPLIT = 128


@dataclass(frozen=True)
class BloscHeader:
    """The fields of a c-blosc 1.x chunk header that decoding needs."""

    flags: int
    typesize: int
    nbytes: int
    blocksize: int
    cbytes: int

    @property
    def shuffle(self) -> bool:
        return bool(self.flags & 0x01)

    @property
    def memcpyed(self) -> bool:
        return bool(self.flags & 0x02)

    @property
    def split(self) -> bool:
        return not self.flags & 0x10

    @property
    def nblocks(self) -> int:
        return -(-self.nbytes // self.blocksize) if self.blocksize else 0


def parse_header(data: memoryview | bytes) -> BloscHeader:
    """The header of a Blosc chunk (its first 16 bytes); ValueError when there are fewer."""
    if len(data) < _HEADER:
        raise ValueError(f"a Blosc chunk has a {_HEADER}-byte header, got {len(data)} bytes")
    b = bytes(data[:_HEADER])
    if b[0] != 2:
        raise ValueError(f"Blosc format version {b[0]} (only version 2, c-blosc 1.x, is decoded on the GPU)")

    def le32(i: int) -> int:
        return int.from_bytes(b[i : i + 4], "little")

    return BloscHeader(flags=b[2], typesize=b[3], nbytes=le32(4), blocksize=le32(8), cbytes=le32(12))


def unsupported_reason(h: BloscHeader, *, nbytes: int, size: int, typesize: int) -> str | None:
    """None when the GPU decoder handles a chunk with header ``h`` of ``size`` stored bytes decoding to
    ``nbytes`` of ``typesize``-byte values (the kernel splits and unshuffles by that size); else why not."""
    if h.nbytes != nbytes:
        return f"chunk decodes to {h.nbytes} bytes, expected {nbytes}"
    if max(nbytes, size) >= 1 << 31:
        return "a chunk of 2 GiB or more (the kernel indexes a chunk in int32)"
    if h.blocksize <= 0:
        return f"blocksize {h.blocksize}"
    if h.cbytes != size:
        return f"header says {h.cbytes} stored bytes, the file has {size}"
    if h.memcpyed:
        return None if size >= _HEADER + nbytes else "stored chunk shorter than its data"
    if h.flags >> 5 != _LZ4:
        return f"Blosc compressor code {h.flags >> 5} (the GPU decodes LZ4, code 1)"
    if h.flags & 0x04:
        return "bitshuffle"
    if not 1 <= h.typesize <= 16:
        return f"typesize {h.typesize}"
    if h.typesize != typesize:  # (zarr's BloscCodec(typesize=...)): its streams are split by another size
        return f"Blosc typesize {h.typesize} for {typesize}-byte values"
    if h.blocksize % h.typesize and h.nblocks > 1:
        return f"blocksize {h.blocksize}"
    if not h.split and h.shuffle:
        return "shuffled blocks that are not split into streams"
    if h.split and h.blocksize // h.typesize < _MIN_SPLIT:  # c-blosc's rule from before the split flag
        return f"blocks of {h.blocksize // h.typesize} values (fewer than {_MIN_SPLIT}: c-blosc does not split them)"
    return None
