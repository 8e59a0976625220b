"""The GPU Blosc-LZ4 decoder against numcodecs: real chunks, multi-block chunks with a leftover block,
several chunks per launch, damaged input (flagged, nothing written outside its place)."""

from __future__ import annotations

import os
import struct

import numcodecs
import numpy as np
import pytest
import torch

from tsconv.kernels import blosc_header
from tsconv.kernels import blosc_lz4 as bl

from ..helpers import mostly_slow
from .sm90 import run_compile_script

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERP or not torch.cuda.is_available() else "cuda"
pytestmark = pytest.mark.skipif(
    DEVICE == "cpu" and not INTERP, reason="needs a CUDA GPU or TRITON_INTERPRET=1"
)
POISON = 0xAB


def _prices(n: int, dtype=np.float32, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (100 + np.cumsum(rng.choice([-1, 0, 0, 1], size=n)) * 0.01).astype(dtype)
    x[rng.random(n) < 0.01] = np.nan
    return x


def _blosc(x: np.ndarray, shuffle: int, clevel: int = 5) -> np.ndarray:
    return np.frombuffer(numcodecs.Blosc(cname="lz4", clevel=clevel, shuffle=shuffle).encode(x), np.uint8)


def _assemble(x: np.ndarray, blocksize: int, shuffle: int) -> np.ndarray:
    """A multi-block chunk of ``x`` with ``blocksize``-byte blocks, as c-blosc lays one out, built from
    single-block chunks that c-blosc compressed (it only picks small blocks for much larger inputs).

    Each block's streams section is copied from a chunk of that block alone. A last, shorter block of fewer
    than 128 elements is compressed as c-blosc compresses a leftover block: one stream, not split."""
    raw = x.view(np.uint8)
    parts, flags = [], None
    for a in range(0, raw.size, blocksize):
        one = _blosc(x[a // x.itemsize : (a + blocksize) // x.itemsize], shuffle)
        h = blosc_header.parse_header(one)
        assert h.nblocks == 1 and not h.memcpyed, h
        if flags is None:
            flags = h.flags
        parts.append(one[16 + 4 :].tobytes())
    nblocks = len(parts)
    starts, pos = [], 16 + 4 * nblocks
    for p in parts:
        starts.append(pos)
        pos += len(p)
    head = struct.pack("<BBBBiii", 2, 1, flags, x.itemsize, raw.size, blocksize, pos)
    return np.frombuffer(head + struct.pack(f"<{nblocks}i", *starts) + b"".join(parts), np.uint8)


def _decode(
    chunks: list[np.ndarray], nbytes: list[int], *, row: int | None = None, **kw
) -> tuple[np.ndarray, list[int]]:
    """Decode ``chunks`` in one launch; (output rows [n, row] with the poison past each chunk, errors)."""
    offs, pos, pieces = [], 0, []
    for c in chunks:
        offs.append(pos)
        pad = -c.size % 16
        pieces += [c, np.zeros(pad, np.uint8)]
        pos += c.size + pad
    heads = [blosc_header.parse_header(c) for c in chunks]
    row = row or max(nbytes)
    out = torch.full((len(chunks), row), POISON, dtype=torch.uint8, device=DEVICE)
    err = bl.decode_chunks(
        torch.from_numpy(np.concatenate(pieces)).to(DEVICE),
        torch.tensor(offs, dtype=torch.int64, device=DEVICE),
        torch.tensor([c.size for c in chunks], dtype=torch.int64, device=DEVICE),
        out,
        typesize=heads[0].typesize,
        max_blocks=max(h.nblocks for h in heads),
        **kw,
    )
    return out.cpu().numpy(), err.cpu().tolist()


@pytest.mark.parametrize(
    ("n", "dtype", "shuffle"),
    mostly_slow(
        [
            (900, np.float32, numcodecs.Blosc.SHUFFLE),
            (701, np.float32, numcodecs.Blosc.NOSHUFFLE),
            (450, np.float64, numcodecs.Blosc.SHUFFLE),
            (1000, np.float16, numcodecs.Blosc.SHUFFLE),
        ],
        fast=(0, 1),
    ),
)
def test_real_chunks_decode_exactly(n: int, dtype, shuffle: int) -> None:
    x = _prices(n, dtype)
    c = _blosc(x, shuffle)
    h = blosc_header.parse_header(c)
    assert blosc_header.unsupported_reason(h, nbytes=x.nbytes, size=c.size, typesize=x.itemsize) is None
    out, err = _decode([c], [x.nbytes], row=x.nbytes + 40)
    assert err == [0]
    np.testing.assert_array_equal(out[0, : x.nbytes], x.view(np.uint8))
    assert (out[0, x.nbytes :] == POISON).all()


def _ext_len(d: bytes, ip: int, n: int) -> tuple[int, int]:
    """LZ4's extended length: add bytes while they are 255 (and the first that is not)."""
    while True:
        n += d[ip]
        ip += 1
        if d[ip - 1] != 255:
            return ip, n


def _sequence_kinds(c: np.ndarray) -> set[str]:
    """Which kinds of LZ4 sequence a single-block, unsplit Blosc chunk holds (the kernel's code paths)."""
    d = c.tobytes()
    ip = 16 + 4 + 4  # header, one block start, the stream's size
    kinds: set[str] = set()
    while ip < len(d):
        tok = d[ip]
        ip += 1
        ll = tok >> 4
        if ll == 15:
            kinds.add("long literal length")
            ip0 = ip
            ip, ll = _ext_len(d, ip, ll)
            kinds.add("literal length in one extra byte" if ip - ip0 == 1 else "literal length in 2+ bytes")
        kinds.add("no literals" if ll == 0 else "literals > 32" if ll > 32 else "literals")
        ip += ll
        if ip >= len(d):
            break
        off = d[ip] | d[ip + 1] << 8
        ip += 2
        ml = tok & 15
        if ml == 15:
            kinds.add("long match length")
            ip0 = ip
            ip, ml = _ext_len(d, ip, ml)
            kinds.add("match length in one extra byte" if ip - ip0 == 1 else "match length in 2+ bytes")
        ml += 4
        kinds.add("overlapping match" if off < ml else "match")
        if off < 32 <= ml:
            kinds.add("offset < 32 <= length")
    return kinds


def test_every_kind_of_sequence_decodes() -> None:
    """Runs, short and long periods, noise: literals with and without extended lengths, matches with and
    without overlap, offsets below the 32-byte copy width (each kind checked present in the chunk)."""
    x, c = _every_kind()
    kinds = _sequence_kinds(c)
    # the window parse takes one-byte extensions; longer ones go a byte at a time
    for kind in ("long literal length", "long match length", "no literals", "literals > 32", "literals",
                 "overlapping match", "match", "offset < 32 <= length", "literal length in one extra byte",
                 "literal length in 2+ bytes", "match length in one extra byte", "match length in 2+ bytes"):  # fmt: skip
        assert kind in kinds, (kind, kinds)
    out, err = _decode([c], [x.nbytes], row=x.nbytes + 33)
    assert err == [0]
    np.testing.assert_array_equal(out[0, : x.nbytes], x)
    assert (out[0, x.nbytes :] == POISON).all()


def _every_kind() -> tuple[np.ndarray, np.ndarray]:
    """Bytes holding every kind of LZ4 sequence, and their one-block, unsplit Blosc-LZ4 chunk."""
    rng = np.random.default_rng(7)
    period3 = np.tile(rng.integers(0, 255, 3, dtype=np.uint8), 200)
    period40 = np.tile(rng.integers(0, 255, 40, dtype=np.uint8), 30)
    twice = rng.integers(0, 255, 100, dtype=np.uint8)  # its second copy: a 100-byte match
    parts = [twice, rng.integers(0, 255, 20, dtype=np.uint8), twice,
             np.zeros(700, np.uint8), rng.integers(0, 255, 300, dtype=np.uint8), period3,
             rng.integers(0, 4, 500, dtype=np.uint8), period40, rng.integers(0, 255, 20, dtype=np.uint8)]  # fmt: skip
    x = np.concatenate(parts * 3)
    c = np.frombuffer(
        numcodecs.Blosc(cname="lz4", clevel=9, shuffle=0, blocksize=1 << 16).encode(x), np.uint8
    )
    h = blosc_header.parse_header(c)
    assert h.nblocks == 1 and not h.split or h.typesize == 1
    return x, c


@pytest.mark.parametrize("span", mostly_slow([0, 64, 256], fast=(1,)))
def test_literals_read_as_one_span_decode_the_same(span: int) -> None:
    """``literal_span``: a group's literals from one read of their span of the input (the default, 64 bytes
    a step, and another width), or (0) through the [G, W] tiles."""
    x, c = _every_kind()
    p = _prices(900, np.float32, seed=9)  # typesize 4: another launch
    for want, chunk in ((x, c), (p.view(np.uint8), _blosc(p, 1))):
        out, err = _decode([chunk], [want.nbytes], row=want.nbytes + 33, literal_span=span)
        assert err == [0]
        np.testing.assert_array_equal(out[0, : want.nbytes], want)
        assert (out[0, want.nbytes :] == POISON).all()


@pytest.mark.parametrize("shuffle", [1, 0])
@pytest.mark.slow
def test_multi_block_chunk_with_a_leftover_block(shuffle: int) -> None:
    x = _prices(3 * 512 + 100, seed=1)  # three 2 KB blocks split into 4 streams, a 400-byte leftover
    c = _assemble(x, 2048, shuffle)
    assert np.array_equal(np.frombuffer(numcodecs.Blosc().decode(c), np.float32), x, equal_nan=True)
    h = blosc_header.parse_header(c)
    assert h.nblocks == 4 and h.nbytes - 3 * h.blocksize == 400
    out, err = _decode([c], [x.nbytes])
    assert err == [0]
    np.testing.assert_array_equal(out[0], x.view(np.uint8))


@pytest.mark.slow
def test_several_chunks_in_one_launch_and_a_stored_chunk() -> None:
    xs = [_prices(700, seed=2), _prices(333, seed=3), np.random.default_rng(4).random(300).astype(np.float32)]
    cs = [_blosc(xs[0], 1), _blosc(xs[1], 0), _blosc(xs[2], 1, clevel=1)]
    hs = [blosc_header.parse_header(c) for c in cs]
    cs[2] = np.frombuffer(  # a chunk c-blosc stored as is (incompressible): the "memcpyed" flag
        struct.pack("<BBBBiii", 2, 1, hs[2].flags | 0x02, 4, xs[2].nbytes, hs[2].blocksize, 16 + xs[2].nbytes)
        + xs[2].tobytes(),
        np.uint8,
    )
    assert np.array_equal(np.frombuffer(numcodecs.Blosc().decode(cs[2]), np.float32), xs[2])
    out, err = _decode(cs, [x.nbytes for x in xs])
    assert err == [0, 0, 0]
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(out[i, : x.nbytes], x.view(np.uint8))
        assert (out[i, x.nbytes :] == POISON).all()


def _damage(c: np.ndarray, how: str) -> np.ndarray:
    d = c.copy()
    first = int.from_bytes(d[16:20].tobytes(), "little")  # block 0's start
    if how == "truncated":
        return d[: d.size - 50]
    if how == "block_start":
        d[16:20] = np.frombuffer(struct.pack("<i", d.size + 1000), np.uint8)
    elif how == "stream_size":
        d[first : first + 4] = np.frombuffer(struct.pack("<i", 1 << 30), np.uint8)
    elif how == "match_offset":
        d[first + 4 + 1 :: 7] ^= 0xFF  # scramble the stream: tokens, lengths and offsets go wrong
    return d


@pytest.mark.parametrize(
    "how", mostly_slow(["truncated", "block_start", "stream_size", "match_offset"], fast=(0, 3))
)
def test_damaged_chunks_are_flagged_and_write_only_their_row(how: str) -> None:
    good = _prices(600, seed=5)
    x = _prices(600, seed=6)
    bad = _damage(_blosc(x, 1), how)
    out, err = _decode([_blosc(good, 1), bad, _blosc(good, 1)], [good.nbytes] * 3, row=good.nbytes + 64)
    assert err == [0, 1, 0]
    for i in (0, 2):
        np.testing.assert_array_equal(out[i, : good.nbytes], good.view(np.uint8))
    assert (out[:, good.nbytes :] == POISON).all()


def _hand_chunk(stream: bytes, nbytes: int) -> np.ndarray:
    """A one-block, unsplit, unshuffled Blosc-LZ4 chunk (typesize 1) around a hand-written LZ4 stream."""
    body = struct.pack("<i", 20) + struct.pack("<i", len(stream)) + stream
    head = struct.pack("<BBBBiii", 2, 1, 0x30, 1, nbytes, nbytes, 16 + len(body))
    return np.frombuffer(head + body, np.uint8)


@pytest.mark.parametrize(("offset", "ok"), [(4, True), (1, True), (0, False), (5, False)])
def test_a_match_offset_of_zero_or_before_the_stream_is_flagged(offset: int, ok: bool) -> None:
    """Four literals, an eight-byte match at ``offset``, a last literal: the kernel checks offsets after
    parsing a group of sequences, and must then copy nothing of the group."""
    stream = bytes([0x44]) + b"abcd" + struct.pack("<H", offset) + bytes([0x10]) + b"e"
    out, err = _decode([_hand_chunk(stream, 13)], [13], row=20)
    assert err == [0 if ok else 1]
    if ok:
        assert out[0, :13].tobytes() == (b"abcdabcdabcde" if offset == 4 else b"abcd" + b"d" * 8 + b"e")
    else:
        assert (out[0, 4:] == POISON).all()  # no match byte, nothing read before the stream
    assert (out[0, 13:] == POISON).all()


def test_headers_the_gpu_does_not_decode_say_why() -> None:
    x = _prices(1000)
    n = x.nbytes
    z = np.frombuffer(numcodecs.Blosc(cname="zstd", shuffle=1).encode(x), np.uint8)
    assert "compressor code" in blosc_header.unsupported_reason(
        blosc_header.parse_header(z), nbytes=n, size=z.size, typesize=4
    )
    b = np.frombuffer(numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.BITSHUFFLE).encode(x), np.uint8)
    assert (
        blosc_header.unsupported_reason(blosc_header.parse_header(b), nbytes=n, size=b.size, typesize=4)
        == "bitshuffle"
    )
    c = _blosc(x, 1)
    assert "expected" in blosc_header.unsupported_reason(
        blosc_header.parse_header(c), nbytes=n + 4, size=c.size, typesize=4
    )
    assert "the file has" in blosc_header.unsupported_reason(
        blosc_header.parse_header(c), nbytes=n, size=c.size - 1, typesize=4
    )
    # a float32 chunk c-blosc split into 8-byte values' streams (zarr's BloscCodec(typesize=8)): the kernel
    # would split it by 4 and flag a sound chunk as damaged
    c8 = np.frombuffer(numcodecs.Blosc(cname="lz4", shuffle=1).encode(x.view(np.int64)), np.uint8)
    assert (
        blosc_header.unsupported_reason(blosc_header.parse_header(c8), nbytes=n, size=c8.size, typesize=4)
        == "Blosc typesize 8 for 4-byte values"
    )
    assert (
        blosc_header.unsupported_reason(blosc_header.parse_header(c8), nbytes=n, size=c8.size, typesize=8)
        is None
    )
    with pytest.raises(ValueError, match="16-byte header"):
        blosc_header.parse_header(c[:10])
    with pytest.raises(ValueError, match="version 3"):
        blosc_header.parse_header(np.concatenate([[3], c[1:]]).astype(np.uint8))


_COMPILE = r"""
from tsconv.kernels import blosc_lz4 as m
runtime = [("src_ptr", "*u8", "D"), ("off_ptr", "*i64", "D"), ("len_ptr", "*i64", "D"), ("dst_ptr", "*u8", "D"),
           ("err_ptr", "*i32", "D"), ("dst_stride", "i64", "")]
class Cfg:
    meta, num_warps, num_stages, maxnreg = {}, 1, 1, None
base = dict(TS=4, V=m.LONG_STEP, G=m.GROUP, W=m.TILE[0], T=m.TILE[1], B=m.WINDOW, WL=m.LITERAL_WIDTH, PROBE=0)
for ls in (64, 0, 256):  # the default literal span, the tiles, another span
    ck = build(m._blosc_lz4_kernel, runtime, dict(base, LS=ls), Cfg())
    regs, spills = ptxas_usage(ck)
    print(f"LS={ls}: {regs} registers, {spills} bytes spilled")
    assert spills == 0
print("compiled OK")
"""


@pytest.mark.parametrize("shuffle", [0, 1])
def test_a_split_flag_on_blocks_of_fewer_than_128_values_is_decoded_on_the_host(shuffle: int) -> None:
    """c-blosc splits a block into streams only where the header's flag allows it and the block holds 128
    values or more (MIN_BUFFERSIZE: the rule before the flag, as c-blosc before 1.5 wrote chunks without
    it); the kernel split such a block by the flag alone, and flagged a chunk numcodecs reads as damaged."""
    x = _prices(300)
    c = np.frombuffer(
        numcodecs.Blosc(cname="lz4", clevel=5, shuffle=shuffle, blocksize=256).encode(x), np.uint8
    ).copy()
    assert c[2] & 0x10  # 64 values a block: c-blosc says "not split"
    c[2] &= 0xEF  # as a chunk written before the flag says it
    np.testing.assert_array_equal(np.frombuffer(numcodecs.Blosc().decode(c), np.float32), x)
    h = blosc_header.parse_header(c)
    assert "fewer than 128" in blosc_header.unsupported_reason(h, nbytes=x.nbytes, size=c.size, typesize=4)


@pytest.mark.slow
@pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU machine the real kernel runs in the other tests"
)
@pytest.mark.slow
def test_kernel_compiles_for_sm90() -> None:
    """The interpreter accepts what the compiler may not (globals, loop-carried types): compile for sm_90."""
    run_compile_script(_COMPILE)
