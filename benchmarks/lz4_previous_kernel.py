"""The one-warp-per-stream Blosc-LZ4 decode kernel as it stood at ae7787a (eleventh session): one sequence
at a time, the next token loaded while a match is copied, one barrier per sequence. Kept for
benchmarks/gpu_decode.py to time the current kernel against in the same process.

Not used by tsconv.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tsconv.kernels.blosc_lz4 import _chunk_header, _le32


@triton.jit
def _blosc_lz4_kernel(
    src_ptr,  # uint8: every chunk's stored bytes
    off_ptr,  # int64 [n_chunks]: where each chunk starts in src
    len_ptr,  # int64 [n_chunks]: its stored size (< 2 GiB: the host checks)
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
    src, dst, lim64, flags, nbytes, bsz_full, nblocks = _chunk_header(
        src_ptr, off_ptr, len_ptr, dst_ptr, c, dst_stride
    )
    lim = lim64.to(tl.int32)
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
            dstb = dst + block0
            bad = tl.full((), 0, tl.int32)
            if memcpyed:
                ip64 = 16 + block0.to(tl.int64)  # after the header
                cs = bsize
            else:
                hdr_end = 16 + 4 * nblocks  # the header, then the block starts
                p = _le32(src, 16 + 4 * blk, lim).to(tl.int64)  # int64: a damaged size must not wrap
                bad = tl.where((p < hdr_end) | (p >= lim), 1, 0)
                for _ in range(0, k):  # skip the streams before this one
                    cs_prev = _le32(src, p, lim)
                    p += 4 + cs_prev
                    bad = tl.where((cs_prev < 0) | (p > lim), 1, bad)
                cs = _le32(src, p, lim)
                ip64 = p + 4
            bad = tl.where((cs < 0) | (ip64 + cs > lim), 1, bad)
            # every position below fits in int32 once checked: chunks are < 2 GiB
            ip = tl.where(bad == 0, ip64, 0).to(tl.int32)
            iend = tl.where(bad == 0, ip64 + cs, 0).to(tl.int32)
            op = tl.full((), 0, tl.int32)
            if (cs == neb) | memcpyed:  # stored as is
                for j0 in range(0, neb, V):
                    j = j0 + lanes
                    m = (j < neb) & (bad == 0)
                    v = tl.load(src + ip + j, mask=m, other=0)
                    q = first + j * stride
                    if transposed:
                        q = tl.where(j < n_el * TS, (j % n_el) * TS + j // n_el, j)
                    tl.store(dstb + q, v, mask=m)
                op = neb
            else:
                # The token and the two bytes after it (the match offset when there are no literals) are
                # loaded one sequence ahead, while the match before is copied: a sequence's chain of
                # dependent loads is then the match copy alone (benchmarks/NOTES.md, eleventh session).
                tok_next = tl.load(src + ip, mask=ip < iend, other=0).to(tl.int32)
                b1 = tl.load(src + ip + 1, mask=ip + 1 < iend, other=0).to(tl.int32)
                b2 = tl.load(src + ip + 2, mask=ip + 2 < iend, other=0).to(tl.int32)
                while (ip < iend) & (bad == 0):
                    tok = tok_next
                    ip += 1
                    ll = tok >> 4
                    if ll == 15:
                        more = tl.full((), 255, tl.int32)
                        while (more == 255) & (ip < iend) & (ll <= neb):  # a bound: ll cannot wrap
                            more = tl.load(src + ip).to(tl.int32)
                            ip += 1
                            ll += more
                    bad = tl.where((ll > iend - ip) | (ll > neb - op), 1, bad)
                    ll = tl.where(bad == 0, ll, 0)
                    for j0 in range(0, ll, V):  # literals
                        j = j0 + lanes
                        m = j < ll
                        v = tl.load(src + ip + j, mask=m, other=0)
                        pos = op + j
                        q = first + pos * stride
                        if transposed:
                            q = tl.where(pos < n_el * TS, (pos % n_el) * TS + pos // n_el, pos)
                        tl.store(dstb + q, v, mask=m)
                    if ll == 0:  # the offset was loaded with the token
                        moff = b1 | (b2 << 8)
                    else:
                        moff = tl.load(src + ip + ll, mask=ip + ll < iend, other=0).to(tl.int32)
                        moff |= tl.load(src + ip + ll + 1, mask=ip + ll + 1 < iend, other=0).to(tl.int32) << 8
                    ip += ll
                    op += ll
                    if (ip < iend) & (bad == 0):  # a match follows (the last sequence has none)
                        ip += 2
                        ml = tok & 15
                        if ml == 15:
                            more = tl.full((), 255, tl.int32)
                            while (more == 255) & (ip < iend) & (ml <= neb):
                                more = tl.load(src + ip).to(tl.int32)
                                ip += 1
                                ml += more
                        ml += 4
                        bad = tl.where((moff == 0) | (moff > op) | (ml > neb - op) | (ip > iend), 1, bad)
                        ml = tl.where(bad == 0, ml, 0)
                        tok_next = tl.load(src + ip, mask=ip < iend, other=0).to(tl.int32)
                        b1 = tl.load(src + ip + 1, mask=ip + 1 < iend, other=0).to(tl.int32)
                        b2 = tl.load(src + ip + 2, mask=ip + 2 < iend, other=0).to(tl.int32)
                        # One barrier per sequence: every byte written so far (the literals just now, the
                        # matches before) is visible to every lane before this match reads.
                        tl.debug_barrier()
                        if (moff >= ml) & (~transposed):  # no overlap: no modulo (almost every match)
                            for j0 in range(0, ml, V):
                                j = j0 + lanes
                                m = j < ml
                                v = tl.load(dstb + first + (op - moff + j) * stride, mask=m, other=0)
                                tl.store(dstb + first + (op + j) * stride, v, mask=m)
                        else:  # the source of match byte j is op - moff + j % moff, always behind op
                            moff1 = tl.maximum(moff, 1)
                            for j0 in range(0, ml, V):
                                j = j0 + lanes
                                m = j < ml
                                spos = op - moff1 + j % moff1
                                sq = first + spos * stride
                                pos = op + j
                                q = first + pos * stride
                                if transposed:
                                    sq = tl.where(spos < n_el * TS, (spos % n_el) * TS + spos // n_el, spos)
                                    q = tl.where(pos < n_el * TS, (pos % n_el) * TS + pos // n_el, pos)
                                v = tl.load(dstb + sq, mask=m, other=0)
                                tl.store(dstb + q, v, mask=m)
                        op += ml
            if (bad != 0) | (op != neb):
                tl.store(err_ptr + c, 1)


def decode_chunks_previous(
    src: torch.Tensor,
    offsets: torch.Tensor,
    sizes: torch.Tensor,
    out: torch.Tensor,
    *,
    typesize: int,
    max_blocks: int,
    err: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode Blosc-LZ4 chunks from ``src`` (uint8, on the device) into the rows of ``out`` (uint8
    [n_chunks, >= nbytes], rows contiguous); returns the int32 [n_chunks] error flags (1: damaged chunk).

    ``offsets`` / ``sizes`` (int64 [n_chunks], same device): each chunk's place in ``src``; a size of 0 skips
    the chunk (its row is left as it was). Every other chunk must have passed :func:`unsupported_reason` on
    the host with this ``typesize``; ``max_blocks``: the largest ``nblocks`` among them.
    ``err`` (int32 [n_chunks], zeroed by the caller) saves an allocation.
    """
    n = int(offsets.numel())
    if out.dim() != 2 or out.dtype != torch.uint8 or out.stride(1) != 1 or out.shape[0] != n:
        raise ValueError(f"out must be uint8 [{n}, nbytes] with contiguous rows, got {tuple(out.shape)}")
    if err is None:
        err = torch.zeros(n, dtype=torch.int32, device=out.device)
    if n == 0 or max_blocks == 0:
        return err
    _blosc_lz4_kernel[(max_blocks * typesize, n)](
        src, offsets, sizes, out, err, out.stride(0), TS=typesize, V=32, num_warps=1
    )
    return err
