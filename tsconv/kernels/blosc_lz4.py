"""Blosc-LZ4 chunks decoded on the GPU: the compressed bytes go to the device, the decoded ones never cross.

Why on the GPU: on the 16-core H200 host, numcodecs decoding in 16 threads reaches 11-20 GB/s depending on the
machine, and the engine thread loses its launches to those threads' GIL hand-offs (benchmarks/NOTES.md,
"Reading and decoding on the CPU"); the issue's 15 GB/s end to end cannot be met with the CPU doing the
decoding. Reading the compressed files is a plain copy (the 1.64x-compressed store is 2.6 GB for 4.3 GB of
float32), and H2D moves 1.64x fewer bytes.

Format handled (c-blosc 1.x, which numcodecs and zarr's ``BloscCodec`` write): header version 2, compressor
LZ4 (``flags >> 5 == 1``), byte shuffle or none (no bitshuffle), blocks split into ``typesize`` streams or
not, stored blocks (``csize == block bytes``) and whole chunks stored raw (the "memcpyed" flag). Layout of
a chunk: 16-byte header (version, versionlz, flags, typesize, nbytes, blocksize, cbytes), ``nblocks`` int32
block starts, then per block ``nstreams`` x (int32 csize, csize bytes). The host checks a chunk
(:mod:`tsconv.kernels.blosc_header`); anything else is decoded on the CPU by the caller.

The kernel: one program (one warp) per (chunk, block, stream) decodes one LZ4 block, writing each byte
straight to its unshuffled place (byte ``p`` of stream ``k`` of a split, shuffled block is byte ``k`` of
element ``p``), so there is no unshuffle pass. It goes G (32) sequences at a time, a lane per sequence:

1. parse: every position of a 128-byte window of the stream is taken as a token, which gives the lengths
   and where the next token would be; the real tokens are the chain from the window's start, found by
   pointer doubling (log2 G gathers) instead of one dependent load per sequence. A sequence the window
   cannot parse alone (its header past the window, a length extension of two or more bytes, the last
   sequence) is then parsed a byte at a time.
2. literals: every sequence's literals at once, in [W, G] tiles (a thread holds one sequence's bytes);
   a sequence longer than the tiles' reach goes alone, 256 bytes per step.
3. matches, in rounds: the source of match byte ``j`` is ``out - offset + j % offset``, always behind
   ``out``; a round copies every match whose source ends before the group's first unfinished match, then
   a barrier. Price data needs about two rounds per group. The modulo is taken only in a group with an
   overlapping match (offset < length).

Why it is written this way: the H200 runs at most 32 one-warp programs per SM, and on price-like float32
data a sequence decodes to about 6 bytes (14,000-21,000 sequences per 128 KB stream), so a one-sequence-
at-a-time decoder is bound by each warp's chain of dependent loads (about 750 cycles per sequence). In batches
of 12 chunks (the engine's), the grouped kernel with the window parse decodes at 53 GB/s against 22 GB/s one
sequence at a time (benchmarks/NOTES.md, "The GPU Blosc-LZ4 decoder"). Positions are int32 (chunks under
2 GiB).

Input is untrusted: every load is masked to the chunk's bytes, every store to the stream's output range,
and a chunk whose streams do not decode to exactly their size (bad offsets, lengths past the end, a
truncated stream) sets its error flag; the caller raises.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["decode_chunks"]

# sequences per group, and the [G, W] tiles' width and reach (bytes per sequence): price data's matches
# are 6 bytes at the median, 24 at the 99th percentile (benchmarks/NOTES.md, "The GPU Blosc-LZ4 decoder")
GROUP = 32
TILE = (8, 32)
LITERAL_WIDTH = 8
WINDOW = 128
# > 0: literals read as one span of the input, this many bytes per step (_copy_literal_span); 0: tiles.
# 64: batches of 12 16 MB chunks decode at 60 GB/s against 53 with tiles, and with the GPU decode the e2e
# loop's bound, the engine's runs were 4-7 ms shorter (benchmarks/NOTES.md, "The GPU Blosc-LZ4 decoder").
# A module constant so benchmarks/engine_trace.py's lspanN variant can set it for the engine's reader.
LITERAL_SPAN = 64
# bytes per step of a stored stream or a long sequence: one memory latency per step
LONG_STEP = 256


@triton.jit
def _le32(ptr, pos, lim):
    """The little-endian int32 at byte ``pos`` (masked to [0, ``lim``): 0 outside)."""
    ok = pos >= 0
    b0 = tl.load(ptr + pos, mask=ok & (pos < lim), other=0).to(tl.int32)
    b1 = tl.load(ptr + pos + 1, mask=ok & (pos + 1 < lim), other=0).to(tl.int32)
    b2 = tl.load(ptr + pos + 2, mask=ok & (pos + 2 < lim), other=0).to(tl.int32)
    b3 = tl.load(ptr + pos + 3, mask=ok & (pos + 3 < lim), other=0).to(tl.int32)
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
def _place(pos, first, stride, transposed, n_el, TS: tl.constexpr):
    """Where byte ``pos`` of a stream goes in its block (see the module docstring)."""
    q = first + pos * stride
    if transposed:
        q = tl.where(pos < n_el * TS, (pos % n_el) * TS + pos // n_el, pos)
    return q


@triton.jit
def _copy_group(
    from_ptr, dstb, s_pos, d_pos, length, active, period, wrap, first, stride, transposed, n_el,
    TS: tl.constexpr, G: tl.constexpr, W: tl.constexpr, T: tl.constexpr, L: tl.constexpr,
    MATCH: tl.constexpr,
):  # fmt: skip
    """Copy, for every ``active`` sequence i of a group, ``length[i]`` bytes to stream positions
    ``d_pos[i] + j``: literals (``MATCH`` false) from ``from_ptr + s_pos[i] + j`` in the compressed input,
    matches from stream position ``s_pos[i] + j % period[i]`` of the output ``dstb`` (``wrap`` false: no
    match overlaps its source, ``j % period[i]`` is ``j``). The first ``T`` bytes
    of every sequence go in [W, G] tiles; longer sequences then go one at a time, ``L * G`` bytes per step
    (a step's loads are all issued before its stores: the step costs one memory latency)."""
    ln = tl.where(active, length, 0)
    reach = tl.max(ln, axis=0)
    # [W, G] tiles: a thread holds one sequence's W bytes, so the [G] vectors need no layout change
    wv = tl.arange(0, W)
    for j0 in range(0, tl.minimum(reach, T), W):
        j = j0 + wv[:, None] + tl.zeros([W, G], tl.int32)
        m = j < ln[None, :]
        if MATCH:
            jj = j
            if wrap:
                jj = j % period[None, :]
            sp = _place(s_pos[None, :] + jj, first, stride, transposed, n_el, TS)
        else:
            sp = s_pos[None, :] + j
        v = tl.load(from_ptr + sp, mask=m, other=0)
        tl.store(dstb + _place(d_pos[None, :] + j, first, stride, transposed, n_el, TS), v, mask=m)
    if reach > T:  # long literals or matches: rare on price data
        idx = tl.arange(0, G)
        rest = ln > T
        step = tl.arange(0, L)[:, None] * G + idx[None, :]
        while tl.max(rest.to(tl.int32), axis=0) > 0:
            i = tl.min(tl.where(rest, idx, G), axis=0)
            one = idx == i
            s_i = tl.sum(tl.where(one, s_pos, 0), axis=0)
            d_i = tl.sum(tl.where(one, d_pos, 0), axis=0)
            n_i = tl.sum(tl.where(one, ln, 0), axis=0)
            p_i = tl.sum(tl.where(one, period, 0), axis=0)
            for j0 in range(T, n_i, L * G):
                j = j0 + step
                m = j < n_i
                if MATCH:
                    sp = _place(s_i + j % p_i, first, stride, transposed, n_el, TS)
                else:
                    sp = s_i + j
                v = tl.load(from_ptr + sp, mask=m, other=0)
                tl.store(dstb + _place(d_i + j, first, stride, transposed, n_el, TS), v, mask=m)
            rest = rest & (~one)


@triton.jit
def _copy_literal_span(
    src, dstb, lit_in, lit_out, ll, n, first, stride, transposed, n_el,
    TS: tl.constexpr, G: tl.constexpr, S: tl.constexpr,
):  # fmt: skip
    """Every literal of a group (sequences below ``n``) read from the span of the compressed input they lie
    in, ``S`` bytes per step: each byte finds its sequence by a binary search over the sequences' literal
    starts (increasing with the sequence), so a step costs one memory latency however the lengths vary.
    An alternative to :func:`_copy_group`'s tiles for literals (``literal_span``; benchmarks/NOTES.md,
    "The GPU Blosc-LZ4 decoder")."""
    i = tl.arange(0, G)
    big = 2147483647
    key = tl.where(i < n, lit_in, big)
    has = (i < n) & (ll > 0)
    lo = tl.min(tl.where(has, lit_in, big), axis=0)
    hi = tl.max(tl.where(has, lit_in + ll, 0), axis=0)
    pv = tl.arange(0, S)
    LOG: tl.constexpr = G.bit_length() - 1  # G is a power of two
    for s0 in range(lo, hi, S):
        p = s0 + pv
        at = tl.zeros([S], tl.int32)
        for kk in tl.static_range(0, LOG):
            cand = at + (1 << (LOG - 1 - kk))
            kv = tl.gather(key, tl.minimum(cand, G - 1), axis=0)
            at = tl.where((cand < G) & (kv <= p), cand, at)
        k0 = tl.gather(key, at, axis=0)
        m = (p < hi) & (p < k0 + tl.gather(ll, at, axis=0))
        v = tl.load(src + p, mask=m, other=0)
        q = tl.gather(lit_out, at, axis=0) + (p - k0)
        tl.store(dstb + _place(q, first, stride, transposed, n_el, TS), v, mask=m)


@triton.jit
def _hop(table, x, B: tl.constexpr):
    """``table[x]`` where x < B; x itself where x >= B (past the window: the chain has left it)."""
    return tl.where(x >= B, x, tl.gather(table, tl.minimum(x, B - 1), axis=0))


@triton.jit
def _window_parse(src, ip, iend, op, neb, G: tl.constexpr, B: tl.constexpr):
    """Parse up to G sequences from the ``B`` bytes at ``src + ip``, all lanes at once.

    Every window position p is taken as a token: its sequence's lengths and where the next token would
    be (``nxt``) follow from the bytes there, so the real tokens are the chain 0, nxt(0), nxt(nxt(0)), ...
    Sequence i's position is nxt applied i times, found by composing nxt with itself (pointer doubling,
    log2(G) gathers) instead of i dependent loads. The chain stops at a sequence the window cannot parse
    alone: its header past the window, an extension of two or more bytes, the stream's last sequence.

    Returns per lane (sequence i, for i below the count parsed, zeros past it): literal start in src, output
    position, literal length, match offset, match length; then the count, the bytes of src consumed, the
    output bytes, and whether a sequence overruns the output (a damaged stream).
    """
    pw = tl.arange(0, B)
    at = ip + pw
    w = tl.load(src + at, mask=at < iend, other=0).to(tl.int32)
    w1 = tl.load(src + at + 1, mask=at + 1 < iend, other=0).to(tl.int32)
    l_ext = (w >> 4) == 15
    m_ext = (w & 15) == 15
    ll = (w >> 4) + tl.where(l_ext, w1, 0)
    offp = pw + 1 + l_ext.to(tl.int32) + ll  # the match offset's first byte
    e2 = tl.gather(w, tl.minimum(offp + 2, B - 1), axis=0)  # the match length's extension byte, if any
    nxt = offp + 2 + m_ext.to(tl.int32)
    ok = (nxt <= B) & (ip + nxt <= iend) & ~(l_ext & (w1 == 255)) & ~(m_ext & (e2 == 255))
    ml = (w & 15) + 4 + tl.where(m_ext, e2, 0)
    # hops of 1, 2, 4, ... sequences; a position that cannot be parsed hops to itself, ending the chain
    hop = tl.where(ok, nxt, pw)
    i = tl.arange(0, G)
    pos = tl.zeros([G], tl.int32)
    for k in tl.static_range(0, G.bit_length() - 1):  # G is a power of two
        pos = tl.where(((i >> k) & 1) != 0, _hop(hop, pos, B), pos)
        hop = _hop(hop, hop, B)
    pc = tl.minimum(pos, B - 1)
    fields = (
        ll | (ml << 9) | (l_ext.to(tl.int32) << 18) | (m_ext.to(tl.int32) << 19) | (ok.to(tl.int32) << 20)
    )
    f = tl.gather(fields, pc, axis=0)
    valid = (pos < B) & (((f >> 20) & 1) != 0)  # a prefix of the lanes
    s_ll = tl.where(valid, f & 511, 0)
    s_ml = tl.where(valid, (f >> 9) & 511, 0)
    lit0 = pos + 1 + ((f >> 18) & 1)
    s_offp = lit0 + s_ll
    s_off = tl.gather(w, tl.minimum(s_offp, B - 1), axis=0) | (
        tl.gather(w, tl.minimum(s_offp + 1, B - 1), axis=0) << 8
    )
    ln = s_ll + s_ml
    out = op + tl.cumsum(ln, axis=0) - ln
    used = tl.max(tl.where(valid, s_offp + 2 + ((f >> 19) & 1), 0), axis=0)
    over = tl.max((valid & (out + ln > neb)).to(tl.int32), axis=0) > 0
    return (tl.where(valid, ip + lit0, 0), tl.where(valid, out, 0), s_ll, tl.where(valid, s_off, 1), s_ml,
            tl.sum(valid.to(tl.int32), axis=0), used, tl.sum(ln, axis=0), over)  # fmt: skip


@triton.jit
def _blosc_lz4_kernel(
    src_ptr,  # uint8: every chunk's stored bytes
    off_ptr,  # int64 [n_chunks]: where each chunk starts in src
    len_ptr,  # int64 [n_chunks]: its stored size (< 2 GiB: the host checks)
    dst_ptr,  # uint8: chunk c decodes to dst[c * dst_stride : c * dst_stride + nbytes]
    err_ptr,  # int32 [n_chunks]: set to 1 when the chunk is damaged
    dst_stride,
    TS: tl.constexpr,  # the typesize the host checked (streams per split block)
    V: tl.constexpr,  # bytes copied per step of a stored stream, or of a long sequence
    G: tl.constexpr,  # sequences parsed, then copied, together
    W: tl.constexpr,  # bytes per sequence per tile step (matches)
    WL: tl.constexpr,  # the same for literals (a tile step's loads wait for the step before)
    LS: tl.constexpr,  # > 0: literals read as one span, LS bytes per step, instead of in tiles
    T: tl.constexpr,  # bytes per sequence copied in tiles (the rest one sequence at a time)
    B: tl.constexpr,  # bytes of the window the sequences' headers are parsed from at once
    PROBE: tl.constexpr,  # 0: decode; 1: parse only; 2: parse and copy literals (benchmarks/gpu_decode.py)
):
    pid = tl.program_id(0)
    c = tl.program_id(1)
    blk = pid // TS
    k = pid % TS
    src, dst, lim64, flags, nbytes, bsz_full, nblocks = _chunk_header(
        src_ptr, off_ptr, len_ptr, dst_ptr, c, dst_stride
    )
    lim = lim64.to(tl.int32)
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
                for j0 in range(0, neb, V):  # a step's loads all go out before its stores
                    j = j0 + tl.arange(0, V)
                    m = (j < neb) & (bad == 0)
                    v = tl.load(src + ip + j, mask=m, other=0)
                    q = first + j * stride
                    if transposed:
                        q = tl.where(j < n_el * TS, (j % n_el) * TS + j // n_el, j)
                    tl.store(dstb + q, v, mask=m)
                op = neb
            else:
                # G sequences at a time: parse their tokens (a short scalar chain per sequence), then copy
                # every literal of the group at once, then the matches in rounds, each round the matches whose
                # source no unfinished match of the group writes (benchmarks/NOTES.md, "The GPU Blosc-LZ4
                # decoder").
                idx = tl.arange(0, G)
                while (ip < iend) & (bad == 0):
                    # per lane (sequence): literals' start in src and in the output, literal length, match
                    # offset and length; first as many as the window parses at once
                    g_lit_in, g_lit_out, g_ll, g_off, g_ml, n, used, made, over = _window_parse(
                        src, ip, iend, op, neb, G, B
                    )
                    ip += used
                    op += made
                    bad = tl.where(over, 1, bad)
                    # then one sequence the window could not parse, a byte at a time
                    n_end = tl.minimum(n + 1, G)
                    while (n < n_end) & (ip < iend) & (bad == 0):
                        tok = tl.load(src + ip).to(tl.int32)
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
                        sel = idx == n
                        g_lit_in = tl.where(sel, ip, g_lit_in)
                        g_lit_out = tl.where(sel, op, g_lit_out)
                        g_ll = tl.where(sel, ll, g_ll)
                        ip += ll
                        op += ll
                        if (ip < iend) & (bad == 0):  # a match follows (the last sequence has none)
                            moff = tl.load(src + ip, mask=ip < iend, other=0).to(tl.int32)
                            moff |= tl.load(src + ip + 1, mask=ip + 1 < iend, other=0).to(tl.int32) << 8
                            ip += 2
                            ml = tok & 15
                            if ml == 15:
                                more = tl.full((), 255, tl.int32)
                                while (more == 255) & (ip < iend) & (ml <= neb):
                                    more = tl.load(src + ip).to(tl.int32)
                                    ip += 1
                                    ml += more
                            ml += 4
                            # the offset is checked after the group: it is not on this loop's chain
                            bad = tl.where((ml > neb - op) | (ip > iend), 1, bad)
                            ml = tl.where(bad == 0, ml, 0)
                            g_off = tl.where(sel, moff, g_off)
                            g_ml = tl.where(sel, ml, g_ml)
                            op += ml
                        n += 1
                    m_out = g_lit_out + g_ll
                    # an offset of 0, or one reaching before the stream, damages the chunk: nothing is copied
                    bad_off = (g_ml > 0) & ((g_off == 0) | (g_off > m_out))
                    bad = tl.where(tl.max(bad_off.to(tl.int32), axis=0) > 0, 1, bad)
                    g_off = tl.maximum(g_off, 1)
                    if (bad == 0) & (PROBE != 1):
                        # literals: independent of each other and of the output
                        if LS > 0:
                            _copy_literal_span(src, dstb, g_lit_in, g_lit_out, g_ll, n, first, stride,
                                               transposed, n_el, TS, G, LS)  # fmt: skip
                        else:
                            _copy_group(src, dstb, g_lit_in, g_lit_out, g_ll, g_ll > 0, g_ll, False, first,
                                        stride, transposed, n_el, TS, G, WL, T, V // G, False)  # fmt: skip
                        # matches: the source of match byte j is out - off + j % off, always behind out
                        s_lo = m_out - g_off
                        s_hi = s_lo + tl.minimum(g_off, g_ml)
                        # a match that overlaps its source (0.2% on price data): the modulo for the group
                        wrap = tl.max((g_off < g_ml).to(tl.int32), axis=0) > 0
                        pending = (g_ml > 0) & (PROBE == 0)
                        # the first unfinished match (neb: none)
                        first_open = tl.min(tl.where(pending, m_out, neb), axis=0)
                        while first_open < neb:
                            # every byte written so far is visible to every lane before the matches read
                            tl.debug_barrier()
                            # ready: the source ends before the first unfinished match (always true of that
                            # one); an exact overlap test saves 13% of the rounds but spills registers
                            ready = pending & (s_hi <= first_open)
                            _copy_group(dstb, dstb, s_lo, m_out, g_ml, ready, g_off, wrap, first, stride,
                                        transposed, n_el, TS, G, W, T, V // G, True)  # fmt: skip
                            pending = pending & (~ready)
                            first_open = tl.min(tl.where(pending, m_out, neb), axis=0)
            if (bad != 0) | (op != neb):
                tl.store(err_ptr + c, 1)


def decode_chunks(
    src: torch.Tensor,
    offsets: torch.Tensor,
    sizes: torch.Tensor,
    out: torch.Tensor,
    *,
    typesize: int,
    max_blocks: int,
    err: torch.Tensor | None = None,
    group: int = GROUP,
    tile: tuple[int, int] = TILE,
    window: int = WINDOW,
    literal_width: int = LITERAL_WIDTH,
    literal_span: int | None = None,
) -> torch.Tensor:
    """Decode Blosc-LZ4 chunks from ``src`` (uint8, on the device) into the rows of ``out`` (uint8
        [n_chunks, >= nbytes], rows contiguous); returns the int32 [n_chunks] error flags (1: damaged chunk).

        ``offsets`` / ``sizes`` (int64 [n_chunks], same device): each chunk's place in ``src``; a size of 0 skips
        the chunk (its row is left as it was). Every other chunk must have passed
    :func:`tsconv.kernels.blosc_header.unsupported_reason` on
        the host with this ``typesize``; ``max_blocks``: the largest ``nblocks`` among them.
        ``err`` (int32 [n_chunks], zeroed by the caller) saves an allocation. ``group`` (sequences decoded
        together), ``tile`` (bytes per sequence per step, bytes per sequence in tiles), ``literal_width``
        (bytes per sequence per step for literals), ``literal_span`` (> 0: literals read as one span of the
        input, that many bytes per step; not measured on a GPU yet) and ``window`` (bytes parsed at once) are
        for benchmarks.
    """
    n = int(offsets.numel())
    if out.dim() != 2 or out.dtype != torch.uint8 or out.stride(1) != 1 or out.shape[0] != n:
        raise ValueError(f"out must be uint8 [{n}, nbytes] with contiguous rows, got {tuple(out.shape)}")
    if err is None:
        err = torch.zeros(n, dtype=torch.int32, device=out.device)
    if n == 0 or max_blocks == 0:
        return err
    _blosc_lz4_kernel[(max_blocks * typesize, n)](
        src,
        offsets,
        sizes,
        out,
        err,
        out.stride(0),
        TS=typesize,
        V=LONG_STEP,
        G=group,
        W=tile[0],
        WL=literal_width,
        LS=LITERAL_SPAN if literal_span is None else literal_span,
        T=tile[1],
        B=window,
        PROBE=0,
        num_warps=1,
    )
    return err
