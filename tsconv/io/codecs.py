"""Codecs in words, for ``tsconv inspect`` and the stores' descriptions."""

from __future__ import annotations

from typing import Any

__all__ = ["codec_words"]

_BLOSC_NAMES = {
    "lz4": "LZ4",
    "lz4hc": "LZ4HC",
    "zstd": "Zstd",
    "blosclz": "BloscLZ",
    "zlib": "zlib",
    "snappy": "Snappy",
}
_BLOSC_SHUFFLE = {0: "", 1: "shuffle", 2: "bitshuffle", -1: "automatic shuffle"}
_NAMES = {"zstd": "zstd", "gzip": "gzip", "zlib": "zlib", "bz2": "bz2", "lzma": "LZMA", "lz4": "LZ4"}


def _name_and_config(codec: Any) -> tuple[str, dict[str, Any]]:
    """A codec's name and settings: zarr 3 codecs (``to_dict``) and numcodecs codecs (``get_config``)."""
    if hasattr(codec, "get_config"):
        config = dict(codec.get_config())
        name = str(config.pop("id", type(codec).__name__))
    elif hasattr(codec, "to_dict"):
        d = codec.to_dict()
        name, config = str(d.get("name", type(codec).__name__)), dict(d.get("configuration") or {})
    else:
        name, config = type(codec).__name__, {}
    return name.removeprefix("numcodecs.").lower(), config


def codec_words(codec: Any, *, itemsize: int | None = None) -> str | None:
    """A codec in words ("Blosc LZ4 level 5 + shuffle", "zstd level 3"); None for the plain little-endian
    bytes serializer, which changes nothing a user needs to know. ``itemsize``: the values' bytes each, so a
    Blosc shuffle over another type size (which compresses and decodes differently) is named."""
    name, c = _name_and_config(codec)
    if name == "bytes":
        return None if c.get("endian") in (None, "little") else f"{c['endian']}-endian bytes"
    if name == "blosc":
        cname = str(getattr(c.get("cname"), "value", c.get("cname")))
        shuffle = c.get("shuffle")
        shuffle = getattr(shuffle, "value", shuffle)
        shuffle = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}.get(shuffle, shuffle)
        words = f"Blosc {_BLOSC_NAMES.get(cname, cname)} level {c.get('clevel')}"
        extra = _BLOSC_SHUFFLE.get(shuffle, f"shuffle {shuffle}")
        typesize = c.get("typesize")
        if extra and itemsize is not None and typesize not in (None, itemsize):
            extra += f" (typesize {typesize} for {itemsize}-byte values)"
        return f"{words} + {extra}" if extra else words
    if name in ("zstd", "gzip", "zlib", "bz2"):
        level = c.get("level")
        if name == "zstd" and level == 0:  # zstd reads 0 as its default level
            level = "3 (the default)"
        words = _NAMES[name] + (f" level {level}" if level is not None else "")
        return words + (" with checksum" if c.get("checksum") else "")
    if name in ("crc32c", "crc32", "adler32", "fletcher32"):
        return f"{name.upper()} checksum"
    if name == "shuffle":
        return "shuffle"
    if name == "delta":
        return "delta"
    if name == "transpose":
        return f"transposed ({tuple(c.get('order', ()))})"
    if name == "sharding_indexed":
        return "sharded"
    settings = ", ".join(f"{k} {v}" for k, v in c.items() if isinstance(v, (int, float, str)))
    return _NAMES.get(name, name) + (f" ({settings})" if settings else "")
