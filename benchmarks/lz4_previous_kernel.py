"""The one-stream Blosc-LZ4 decode kernel as it stood at 6493ef5 (tenth session), kept for
benchmarks/gpu_decode.py to time the current kernel against in the same process.

Not used by tsconv. Two barriers per sequence, int64 positions, the modulo on every match, loads in the
order the format gives them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tsconv.kernels.blosc_lz4 import _chunk_header, _le32  # unchanged since, but for _le32's mask below 0


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


def decode_chunks_previous(
    src: torch.Tensor, offsets: torch.Tensor, sizes: torch.Tensor, out: torch.Tensor, *, typesize: int,
    max_blocks: int,
) -> torch.Tensor:  # fmt: skip
    """``tsconv.kernels.blosc_lz4.decode_chunks`` with the previous kernel."""
    n = int(offsets.numel())
    err = torch.zeros(n, dtype=torch.int32, device=out.device)
    _blosc_lz4_kernel[(max_blocks * typesize, n)](
        src, offsets, sizes, out, err, out.stride(0), TS=typesize, V=32, num_warps=1
    )
    return err
