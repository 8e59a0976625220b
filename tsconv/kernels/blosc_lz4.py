"""Blosc-LZ4 chunks decoded on the GPU: the compressed bytes go to the device, the decoded ones never cross.

Why on the GPU: on the 16-core H200 host, numcodecs decoding in 16 threads reaches 11-20 GB/s depending on
the lease, and the engine thread loses its launches to those threads' GIL hand-offs (benchmarks/NOTES.md);
the issue's 15 GB/s end to end cannot be met with the CPU doing the decoding. Reading the compressed files
is a plain copy (the 1.64x-compressed store is 2.6 GB for 4.3 GB of float32), and H2D moves 1.64x fewer
bytes.

Format handled (c-blosc 1.x, which numcodecs and zarr's ``BloscCodec`` write): header version 2, compressor
LZ4 (``flags >> 5 == 1``), byte shuffle or none (no bitshuffle), blocks split into ``typesize`` streams or
not, stored blocks (``csize == block bytes``) and whole chunks stored raw (the "memcpyed" flag). Layout of
a chunk: 16-byte header (version, versionlz, flags, typesize, nbytes, blocksize, cbytes), ``nblocks`` int32
block starts, then per block ``nstreams`` x (int32 csize, csize bytes). :func:`parse_header` checks a chunk
on the host; anything else is decoded on the CPU by the caller.

The kernel: one program (one warp) per (chunk, block, stream) decodes one LZ4 block sequentially, copying
literals and matches ``V`` bytes at a time, and writes each byte straight to its unshuffled place (byte
``p`` of stream ``k`` of a split, shuffled block is byte ``k`` of element ``p``), so there is no unshuffle
pass. A match reads bytes written by earlier sequences of the same program; the source of a byte at match
position ``j`` is ``op - offset + j % offset``, always behind ``op``, so one barrier between writing and
reading suffices even for overlapping matches (offset < length).

Input is untrusted: every load is masked to the chunk's bytes, every store to the stream's output range,
and a chunk whose streams do not decode to exactly their size (bad offsets, lengths past the end, a
truncated stream) sets its error flag; the caller raises.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

__all__ = ["BloscHeader", "decode_chunks", "parse_header", "unsupported_reason"]

_HEADER = 16
_LZ4 = 1


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


def unsupported_reason(h: BloscHeader, *, nbytes: int, size: int) -> str | None:
    """None when the GPU decoder handles a chunk with header ``h`` of ``size`` stored bytes decoding to
    ``nbytes``; else why not."""
    if h.nbytes != nbytes:
        return f"chunk decodes to {h.nbytes} bytes, expected {nbytes}"
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
    if h.blocksize % h.typesize and h.nblocks > 1:
        return f"blocksize {h.blocksize}"
    if not h.split and h.shuffle:
        return "shuffled blocks that are not split into streams"
    return None


@triton.jit
def _le32(ptr, pos, lim):
    """The little-endian int32 at byte ``pos`` (masked to ``lim``: 0 past it)."""
    b0 = tl.load(ptr + pos, mask=pos < lim, other=0).to(tl.int32)
    b1 = tl.load(ptr + pos + 1, mask=pos + 1 < lim, other=0).to(tl.int32)
    b2 = tl.load(ptr + pos + 2, mask=pos + 2 < lim, other=0).to(tl.int32)
    b3 = tl.load(ptr + pos + 3, mask=pos + 3 < lim, other=0).to(tl.int32)
    return b0 | (b1 << 8) | (b2 << 16) | (b3 << 24)


@triton.jit
def _chunk_header(src_ptr, off_ptr, len_ptr, dst_ptr, c, dst_stride):
    """Chunk ``c``'s bytes, output row, stored size (0: not decoded here: a missing chunk, or one the host
    decodes) and header fields: (src, dst, lim, flags, nbytes, blocksize, nblocks)."""
    lim = tl.load(len_ptr + c)
    src = src_ptr + tl.load(off_ptr + c)
    dst = dst_ptr + c.to(tl.int64) * dst_stride
    flags = tl.load(src + 2, mask=lim > 2, other=0).to(tl.int32)
    nbytes = _le32(src, 4, lim)
    bsz_full = tl.maximum(_le32(src, 8, lim), 1)
    return src, dst, lim, flags, nbytes, bsz_full, (nbytes + bsz_full - 1) // bsz_full


@triton.jit
def _blosc_lz4_kernel(
    src_ptr,  # uint8: every chunk's stored bytes
    off_ptr,  # int64 [n_chunks]: where each chunk starts in src
    len_ptr,  # int64 [n_chunks]: its stored size
    dst_ptr,  # uint8: chunk c decodes to dst[c * dst_stride : c * dst_stride + nbytes]
    err_ptr,  # int32 [n_chunks]: set to 1 when the chunk is damaged
    dst_stride,
    TS: tl.constexpr,  # the typesize the host checked (streams per split block)
    V: tl.constexpr,  # bytes copied per step
):
    pid = tl.program_id(0)
    c = tl.program_id(1)
    blk = pid // TS
    k = pid % TS
    src, dst, lim, flags, nbytes, bsz_full, nblocks = _chunk_header(
        src_ptr, off_ptr, len_ptr, dst_ptr, c, dst_stride
    )
    lanes = tl.arange(0, V)
    if (blk < nblocks) & (lim >= 16):
        block0 = blk * bsz_full
        bsize = tl.minimum(bsz_full, nbytes - block0)
        leftover = bsize < bsz_full
        memcpyed = (flags & 2) != 0
        split = ((flags & 0x10) == 0) & (~leftover) & (~memcpyed)
        nstreams = tl.where(split, TS, 1)
        if k < nstreams:
            neb = bsize // nstreams
            shuffle = ((flags & 1) != 0) & (~memcpyed)
            # output byte of stream position p: block0 + p * stride + first
            stride = tl.where(split & shuffle, TS, 1)
            first = tl.where(split & shuffle, k, k * neb)
            # a leftover (unsplit) shuffled block: elements' bytes are transposed within it
            n_el = bsize // TS
            transposed = shuffle & (~split)
            bad = tl.full((), 0, tl.int32)
            if memcpyed:
                ip = 16 + block0.to(tl.int64)  # after the header
                cs = bsize
            else:
                hdr_end = 16 + 4 * nblocks  # the header, then the block starts
                p = _le32(src, 16 + 4 * blk, lim).to(tl.int64)
                bad = tl.where((p < hdr_end) | (p >= lim), 1, 0)
                for _ in range(0, k):  # skip the streams before this one
                    cs_prev = _le32(src, p, lim)
                    p += 4 + cs_prev
                    bad = tl.where((cs_prev < 0) | (p > lim), 1, bad)
                cs = _le32(src, p, lim)
                ip = p + 4
            iend = ip + cs
            bad = tl.where((cs < 0) | (iend > lim), 1, bad)
            op = tl.full((), 0, tl.int32)
            if (cs == neb) | memcpyed:  # stored as is
                for j0 in range(0, neb, V):
                    j = j0 + lanes
                    m = (j < neb) & (bad == 0)
                    v = tl.load(src + ip + j, mask=m, other=0)
                    q = first + j * stride
                    if transposed:
                        q = tl.where(j < n_el * TS, (j % n_el) * TS + j // n_el, j)
                    tl.store(dst + block0 + q, v, mask=m)
                op = neb
            else:
                while (ip < iend) & (bad == 0):
                    tok = tl.load(src + ip).to(tl.int32)
                    ip += 1
                    ll = tok >> 4
                    if ll == 15:
                        more = tl.full((), 255, tl.int32)
                        while (more == 255) & (ip < iend):
                            more = tl.load(src + ip).to(tl.int32)
                            ip += 1
                            ll += more
                    bad = tl.where((ip + ll > iend) | (op + ll > neb), 1, bad)
                    for j0 in range(0, ll, V):  # literals
                        j = j0 + lanes
                        m = (j < ll) & (bad == 0)
                        v = tl.load(src + ip + j, mask=m, other=0)
                        pos = op + j
                        q = first + pos * stride
                        if transposed:
                            q = tl.where(pos < n_el * TS, (pos % n_el) * TS + pos // n_el, pos)
                        tl.store(dst + block0 + q, v, mask=m)
                    ip += ll
                    op += ll
                    if (ip < iend) & (bad == 0):  # a match follows (the last sequence has none)
                        moff = tl.load(src + ip, mask=ip < iend, other=0).to(tl.int32)
                        moff |= tl.load(src + ip + 1, mask=ip + 1 < iend, other=0).to(tl.int32) << 8
                        ip += 2
                        ml = tok & 15
                        if ml == 15:
                            more = tl.full((), 255, tl.int32)
                            while (more == 255) & (ip < iend):
                                more = tl.load(src + ip).to(tl.int32)
                                ip += 1
                                ml += more
                        ml += 4
                        bad = tl.where((moff == 0) | (moff > op) | (op + ml > neb) | (ip > iend), 1, bad)
                        tl.debug_barrier()  # the literals just written are visible to every lane
                        for j0 in range(0, ml, V):
                            j = j0 + lanes
                            m = (j < ml) & (bad == 0)
                            spos = op - moff + j % tl.maximum(moff, 1)
                            sq = first + spos * stride
                            pos = op + j
                            q = first + pos * stride
                            if transposed:
                                sq = tl.where(spos < n_el * TS, (spos % n_el) * TS + spos // n_el, spos)
                                q = tl.where(pos < n_el * TS, (pos % n_el) * TS + pos // n_el, pos)
                            v = tl.load(dst + block0 + sq, mask=m, other=0)
                            tl.store(dst + block0 + q, v, mask=m)
                        op += ml
                        tl.debug_barrier()
            if (bad != 0) | (op != neb):
                tl.store(err_ptr + c, 1)


@triton.jit
def _out_index(pos, first, stride, n_el, transposed, TS: tl.constexpr, ANY_T: tl.constexpr):
    """Where byte ``pos`` of a stream goes in its block (see ``_blosc_lz4_kernel``); [S, V] tiles."""
    q = first + pos * stride
    if ANY_T:
        q = tl.where(transposed & (pos < n_el * TS), (pos % n_el) * TS + pos // tl.maximum(n_el, 1), q)
    return q


@triton.jit
def _ext_len(src, ip, iend, n, need):
    """LZ4's extended length: while a byte is 255 add the next one ([S] lanes where ``need``)."""
    more = tl.where(need, 255, 0)
    while tl.max(((more == 255) & (ip < iend)).to(tl.int32), axis=0) > 0:
        go = (more == 255) & (ip < iend)
        b = tl.load(src + ip, mask=go, other=0).to(tl.int32)
        ip = tl.where(go, ip + 1, ip)
        n = tl.where(go, n + b, n)
        more = tl.where(go, b, 0)
    return ip, n


@triton.jit
def _blosc_lz4_multi_kernel(
    src_ptr, off_ptr, len_ptr, dst_ptr, err_ptr, dst_stride,
    TS: tl.constexpr, V: tl.constexpr, S: tl.constexpr,
):  # fmt: skip
    """``_blosc_lz4_kernel`` with ``S`` streams per program, decoded in lockstep ([S] state, [S, V] copies).

    Why: one stream's sequences form a chain of dependent loads (token, offset, then the match's bytes,
    written just before), about 1,300 cycles each on the H200; with one stream per warp and at most 32
    one-warp programs per SM, batches of fewer than ~32 chunks leave the GPU idle (benchmarks/NOTES.md,
    tenth session). ``S`` streams per warp overlap ``S`` chains. Experimental (``streams`` in
    :func:`decode_chunks`); the same bytes as the one-stream kernel, checked against numcodecs."""
    pid = tl.program_id(0)
    c = tl.program_id(1)
    src, dst, lim, flags, nbytes, bsz_full, nblocks = _chunk_header(
        src_ptr, off_ptr, len_ptr, dst_ptr, c, dst_stride
    )
    lanes = tl.arange(0, V)[None, :]
    sid = pid * S + tl.arange(0, S)
    blk = sid // TS
    k = sid % TS
    memcpyed = (flags & 2) != 0
    block0 = blk * bsz_full
    bsize = tl.minimum(bsz_full, nbytes - block0)
    leftover = bsize < bsz_full
    split = ((flags & 0x10) == 0) & (~leftover) & (~memcpyed)
    nstreams = tl.where(split, TS, 1)
    active = (blk < nblocks) & (k < nstreams) & (lim >= 16)
    neb = tl.where(active, bsize // nstreams, 0)
    shuffle = ((flags & 1) != 0) & (~memcpyed)
    stride = tl.where(split & shuffle, TS, 1)
    first = tl.where(split & shuffle, k, k * neb)
    n_el = bsize // TS
    transposed = shuffle & (~split)
    any_t = tl.max((transposed & active).to(tl.int32), axis=0) > 0
    hdr_end = 16 + 4 * nblocks
    p = _le32(src, 16 + 4 * blk, tl.where(active, lim, 0)).to(tl.int64)
    bad = tl.where(active & (~memcpyed) & ((p < hdr_end) | (p >= lim)), 1, 0)  # a stored chunk has no starts
    for t in range(0, TS - 1):  # skip the streams before each lane's own
        upd = active & (t < k)
        cs_prev = _le32(src, p, tl.where(upd, lim, 0))
        p = tl.where(upd, p + 4 + cs_prev, p)
        bad = tl.where(upd & ((cs_prev < 0) | (p > lim)), 1, bad)
    cs = tl.where(memcpyed, bsize, _le32(src, p, tl.where(active, lim, 0)))
    ip = tl.where(memcpyed, 16 + block0.to(tl.int64), p + 4)
    iend = ip + cs
    bad = tl.where(active & ((cs < 0) | (iend > lim)), 1, bad)
    raw = active & ((cs == neb) | memcpyed)
    op = tl.where(raw, neb, 0)
    n_raw = tl.max(tl.where(raw & (bad == 0), neb, 0), axis=0)
    for j0 in range(0, n_raw, V):  # streams stored as is
        j = j0 + lanes
        m = (raw & (bad == 0))[:, None] & (j < neb[:, None])
        v = tl.load(src + ip[:, None] + j, mask=m, other=0)
        if any_t:
            q = _out_index(j, first[:, None], stride[:, None], n_el[:, None], transposed[:, None], TS, True)
        else:
            q = _out_index(j, first[:, None], stride[:, None], n_el[:, None], transposed[:, None], TS, False)
        tl.store(dst + block0[:, None] + q, v, mask=m)
    todo = active & (~raw)
    while tl.max((todo & (ip < iend) & (bad == 0)).to(tl.int32), axis=0) > 0:
        live = todo & (ip < iend) & (bad == 0)
        tok = tl.load(src + ip, mask=live, other=0).to(tl.int32)
        ip = tl.where(live, ip + 1, ip)
        ll = tok >> 4
        ip, ll = _ext_len(src, ip, iend, ll, live & (ll == 15))
        bad = tl.where(live & ((ip + ll > iend) | (op + ll > neb)), 1, bad)
        ll = tl.where(live & (bad == 0), ll, 0)
        for j0 in range(0, tl.max(ll, axis=0), V):  # literals
            j = j0 + lanes
            m = j < ll[:, None]
            v = tl.load(src + ip[:, None] + j, mask=m, other=0)
            pos = op[:, None] + j
            if any_t:
                q = _out_index(
                    pos, first[:, None], stride[:, None], n_el[:, None], transposed[:, None], TS, True
                )
            else:
                q = _out_index(
                    pos, first[:, None], stride[:, None], n_el[:, None], transposed[:, None], TS, False
                )
            tl.store(dst + block0[:, None] + q, v, mask=m)
        ip = ip + ll
        op = op + ll
        mt = live & (ip < iend) & (bad == 0)  # a match follows (the last sequence has none)
        moff = tl.load(src + ip, mask=mt, other=0).to(tl.int32)
        moff |= tl.load(src + ip + 1, mask=mt & (ip + 1 < iend), other=0).to(tl.int32) << 8
        ip = tl.where(mt, ip + 2, ip)
        ml = tok & 15
        ip, ml = _ext_len(src, ip, iend, ml, mt & (ml == 15))
        ml = ml + 4
        bad = tl.where(mt & ((moff == 0) | (moff > op) | (op + ml > neb) | (ip > iend)), 1, bad)
        ml = tl.where(mt & (bad == 0), ml, 0)
        tl.debug_barrier()  # the literals just written are visible to every lane
        moff1 = tl.maximum(moff, 1)[:, None]
        for j0 in range(0, tl.max(ml, axis=0), V):
            j = j0 + lanes
            m = j < ml[:, None]
            spos = op[:, None] - moff1 + j % moff1
            pos = op[:, None] + j
            if any_t:
                sq = _out_index(
                    spos, first[:, None], stride[:, None], n_el[:, None], transposed[:, None], TS, True
                )
                q = _out_index(
                    pos, first[:, None], stride[:, None], n_el[:, None], transposed[:, None], TS, True
                )
            else:
                sq = _out_index(
                    spos, first[:, None], stride[:, None], n_el[:, None], transposed[:, None], TS, False
                )
                q = _out_index(
                    pos, first[:, None], stride[:, None], n_el[:, None], transposed[:, None], TS, False
                )
            v = tl.load(dst + block0[:, None] + sq, mask=m, other=0)
            tl.store(dst + block0[:, None] + q, v, mask=m)
        op = op + ml
        tl.debug_barrier()
    failed = active & ((bad != 0) | (op != neb))
    tl.store(err_ptr + c, 1, mask=tl.max(failed.to(tl.int32), axis=0) > 0)


def decode_chunks(
    src: torch.Tensor,
    offsets: torch.Tensor,
    sizes: torch.Tensor,
    out: torch.Tensor,
    *,
    typesize: int,
    max_blocks: int,
    err: torch.Tensor | None = None,
    streams: int = 1,
) -> torch.Tensor:
    """Decode Blosc-LZ4 chunks from ``src`` (uint8, on the device) into the rows of ``out`` (uint8
    [n_chunks, >= nbytes], rows contiguous); returns the int32 [n_chunks] error flags (1: damaged chunk).

    ``offsets`` / ``sizes`` (int64 [n_chunks], same device): each chunk's place in ``src``; a size of 0 skips
    the chunk (its row is left as it was). Every other chunk must have passed :func:`unsupported_reason` on
    the host with this ``typesize``; ``max_blocks``: the largest ``nblocks`` among them. ``err`` (int32 [n_chunks], zeroed by the caller) saves an allocation. ``streams``:
    LZ4 streams per program (1, or 2 / 4 / 8 for the experimental lockstep kernel).
    """
    n = int(offsets.numel())
    if out.dim() != 2 or out.dtype != torch.uint8 or out.stride(1) != 1 or out.shape[0] != n:
        raise ValueError(f"out must be uint8 [{n}, nbytes] with contiguous rows, got {tuple(out.shape)}")
    if err is None:
        err = torch.zeros(n, dtype=torch.int32, device=out.device)
    if n == 0 or max_blocks == 0:
        return err
    if streams == 1:
        grid = (max_blocks * typesize, n)
        _blosc_lz4_kernel[grid](src, offsets, sizes, out, err, out.stride(0), TS=typesize, V=32, num_warps=1)
        return err
    if streams not in (2, 4, 8):
        raise ValueError(f"streams per program must be 1, 2, 4 or 8, got {streams}")
    grid = (triton.cdiv(max_blocks * typesize, streams), n)
    _blosc_lz4_multi_kernel[grid](
        src, offsets, sizes, out, err, out.stride(0), TS=typesize, V=32, S=streams, num_warps=1
    )
    return err
