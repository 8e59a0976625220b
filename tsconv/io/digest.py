"""Input digests: what an output was computed from, cheap enough to take at every run's start.

Reading the input's bytes again would cost as much as the run, so a digest is taken from the file
system instead: for each chunk file of the input's ``values`` and ``time`` arrays, its size, mtime_ns and
inode (a missing chunk file, which zarr reads as the fill value, counts as absent), grouped by row band
of the array's chunk grid (every chunk file holding those rows) and hashed per band (BLAKE2b, 8 bytes).
The arrays' metadata documents are hashed by content but for their shape, which is recorded beside (rows
appended to an input change the shape alone). A band's digest changes when any of its chunk
files is rewritten, replaced or removed, so bands can be told apart one by one: ``--resume`` refuses an
input whose already processed rows changed, naming the first changed band, and a later ``--update``
(rows appended, the input's last partial band rewritten) can tell unchanged bands from changed ones.

The digest is written once, as ``.tsconv-input.json`` inside the output's ``values`` directory: zarr and
xarray read only metadata and chunk keys there, while a file at the group's root would make zarr warn
on every listing of its members; and the group's ``zarr.json``, rewritten at every progress update,
stays small however many chunk files the input has. An array whose last band is partial (its rows
end inside a chunk) also records a hash of those rows' bytes (``tail``): appending rows rewrites that
band's chunk files, so ``--update`` re-reads and re-hashes just those rows to tell an append from a change
(a band or less of reading, however long the history). Input stores that are not local directories (an
object store) have no digest (``{"skipped": why}``); resuming from such an input checks the fingerprint
only. An output in an object store keeps its digest as the object of the same key.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tsconv.errors import StoreError, TsconvError, disk_advice, first_line
from tsconv.io.objstore import StoreURL
from tsconv.io.timecolumn import TimeColumn

__all__ = [
    "DIGEST_FILE",
    "changed_bands",
    "digest_note",
    "first_change",
    "input_arrays",
    "input_digest",
    "read_digest",
    "verify_input",
    "write_digest",
]

RowRead = Callable[[int, int], Any]  # rows [start, stop) of an array, as stored

DIGEST_FILE = ".tsconv-input.json"
DIGEST_VERSION = 1
_METADATA = ("zarr.json", ".zarray", ".zattrs")


def _array_digest(
    array: Any, read: RowRead | None = None, known: dict[str, Any] | None = None
) -> dict[str, Any] | str:
    """One array's digest, or why none can be taken. ``read``: where its rows are read (default zarr).
    ``known``: the same array's recorded digest, whose tail hash stands where its last band's files and
    the shape are unchanged (the band digests trust the files' stats alike; the rows are not read)."""
    from zarr.storage import LocalStore

    store_path = getattr(array, "store_path", None)
    meta = getattr(array, "metadata", None)
    if store_path is None or meta is None:
        return f"not a zarr array ({type(array).__name__})"
    if not isinstance(store_path.store, LocalStore):
        return f"{type(store_path.store).__name__} (not a local directory)"
    grid = meta.chunks if meta.zarr_format == 2 else getattr(meta.chunk_grid, "chunk_shape", None)
    if grid is None:
        return f"chunk grid {type(meta.chunk_grid).__name__}"
    root = Path(store_path.store.root)
    if store_path.path:
        root = root / store_path.path
    docs = hashlib.sha256()
    for name in _METADATA:
        try:
            docs.update(name.encode() + b"\0" + _without_shape((root / name).read_bytes()) + b"\0")
        except FileNotFoundError:
            pass
    shape = tuple(int(n) for n in array.shape)
    band_rows = int(grid[0])
    n_bands = math.ceil(shape[0] / band_rows)
    # The other dimensions' chunk indices: every chunk file of a band (one for a 1-D array).
    rest = [range(math.ceil(n / int(c))) for n, c in zip(shape[1:], grid[1:], strict=True)]
    others = [()]
    for r in rest:
        others = [(*o, i) for o in others for i in r]
    key, base = meta.encode_chunk_key, f"{root}{os.sep}"
    bands = []
    for b in range(n_bands):
        h = hashlib.blake2b(digest_size=8)
        for o in others:
            try:
                st = os.stat(base + key((b, *o)))  # str, not Path: pathlib took half the time
                h.update(b"%d:%d:%d;" % (st.st_size, st.st_mtime_ns, st.st_ino))
            except FileNotFoundError:
                h.update(b"-;")
        bands.append(h.hexdigest())
    out = {
        "path": store_path.path,
        "shape": list(shape),
        "band_rows": band_rows,
        "chunk_files_per_band": len(others),
        "metadata": docs.hexdigest(),
        "bands": bands,
    }
    if shape[0] % band_rows:
        start = (n_bands - 1) * band_rows
        old = (known or {}).get("tail")
        same = known is not None and all(
            known.get(k) == out[k] for k in ("shape", "band_rows", "bands", "metadata")
        )
        if same and old is not None and int(old["start"]) == start:
            out["tail"] = dict(old)
        else:
            out["tail"] = {
                "start": start,
                "hash": _rows_hash(array, start, shape[0], read),
                "algo": _TAIL_ALGO,
            }
    return out


# The tail's hash: SHA-256, which CPUs compute in hardware (12.8 MB in 7 ms on the 2-core VM against blake2b's 17 ms,
# the old tail of an update being a band of rows), cut to 16 bytes. A tail recorded without "algo" is blake2b's.
_TAIL_ALGO = "sha256"


def _rows_hash(array: Any, start: int, stop: int, read: RowRead | None = None, algo: str = _TAIL_ALGO) -> str:
    """A hash (``algo``: sha256 or blake2b) of the stored values of rows [start, stop) of ``array``, read
    through zarr or ``read`` (a reader of the same array: the same values, so the same bytes)."""
    import numpy as np

    rows = np.ascontiguousarray(array[start:stop] if read is None else read(start, stop))
    data = rows.reshape(-1).view(np.uint8).data  # their bytes: a datetime64 array exposes no buffer itself
    if algo == "blake2b":
        return hashlib.blake2b(data, digest_size=16).hexdigest()
    return hashlib.new(algo, data).hexdigest()[:32]


def _without_shape(doc: bytes) -> bytes:
    """A metadata document, canonical and without its ``shape``; other bytes as they are."""
    try:
        parsed = json.loads(doc)
    except ValueError:
        return doc
    if isinstance(parsed, dict):
        parsed.pop("shape", None)
    return json.dumps(parsed, sort_keys=True).encode()


def input_digest(
    store: Any, *, read_values: RowRead | None = None, known: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The digest of an input store (:class:`~tsconv.io.store.InputStore`): its ``values`` and ``time``
    arrays' metadata and chunk-file bands; ``{"skipped": why}`` where the files cannot be listed.
    ``read_values``: where the values' rows are read, if not through zarr (a run's reader, which then has
    the band decoded for the run). ``known``: a digest recorded earlier of the same input, whose tail
    hashes are kept for arrays whose files are unchanged (an input that did not grow is not read)."""
    arrays: dict[str, Any] = {}
    old = (known or {}).get("arrays") or {}
    for name, array in input_arrays(store).items():
        got = _array_digest(array, read_values if name == "values" else None, old.get(name))
        if isinstance(got, str):
            return {"version": DIGEST_VERSION, "skipped": f"{name}: {got}"}
        arrays[name] = got
    return {"version": DIGEST_VERSION, "input": str(store.path), "arrays": arrays}


def digest_note(digest: dict[str, Any]) -> str:
    """What the output's ``tsconv.input_digest`` attribute says about its digest."""
    if "skipped" in digest:
        return f"skipped: {digest['skipped']}"
    return f"values/{DIGEST_FILE}"


def changed_bands(
    recorded: dict[str, Any],
    current: dict[str, Any],
    *,
    arrays: dict[str, Any] | None = None,
    read_values: RowRead | None = None,
) -> dict[str, list[int] | None]:
    """Per array, the indices of the bands whose digest differs, over the bands both digests have (an
    input grown by appended rows: its old bands, the last partial one rewritten); None for an array whose
    metadata (but for its shape), band rows or presence differ (every band counts as changed).

    ``arrays`` (name -> the input's current array): a recorded partial last band whose files changed but
    whose recorded rows still hold the same bytes (rows appended after them) counts as unchanged; the values'
    rows are read through ``read_values`` where given."""
    out: dict[str, list[int] | None] = {}
    old, new = recorded.get("arrays", {}), current.get("arrays", {})
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a is None or b is None or a["metadata"] != b["metadata"] or a["band_rows"] != b["band_rows"]:
            out[name] = None
            continue
        bands = [i for i, (x, y) in enumerate(zip(a["bands"], b["bands"], strict=False)) if x != y]
        tail, rows = a.get("tail"), int(a["shape"][0])
        if bands and tail is not None and arrays is not None and name in arrays and b["shape"][0] >= rows:
            last = int(tail["start"]) // int(a["band_rows"])
            read = read_values if name == "values" else None
            algo = tail.get("algo", "blake2b")
            ours = algo in ("sha256", "blake2b")  # else not a digest tsconv wrote: the band counts as changed
            if (
                bands[-1] == last
                and ours
                and _rows_hash(arrays[name], int(tail["start"]), rows, read, algo) == tail["hash"]
            ):
                bands.pop()
        out[name] = bands
    return out


def first_change(
    recorded: dict[str, Any],
    current: dict[str, Any],
    *,
    before: int,
    arrays: dict[str, Any] | None = None,
    read_values: RowRead | None = None,
) -> str | None:
    """Where the input first changed among rows [0, ``before``): "rows A..B (values chunk files)", or
    None when those rows are unchanged. Digests taken without files (skipped) compare as unchanged.
    ``arrays``, ``read_values``: as for :func:`changed_bands`."""
    if "arrays" not in recorded or "arrays" not in current:
        return None
    first: tuple[int, int, str] | None = None
    changed = changed_bands(recorded, current, arrays=arrays, read_values=read_values)
    for name in sorted(changed, key=lambda n: (n != "values", n)):  # a tie names the values
        bands = changed[name]
        info = current["arrays"].get(name) or recorded["arrays"][name]
        rows, band_rows = int(info["shape"][0]), int(info["band_rows"])
        if bands is None:
            what = f"{name}: its metadata or chunking" if name in current["arrays"] else f"{name}: removed"
            found = (0, rows, what)
        else:
            hits = [i for i in bands if i * band_rows < before]
            if not hits:
                continue
            a = hits[0] * band_rows
            found = (a, min(a + band_rows, rows), f"{name} chunk files")
        if first is None or found[0] < first[0]:
            first = found
    if first is None:
        return None
    return f"rows {first[0]:,}..{first[1]:,} ({first[2]})"


def _digest_path(output: Path) -> Path:
    return Path(output) / "values" / DIGEST_FILE


def read_digest(output: Path | StoreURL) -> dict[str, Any] | None:
    """The digest recorded in an output store, or None (none recorded: an older output)."""
    try:
        if isinstance(output, StoreURL):
            raw = output.read_bytes(f"values/{DIGEST_FILE}")
            doc = json.loads(raw) if raw is not None else None
        else:
            doc = json.loads(_digest_path(output).read_text())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def write_digest(output: Path | StoreURL, digest: dict[str, Any]) -> None:
    """Record ``digest`` in the output store at ``output`` (atomically: a kill leaves the old one)."""
    if isinstance(output, StoreURL):  # one PUT: the old object or the new one
        output.write_bytes(f"values/{DIGEST_FILE}", json.dumps(digest, separators=(",", ":")).encode())
        return
    path = _digest_path(output)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")
    try:
        tmp.write_text(json.dumps(digest, separators=(",", ":")))
        os.replace(tmp, path)
    except OSError as exc:
        # a full disk stopped a --resume or --update here with a bare "[Errno 28] No space left on device",
        # leaving the temporary file
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        space = disk_advice(exc)
        raise StoreError(
            f"cannot record the input's digest in the output store {str(output)!r}: {first_line(exc)}",
            hint=f"{space}, then run the same command again.",
        ) from exc


def input_arrays(store: Any) -> dict[str, Any]:
    """The stored arrays a digest covers, by name (what :func:`changed_bands` re-reads tails from)."""
    time = store.time.array if isinstance(store.time, TimeColumn) else store.time
    return {k: v for k, v in (("values", store.values), ("time", time)) if v is not None}


def verify_input(
    output: Path | StoreURL,
    store: Any,
    *,
    before: int,
    verb: str = "resume",
    read_values: RowRead | None = None,
    note: str | None = None,
) -> dict[str, Any]:
    """Refuse to continue ``output`` when its input's rows [0, ``before``) (those it was already computed
    from) changed since it was started; returns the input's current digest. Rows appended to the input
    are not a change (a recorded partial band is re-read, :func:`changed_bands`). ``verb``: what is
    refused ("resume", "update"), for the message. ``read_values``: as for :func:`input_digest`.
    ``note``: the output's ``tsconv.input_digest`` attribute (:func:`digest_note`).

    Outputs with no digest recorded (older ones, or skipped) are not checked; one whose attribute names its
    digest file while the file is gone, unreadable or holds no chunk files' digest is refused (its rows could
    not be checked).
    """
    recorded = read_digest(output)
    what = "resume into" if verb == "resume" else verb
    unreadable = StoreError(
        f"cannot {what} {str(output)!r}: its input digest (values/{DIGEST_FILE}) is missing or unreadable, so "
        f"whether the input's first {before:,} rows (those the output holds) changed cannot be checked",
        hint="use --overwrite to compute the output again from the current input.",
    )
    # the attribute names a digest file: one that holds neither chunk files' digest nor why it was skipped
    # (emptied, another document) cannot vouch for the rows either
    kept = isinstance(recorded, dict) and (isinstance(recorded.get("arrays"), dict) or "skipped" in recorded)
    if before > 0 and note == f"values/{DIGEST_FILE}" and not kept:
        raise unreadable
    try:
        current = input_digest(store, read_values=read_values, known=recorded)
        if recorded is None or before <= 0:
            return current
        change = first_change(
            recorded, current, before=before, arrays=input_arrays(store), read_values=read_values
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a digest file of other shapes
        if isinstance(exc, TsconvError):
            raise
        raise unreadable from None
    if change is not None:
        what, since = ("resume into", "started") if verb == "resume" else (verb, "written")
        hint = "use --overwrite to compute the output again from the current input"
        if change.endswith("chunk files)"):
            # the band digests are the files' stats: a store written again whole with the same rows (a daily
            # xarray to_zarr(mode="w")) reads as changed, and "changed" alone left the user sure it had not
            hint += (
                "; chunk files written again count as a change even where they hold the same rows (tsconv "
                "compares their size, time and inode, not their values): to --update, grow the input in place "
                'instead (zarr: resize, then write the new rows; xarray: to_zarr(..., append_dim="time"); '
                "tsconv ingest --append)"
            )
        raise StoreError(
            f"cannot {what} {str(output)!r}: its input {str(store.path)!r} changed since the output was "
            f"{since}, first at {change}, and the output holds rows computed from the old data "
            f"(up to row {before:,})",
            hint=hint + ".",
        )
    return current
