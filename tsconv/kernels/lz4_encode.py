"""Blosc-LZ4 chunks encoded on the GPU: byte shuffle in torch, LZ4 by nvCOMP's batched compressor, the
Blosc framing by a Triton kernel.

Why: a wide output (the default bank on 96 features writes 4 GB of float32 features for 0.8 GB read)
spent 18-21 CPU-seconds in c-blosc's LZ4 on the host, the bound of the whole run, while its rows were on
the GPU already (benchmarks/NOTES.md, "The writer"). nvCOMP (``nvidia-libnvcomp``, an optional extra) is
NVIDIA's kept LZ4 for GPUs; tsconv writes only what it lacks, the Blosc chunk around the streams.

Each output chunk becomes one c-blosc 1.x chunk (format version 2, LZ4, byte shuffle, every block split
into ``typesize`` streams), which numcodecs' Blosc, zarr and tsconv's own GPU decoder read. Its bytes
differ from c-blosc's (another match finder, a blocksize chosen here), its decoded values do not. A
stream LZ4 does not shrink is stored raw (its size field equals the stream's size, as c-blosc does), and
a chunk that would not shrink at all is stored "memcpyed" (header, then the raw bytes).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import triton
import triton.language as tl

__all__ = [
    "BloscEncoder",
    "FrameLayout",
    "NvcompLZ4",
    "default_compressor",
    "encode_reason",
    "frame_layout",
    "nvcomp_reason",
]

HEADER = 16
_LZ4_CODE = 1  # Blosc's compressor code for LZ4 (flags >> 5)
_SHUFFLE = 0x01
_MEMCPYED = 0x02
# 64 KiB blocks, four 16 KiB streams each: nvCOMP needs thousands of streams in flight, and a step holds only a
# few chunks; store c (H200, ceac2f4) encoded in 0.68-0.72 s of copy-back stream against 1.54-1.58 s with
# 256 KiB blocks, the output 1% larger (benchmarks/NOTES.md, "Chunks encoded on the GPU")
TARGET_BLOCK = 1 << 16
# Outputs smaller than this are encoded by the host's threads: a fresh process's first GPU encode (nvCOMP's
# and the framing kernel's first loads) cost store e's runs (168 MB / 34 MB of output) 0.12-0.16 s of
# copy-back stream against 0.001-0.003 s for the rows' copy, while c-blosc on 16 threads encodes about
# 6.7 GB/s (H200 machine, benchmarks/results/cli.json at cc24022 and cf15b0e): about 1 GB breaks even.
MIN_OUTPUT_BYTES = 1 << 30
# c-blosc decodes a block as split streams only where each has at least this many bytes (MIN_BUFFERSIZE);
# a smaller "split" block fails to decode (measured: error -1 from numcodecs for 96-byte streams)
MIN_STREAM = 128
_TILE = 4096  # bytes a program of the framing kernel copies
_HEADER_C: tl.constexpr = tl.constexpr(HEADER)


@dataclass(frozen=True)
class FrameLayout:
    """How one output chunk of ``chunk_bytes`` is cut: blocks of ``blocksize`` bytes, each split into
    ``typesize`` streams of ``neblock`` bytes."""

    chunk_bytes: int
    blocksize: int
    typesize: int = 4

    @property
    def nblocks(self) -> int:
        return self.chunk_bytes // self.blocksize

    @property
    def neblock(self) -> int:
        return self.blocksize // self.typesize

    @property
    def streams(self) -> int:
        return self.nblocks * self.typesize

    @property
    def frame_bytes(self) -> int:
        """An upper bound of one encoded chunk (a memcpyed one: header + raw), rounded up to 256 bytes."""
        return -(-(HEADER + self.chunk_bytes) // 256) * 256


def frame_layout(
    *, chunk_rows: int, row_bytes: int, typesize: int = 4, block: int | None = None
) -> FrameLayout:
    """The layout of a chunk of ``chunk_rows`` rows of ``row_bytes``: blocks of whole rows, a power of two
    of them that divides ``chunk_rows`` (so there is no short last block, which c-blosc does not split),
    as close to ``block`` (default TARGET_BLOCK) as that allows."""
    target = TARGET_BLOCK if block is None else block
    if chunk_rows < 1 or row_bytes < typesize or row_bytes % typesize:
        msg = f"chunk of {chunk_rows} rows of {row_bytes} bytes (whole {typesize}-byte values expected)"
        raise ValueError(msg)
    rows = chunk_rows & -chunk_rows  # the largest power of two dividing chunk_rows
    while rows > 1 and rows * row_bytes > target and rows // 2 * row_bytes >= MIN_STREAM * typesize:
        rows //= 2
    if rows * row_bytes < MIN_STREAM * typesize:
        msg = (f"chunks of {chunk_rows} rows of {row_bytes} bytes are too small to split into streams of "
               f"{MIN_STREAM} bytes or more")  # fmt: skip
        raise ValueError(msg)
    return FrameLayout(chunk_bytes=chunk_rows * row_bytes, blocksize=rows * row_bytes, typesize=typesize)


class Compressor(Protocol):
    """Compresses the ``per_row`` streams of ``neblock`` bytes at the start of each row of ``src`` (uint8;
    stream i at row ``i // per_row``, byte ``i % per_row * neblock``) into ``dst[i, :]`` (rows of at least
    ``max_out`` bytes), each compressed size into ``sizes[i]`` (int64), on the current stream."""

    max_out: int  # the most bytes one stream can compress to

    def __call__(self, src: torch.Tensor, per_row: int, dst: torch.Tensor, sizes: torch.Tensor) -> None: ...


# -- nvCOMP's batched LZ4 through its C API --------------------------------------------------------------


class _CompressOpts(ctypes.Structure):  # nvcompBatchedLZ4CompressOpts_t (nvcomp/lz4.h)
    _fields_ = [
        ("data_type", ctypes.c_int),
        ("bitshuffle_mode", ctypes.c_int),
        ("reserved", ctypes.c_char * 56),
    ]


class _Alignments(ctypes.Structure):  # nvcompAlignmentRequirements_t (nvcomp/shared_types.h)
    _fields_ = [("input", ctypes.c_size_t), ("output", ctypes.c_size_t), ("temp", ctypes.c_size_t)]


_LIB: Any = None
_LIB_REASON: str | None = None


def _library() -> Any:
    global _LIB, _LIB_REASON
    if _LIB is None and _LIB_REASON is None:
        try:
            from nvidia.libnvcomp.load import load_library  # type: ignore[import-not-found]

            lib = load_library()
            if lib is None:
                raise OSError("libnvcomp.so.6 did not load")
            lib.nvcompBatchedLZ4CompressAsync  # noqa: B018 (the symbol this module calls)
            _LIB = lib
        except (ImportError, OSError, AttributeError) as exc:
            _LIB_REASON = f"nvCOMP is not available ({type(exc).__name__}: {exc}); install tsconv[nvcomp]"
    return _LIB


def nvcomp_reason() -> str | None:
    """None when nvCOMP's LZ4 can be called here, else why not."""
    _library()
    return _LIB_REASON


def encode_reason(device: torch.device) -> str | None:
    """None when output chunks can be encoded on ``device``, else why the host's threads encode them."""
    from tsconv import config

    if not config.current().gpu_encode:
        return "the gpu_encode setting is off"
    if device.type != "cuda":
        return f"device {device.type}"
    return nvcomp_reason() or _probe(
        torch.device(device.type, torch.cuda.current_device() if device.index is None else device.index)
    )


_PROBED: dict[torch.device, str | None] = {}


def _probe(device: torch.device) -> str | None:
    """None once nvCOMP has compressed one small stream on ``device`` (once per process and device), else
    why it could not: an installed nvCOMP built for a newer CUDA than the driver's fails every call, and the
    host's encoder then keeps the run going instead of the run failing at its first step."""
    if device not in _PROBED:
        try:
            lz4 = NvcompLZ4(neblock=MIN_STREAM, max_streams=1, device=device)
            src = torch.zeros((1, MIN_STREAM), dtype=torch.uint8, device=device)
            dst = torch.empty((1, lz4.max_out), dtype=torch.uint8, device=device)
            sizes = torch.zeros(1, dtype=torch.int64, device=device)
            with torch.cuda.device(device):
                lz4(src, 1, dst, sizes)
                torch.cuda.synchronize(device)
            ok = 0 < int(sizes.item()) <= lz4.max_out
            _PROBED[device] = None if ok else f"nvCOMP's test compression gave {int(sizes.item())} bytes"
        except (RuntimeError, ValueError, OSError) as exc:
            _PROBED[device] = f"nvCOMP failed a test compression ({exc})"
    return _PROBED[device]


def default_compressor(layout: FrameLayout, *, max_streams: int, device: torch.device) -> Compressor:
    """The streams' compressor: nvCOMP's LZ4 (tests put a CPU LZ4 here)."""
    return NvcompLZ4(neblock=layout.neblock, max_streams=max_streams, device=device)


class NvcompLZ4:
    """nvCOMP's batched LZ4 compressor for up to ``max_streams`` streams of ``neblock`` bytes on ``device``."""

    def __init__(self, *, neblock: int, max_streams: int, device: torch.device) -> None:
        lib = _library()
        if lib is None:
            raise RuntimeError(_LIB_REASON)
        self._lib, self.neblock, self.device = lib, neblock, device
        self._opts = _CompressOpts(0, 0)  # NVCOMP_TYPE_CHAR (the bytes are shuffled), no bitshuffle
        align = _Alignments()
        self._check(
            lib.nvcompBatchedLZ4CompressGetRequiredAlignments(self._opts, ctypes.byref(align)), "alignments"
        )
        self.align = (int(align.input), int(align.output), int(align.temp))
        if neblock % self.align[0]:
            raise ValueError(f"streams of {neblock} bytes are not {self.align[0]}-byte aligned for nvCOMP")
        out = ctypes.c_size_t()
        self._check(lib.nvcompBatchedLZ4CompressGetMaxOutputChunkSize(ctypes.c_size_t(neblock), self._opts,
                                                                      ctypes.byref(out)), "max output")  # fmt: skip
        self.max_out = -(-int(out.value) // 16) * 16
        temp = ctypes.c_size_t()
        self._check(lib.nvcompBatchedLZ4CompressGetTempSize(ctypes.c_size_t(max_streams), ctypes.c_size_t(neblock),
                    self._opts, ctypes.byref(temp), ctypes.c_size_t(max_streams * neblock), ctypes.c_void_p(0)),
                    "temp size")  # fmt: skip
        self.max_streams = max_streams
        self._temp = torch.empty(max(1, int(temp.value)), dtype=torch.uint8, device=device)
        self._steps = torch.arange(max_streams, dtype=torch.int64, device=device)
        self._in_sizes = torch.full((max_streams,), neblock, dtype=torch.int64, device=device)
        self._ptrs = torch.empty((2, max_streams), dtype=torch.int64, device=device)

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"nvCOMP LZ4 {what} failed with status {status}")

    def __call__(self, src: torch.Tensor, per_row: int, dst: torch.Tensor, sizes: torch.Tensor) -> None:
        n = src.shape[0] * per_row
        if n > self.max_streams:
            raise ValueError(f"{n} streams, the compressor was made for {self.max_streams}")
        steps = self._steps[:n]
        ptrs = self._ptrs[:, :n]
        torch.add(
            steps // per_row * src.stride(0) + steps % per_row * self.neblock, src.data_ptr(), out=ptrs[0]
        )
        torch.add(steps * dst.stride(0), dst.data_ptr(), out=ptrs[1])
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._check(self._lib.nvcompBatchedLZ4CompressAsync(
            ctypes.c_void_p(ptrs[0].data_ptr()), ctypes.c_void_p(self._in_sizes.data_ptr()),
            ctypes.c_size_t(self.neblock), ctypes.c_size_t(n), ctypes.c_void_p(self._temp.data_ptr()),
            ctypes.c_size_t(self._temp.numel()), ctypes.c_void_p(ptrs[1].data_ptr()),
            ctypes.c_void_p(sizes.data_ptr()), self._opts, ctypes.c_void_p(0), ctypes.c_void_p(stream),
        ), "compress")  # fmt: skip


# -- the framing ------------------------------------------------------------------------------------------


@triton.jit
def _frame_kernel(
    frame_ptr, raw_ptr, comp_ptr, size_ptr, off_ptr, memcpy_ptr,
    S, NEBLOCK, BLOCKSIZE, COMP_STRIDE, FRAME_STRIDE, CHUNK_BYTES, TS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Program (stream g of all chunks, tile t): copy the stream's bytes into its chunk's frame: after its
    4-byte size field at ``off``, its compressed bytes, or, where LZ4 did not shrink it, its shuffled bytes
    gathered from the raw rows; in a memcpyed chunk, the raw bytes of the same span right after the header.
    Reads only ``raw`` and ``comp``: the frames may overwrite the shuffled copy that was compressed."""
    g = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1)
    c = g // S
    s = g % S
    i = t * BLOCK + tl.arange(0, BLOCK)
    frame = frame_ptr + c * FRAME_STRIDE
    raw = raw_ptr + c * CHUNK_BYTES
    if tl.load(memcpy_ptr + c) != 0:
        m = i < NEBLOCK
        v = tl.load(raw + s * NEBLOCK + i, mask=m)
        tl.store(frame + _HEADER_C + s * NEBLOCK + i, v, mask=m)
    else:
        size = tl.load(size_ptr + g)
        off = tl.load(off_ptr + g)
        if t == 0:
            k = tl.arange(0, 4)
            tl.store(frame + off + k, ((size >> (8 * k)) & 255).to(tl.uint8))
        m = i < size
        if size < NEBLOCK:
            v = tl.load(comp_ptr + g * COMP_STRIDE + i, mask=m)
        else:  # byte s % TS of each value of block s // TS: the stream as the shuffle laid it out
            v = tl.load(raw + (s // TS) * BLOCKSIZE + i * TS + s % TS, mask=m)
        tl.store(frame + off + 4 + i, v, mask=m)


class BloscEncoder:
    """Encodes up to ``max_chunks`` output chunks of ``layout`` at a time into Blosc-LZ4 frames on the
    GPU (or, with another ``compressor``, wherever its tensors live: tests use a CPU LZ4).

    It holds two buffers of about the chunks' size: the shuffled bytes (which the frames then overwrite:
    :attr:`frames`) and the compressed streams."""

    def __init__(
        self,
        layout: FrameLayout,
        *,
        max_chunks: int,
        device: torch.device,
        compressor: Compressor | None = None,
    ) -> None:
        self.layout, self.max_chunks, self.device = layout, max_chunks, device
        n = max_chunks * layout.streams
        self.compress = compressor or default_compressor(layout, max_streams=n, device=device)
        # frames[c] starts as chunk c's shuffled bytes (its first chunk_bytes), then holds its frame
        self.frames = torch.empty((max_chunks, layout.frame_bytes), dtype=torch.uint8, device=device)
        stride = -(-self.compress.max_out // 16) * 16
        self._comp = torch.empty((n, stride), dtype=torch.uint8, device=device)
        self._sizes = torch.empty(n, dtype=torch.int64, device=device)
        fields = torch.tensor([2 | 1 << 8 | (_SHUFFLE | _LZ4_CODE << 5) << 16 | layout.typesize << 24,
                               layout.chunk_bytes, layout.blocksize], dtype=torch.int64)  # fmt: skip
        self._fields = fields.to(torch.int32).to(device)
        self._neblock = torch.tensor(layout.neblock, dtype=torch.int64, device=device)

    @property
    def held_bytes(self) -> int:
        """Device memory this encoder holds (nvCOMP's scratch included)."""
        held = [self.frames, self._comp, self._sizes, getattr(self.compress, "_temp", self._sizes)]
        return sum(t.numel() * t.element_size() for t in held)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Encode ``x`` (k whole chunks, C-contiguous, k <= max_chunks) into the first k rows of
        :attr:`frames` (returned): row c holds chunk c's frame, its length in the header's bytes 12-16.
        Runs on the current stream and returns before the GPU is done; the rows stay valid until the next
        call."""
        lay = self.layout
        if not x.is_contiguous():
            raise ValueError("the rows to encode must be C-contiguous")
        raw = x.reshape(-1).view(torch.uint8)
        if raw.numel() % lay.chunk_bytes:
            raise ValueError(f"{raw.numel()} bytes are not whole chunks of {lay.chunk_bytes}")
        k = raw.numel() // lay.chunk_bytes
        if k > self.max_chunks:
            raise ValueError(f"{k} chunks, the encoder holds {self.max_chunks}")
        out = self.frames[:k]
        if k == 0:
            return out
        S, ts = lay.streams, lay.typesize
        shuf = out[:, : lay.chunk_bytes]
        # Blosc's byte shuffle, per block: byte j of every value, then byte j + 1, ...
        shuf.unflatten(1, (lay.nblocks, ts, lay.neblock)).copy_(
            raw.view(k, lay.nblocks, lay.neblock, ts).transpose(2, 3)
        )
        n = k * S
        sizes = self._sizes[:n]
        self.compress(out, S, self._comp, sizes)
        payload = torch.minimum(sizes, self._neblock)
        lens = (payload + 4).view(k, S)
        ends = lens.cumsum(1)
        start = HEADER + 4 * lay.nblocks
        offs = ends - lens + start
        total = ends[:, -1] + start
        memcpy = total > HEADER + lay.chunk_bytes  # c-blosc's rule: never more than the raw bytes + header
        cbytes = torch.where(memcpy, HEADER + lay.chunk_bytes, total)
        head = torch.empty((k, 4 + lay.nblocks), dtype=torch.int32, device=x.device)
        head[:, :3] = self._fields
        head[:, 3] = cbytes.to(torch.int32)
        head[:, 4:] = offs[:, ::ts].to(torch.int32)
        hb = head.view(torch.uint8).view(k, -1)
        hb[:, 2] |= memcpy.to(torch.uint8) * _MEMCPYED
        out[:, : hb.shape[1]] = hb  # before the kernel: a memcpyed chunk's raw bytes then replace bstarts
        grid = (n, triton.cdiv(lay.neblock, _TILE))
        _frame_kernel[grid](
            out, raw, self._comp, payload, offs.reshape(-1), memcpy.to(torch.int32),
            S, lay.neblock, lay.blocksize, self._comp.stride(0), out.stride(0), lay.chunk_bytes, TS=ts, BLOCK=_TILE,
        )  # fmt: skip
        return out
