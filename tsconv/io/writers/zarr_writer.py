"""The output store: created up front, written in whole chunks, marked complete only at the end.

Layout: a zarr (format 3) group with ``values`` [T, D] float32, ``time`` copied from the input when it
has one (int64 ns since the epoch, with the CF attributes that say so), ``feature`` (the output names, a
string array), and attributes ``features`` (the names again), ``pipeline`` (as run), ``source`` and
``tsconv`` (``complete``, ``rows_done``, ``fingerprint``, ``run_id``, ``input_digest``, ...); the input's
digest itself is ``values/.tsconv-input.json`` (:mod:`tsconv.io.digest`). The arrays carry the dimension
names (time, feature), so ``xarray.open_zarr`` reads the store as a Dataset with datetime64 ``time`` and a
``feature`` coordinate. A finished store also holds consolidated metadata (in its root ``zarr.json``),
written with the mark ``complete`` in one atomic write; a resumed store has it removed first
(:func:`drop_consolidated`), so nothing reads metadata a run could make stale. Every write covers whole chunks, and
``rows_done`` advances only over the prefix of chunks whose data is stored (each chunk file is written
atomically), so a run killed at any moment resumes from ``rows_done`` and rewrites anything after it. An
update (:func:`grow_output`) first marks the store incomplete with its new rows and the row it restarts
from, then extends the arrays; :meth:`OutputWriter.reopen` finishes an extension a kill cut short, and
:meth:`OutputWriter.keep` reads back the rows of the restart's chunk that the update does not compute again.

Ownership: the engine holds the output's lock (:mod:`tsconv.io.lock`) for the whole run and calls
:func:`prepare_output`, :func:`remove_leftovers` and :func:`discard_output` under it. A writer marks the
store complete only after :func:`check_owner` has read back from disk that the store still names its run
and is the directory it opened.

Writes run in a thread pool, several chunks at once: for the layout tsconv creates, each task encodes
its chunk with numcodecs' Blosc (which releases the GIL) and writes the chunk file itself
(:mod:`tsconv.io.writers.encode`, the same bytes zarr would write); other layouts are written by zarr from the
threads (disjoint chunks). Chunks may finish out of order; ``rows_done`` still only covers a contiguous
prefix, and the first failure surfaces at the next ``append`` or at ``finish``.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec

from tsconv import config, trace
from tsconv.errors import OutputExistsError, OutputLostError, StoreError, TsconvError, disk_advice, first_line
from tsconv.io.contracts import is_rows_of
from tsconv.io.digest import DIGEST_FILE, read_digest, write_digest
from tsconv.io.objstore import StoreURL, open_group, overlaps, remote_error
from tsconv.io.store import is_zarr_store, store_identity
from tsconv.io.tail import TAIL_FILE
from tsconv.io.timecoding import NS_SINCE_EPOCH
from tsconv.io.timecolumn import TimeReader
from tsconv.io.writers.encode import ChunkFileWriter, remove_partial_files
from tsconv.kernels.blosc_header import parse_header

__all__ = [
    "PinnedAttrs",
    "COMPRESSIONS",
    "CREATING_SUFFIX",
    "DISCARDED_SUFFIX",
    "FORMAT_VERSION",
    "OutputWriter",
    "auto_pending",
    "check_compression",
    "check_output_flags",
    "check_output_path",
    "check_owner",
    "check_kept_compression",
    "write_consolidated",
    "default_write_threads",
    "discard_output",
    "drop_consolidated",
    "finish_grow",
    "foreign_entries",
    "grow_output",
    "is_metadata_temporary",
    "output_chunk_rows",
    "output_meta",
    "prepare_output",
    "refuse_foreign",
    "remove_leftovers",
    "remove_temporaries",
    "rows_written",
]

FORMAT_VERSION = 1
# About 4 MB output chunks: Blosc-LZ4 encodes a 4 MB chunk in 2.5 ms against 14.5 ms for 16 MB (one thread, VM: the
# smaller stays in cache), zarr-python reads them back at 2.0 against 0.75 GB/s, and an update re-encodes the chunk
# holding the old end (benchmarks/NOTES.md, "The writer")
_TARGET_CHUNK_BYTES = 4 << 20


def default_write_threads() -> int:
    """The ``write_threads`` setting, else min(16, CPU count): Blosc-LZ4 encodes 0.5-0.65 GB/s a thread,
    and a bank pipeline writes five float32 features per input value (benchmarks/NOTES.md, "The writer")."""
    n = config.current().write_threads
    return n if n is not None else max(1, min(16, config.cpu_count()))


def output_chunk_rows(chunk: int, n_outputs: int) -> int:
    """Rows per output chunk: a multiple of the engine's chunk, about 4 MB."""
    per_chunk = chunk * n_outputs * 4
    return chunk * max(1, _TARGET_CHUNK_BYTES // max(per_chunk, 1))


COMPRESSIONS = ("auto", "lz4", "none")
# "auto": lz4 unless a sample of the first chunk with a value shows it saving less than this share of the bytes
AUTO_MIN_SAVING = 0.10
_AUTO_SAMPLE_BYTES = 1 << 20


def check_compression(compression: str) -> None:
    if compression not in COMPRESSIONS:
        raise TsconvError(
            f"unknown output compression {compression!r}", hint=f"use one of {', '.join(COMPRESSIONS)}."
        )


def _codec(clevel: int = 5) -> BloscCodec:
    """The output's codec: Blosc-LZ4 with byte shuffle; clevel 0 stores the bytes uncompressed (Blosc's framing
    only), which any Blosc reader decodes."""
    return BloscCodec(cname="lz4", clevel=clevel, shuffle="shuffle")


def check_output_flags(*, overwrite: object, resume: object, update: object = False) -> None:
    """``overwrite``, ``resume`` and ``update`` are booleans, at most one of them true."""
    for name, value in (("overwrite", overwrite), ("resume", resume), ("update", update)):
        if not isinstance(value, bool):
            raise TsconvError(
                f"{name} must be True or False, got {value!r}",
                hint="overwrite=True replaces the output; resume=True finishes an interrupted run; "
                "update=True extends it with rows appended to the input.",
            )
    given = [
        name for name, value in (("overwrite", overwrite), ("resume", resume), ("update", update)) if value
    ]
    if len(given) > 1:
        raise TsconvError(
            f"{'=True and '.join(given)}=True exclude each other",
            hint="resume finishes an interrupted run; update extends a finished one with new input rows; "
            "overwrite starts again from scratch.",
        )


def check_output_path(
    path: Path | StoreURL, *, input_path: Path | StoreURL, overwrite: bool, resume: bool
) -> None:
    """The refusals that need no lock, made before the lock file is written beside ``path`` (so a refused
    run writes nothing; :func:`prepare_output` makes them again holding the lock): an output that is,
    contains or lies inside the input, a path that is not a zarr store, an existing store without
    ``overwrite`` or ``resume``. ``path`` and ``input_path`` may be URLs (:mod:`tsconv.io.objstore`)."""
    out = path.resolve() if isinstance(path, Path) else path
    inp = input_path.resolve() if isinstance(input_path, Path) else input_path
    if overlaps(out, inp):
        raise StoreError(
            f"output {str(out)!r} would overlap the input store {str(inp)!r}",
            hint="choose an output path outside the input store; tsconv never writes into its input.",
        )
    if isinstance(out, StoreURL):
        there = _remote_store_kind(out)
        if there is None:
            return
        is_store = there != "objects"
    elif not out.exists():
        blocked = next((d for d in out.parents if d.exists() and not d.is_dir()), None)
        if blocked is not None:
            raise StoreError(
                f"output {str(out)!r} cannot be made: {str(blocked)!r} is a file, not a folder",
                hint="choose an --output in a folder.",
            )
        return
    else:
        is_store = is_zarr_store(out)
    if not is_store:
        raise StoreError(
            f"output path {str(out)!r} exists and is not a zarr store; refusing to replace it",
            hint="remove it yourself or choose another --output.",
        )
    if not overwrite and not resume:
        raise OutputExistsError(
            f"output store {str(out)!r} already exists",
            hint="pass --overwrite to replace it, --resume to finish an interrupted run, or --update to "
            "extend it with rows appended to the input.",
        )


def _remote_store_kind(url: StoreURL) -> str | None:
    """What is at an output URL: None (nothing), "store" (zarr metadata at its root) or "objects" (objects
    without it)."""
    try:
        keys = url.children()  # one listing request; each round trip costs milliseconds
    except Exception as exc:  # no credentials, an endpoint out of reach: one line, as for an input
        raise remote_error(exc, url, "write the output") from None
    if not keys:
        return None
    return "store" if {"zarr.json", ".zgroup", ".zarray"} & set(keys) else "objects"


CREATING_SUFFIX = ".tsconv-creating"  # a new store being built, renamed into place once laid out
DISCARDED_SUFFIX = ".tsconv-discarded"  # an old store being deleted by --overwrite


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(f".{path.name}{suffix}")


def remove_leftovers(path: Path) -> list[str]:
    """Delete what a killed run left beside the output ``path``: a store it was creating, or an old one it
    was deleting for ``--overwrite``. Call it holding the output's lock; returns the names removed. An
    output in an object store has none: it is built and deleted in place (:func:`discard_output`)."""
    if isinstance(path, StoreURL):
        return []
    done = []
    for suffix in (CREATING_SUFFIX, DISCARDED_SUFFIX):
        leftover = _sibling(path, suffix)
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover)
            done.append(leftover.name)
    return done


def discard_output(path: Path, *, background: bool = False) -> Callable[[], None]:
    """Delete the output store at ``path`` for ``--overwrite``: call it holding the output's lock, once
    :func:`prepare_output` has said "replace" (the store holds zarr data only). Returns a function that
    waits for the deletion; call it before the lock is released.

    It is renamed aside first, so ``path`` holds the old store or nothing, never a half-deleted store
    whose metadata still says complete; a kill during the deletion leaves the rest to
    :func:`remove_leftovers`. The new store is then built beside ``path`` and renamed in
    (:meth:`OutputWriter.create`). With ``background`` the renamed store's files are deleted in a thread
    while the run builds the new one: unlinking a 4 GB output took the H200 machine's main thread about
    0.25 s before its run could start (benchmarks/NOTES.md, section 16). A deletion that fails then warns
    rather than failing a finished run; the next run on the output deletes what is left.

    In an object store nothing can be renamed at once: the root document is first replaced (one PUT) by
    a placeholder group marked incomplete, then every other object is deleted, so at every instant the
    URL holds the old complete store or a store marked incomplete (refused as an input; ``--overwrite``
    replaces it, ``--resume`` refuses it).
    """
    if isinstance(path, StoreURL):
        _write_placeholder(path)
        fs, root = path.filesystem()
        others = [f"{root}/{k}" for k in path.objects() if k != "zarr.json"]
        if others:
            fs.rm(others)
        return _done
    aside = _sibling(path, DISCARDED_SUFFIX)
    if aside.exists():
        shutil.rmtree(aside)
    os.rename(path, aside)
    if not background:
        shutil.rmtree(aside)
        return _done
    failed: list[BaseException] = []

    def delete() -> None:
        try:
            shutil.rmtree(aside)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            failed.append(exc)

    thread = threading.Thread(target=delete, name="tsconv-discard", daemon=True)
    thread.start()

    def wait() -> None:
        thread.join()
        if not failed:
            return
        if not isinstance(failed[0], OSError):
            raise failed[0]
        warnings.warn(
            f"could not delete the replaced output, now at {aside} ({failed[0]}); the next run on "
            f"{path} deletes what is left",
            stacklevel=2,
        )

    return wait


def _done() -> None:
    """The wait of a deletion already finished."""


_METADATA_FILES = frozenset({"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"})
# A chunk key's parts (v3 default "c/0/1" or "c.0.1", v2 "0.1" or "0/1"); writers' temporary files end in
# ".partial" (zarr's LocalStore and tsconv's chunk writer).
_CHUNK_PART = re.compile(r"(c|\d+)(\.\d+)*(\.[^/]*\.partial)?")
# A metadata document's temporary file: tsconv's own (_set_meta: "zarr.json.<hex>.partial") and zarr's
# LocalStore, which names it with Path.with_suffix ("zarr.<hex>.partial": ".json" is replaced).
_PARTIAL_META = re.compile(r"zarr(\.json)?\.[0-9a-f]+\.partial")


def is_metadata_temporary(name: str) -> bool:
    """Whether the file name ``name`` is the temporary file of a ``zarr.json`` write (tsconv's or zarr's)
    that a killed process left before renaming it into place: nothing reads it, and it is safe to delete."""
    return _PARTIAL_META.fullmatch(name) is not None


def remove_temporaries(path: Path | StoreURL, group: zarr.Group, *, start: int) -> None:
    """Delete the temporary files a killed run left in the output ``path`` (open as ``group``): its metadata
    documents' and its arrays' chunk files from row ``start`` on. Only for a run holding the output's lock
    before any of its writers starts (a resume, an update): another writer's would be in use. An object store
    has none: each object is written in one PUT."""
    if isinstance(path, StoreURL):
        return
    for tmp in Path(path).glob("zarr.*.partial"):  # a progress update cut short (_set_meta, zarr)
        if is_metadata_temporary(tmp.name):
            tmp.unlink(missing_ok=True)
    for name in ("values", "time"):  # the arrays a writer writes chunk files of
        if (array := _member(group, name)) is not None:
            remove_partial_files(array, from_row=start)


def _write_placeholder(url: StoreURL) -> None:
    """A group root document marked incomplete, without a fingerprint: what an object-store output holds
    while it is cleared or laid out."""
    doc = {
        "attributes": {"tsconv": {"complete": False, "rows_done": 0}},
        "zarr_format": 3,
        "node_type": "group",
    }
    url.write_bytes("zarr.json", json.dumps(doc, indent=2).encode())


def _foreign_keys(keys: list[str], *, limit: int) -> list[str]:
    """The object keys of a store (relative to its root) that are not zarr data: :func:`foreign_entries`
    for an object store, where a node is a prefix holding a metadata document."""
    nodes = sorted(
        {k.rpartition("/")[0] for k in keys if k.rpartition("/")[2] in ("zarr.json", ".zarray", ".zgroup")}
    )
    found = []
    for key in keys:
        head, _, name = key.rpartition("/")
        if name in _METADATA_FILES or (head == "values" and _is_own_file(name)):
            continue
        node = max((n for n in nodes if n == "" or key.startswith(n + "/")), key=len, default=None)
        rest = key[len(node) + 1 :].split("/") if node else key.split("/")
        if node is None or not all(_CHUNK_PART.fullmatch(part) for part in rest):
            found.append(key)
            if len(found) >= limit:
                break
    return found


def _node_type(path: Path) -> str | None:
    """ "array", "group" or None (not a zarr node) for the directory ``path``."""
    if (path / ".zarray").is_file():
        return "array"
    if (path / ".zgroup").is_file():
        return "group"
    try:
        doc = json.loads((path / "zarr.json").read_text())
    except (OSError, ValueError):
        return None
    kind = doc.get("node_type") if isinstance(doc, dict) else None
    return kind if kind in ("array", "group") else None


def foreign_entries(root: Path, *, limit: int = 5) -> list[str]:
    """Paths in the zarr store ``root`` that are not zarr data (at most ``limit``, relative, directories
    ending in "/"): zarr metadata, chunk files under arrays, sub-nodes and tsconv's own files are data.

    ``--overwrite`` deletes a store only when this is empty: a file someone kept in a store is not
    tsconv's to delete.
    """
    found: list[str] = []
    nodes = [(root, _node_type(root))]
    while nodes and len(found) < limit:
        node, kind = nodes.pop()
        for entry in sorted(os.scandir(node), key=lambda e: e.name):
            name, rel = entry.name, os.path.relpath(entry.path, root)
            is_dir = entry.is_dir(follow_symlinks=False)
            if not is_dir and (name in _METADATA_FILES or _PARTIAL_META.fullmatch(name)):
                continue
            if is_dir and (sub := _node_type(Path(entry.path))) is not None:
                nodes.append((Path(entry.path), sub))
                continue
            if kind == "array" and _CHUNK_PART.fullmatch(name) and not entry.is_symlink():
                bad = _foreign_chunk_tree(Path(entry.path), root) if is_dir else []
                found.extend(bad[: limit - len(found)])
            elif kind == "array" and node == root / "values" and not is_dir and _is_own_file(name):
                continue
            else:
                found.append(rel + ("/" if is_dir else ""))
            if len(found) >= limit:
                break
    return found


def _is_own_file(name: str) -> bool:
    """tsconv's files in an output's ``values`` directory: the input digest and the input rows kept for the
    next update (:mod:`tsconv.io.tail`), and their temporary files."""
    return any(
        name == own or (name.startswith(f"{own}.") and name.endswith(".partial"))
        for own in (DIGEST_FILE, TAIL_FILE)
    )


def _foreign_chunk_tree(top: Path, root: Path) -> list[str]:
    """Entries under an array's chunk directory ``top`` that are not chunk files or chunk directories
    (the first directory holding any; DirEntry types come from the listing, no stat per file)."""
    stack = [str(top)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            bad = []
            for entry in entries:
                if entry.is_symlink() or not _CHUNK_PART.fullmatch(entry.name):
                    is_dir = entry.is_dir(follow_symlinks=False)
                    bad.append(os.path.relpath(entry.path, root) + ("/" if is_dir else ""))
                elif entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
        if bad:
            return sorted(bad)
    return []


def prepare_output(
    path: Path,
    *,
    input_path: Path,
    overwrite: bool,
    resume: bool,
    fingerprint: str,
    update: bool = False,
    legacy: Callable[[int | None], str] | None = None,
    run: Callable[[], dict[str, Any]] | None = None,
) -> tuple[str, int]:
    """Decide what to do with ``path``: returns (action, rows_done), action one of create, replace
    (``overwrite`` of an existing store: :func:`discard_output` it, then create), resume, done (a complete
    output, ``resume``) or update (a complete output, ``update``: the caller compares its rows with the
    input's). Call it holding the output's lock (:class:`tsconv.io.lock.OutputLock`).

    Refuses to touch the input, a path that is not a zarr store, a store holding files that are not
    zarr data, an existing output without ``overwrite``, ``resume`` or ``update``, and (``resume``,
    ``update``) an output whose ``tsconv.fingerprint`` is neither ``fingerprint`` nor one an output of the same
    computation was written with before: ``legacy(None)``, and ``legacy(rows)`` for the input rows it
    recorded (when fingerprints held the input's rows). ``run()``: this run's record as a new output's
    attributes hold it (``source``, ``pipeline``, ``tsconv.chunk`` and ``warmup``), for the refusal to name
    what differs (:func:`what_differs`).
    """
    keep = resume or update
    check_output_path(path, input_path=input_path, overwrite=overwrite, resume=keep)
    out = path.resolve() if isinstance(path, Path) else path
    if not (out.exists() if isinstance(out, Path) else _remote_store_kind(out) is not None):
        return "create", 0
    if keep:
        verb = "resume into" if resume else "update"
        # --output naming a store tsconv did not write (a typo, another input) is said to be one: it read as
        # "written by a different input, pipeline or chunk size" with the hint --overwrite, which deletes it
        not_ours = (
            "a zarr array, not a group" if isinstance(out, Path) and _node_type(out) == "array" else None
        )
        try:
            meta = output_meta(out) if not_ours is None else {}
        except Exception as exc:
            raise StoreError(f"cannot {verb} {str(out)!r}: {exc}") from None
        if not_ours is not None or not meta:
            raise StoreError(
                f"cannot {verb} {str(out)!r}: it is not an output of tsconv "
                f"({not_ours or 'its attributes hold no ' + repr('tsconv') + ' record'})",
                hint="check --output: it names a store tsconv did not write. To write the features to a new "
                "store, name another path (without --resume/--update).",
            )
        found = meta.get("fingerprint")
        if found != fingerprint and (
            legacy is None or found not in {legacy(n) for n in (None, *_recorded_rows(out, meta))}
        ):
            then = _attributes(out)
            changed = what_differs(then, run()) if run is not None else []
            hint = "use --overwrite to start again."
            settings = {"chunk": "chunk", "warm-up": "warmup"}
            said = [c.split(":", 1)[0] for c in changed]
            recorded = then.get("tsconv") or {}
            if said and all(k in settings and settings[k] in recorded for k in said):
                # only a setting left out or changed: the way on is to give it as the output was written, not
                # to compute everything again
                given = [(settings[k], recorded[settings[k]]) for k in said]
                flags = " ".join(f"--{k} {v}" for k, v in given)
                kwargs = ", ".join(f"{k}={v!r}" for k, v in given)
                hint = (
                    f"pass {flags} as the output was written ({kwargs} in Python) to continue it; or {hint}"
                )
            elif len(changed) == 1 and changed[0].startswith("the pipeline's name:"):
                name = json.dumps((then.get("pipeline") or {}).get("name"))
                hint = f"if it computes the same, set name = {name} in the pipeline to continue it; or {hint}"
            raise StoreError(
                f"cannot {verb} {str(out)!r}: it was written by a different input, pipeline or chunk size "
                "(or warm-up)" + (f"; what differs: {'; '.join(changed)}" if changed else ""),
                hint=hint,
            )
        rows = int(meta["rows"]) if meta.get("complete") else int(meta.get("rows_done", 0))
        if isinstance(out, Path) and (link := linked_entry(out, from_row=rows)) is not None:
            raise StoreError(
                f"cannot {verb} {str(out)!r}: {link} in it is a symbolic link (to "
                f"{os.readlink(out / link)!r}); a run would write its files wherever the link points",
                hint="delete the output and run again without --resume/--update, or replace the link by a copy "
                "of what it points to.",
            )
        if meta.get("complete"):
            return ("done" if resume else "update"), rows
        return "resume", rows
    refuse_foreign(out)
    return "replace", 0


# what follows from a pipeline's other entries (a z-score's window sets the halo, a bank's filters its shape):
# named only where nothing else differs, so a refusal names what the user changed
_DERIVED = {"halo", "shape", "groups", "weight_sha256", "bias_sha256", "tap_sums_sha256", "compute", "moments",
            "ema_alpha_1"}  # fmt: skip
_HASHES = {"weight_sha256": "weights (content)", "bias_sha256": "bias (content)",
           "tap_sums_sha256": "weights' tap sums (content)"}  # fmt: skip
_TABLES = {"preprocess": "[preprocess]", "stages": "[[conv]]", "head": "[head]"}
_INPUT = {"features": "the input's feature count", "names_sha256": "the input's feature names (content)",
          "dtype": "the input's dtype"}  # fmt: skip
# the recorded names are those the pipeline reads, after its [preprocess] selection: where the selection changed,
# they differ with it, and naming them would blame the input's names, which are as they were
_SELECTION = ("select", "select_regex")
# the name is recorded in the fingerprint: a pipeline file renamed or copied unchanged gets another
_NOTES = {("pipeline", "name"): ' (the file\'s name unless the pipeline sets name = "...")'}


def what_differs(then: dict[str, Any], now: dict[str, Any], *, limit: int = 6) -> list[str]:
    """What an output's recorded run (its attributes, ``then``) and this run (``now``, alike) differ in, each
    as "what: X then, Y now": the input (its path; its dtype, feature count and names where the record holds
    them), chunk, warm-up and the pipeline's entries; empty where the record does not tell (an older output)."""
    found: list[tuple[tuple[Any, ...], Any, Any]] = []
    if "source" in then:
        _differ(then["source"], now.get("source"), ("input",), found)
    t, n = then.get("tsconv") or {}, now.get("tsconv") or {}
    for key in ("chunk", "warmup"):
        if key in t:
            _differ(t[key], n.get(key), (key,), found)
    pipe: list[tuple[tuple[Any, ...], Any, Any]] = []
    if isinstance(then.get("pipeline"), dict) and isinstance(now.get("pipeline"), dict):
        old, new = then["pipeline"], now["pipeline"]
        for key in dict.fromkeys([*old, *new]):
            if key not in ("origin", "text"):  # where it came from, not what it computes
                _differ(old.get(key), new.get(key), ("pipeline", key), pipe)
    reselected = _selection(then.get("pipeline")) != _selection(now.get("pipeline"))
    ti, ni = t.get("input"), n.get("input")
    if isinstance(ti, dict) and isinstance(ni, dict):
        for key, label in _INPUT.items():
            if not (reselected and key == "names_sha256"):
                _differ(ti.get(key), ni.get(key), (label,), found)
    given = [d for d in pipe if d[0][-1] not in _DERIVED]
    # another input's features change what follows from them (a bank's shape): named only without one
    found += given or ([] if any(d[0][0] in _INPUT.values() for d in found) else pipe)
    items = [
        f"{_label(path)}: {_shown(a)} then, {_shown(b)} now{_NOTES.get(path, '')}" for path, a, b in found
    ]
    return items if len(items) <= limit else [*items[:limit], f"and {len(items) - limit} more"]


def _selection(pipeline: Any) -> tuple[Any, ...]:
    """A recorded pipeline's ``[preprocess]`` selection (``select``, ``select_regex``; None where unset)."""
    pre = pipeline.get("preprocess") if isinstance(pipeline, dict) else None
    return tuple(pre.get(key) if isinstance(pre, dict) else None for key in _SELECTION)


def _differ(a: Any, b: Any, path: tuple[Any, ...], out: list[tuple[tuple[Any, ...], Any, Any]]) -> None:
    """Append (path, a, b) for each entry where ``a`` and ``b`` differ: tables and lists of tables entry by
    entry, anything else whole."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in dict.fromkeys([*a, *b]):
            _differ(a.get(key), b.get(key), (*path, key), out)
    elif isinstance(a, list) and isinstance(b, list) and all(isinstance(x, dict) for x in a + b) and a and b:
        for i in range(max(len(a), len(b))):
            _differ(a[i] if i < len(a) else None, b[i] if i < len(b) else None, (*path, i), out)
    elif a != b:
        out.append((path, a, b))


def _label(path: tuple[Any, ...]) -> str:
    if path[0] != "pipeline":
        return {"warmup": "warm-up"}.get(path[0], path[0])
    words = [_TABLES.get(path[1], path[1])]
    for key in path[2:]:
        words.append(f"stage {key + 1}" if isinstance(key, int) else _HASHES.get(key, key))
    return "the pipeline's " + " ".join(words)


def _shown(v: Any, *, width: int = 80) -> str:
    if v is None:
        return "none"
    if isinstance(v, dict):
        v = {k: x for k, x in v.items() if x is not None}
    if isinstance(v, str) and len(v) == 64 and re.fullmatch(r"[0-9a-f]+", v):
        return repr(v[:12] + "…")
    if isinstance(v, str):
        # a path or a name, shown whole: two inputs' paths differ at their end, which a cut would drop
        return repr(v)
    text = json.dumps(v)
    return text if len(text) <= width else text[: width - 1] + "…"


def _attributes(path: Path | StoreURL) -> dict[str, Any]:
    """The attributes of the output store at ``path`` (its record of the run that wrote it); {} where they
    cannot be read."""
    try:
        doc = _read_doc(path, "zarr.json")
        if isinstance(doc, dict) and doc.get("node_type") == "group":
            return dict(doc.get("attributes") or {})
        return dict(open_group(path, mode="r").attrs)
    except Exception:  # noqa: BLE001 - a refusal's detail: without it the refusal says less
        return {}


def linked_entry(root: Path, *, from_row: int) -> str | None:
    """The first symbolic link (its path relative to ``root``) among the entries of the output store ``root``
    that a resume or an update from row ``from_row`` writes through: the store's own entries, its arrays',
    their chunk directories' and the chunk directories of the rows from ``from_row`` on; else None. A chunk
    file renamed onto a link replaces it, but a linked directory takes the files written in it (an input's
    chunk directory linked into the output would get the output's chunks). Rows before ``from_row`` are not
    listed: what a resume or an update costs does not grow with the history."""
    nodes = [root]
    for entry in os.scandir(root):
        if entry.is_symlink():
            return entry.name
        if entry.is_dir() and _node_type(Path(entry.path)) == "array":
            nodes.append(Path(entry.path))
    for node in nodes[1:]:
        tops = [node, node / "c"] if (node / "c").is_dir() and not (node / "c").is_symlink() else [node]
        try:
            doc = json.loads((node / "zarr.json").read_text())
            first = from_row // int(doc["chunk_grid"]["configuration"]["chunk_shape"][0])
        except (OSError, ValueError, KeyError, TypeError, IndexError, ZeroDivisionError):
            first = 0
        for top in tops:
            for entry in os.scandir(top):
                if entry.is_symlink():
                    return os.path.relpath(entry.path, root)
                if (
                    top.name == "c"
                    and entry.is_dir()
                    and (not entry.name.isdigit() or int(entry.name) >= first)
                ):
                    tops.append(Path(entry.path))
    return None


def refuse_foreign(path: Path | StoreURL, *, what: str = "overwrite") -> None:
    """Refuse to delete the store at ``path`` (to ``what`` it) when it holds files that are not zarr data."""
    foreign = foreign_entries(path) if isinstance(path, Path) else _foreign_keys(path.objects(), limit=5)
    if foreign:
        raise StoreError(
            f"refusing to {what} {str(path)!r}: it holds files that are not zarr data ({', '.join(foreign)})",
            hint="move them out of the store, or remove the store yourself.",
        )


def _recorded_rows(out: Path | StoreURL, meta: dict[str, Any]) -> set[int]:
    """The input row counts an output may have been fingerprinted with: its rows, and its digest's."""
    found = {int(meta.get("rows", 0))}
    digest = read_digest(out) or {}
    shape = digest.get("arrays", {}).get("values", {}).get("shape")
    if shape:
        found.add(int(shape[0]))
    return found


def grow_output(path: Path | StoreURL, *, rows: int, start: int, changes: dict[str, Any]) -> None:
    """Extend the output at ``path`` to ``rows`` rows, to be written again from row ``start`` on (an update).

    Crash-safe in two steps: first one atomic write of the group's document marks it incomplete with
    ``rows`` (the target), ``rows_done`` = ``start`` and ``changes`` (a change to None drops the key), and
    drops its consolidated metadata; then each array's shape is extended (:func:`_resize_arrays`). A kill
    between them leaves an output that reads as incomplete and whose arrays :meth:`OutputWriter.reopen`
    extends, so the next ``--resume`` or ``--update`` finishes it."""
    doc = _read_doc(path, "zarr.json") or {}
    doc.pop("consolidated_metadata", None)
    meta = {**doc.get("attributes", {}).get("tsconv", {}), **changes}
    meta.update(complete=False, rows=rows, rows_done=start)
    doc.setdefault("attributes", {})["tsconv"] = {k: v for k, v in meta.items() if v is not None}
    _write_doc(path, "zarr.json", doc)
    _resize_arrays(path, rows)


def finish_grow(path: Path | StoreURL) -> None:
    """Give the output's arrays the rows its group document targets: the second step of :func:`grow_output`,
    which an update killed between its two steps left undone. Every run that continues an output (a resume,
    an update; one process or dask's client) calls it before writing rows."""
    target = (_read_doc(path, "zarr.json") or {}).get("attributes", {}).get("tsconv", {}).get("rows")
    if target is not None:
        _resize_arrays(path, int(target))


def _resize_arrays(path: Path | StoreURL, rows: int) -> None:
    """Give the output's ``values`` and ``time`` arrays ``rows`` rows (their documents' shapes; rows past
    the old end read as the fill value until written). Nothing to do when they have them already."""
    for name in ("values", "time"):
        doc = _read_doc(path, f"{name}/zarr.json")
        if doc is not None and int(doc["shape"][0]) != rows:
            doc["shape"][0] = rows
            _write_doc(path, f"{name}/zarr.json", doc)


def output_meta(path: Path | StoreURL) -> dict[str, Any]:
    """The ``tsconv`` attributes of the output store at ``path``: from its root document where it is a
    format-3 group (a JSON read; zarr's open took 1-3 ms, several times an update), else through zarr."""
    doc = _read_doc(path, "zarr.json")
    if isinstance(doc, dict) and doc.get("node_type") == "group":
        meta = (doc.get("attributes") or {}).get("tsconv") or {}
    else:
        meta = open_group(path, mode="r").attrs.get("tsconv", {})
    return _checked_meta(meta, path)


def _checked_meta(meta: Any, path: Path | StoreURL) -> dict[str, Any]:
    """``meta`` where the attributes runs read have their types (counts, row ranges); else a StoreError: an
    output whose bookkeeping was edited or damaged is not continued on guesses."""

    def count(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    def span(v: Any) -> bool:
        return isinstance(v, list) and len(v) == 2 and all(count(x) for x in v) and v[0] <= v[1]

    bad = None
    if not isinstance(meta, dict):
        bad = f"tsconv={meta!r}"
    else:
        for key, ok in (
            ("rows", count),
            ("rows_done", count),
            ("complete", lambda v: isinstance(v, bool)),
            ("input_rows", lambda v: v is None or span(v)),
            ("partitions_done", lambda v: v is None or (isinstance(v, list) and all(span(x) for x in v))),
        ):
            if key in meta and not ok(meta[key]):
                bad = f"tsconv.{key}={meta[key]!r}"
                break
        if bad is None and count(meta.get("rows")) and int(meta.get("rows_done", 0)) > meta["rows"]:
            bad = f"tsconv.rows_done={meta['rows_done']!r} beyond its {meta['rows']:,} rows"
    if bad is not None:
        raise StoreError(
            f"{str(path)!r}: its tsconv attributes are damaged ({bad[:200]})",
            hint="use --overwrite to compute the output again.",
        )
    return dict(meta)


def rows_written(path: Path | StoreURL) -> int:
    """The end of the furthest rows an output store holds: ``rows`` when complete, else the furthest of
    ``tsconv.rows_done`` and the dask run's ``partitions_done``."""
    meta = output_meta(path)
    if meta.get("complete"):
        return int(meta["rows"])
    stops = [int(p[1]) for p in meta.get("partitions_done", []) or []]
    return max([int(meta.get("rows_done", 0)), *stops])


def check_owner(
    path: Path | StoreURL,
    *,
    run_id: str | None,
    identity: tuple[int, int] | None,
    group: zarr.Group | None = None,
    rows: tuple[int, int] | None = None,
) -> None:
    """Refuse to go on when the output store at ``path`` is no longer the one this run created or resumed:
    its ``tsconv.run_id``, read from disk, is another run's, or its root is another directory (``identity``,
    from :func:`store_identity`). ``group``: read the attributes through zarr (stores that are not local
    format-3 directories). ``rows``: the caller is a dask task writing these rows (an OutputLostError)."""
    if run_id is None:
        return
    try:
        if group is None:
            doc = _read_doc(path, "zarr.json") or {}
            found = doc.get("attributes", {}).get("tsconv", {}).get("run_id")
        else:
            fresh = zarr.open_group(store=group.store, path=group.path, mode="r")
            found = dict(fresh.attrs.get("tsconv", {})).get("run_id")
    except (OSError, ValueError, AttributeError, KeyError):
        found = None
    moved = identity is not None and store_identity(path) != identity
    if found != run_id or moved:
        why = (
            "another directory is at that path now" if moved else f"its metadata names run {str(found)[:12]}"
        )
        if rows is not None:
            raise OutputLostError(
                f"the output store {str(path)!r} was replaced while this run (run {run_id[:12]}) was writing it: "
                f"{why}; this task (rows {rows[0]:,}..{rows[1]:,}) stores no more chunks in it",
                hint="the run was stopped or lost its output to another run (--overwrite, --resume), whose "
                "output stands; rerun this one if it is still wanted.",
            )
        raise StoreError(
            f"the output store {str(path)!r} was replaced while this run (run {run_id[:12]}) was writing it: "
            f"{why}; not marking it complete",
            hint="another writer replaced it; check which run's output you want, then rerun with --overwrite.",
        )


def _check_doc_owner(root: StoreURL, doc: dict[str, Any], *, run_id: str | None) -> None:
    """Raise OutputLostError when the root document ``doc`` just read from ``root`` names another run than
    ``run_id``."""
    found = doc.get("attributes", {}).get("tsconv", {}).get("run_id")
    if run_id is not None and found != run_id:
        raise OutputLostError(
            f"the output store {root.url!r} names run {str(found)[:12]} now, not this run ({run_id[:12]}): another "
            "run took it over while this one was writing it (this run stalled longer than TSCONV_LOCK_TTL?); this "
            "run wrote nothing more to it, and the other run's output stands",
            hint="check that output, and rerun this one (with --overwrite) if it is still wanted; for runs that "
            "may pause, raise TSCONV_LOCK_TTL.",
        )


def _read_doc(root: Path | StoreURL, key: str) -> dict[str, Any] | None:
    """The JSON document ``key`` below a local store's directory or an object store's URL (None: absent)."""
    if isinstance(root, StoreURL):
        raw = root.read_bytes(key)
        return None if raw is None else json.loads(raw)
    try:
        return json.loads((root / key).read_text())
    except FileNotFoundError:
        return None


def _write_doc(root: Path | StoreURL, key: str, doc: dict[str, Any], *, indent: int | None = 2) -> None:
    """Replace the JSON document ``key`` whole: a local file atomically (:func:`_replace_json`), an object
    in one PUT (readers see the old object or the new one)."""
    if isinstance(root, StoreURL):
        root.write_bytes(key, json.dumps(doc, indent=indent).encode())
    else:
        _replace_json(root / key, doc, indent=indent)


def _member(group: zarr.Group, name: str) -> zarr.Array | None:
    """The group's array ``name``, or None: one lookup, where listing the members (``array_keys``) read
    every member's document (2 ms of a 0.1 s update)."""
    try:
        return group[name]
    except KeyError:
        return None


def _local_group_json(group: zarr.Group) -> Path | None:
    """The zarr.json holding a local format-3 group's attributes, or None (other stores: through zarr)."""
    from zarr.storage import LocalStore

    store = getattr(group, "store", None)
    if not isinstance(store, LocalStore) or group.metadata.zarr_format != 3:
        return None
    path = Path(store.root) / group.path / "zarr.json" if group.path else Path(store.root) / "zarr.json"
    return path if path.is_file() else None


class PinnedAttrs:
    """The ``tsconv`` attributes of a store's root group, read and replaced relative to its directory as opened
    here (local format-3 stores where the system has ``dir_fd``; elsewhere through zarr): a record written
    after a check of the store's owner, while another run renamed its own store in over the path, goes to the
    directory this run opened, never into the other store."""

    def __init__(self, group: zarr.Group) -> None:
        self.group = group
        self._fd: int | None = None
        doc = _local_group_json(group)
        if doc is not None and not group.path and os.replace in os.supports_dir_fd:
            self._fd = os.open(doc.parent, os.O_RDONLY | os.O_DIRECTORY)
            weakref.finalize(self, os.close, self._fd)

    def get(self) -> dict[str, Any]:
        """The ``tsconv`` attributes, as stored now."""
        if self._fd is None:
            return dict(self.group.attrs.get("tsconv", {}))
        return dict(self._doc().get("attributes", {}).get("tsconv", {}))

    def set(self, meta: dict[str, Any]) -> None:
        """Replace the ``tsconv`` attributes, atomically."""
        if self._fd is None:
            self.group.attrs["tsconv"] = meta
            return
        doc = self._doc()
        doc.setdefault("attributes", {})["tsconv"] = meta
        tmp = f"zarr.json.{uuid.uuid4().hex}.partial"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666, dir_fd=self._fd), "w") as f:
            f.write(json.dumps(doc, indent=2))
        os.replace(tmp, "zarr.json", src_dir_fd=self._fd, dst_dir_fd=self._fd)

    def _doc(self) -> dict[str, Any]:
        with open(os.open("zarr.json", os.O_RDONLY, dir_fd=self._fd)) as f:
            return json.load(f)


def _replace_json(path: Path, doc: dict[str, Any], *, indent: int | None = 2) -> None:
    """Write a zarr.json atomically: a kill leaves the old file (and a ``.partial`` that reopening removes).
    ``indent=None`` for frequent updates: only then does ``json`` encode in C, not in Python."""
    tmp = path.with_name(f"zarr.json.{uuid.uuid4().hex}.partial")
    tmp.write_text(json.dumps(doc, indent=indent))
    os.replace(tmp, path)


def _array_doc(
    shape: list[int],
    chunks: list[int],
    dtype: str,
    fill: Any,
    codec: BloscCodec | None,
    dims: list[str],
    attributes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A zarr format-3 array's zarr.json as zarr 3.1 writes it for ``create_array(..., compressors=[codec],
    dimension_names=dims, attributes=attributes)``; ``codec`` None: the "string" array's, without a
    compressor."""
    if codec is None:
        codecs: list[dict[str, Any]] = [{"name": "vlen-utf8", "configuration": {}}]
    else:
        blosc = {"typesize": np.dtype(dtype).itemsize, "cname": codec.cname.value, "clevel": int(codec.clevel),
                 "shuffle": codec.shuffle.value, "blocksize": int(codec.blocksize)}  # fmt: skip
        codecs = [
            {"name": "bytes", "configuration": {"endian": "little"}},
            {"name": "blosc", "configuration": blosc},
        ]
    return {
        "shape": shape,
        "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill,
        "codecs": codecs,
        "attributes": dict(attributes or {}),
        "dimension_names": dims,
        "zarr_format": 3,
        "node_type": "array",
        "storage_transformers": [],
    }


def _write_layout(
    root: Path | StoreURL,
    *,
    rows: int,
    names: tuple[str, ...],
    chunk_rows: int,
    clevel: int,
    time: bool,
    attrs: dict[str, Any],
) -> None:
    """The empty output store's metadata and its ``feature`` array, written as files. Why not zarr's
    ``create_array``: through its event loop the documents took 19-24 ms on the H200 host, about a tenth
    of the e2e job, against about 1 ms here (benchmarks/NOTES.md, "The writer"). tests/test_writer.py
    checks the documents and the feature chunk equal zarr's own for the same calls.

    At a URL the same objects are written in place, the group's root document last: until then the
    root holds the placeholder of :func:`_write_placeholder`, marked incomplete."""
    n = len(names)
    docs = {
        "values/zarr.json": _array_doc(
            [rows, n], [chunk_rows, n], "float32", "NaN", _codec(clevel), ["time", "feature"]
        ),
        "feature/zarr.json": _array_doc([n], [n], "string", "", None, ["feature"]),
    }
    if time:
        docs["time/zarr.json"] = _array_doc(
            [rows], [chunk_rows], "int64", 0, _codec(), ["time"], NS_SINCE_EPOCH
        )
    docs["zarr.json"] = {"attributes": attrs, "zarr_format": 3, "node_type": "group"}
    names_chunk = numcodecs.VLenUTF8().encode(np.array(names, dtype=object))
    if isinstance(root, StoreURL):
        _write_placeholder(root)
        root.write_bytes("feature/c/0", names_chunk)
        for key, doc in docs.items():
            root.write_bytes(key, json.dumps(doc, indent=2).encode())
        return
    root.mkdir(parents=True)
    for key, doc in docs.items():
        (root / key).parent.mkdir(exist_ok=True)
        (root / key).write_text(json.dumps(doc, indent=2))
    (root / "feature" / "c").mkdir()
    (root / "feature" / "c" / "0").write_bytes(names_chunk)


def _prepare_error(path: Path | StoreURL, what: str, exc: OSError, *, then: str) -> StoreError:
    """A write failed before any row was stored (a full disk, most often), with the store and what to do."""
    where = path.url if isinstance(path, StoreURL) else str(path)
    space = disk_advice(exc)
    return StoreError(f"cannot {what} {where!r}: {first_line(exc)}", hint=f"{space}, then {then}.")


def _consolidated_doc(root: Path | StoreURL) -> dict[str, Any]:
    """The ``consolidated_metadata`` entry zarr.consolidate_metadata writes into a local format-3 group's
    zarr.json, built from its arrays' zarr.json files as they are on disk (tsconv's layout: no sub-groups).

    Built here rather than by zarr.consolidate_metadata so that it lands in the same atomic write of the root
    document as ``complete: true``: zarr's call rewrites that document by itself, and a kill between the
    two would leave a complete store without it. tests/io/test_output_xarray.py keeps the two equal."""
    found = {}
    if isinstance(root, StoreURL):
        for key in root.objects():
            name, _, rest = key.partition("/")
            if rest == "zarr.json":
                doc = _read_doc(root, key) or {}
                if doc.get("node_type") != "array":
                    msg = f"internal error: {name!r} in {str(root)!r} is not an array"
                    raise RuntimeError(msg)
                found[name] = doc
        return {"kind": "inline", "must_understand": False, "metadata": found}
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        doc_path = Path(entry.path) / "zarr.json"
        if entry.is_dir(follow_symlinks=False) and doc_path.is_file():
            doc = json.loads(doc_path.read_text())
            if doc.get("node_type") != "array":
                msg = f"internal error: {entry.name!r} in {str(root)!r} is not an array"
                raise RuntimeError(msg)
            found[entry.name] = doc
    return {"kind": "inline", "must_understand": False, "metadata": found}


_CONSOLIDATING = threading.Lock()


def write_consolidated(store: Any, *, path: str | None = None, zarr_format: int = 3) -> None:
    """Write consolidated metadata through zarr into ``store`` (a local path, or a zarr store with the group's
    ``path`` in it): a dask run's end, an ingest's append, a format 2 output's marks."""
    # zarr warns that consolidated metadata is not part of the format 3 specification (xarray reads it). That
    # one message is silenced, not every UserWarning: catch_warnings swaps the process's filters, so another
    # thread's warnings (a TsconvWarning among them) went unseen meanwhile, and two such blocks interleaved
    # left the silencing filter in place for good. One block at a time, so tsconv's own never interleave.
    with _CONSOLIDATING, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        zarr.consolidate_metadata(str(store) if isinstance(store, Path) else store, path=path,
                                  zarr_format=zarr_format)  # fmt: skip


def drop_consolidated(path: Path | StoreURL) -> None:
    """Remove the consolidated metadata of the output store at ``path`` (a resumed run: its arrays
    and attributes are then read from their own documents, and readers see no copy that could go stale)."""
    try:
        doc = _read_doc(path, "zarr.json")
    except (OSError, ValueError):
        return
    if isinstance(doc, dict) and doc.pop("consolidated_metadata", None) is not None:
        _write_doc(path, "zarr.json", doc)


def stored_compression(path: Path | StoreURL) -> str:
    """The codec of the output at ``path``'s values: "lz4", "none", or what else its codecs are.

    Read from the values' document where it names a Blosc codec (a JSON read: zarr's open of the group took
    1-3 ms on the VM, and an update asks three times); through zarr otherwise."""
    try:
        doc = _read_doc(path, "values/zarr.json")
    except (OSError, ValueError):
        doc = None
    if isinstance(doc, dict) and doc.get("node_type") == "array" and isinstance(doc.get("codecs"), list):
        blosc = [c for c in doc["codecs"] if isinstance(c, dict) and c.get("name") == "blosc"]
        conf = blosc[0].get("configuration") if blosc else None
        if (
            isinstance(conf, dict)
            and isinstance(conf.get("clevel"), int)
            and isinstance(conf.get("cname"), str)
        ):
            return "none" if conf["clevel"] == 0 else conf["cname"]
    group = open_group(path, mode="r", use_consolidated=False)
    try:
        values = group["values"]
    except KeyError:
        raise StoreError(
            f"the output {str(path)!r} has no 'values' array: it cannot be continued",
            hint="use --overwrite to compute it again.",
        ) from None
    return _compression_of(values)


def auto_pending(path: Path | StoreURL) -> bool:
    """Whether the local output at ``path`` was created with compression "auto" (its ``tsconv.compression``)
    and has chosen no codec yet: Blosc-LZ4 still in its metadata and no values chunk stored (every chunk so far
    was all NaN, which is not stored; a choice of none rewrites the metadata, one of lz4 stores the chunk it
    sampled). A run that continues it chooses at its first chunk with a value, as one run would have."""
    if isinstance(path, StoreURL):
        return False
    meta = output_meta(path)
    if meta.get("compression") != "auto" or stored_compression(path) != "lz4":
        return False
    try:
        with os.scandir(Path(path) / "values" / "c") as chunks:
            return next(chunks, None) is None
    except FileNotFoundError:
        return True


def check_kept_compression(path: Path | StoreURL, asked: str | None, *, verb: str) -> str:
    """The codec the output at ``path`` was written with, which a run that continues it (``verb``: "update",
    "resume") keeps; refuses a ``compression`` asked that is another."""
    kept = stored_compression(path)
    if asked is not None and asked != "auto" and kept != asked:
        raise TsconvError(
            f"--compression {asked}: the output {str(path)!r} is stored with {kept}, which {'an' if verb[0] in 'aeiou' else 'a'} {verb} keeps",
            hint="drop --compression, or use --overwrite to write the output again with another codec.",
        )
    return kept


def _compression_of(array: zarr.Array) -> str:
    """ "lz4" or "none" (clevel 0) for tsconv's Blosc-LZ4 outputs; else the codecs' names."""
    codecs = tuple(array.metadata.codecs) if array.metadata.zarr_format == 3 else ()
    blosc = [c for c in codecs if isinstance(c, BloscCodec)]
    if blosc:
        return "none" if int(blosc[0].clevel) == 0 else str(blosc[0].cname.value)
    return ", ".join(type(c).__name__ for c in codecs) or "zarr format 2"


def _where(group: zarr.Group) -> str:
    root = getattr(group.store, "root", None)
    return f"the output store {str(root)!r}" if root is not None else f"the output store {group.store_path}"


@dataclass(frozen=True)
class _Frame:
    """One chunk the engine encoded: its Blosc frame, and whether the chunk is all fill value."""

    data: np.ndarray
    empty: bool


class _Borrow:
    """The readers of a block lent to :meth:`OutputWriter.append`: the caller while it appends, and each
    chunk write reading it. ``release`` runs once, when the last of them is done."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release, self._users, self._lock = release, 1, threading.Lock()

    def take(self) -> None:
        with self._lock:
            self._users += 1

    def drop(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self._release()


class OutputWriter:
    """Buffers rows into whole output chunks; a thread pool encodes and stores them, several at once.

    ``threads``: write threads (default min(16, CPU count)); 0 or 1 writes each chunk in the caller's
    thread as it fills. ``buffers``: chunk buffers (default threads + 1, one being filled), which bounds
    memory: ``append`` blocks while all are in flight. ``fast=False`` always writes through zarr.

    Attributes: ``rows_done`` (rows stored: a contiguous prefix, which ``tsconv.rows_done`` records, one write
    behind at most while chunks are stored, unless recording it failed, which fails the writer),
    ``fast`` and ``fallback_reason`` (whether chunk files are written directly, and why not),
    ``busy_seconds`` (encode + write + record, summed over threads) and ``wait_seconds`` (time
    ``append`` and ``finish`` spent blocked on free buffers or completions). ``close()`` (also leaving a
    ``with`` block) stops the threads without marking the store complete.
    """

    def __init__(
        self,
        group: zarr.Group,
        *,
        time_source: Any | None,
        start: int,
        stop: int | None = None,
        record: bool = True,
        threads: int | None = None,
        buffers: int | None = None,
        fast: bool = True,
        location: StoreURL | None = None,
    ) -> None:
        """Write rows [start, stop) (default: to the end). ``record``: advance ``tsconv.rows_done`` and mark
        the store complete; a region writer (one of several dask tasks) leaves the attributes alone.
        ``location``: the URL of a ``group`` in an object store, whose root document is then written
        whole, as a local store's is."""
        self.group = group
        self.values = group["values"]
        self.time_out = _member(group, "time")
        self.time_source = time_source
        self.rows = int(self.values.shape[0])
        self.chunk_rows = int(self.values.chunks[0])
        if start % self.chunk_rows and start != self.rows:
            msg = f"resume point {start} is not on a chunk boundary of {self.chunk_rows} rows"
            raise StoreError(msg)
        self.stop = self.rows if stop is None else stop
        if self.stop % self.chunk_rows and self.stop != self.rows:
            msg = f"region end {self.stop} is not on a chunk boundary of {self.chunk_rows} rows"
            raise StoreError(msg)
        self.record = record
        # called once every row is written, before the store is marked complete (an error leaves it incomplete):
        # the run's check that its input did not change meanwhile
        self.before_complete: Callable[[], None] | None = None
        # called before every chunk and metadata write: raises OutputLostError once the run's lock on an object
        # store's output is another run's (tsconv.io.lock.ObjectLock.check)
        self.check_lock: Callable[[], None] | None = None
        self.where = f"the output store {location.url!r}" if location is not None else _where(group)
        self.threads = default_write_threads() if threads is None else max(0, int(threads))
        self._sync = self.threads <= 1
        self._max_buffers = (
            1 if self._sync else max(1, int(buffers) if buffers is not None else self.threads + 1)
        )
        self._chunks: ChunkFileWriter | None = None
        self.fallback_reason: str | None = "fast=False"
        if fast:
            self._chunks, self.fallback_reason = ChunkFileWriter.for_array(self.values)
            if self._chunks is not None and self._chunks.dtype != np.float32:
                self._chunks, self.fallback_reason = None, f"dtype {self._chunks.dtype} (buffers are float32)"
        self.fast = self._chunks is not None
        self._auto_pending = False  # create(compression="auto"): the codec is chosen at the first chunk
        self._auto_lock = threading.Lock()
        self.compression = _compression_of(self.values)
        # A task's time rows cover whole time chunks when they are chunked like the values; otherwise two
        # tasks could read-modify-write one time chunk at once, so those writes take turns.
        aligned = self.time_out is None or int(self.time_out.chunks[0]) == self.chunk_rows
        self._time_lock = None if aligned else threading.Lock()
        # The time rows are read from the input's chunk files and written as chunk files (GIL-free) where
        # the layouts allow: zarr's Python in these threads slows the engine thread (timecolumn.py).
        self._time_in = (
            TimeReader(time_source) if self.time_out is not None and time_source is not None else None
        )
        self._time_chunks: ChunkFileWriter | None = None
        if fast and aligned and self.time_out is not None:
            self._time_chunks, _ = ChunkFileWriter.for_array(self.time_out)
        self.rows_done = start
        self._recorded = start  # rows_done as the attributes hold it
        self._recording = False  # a writer thread is writing rows_done to the attributes
        self._meta: dict[str, Any] | None = None  # the tsconv attributes as last written
        local_json = _local_group_json(group)
        # Where the group's root document is written whole (a local directory, or a URL), else None: through zarr.
        self._doc_root: Path | StoreURL | None = local_json.parent if local_json is not None else location
        # Whose store this is, checked against the disk before marking it complete (check_owner).
        self.run_id: str | None = (group.attrs.get("tsconv") or {}).get("run_id") if record else None
        self._identity = store_identity(self._doc_root) if self._doc_root is not None else None
        self._group_doc: dict[str, Any] | None = None  # its contents, as last written by _set_meta
        self.busy_seconds = 0.0
        self.wait_seconds = 0.0
        self._next = start  # first row of the buffer being filled
        self._buf: np.ndarray | None = None
        self._fill = 0
        self._free: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        self._allocated = 0
        self._lock = threading.Lock()  # rows_done, _stored, _error, busy_seconds, _recording
        self._stored: dict[int, int] = {}  # chunks stored beyond the prefix: start row -> stop row
        self._error: StoreError | None = None
        self._inflight: list[Future[None]] = []
        self._pool: ThreadPoolExecutor | None = None
        self._finalizer: weakref.finalize | None = None
        self._closed = False

    @classmethod
    def create(
        cls,
        path: Path | StoreURL,
        *,
        rows: int,
        names: tuple[str, ...],
        chunk_rows: int,
        time_source: Any | None,
        attrs: dict[str, Any],
        threads: int | None = None,
        buffers: int | None = None,
        fast: bool = True,
        compression: str = "auto",
        input_digest: dict[str, Any] | None = None,
    ) -> OutputWriter:
        """A writer of a new output store at ``path``. ``compression`` (the values' codec): ``lz4`` (Blosc-LZ4,
        byte shuffle), ``none`` (Blosc without compression) or ``auto`` (lz4, switched to none before the
        first chunk is stored when lz4 saves less than AUTO_MIN_SAVING of a sample of it: float features
        often do not compress, and encoding them cost the writer threads more CPU than the rest of the
        run; benchmarks/NOTES.md, "The writer"). The time column is always lz4. ``input_digest``
        (:func:`tsconv.io.digest.input_digest`) is recorded in the new store."""
        check_compression(compression)
        if isinstance(path, StoreURL):  # laid out in place, the root document last (_write_layout)
            _write_layout(path, rows=rows, names=names, chunk_rows=min(chunk_rows, rows), time=time_source is not None,
                          clevel=0 if compression == "none" else 5, attrs={**attrs, "features": list(names)})  # fmt: skip
            if input_digest is not None:
                write_digest(path, input_digest)
            group = open_group(path, mode="r+", use_consolidated=False)
            return cls(
                group, time_source=time_source, start=0, threads=threads, buffers=buffers, location=path
            )
        # Build the empty store beside its final place and rename it in: a kill during creation then
        # leaves no half-made store at ``path`` that a later --resume would have to refuse.
        tmp = _sibling(path, CREATING_SUFFIX)
        try:
            if tmp.exists():
                shutil.rmtree(tmp)
            _write_layout(
                tmp,
                rows=rows,
                names=names,
                chunk_rows=min(chunk_rows, rows),
                clevel=0 if compression == "none" else 5,
                time=time_source is not None,
                attrs={**attrs, "features": list(names)},
            )
            if input_digest is not None:
                write_digest(tmp, input_digest)
            os.rename(tmp, path)
        except BaseException as exc:
            # A full disk here (its first file's close) stopped the run with a bare "[Errno 28] No space left
            # on device" naming no file, and left the half-made store beside the output until the next run.
            shutil.rmtree(tmp, ignore_errors=True)
            failed = exc.__cause__ if isinstance(exc, StoreError) else exc  # write_digest's names the tmp
            if not isinstance(failed, OSError):
                raise
            raise _prepare_error(
                path, "create the output store", failed, then="rerun the command (no store was made)"
            ) from exc
        writer = cls(
            zarr.open_group(str(path), mode="r+"),
            time_source=time_source,
            start=0,
            threads=threads,
            buffers=buffers,
            fast=fast,
        )
        writer._auto_pending = compression == "auto" and writer.fast
        return writer

    @classmethod
    def reopen(
        cls,
        path: Path | StoreURL,
        *,
        time_source: Any | None,
        start: int,
        threads: int | None = None,
        buffers: int | None = None,
        fast: bool = True,
        run_id: str | None = None,
    ) -> OutputWriter:
        """A writer resuming at ``start``; temporary chunk files a killed run left behind are removed.
        ``run_id``: recorded as the store's ``tsconv.run_id`` (this run owns it now). An object store has
        no temporary objects: each is written in one PUT."""
        remote = isinstance(path, StoreURL)
        try:
            drop_consolidated(path)
            finish_grow(path)
            group = open_group(path, mode="r+", use_consolidated=False)
            remove_temporaries(path, group, start=start)
            writer = cls(group, time_source=time_source, start=start, threads=threads, buffers=buffers,
                         fast=fast, location=path if remote else None)  # fmt: skip
            writer._auto_pending = not remote and writer.fast and auto_pending(path)
            if run_id is not None:
                writer._set_meta(run_id=run_id)
                writer.run_id = run_id
        except OSError as exc:
            # as in create: a full disk or a read-only store was a bare errno (or a temporary file's name)
            raise _prepare_error(
                path,
                "continue the output store",
                exc,
                then="run the same command again (the rows stored are kept)",
            ) from exc
        return writer

    @classmethod
    def region(
        cls,
        path: Path,
        *,
        time_source: Any | None,
        start: int,
        stop: int,
        threads: int | None = None,
        buffers: int | None = None,
        fast: bool = True,
        run_id: str | None = None,
        identity: tuple[int, int] | None = None,
    ) -> OutputWriter:
        """A writer of the chunk-aligned rows [start, stop) only, which never touches the attributes.

        ``run_id``, ``identity``: the run's and its store's (:func:`store_identity` on the client): every chunk
        is stored only while the store at ``path`` is still that run's, else an :class:`OutputLostError`
        (a task of a stopped client's run goes on running, and must not write into a store that replaced it).
        """
        writer = cls(
            zarr.open_group(str(path), mode="r+"),
            time_source=time_source,
            start=start,
            stop=stop,
            record=False,
            threads=threads,
            buffers=buffers,
            fast=fast,
        )
        if run_id is not None:
            writer._pin(path, run_id=run_id, identity=identity)
        return writer

    def _pin(self, path: Path, *, run_id: str, identity: tuple[int, int] | None) -> None:
        """A region writer's check of the store's owner, at once and before each chunk is stored."""
        pinned = os.rename in os.supports_dir_fd
        root_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY) if pinned else None
        try:
            here = os.fstat(root_fd) if root_fd is not None else os.stat(path)
            local, rows = (here.st_dev, here.st_ino), (self.rows_done, self.stop)
            # Device numbers of one shared file system differ between hosts (NFS), inode numbers do not: the
            # client's identity is compared by its inode, the checks that follow by this host's.
            first = local if identity is None else (here.st_dev, identity[1])
            check_owner(path, run_id=run_id, identity=first, rows=rows)

            def guard() -> None:
                check_owner(path, run_id=run_id, identity=local, rows=rows)

            if self._chunks is None or (self.time_out is not None and self._time_chunks is None):
                self.check_lock = guard  # before each chunk, for the arrays zarr writes (one check a chunk)
            for files in (self._chunks, self._time_chunks):
                if files is not None:
                    # Without directory descriptors (Windows), a store renamed in between the check and a
                    # chunk's rename gets that chunk: one a writer thread at most.
                    sub = os.path.relpath(files.root, path)
                    fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY, dir_fd=root_fd) if pinned else None
                    files.pin(guard, dir_fd=fd)
        finally:
            if root_fd is not None:
                os.close(root_fd)

    # -- the caller's side ------------------------------------------------------------------------

    def reserve(self, n: int) -> np.ndarray | None:
        """The next rows of the chunk being filled, up to ``n`` (to its end), for an engine to compute into:
        appending them then copies nothing (a copy of every output byte was a tenth of a CPU run's time)."""
        self._check_open()
        self._raise_if_failed()
        if self._buf is None:
            self._buf = self._take_buffer()
        k = min(n, self.chunk_rows - self._fill, self.stop - self._next - self._fill)
        return self._buf[self._fill : self._fill + k] if k > 0 else None

    def keep(self, n: int) -> None:
        """The next ``n`` rows, all within the chunk being filled, are the store's own as it holds them: read
        back into that chunk, which is stored again with the rows appended after them (an update computes
        from the engine chunk holding the old end, not from the start of its output chunk)."""
        self._check_open()
        if n <= 0:
            return
        if self._fill or self._next % self.chunk_rows or n > min(self.chunk_rows, self.stop - self._next):
            msg = (
                f"internal error: keeping {n} rows at row {self._next + self._fill:,} is not within one chunk"
            )
            raise RuntimeError(msg)
        self._buf = self._take_buffer() if self._buf is None else self._buf
        if self._chunks is not None:
            band = self._next // self.chunk_rows
            try:
                self._chunks.read(band, self._buf)
            except Exception as exc:  # a damaged or cut-short chunk file: its rows would be kept wrong
                raise StoreError(
                    f"cannot read rows {self._next:,}..{self._next + n:,} of {self.where} back (chunk file "
                    f"{self._chunks.path(band)}): {type(exc).__name__}: {exc}",
                    hint="the output is damaged; compute it again with --overwrite instead of --update/--resume.",
                ) from None
        else:
            self._buf[:n] = self.values[self._next : self._next + n]
        self._fill = n

    def append(self, block: np.ndarray, *, release: Callable[[], None] | None = None) -> None:
        """Add the next rows, in order; full chunks go to the writer threads.

        Without ``release`` the rows are copied before it returns. With it, ``block`` (C-contiguous) is
        borrowed: the full chunks that lie within it are stored straight from it by the writer threads,
        without a copy (a serial copy of every output byte would bound wide outputs), and
        ``release()`` is called exactly once, by whichever thread reads it last, also when a write fails
        or the writer is closed first.

        Raises the first failed write (a :class:`StoreError` naming its rows) of any earlier chunk.
        """
        borrow = _Borrow(release) if release is not None else None
        try:
            self._check_open()
            self._raise_if_failed()
            n, i = block.shape[0], 0
            if self._next + self._fill + n > self.stop:
                msg = f"internal error: {n} more rows after row {self._next + self._fill:,} overrun the end {self.stop:,}"
                raise RuntimeError(msg)
            while i < n:
                mine = self._buf is not None and is_rows_of(block, self._buf, self._fill)
                if borrow is not None and self._fill == 0 and n - i >= self.chunk_rows and not mine:
                    a = self._next
                    self._next += self.chunk_rows
                    borrow.take()
                    self._dispatch(a, self._next, block[i : i + self.chunk_rows], borrow)
                    i += self.chunk_rows
                    continue
                if self._buf is None:
                    self._buf = self._take_buffer()
                take = min(n - i, self.chunk_rows - self._fill)
                if not (mine and take == n):  # else computed in place, where reserve() put it
                    self._buf[self._fill : self._fill + take] = block[i : i + take]
                self._fill += take
                i += take
                if self._fill == self.chunk_rows or self._next + self._fill == self.stop:
                    self._submit()
        finally:
            if borrow is not None:
                borrow.drop()

    def frame_rows(self) -> int | None:
        """Rows per chunk when this writer also stores chunks the engine encoded itself as Blosc-LZ4 frames
        (:meth:`append_frames`): chunk files written directly, the values' codec LZ4 (or ``auto`` not yet
        decided), float32 with a NaN fill value (each frame's chunk padded with NaN). Else None."""
        if self._chunks is None or self.values.ndim != 2 or not np.isnan(self._chunks.fill):
            return None
        c = self._chunks.codec
        lz4 = c.cname == "lz4" and c.clevel > 0 and c.shuffle == numcodecs.Blosc.SHUFFLE
        return self.chunk_rows if lz4 or self._auto_pending else None

    def decide_compression(self, sample: np.ndarray | None) -> bool | None:
        """Settle ``compression="auto"`` from ``sample`` (rows of the first chunk, as the writer threads
        would sample them) before any chunk is stored: True when the values are LZ4, so frames from
        :meth:`append_frames` may be stored; False when they are not; None while still to be decided (the
        sample, or no sample, held no value: the next chunk with one decides, here or in a writer thread)."""
        with self._auto_lock:
            if self._auto_pending:
                if sample is None or not self._choose_compression(sample):
                    return None
                self._auto_pending = False
        return self.frame_rows() is not None

    def append_frames(
        self, frames: np.ndarray, *, rows: int, empty: np.ndarray, release: Callable[[], None]
    ) -> None:
        """Add the next ``rows`` rows, already encoded: ``frames[c]`` (uint8) holds chunk c's Blosc frame
        (its length in its header), ``empty[c]`` whether that chunk is all NaN. Every chunk is whole but the
        store's last; nothing may be buffered from :meth:`append`. ``frames`` is lent as ``append``'s block
        is, ``release()`` called once every chunk in it is stored (also on failure)."""
        borrow = _Borrow(release)
        try:
            self._check_open()
            self._raise_if_failed()
            if self._fill or self._auto_pending:
                raise RuntimeError(
                    "internal error: frames appended after buffered rows or before the codec is settled"
                )
            k = -(-rows // self.chunk_rows)
            if (
                k > frames.shape[0]
                or self._next + rows > self.stop
                or (rows % self.chunk_rows and self._next + rows != self.stop)
            ):
                msg = f"internal error: {rows} rows in {frames.shape[0]} frames after row {self._next:,} (end {self.stop:,})"
                raise RuntimeError(msg)
            for c in range(k):
                a = self._next
                self._next = min(a + self.chunk_rows, self.stop)
                size = parse_header(frames[c]).cbytes
                borrow.take()
                self._dispatch(a, self._next, _Frame(frames[c, :size], bool(empty[c])), borrow)
        finally:
            borrow.drop()

    def finish(self) -> None:
        """Wait for every write, then mark the store complete (a region writer: just wait).

        Raises the first failed write as a :class:`StoreError`; the store then stays incomplete.
        """
        self._check_open()
        try:
            self._raise_if_failed()
            if self._next + self._fill != self.stop:
                msg = f"internal error: finished with {self._next + self._fill} of {self.stop} rows appended"
                raise RuntimeError(msg)
            if self._fill:
                self._submit()
            self._drain()
            self._raise_if_failed()
            if self.rows_done != self.stop:
                msg = f"internal error: finished with {self.rows_done} of {self.stop} rows written"
                raise RuntimeError(msg)
            if self.record:
                if self.before_complete is not None:
                    self.before_complete()
                with self._lock:  # no thread records rows_done now: _drain() waited for every _store
                    check_owner(self._root(), run_id=self.run_id, identity=self._identity,
                                group=None if self._doc_root is not None else self.group)  # fmt: skip
                    self._set_meta(complete=True, rows_done=self.rows, partitions_done=None, consolidate=True)
        finally:
            self.close()

    def close(self) -> None:
        """Stop: drop queued chunk writes, wait for running ones, free the threads. Never marks complete."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            if self._finalizer is not None:
                self._finalizer.detach()
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _root(self) -> Path | StoreURL:
        if self._doc_root is not None:
            return self._doc_root
        root = getattr(self.group.store, "root", None)
        return Path(root) / self.group.path if root is not None else Path(str(self.group.store_path))

    def __enter__(self) -> OutputWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            msg = "the OutputWriter is closed (finished, or stopped after an error)"
            raise ValueError(msg)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _take_buffer(self) -> np.ndarray:
        """A free chunk buffer: a returned one, a new one while under the limit, else wait for one."""
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        if self._allocated < self._max_buffers:
            self._allocated += 1
            return np.empty((self.chunk_rows, self.values.shape[1]), dtype=np.float32)
        t0 = time.perf_counter()
        buf = self._free.get()
        self.wait_seconds += time.perf_counter() - t0
        if self._error is not None:  # surface a failure as soon as it is seen
            self._free.put(buf)
            raise self._error
        return buf

    def _submit(self) -> None:
        """Hand the filled buffer to a writer thread (or write it here when synchronous)."""
        a, b, buf = self._next, self._next + self._fill, self._buf
        assert buf is not None
        self._buf, self._fill, self._next = None, 0, b
        self._dispatch(a, b, buf, None)

    def _dispatch(self, a: int, b: int, buf: np.ndarray, borrow: _Borrow | None) -> None:
        """Store rows [a, b) from ``buf`` (one of ours, or a borrowed full chunk) in a writer thread."""
        if self._auto_pending and self._chunks is not None:
            # compression="auto" is settled here, in row order: in the writer threads the chunk stored first
            # decided, and a run's short last chunk (a few rows LZ4 cannot shrink) stored before the first
            # made the output uncompressed by the threads' timing
            with self._auto_lock:
                if self._auto_pending and self._choose_compression(buf[: b - a]):
                    self._auto_pending = False
        if self._sync:
            self._store(a, b, buf, borrow)
            self._raise_if_failed()
            return
        if self._pool is None:
            from tsconv.io.readers.threads import lower_thread_priority

            self._pool = ThreadPoolExecutor(
                max_workers=self.threads, thread_name_prefix="tsconv-write", initializer=lower_thread_priority
            )
            # Threads die with the writer if the caller neither finishes nor closes it.
            self._finalizer = weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
        self._inflight = [f for f in self._inflight if not f.done()]
        # the run's last chunk with writer threads idle (an update's only chunk): its encode split over them
        parts = (
            max(1, self.threads - len(self._inflight))
            if b == self.stop and isinstance(buf, np.ndarray)
            else 1
        )
        try:
            future = self._pool.submit(self._store, a, b, buf, borrow, parts)
        except BaseException:
            if borrow is not None:
                borrow.drop()
            raise
        if borrow is not None:  # a write dropped by close() never runs: its reference goes with it
            future.add_done_callback(lambda f: borrow.drop() if f.cancelled() else None)
        self._inflight.append(future)

    def _drain(self) -> None:
        if self._inflight:
            t0 = time.perf_counter()
            wait_futures(self._inflight)
            self.wait_seconds += time.perf_counter() - t0
            self._inflight = []

    # -- the writer threads' side -----------------------------------------------------------------

    def _store(self, a: int, b: int, buf: np.ndarray, borrow: _Borrow | None = None, parts: int = 1) -> None:
        """Store rows [a, b) from ``buf`` (encoded by up to ``parts`` threads), then advance ``rows_done`` over
        the stored prefix. Never raises: a failure is kept for the caller's next ``append`` or ``finish``."""
        t0 = time.perf_counter()
        failure: BaseException | None = None
        try:
            if self.check_lock is not None:
                self.check_lock()
            self._write(a, b, buf, parts)
        except Exception as exc:
            failure = exc
        finally:  # the data is in the file (or lost): the buffer may be refilled
            if borrow is None:
                self._free.put(buf)
            else:
                borrow.drop()
        t_written = time.perf_counter()
        recorder = False
        with self._lock:
            if failure is None:
                recorder = self._advance(a, b)
            else:
                self._fail(f"cannot write rows {a:,}..{b:,} of {self.where}", failure)
        if recorder:
            self._record()
        t1 = time.perf_counter()
        with self._lock:
            self.busy_seconds += t1 - t0
        if trace.on:
            trace.add("write", t0, t1, a)
            trace.add("write_record", t_written, t1, a)  # the lock's wait and rows_done's record

    def _fail(self, what: str, failure: BaseException) -> None:
        """Keep the first failure, ``what`` failing (under ``_lock``)."""
        if self._error is None and isinstance(failure, OutputLostError):
            self._error = failure  # its own message: no write failed, the output is another run's
        elif self._error is None:
            self._error = StoreError(
                f"{what}: {type(failure).__name__}: {failure}",
                hint="check free space and permissions; rows before tsconv.rows_done are stored, "
                "and --resume continues from there.",
            )
            self._error.__cause__ = failure

    def _record(self) -> None:
        """Write ``rows_done`` to the attributes until they hold the latest prefix. One thread at a time
        records, outside the lock: the threads whose chunks advance the prefix meanwhile go on storing (with
        one write per chunk under the lock, 16 writer threads waited there for 5-14 thread-seconds of a
        1-second run; benchmarks/NOTES.md, "The writer")."""
        handed = False  # the role given up under the lock, in the section that saw nothing left to record
        try:
            while True:
                with self._lock:
                    target = self.rows_done
                    if target == self._recorded:
                        self._recording, handed = False, True
                        return
                try:
                    self._set_meta(rows_done=target)
                except Exception as exc:
                    with self._lock:
                        self._recording, handed = False, True
                        self._fail(
                            f"cannot record the rows stored in {self.where} (tsconv.rows_done = {target:,})",
                            exc,
                        )
                    return
                self._recorded = target  # only the recording thread writes it
        finally:
            if not handed:  # interrupted (Ctrl-C where the caller's thread stores): another thread may record
                with self._lock:
                    self._recording = False

    def _write(self, a: int, b: int, buf: np.ndarray | _Frame, parts: int = 1) -> None:
        n = b - a
        if isinstance(buf, _Frame):
            assert self._chunks is not None
            self._chunks.write_frame(a // self.chunk_rows, buf.data, empty=buf.empty)
        elif self._chunks is not None:
            if self._auto_pending:
                with self._auto_lock:  # the other writer threads wait for the choice (~1 ms)
                    if self._auto_pending and self._choose_compression(buf[:n]):
                        self._auto_pending = False
                # else all NaN: the chunk is left out (the fill value), and a later one decides
            if n < self.chunk_rows:  # never a borrowed block: those are full chunks
                buf[n:] = self._chunks.fill  # zarr pads the edge chunk with the fill value
            self._chunks.write(a // self.chunk_rows, buf, parts=parts)
        else:
            self.values[a:b] = buf[:n]
        if self.time_out is not None:
            assert self._time_in is not None
            t_time = time.perf_counter()
            t = self._time_in.read(a, b)
            if self._time_chunks is not None:
                if n < self.chunk_rows:  # the edge chunk, padded as zarr pads it
                    t = np.concatenate([t, np.full(self.chunk_rows - n, self._time_chunks.fill, np.int64)])
                self._time_chunks.write(a // self.chunk_rows, t)
            elif self._time_lock is None:
                self.time_out[a:b] = t
            else:
                with self._time_lock:
                    self.time_out[a:b] = t
            if trace.on:
                trace.add("write_time", t_time, time.perf_counter(), a)

    def _choose_compression(self, rows: np.ndarray) -> bool:
        """compression="auto": keep lz4 if it saves at least AUTO_MIN_SAVING of a sample of ``rows`` (about
        1 MiB from the middle of those from their first row with a value on: past a warm-up's NaN rows and
        symbols not trading yet), else store the values uncompressed from now on (the array's codec
        rewritten to clevel 0, so its metadata says how the chunks are stored). False, deciding nothing,
        when every value is NaN: such a chunk is not stored, and a sample of it would say "saved 100%"."""
        assert self._chunks is not None
        valued = np.flatnonzero(~np.isnan(rows).all(axis=tuple(range(1, rows.ndim))))
        if valued.size == 0:
            return False
        rows = rows[valued[0] :]
        take = max(1, _AUTO_SAMPLE_BYTES // max(rows[:1].nbytes, 1))
        lo = max(0, min(rows.shape[0] - take, rows.shape[0] // 2))
        sample = np.ascontiguousarray(rows[lo : lo + take])
        saving = 1.0 - len(self._chunks.codec.encode(sample)) / max(sample.nbytes, 1)
        if saving >= AUTO_MIN_SAVING:
            self.compression = f"lz4 (auto: it saved {saving:.0%} of a sample)"
            return True
        path = self._chunks.root / "zarr.json"
        doc = json.loads(path.read_text())
        for codec in doc["codecs"]:
            if codec.get("name") == "blosc":
                codec["configuration"]["clevel"] = 0
        _replace_json(path, doc)
        self.values = self.group["values"]
        self._chunks = ChunkFileWriter(self.values)
        self.compression = f"none (auto: lz4 saved {saving:.0%} of a sample)"
        return True

    def _advance(self, a: int, b: int) -> bool:
        """Rows [a, b) are stored: extend the contiguous prefix (under ``_lock``). True when the caller is to
        record it (:meth:`_record`): no other thread is recording."""
        self._stored[a] = b
        prefix = self.rows_done
        while prefix in self._stored:
            prefix = self._stored.pop(prefix)
        if prefix == self.rows_done:
            return False  # an earlier chunk is still in flight (or failed): rows_done must not pass it
        self.rows_done = prefix
        if not self.record or self._recording:
            return False
        self._recording = True
        return True

    def _set_meta(self, *, consolidate: bool = False, **changes: Any) -> None:
        """Update the ``tsconv`` attributes (a change to None drops the key); ``consolidate``: also write the
        store's consolidated metadata, in the same write for a local store."""
        if self.check_lock is not None:
            self.check_lock()
        meta = dict(self._meta if self._meta is not None else self.group.attrs.get("tsconv", {}))
        meta.update(changes)
        meta = {k: v for k, v in meta.items() if v is not None or k not in changes}
        if self._doc_root is not None:
            # The group's zarr.json rewritten here (atomically), not through zarr: zarr's attribute update
            # runs Python on its event loop that slows the engine thread (timecolumn.py says how much), and
            # the final one took 2-3 ms of the run's tail; in an object store this also puts the complete
            # mark and the consolidated metadata in one PUT. The document is read once: nothing else writes
            # this store's attributes while it runs. Progress is written compact (json's C encoder).
            if isinstance(self._doc_root, StoreURL):
                # read again before each write: a copy kept from before would put this run's id back over
                # that of a run that took the output over while this one stalled (its lock lost), and
                # check_owner would then pass
                self._group_doc = _read_doc(self._doc_root, "zarr.json") or {}
                _check_doc_owner(self._doc_root, self._group_doc, run_id=self.run_id)
            elif self._group_doc is None:
                self._group_doc = _read_doc(self._doc_root, "zarr.json") or {}
            self._group_doc.setdefault("attributes", {})["tsconv"] = meta
            if consolidate:
                self._group_doc["consolidated_metadata"] = _consolidated_doc(self._doc_root)
            done = meta.get("complete", False)
            _write_doc(self._doc_root, "zarr.json", self._group_doc, indent=2 if done else None)
        else:
            self.group.attrs["tsconv"] = meta
            if consolidate:
                write_consolidated(
                    self.group.store, path=self.group.path, zarr_format=self.group.metadata.zarr_format
                )
        self._meta = meta
