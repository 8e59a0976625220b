"""The store convention: open and validate an input zarr store (format 2 or 3), read-only.

An input is either a group holding ``values`` [T, F] (time-major), ``time`` [T] int64 nanoseconds
strictly increasing and the attribute ``features`` (F names), or a bare 2-D array [T, F] whose
features are named f0, f1, ... and which has no time.

Groups written by xarray (``Dataset.to_zarr``) are read too: the values are ``values`` or the one 2-D
data variable along the time dimension, the feature names the coordinate of its second dimension, and
the time ``time`` or the coordinate of its first dimension, decoded from CF units
(:mod:`tsconv.io.timecoding`). Dimension names come from zarr 3's ``dimension_names`` or xarray's
``_ARRAY_DIMENSIONS`` attribute in format 2.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import os
import re
import shlex
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from tsconv.errors import StoreError, TsconvWarning
from tsconv.io.codecs import codec_words
from tsconv.io.names import control_name, describe_repeats, repeated_names
from tsconv.io.objstore import StoreURL, hierarchy_root, location, open_zarr, remote_error
from tsconv.io.readers.chunkfile import shard_index
from tsconv.io.timecoding import iso_utc, looks_early
from tsconv.io.timecolumn import TimeColumn, TimeReader

__all__ = [
    "InputStore",
    "group_attrs",
    "open_input",
    "is_zarr_store",
    "check_time",
    "interrupted_append",
    "AbsentChunks",
    "absent_chunks",
    "absent_time_chunks",
    "warn_absent_chunks",
    "unitless_early_time",
    "warn_unitless_early_time",
    "store_identity",
]

_ZARR_MARKERS = ("zarr.json", ".zgroup", ".zarray")
_NAT = int(np.iinfo(np.int64).min)


def is_zarr_store(path: Path) -> bool:
    """True when ``path`` is a directory with zarr metadata at its root."""
    return path.is_dir() and any((path / m).is_file() for m in _ZARR_MARKERS)


@dataclass(frozen=True)
class InputStore:
    """A validated input store, opened read-only; ``path`` is a local path or a URL (:mod:`tsconv.io.objstore`)."""

    path: Path | StoreURL
    values: zarr.Array
    time: TimeColumn | None  # int64 ns since the epoch (UTC), decoded from the stored array on each read
    features: tuple[str, ...]
    # (st_dev, st_ino) of the local store's directory as opened: tells the store apart from another renamed
    # onto its path since (``tsconv ingest --overwrite``); None at a URL
    identity: tuple[int, int] | None = None

    @property
    def remote(self) -> bool:
        """Whether the store is in an object store (read through zarr, not from local chunk files)."""
        return isinstance(self.path, StoreURL)

    @functools.cached_property
    def root(self) -> Path | StoreURL:
        """The outermost zarr hierarchy holding the store: its path, or a group above it (``-i ticks.zarr/px``
        names an array inside ``ticks.zarr``, whose files tsconv must not write among either). Found once: at a
        URL each level up costs requests."""
        return hierarchy_root(self.path)

    @property
    def rows(self) -> int:
        return int(self.values.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.values.shape[1])

    def check_unreplaced(self) -> None:
        """Raise :class:`~tsconv.errors.StoreError` when another store took this one's path since it was
        opened: its features, rows and chunks were read from this one, while its files (a digest, the rows)
        would be read from the other."""
        if self.identity is not None and store_identity(self.path) != self.identity:
            raise StoreError(
                f"the input {str(self.path)!r} was replaced by another store after this run opened it (written "
                "again meanwhile, e.g. by `tsconv ingest --overwrite`): its features and rows were read from the "
                "store that was there; nothing was computed",
                hint="run again once the input is settled.",
            )

    @property
    def chunk_rows(self) -> int:
        return int(self.values.chunks[0])

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.values.dtype)

    def describe(self) -> dict[str, Any]:
        """Shape, dtype, chunks and codecs (in words), for ``tsconv inspect`` and reports."""
        v = self.values
        fmt = v.metadata.zarr_format
        if fmt == 3:
            chain = (*v.filters, v.serializer, *v.compressors)
        else:
            chain = (*(v.filters or ()), *v.compressors)
        size = np.dtype(v.dtype).itemsize
        codecs = [w for w in (codec_words(c, itemsize=size) for c in chain if c is not None) if w is not None]
        return {
            "path": str(self.path),
            "zarr_format": fmt,
            "layout": "group" if self.time is not None or self.values.path else "array",
            "rows": self.rows,
            "features": self.n_features,
            "dtype": str(self.dtype),
            "chunks": list(v.chunks),
            "shards": list(v.shards) if getattr(v, "shards", None) else None,
            "codecs": codecs,
            "has_time": self.time is not None,
            "time_encoding": self.time.coding.description if self.time is not None else None,
        }


def _open_remote(url: StoreURL) -> Any:
    import zarr.errors

    try:
        return open_zarr(url, mode="r")
    except zarr.errors.NodeNotFoundError:
        if url.objects(limit=1):
            raise StoreError(
                f"{url.url!r} is not a zarr store (objects without zarr metadata at its root)",
                hint="tsconv reads zarr stores (format 2 or 3); ingest other files into one first.",
            ) from None
        raise url.missing("input store") from None
    except StoreError:
        raise
    except Exception as exc:
        raise remote_error(exc, url, "open the input store") from None


def _open_node(path: Path | StoreURL) -> Any:
    if isinstance(path, StoreURL):
        return _open_remote(path)
    if not path.exists():
        raise StoreError(
            f"input store {str(path)!r} does not exist",
            hint="check the store's path (a zarr store: a directory).",
        )
    if not is_zarr_store(path):
        from tsconv.io.writers.parquet_writer import parquet_output_words

        words = parquet_output_words(path) if path.is_file() else None
        if words is not None:  # "ingest other files into one first" is no advice for tsconv's own output
            raise StoreError(
                f"{str(path)!r} is {words}, not a zarr store",
                hint="tsconv reads zarr stores; read a Parquet output with polars, pandas or duckdb, or "
                "run tsconv process again with a .zarr output to inspect or plot it.",
            )
        what = "a file" if path.is_file() else "a directory without zarr metadata"
        raise StoreError(
            f"{str(path)!r} is not a zarr store ({what})",
            hint="tsconv reads zarr stores (format 2 or 3); ingest other files into one first.",
        )
    try:
        if _is_group(path):
            # the arrays' own metadata, not a consolidated copy: rows appended by zarr (resize, write) without
            # consolidating again would otherwise stay unseen, and an --update find nothing new
            return zarr.open_group(str(path), mode="r", use_consolidated=False)
        return zarr.open(str(path), mode="r")
    except Exception as exc:
        raise StoreError(f"cannot open zarr store {str(path)!r}: {exc}") from None


def _is_group(path: Path) -> bool:
    """Whether the local zarr node at ``path`` is a group (format 3's node_type, or format 2's .zgroup)."""
    if (path / ".zgroup").is_file():
        return True
    try:
        return json.loads((path / "zarr.json").read_text()).get("node_type") == "group"
    except (OSError, ValueError, AttributeError):
        return False


# Bounds on what a store may declare (its metadata is a few bytes, whatever it declares)
MAX_FEATURES = 1 << 20
MAX_CHUNK_BYTES = 2 << 30  # Blosc's own limit on a chunk


def _check_values(values: Any, where: str) -> None:
    if not isinstance(values, zarr.Array):
        raise StoreError(f"{where}: 'values' is a group, expected a 2-D array [T, F]")
    if values.ndim != 2:
        raise StoreError(
            f"{where}: expected a 2-D array [T, F] (time-major), got {values.ndim}-D with shape {list(values.shape)}",
            hint="store one row per time step and one column per feature.",
        )
    dt = np.dtype(values.dtype)
    if dt.kind not in "fiu":
        raise StoreError(
            f"{where}: values have dtype {dt}, expected a real numeric dtype (float32, float64, float16 or integer)",
            hint="store the values as numbers, e.g. float32 (booleans as 0 and 1, complex values as two features).",
        )
    if values.shape[0] == 0:
        raise StoreError(f"{where}: the series is empty (0 steps)", hint="write its rows first.")
    if values.shape[1] == 0:
        raise StoreError(f"{where}: the series has no features (0 columns)", hint="write its features first.")
    if values.shape[1] > MAX_FEATURES:  # a few bytes of metadata must not make a run build a billion names
        raise StoreError(
            f"{where}: values declare {values.shape[1]:,} features; tsconv reads at most {MAX_FEATURES:,}",
            hint="split the features over several stores.",
        )
    chunk_bytes = math.prod(int(c) for c in values.chunks) * dt.itemsize
    if chunk_bytes > MAX_CHUNK_BYTES:  # read whole: a store of no chunk files could declare one of 745 GB
        raise StoreError(
            f"{where}: values are stored in chunks {list(values.chunks)} of {chunk_bytes / 2**30:,.1f} GiB decoded; "
            f"tsconv reads chunks of at most {MAX_CHUNK_BYTES >> 30} GiB",
            hint="rechunk the store (zarr's default chunks are a few MB).",
        )


def open_input(path: str | os.PathLike[str] | StoreURL, *, allow_incomplete: bool = False) -> InputStore:
    """Open an input store (a local path or a URL) read-only and check it follows the store convention.

    The output of an unfinished tsconv run is refused unless ``allow_incomplete``: its tail is missing.
    """
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(text, str | StoreURL):  # None, a number or bytes reached os.fspath's TypeError
        raise StoreError(
            f"a store's location must be a str path, an os.PathLike (pathlib.Path) or a URL, got "
            f"{type(path).__name__} {path!r}"[:300],
            hint="pass it as text, e.g. 'ticks.zarr' or Path('ticks.zarr')"
            + (" (.decode() for bytes)." if isinstance(text, bytes) else "."),
        )
    p = location(path)
    p = p.resolve() if isinstance(p, Path) else p
    identity = store_identity(
        p
    )  # before its metadata is read: a store replaced in between is told apart later
    node = _open_node(p)
    where = str(p)
    meta = node.attrs.get("tsconv") if isinstance(node, zarr.Group) else None
    if isinstance(meta, dict) and not meta.get("complete", True) and not allow_incomplete:
        raise StoreError(
            f"{where} is the output of an unfinished tsconv run ({meta.get('rows_done', 0):,} of "
            f"{meta.get('rows', '?'):,} rows written)",
            hint="finish it with `tsconv process ... --resume` before reading it.",
        )
    if isinstance(node, zarr.Group):
        _refuse_unfinished_append(node, where)
    if isinstance(node, zarr.Array):
        root = hierarchy_root(p)
        if root != p:
            # the marker is on the store's group: its array read bare would show the rows never committed
            enclosing = _open_enclosing(root)
            if enclosing is not None:
                _refuse_unfinished_append(enclosing, str(root), array=where)
        _check_values(node, where)
        _refuse_cf_encoding(node, getattr(p, "name", where), where)
        names = tuple(f"f{j}" for j in range(node.shape[1]))
        if root != p:
            # the store is the group holding the array, not the hierarchy's root: for an array of a nested
            # group (xarray's to_zarr(..., group="eq/daily")) the root holds no series, and naming it sent
            # the user to an error
            holder = p.parent
            warnings.warn(
                f"{where} is an array inside the store {str(root)!r}: read bare, with no time column and "
                f"features f0..f{node.shape[1] - 1}; give the store itself, {str(holder)!r}, for its time and names",
                TsconvWarning,
                stacklevel=2,
            )
        return InputStore(path=p, values=node, time=None, features=names, identity=identity)
    try:
        arrays = dict(node.arrays())
    except (ValueError, TypeError) as exc:  # an array's metadata document damaged (JSON, shape, chunks)
        raise StoreError(
            f"{where}: an array's metadata cannot be read ({type(exc).__name__}: {exc})"[:400],
            hint="the store's zarr.json / .zarray files are damaged: write the store again.",
        ) from None
    for arr_name, arr in arrays.items():
        if any(int(c) < 1 for c in arr.chunks):
            raise StoreError(
                f"{where}: array {arr_name!r} declares chunks {list(arr.chunks)}; each must be at least 1"
            )
    name = _values_name(arrays, where, groups=tuple(node.group_keys()))
    values = arrays[name]
    _check_values(values, where if name == "values" else f"{where}: {name!r}")
    _refuse_cf_encoding(values, name, where)
    dims = _dims(values)
    names_attr = node.attrs.get("features")
    if names_attr is None:
        _refuse_names_first(arrays, dims, name, where)
    time = _time_array(arrays, dims, values, where)
    if names_attr is not None:
        if not isinstance(names_attr, list) or not all(isinstance(n, str) for n in names_attr):
            raise StoreError(
                f"{where}: attribute 'features' must be a list of strings",
                hint="set it to the features' names, one per column of values, or remove it (names f0, f1, ...).",
            )
        if len(names_attr) == values.shape[0] != values.shape[1]:
            raise _feature_major(
                where, values, f"attribute 'features' names {len(names_attr)}, as many as their rows"
            )
        if len(names_attr) != values.shape[1]:
            raise StoreError(
                f"{where}: attribute 'features' names {len(names_attr)} features but values have {values.shape[1]} columns",
                hint="set it to the features' names, one per column of values, or remove it (names f0, f1, ...).",
            )
        names = tuple(names_attr)
        if dims is not None and len(dims) == 2 and dims[1] in arrays and dims[1] != name:
            try:
                coord = _coordinate_names(arrays[dims[1]], dims[1], values.shape[1], where)
            except StoreError:  # not names (numbers, another length): the attribute names the features
                coord = names
            if coord != names:  # xarray keeps a Dataset's attributes through sortby, isel, reindex
                j = next(i for i, (a, b) in enumerate(zip(names, coord, strict=True)) if a != b)
                raise StoreError(
                    f"{where}: attribute 'features' and the feature coordinate {dims[1]!r} disagree: column {j} "
                    f"is {names[j]!r} in the attribute and {coord[j]!r} in the coordinate (a dataset reordered "
                    "or subset in xarray keeps its attributes)",
                    hint="drop the stale attribute (del ds.attrs['features']) or set it to the coordinate's "
                    "names, and write the store again.",
                )
    elif dims is not None and len(dims) == 2 and dims[1] in arrays and dims[1] != name:
        names = _coordinate_names(arrays[dims[1]], dims[1], values.shape[1], where)
    else:
        names = tuple(f"f{j}" for j in range(values.shape[1]))
    if "" in names:  # its outputs would be named ".diff1", and polars renames an empty column "column_1"
        raise StoreError(
            f"{where}: feature {names.index('')} has an empty name",
            hint="name every feature (the 'features' attribute or the feature coordinate).",
        )
    bad = control_name(names)
    if bad is not None:
        raise StoreError(
            f"{where}: feature name {bad!r} holds a control character",
            hint="name features with printable characters (the 'features' attribute or the feature coordinate).",
        )
    dups = repeated_names(names)
    if dups:  # a pipeline selects features by name
        raise StoreError(
            f"{where}: feature names repeat ({describe_repeats(names, dups)})",
            hint="give every feature a distinct name (the 'features' attribute or the feature coordinate).",
        )
    return InputStore(path=p, values=values, time=time, features=names, identity=identity)


def store_identity(path: Path | StoreURL) -> tuple[int, int] | None:
    """(device, inode) of a local store's root directory: a store replaced by another has another (None
    in an object store, where only a run id tells, or where there is none)."""
    if not isinstance(path, Path):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def interrupted_append(attrs: Any) -> int | None:
    """The committed rows of a store whose last ``tsconv ingest --append`` did not finish, read from its
    root group's attributes; None when no append is pending."""
    meta = attrs.get("ingest") if hasattr(attrs, "get") else None
    if not isinstance(meta, dict) or meta.get("complete") is not False or "rows_before" not in meta:
        return None
    rows = meta["rows_before"]
    return rows if isinstance(rows, int) and not isinstance(rows, bool) and rows >= 0 else None


def _refuse_unfinished_append(group: zarr.Group, where: str, *, array: str | None = None) -> None:
    """Refuse the store ``group`` at ``where`` (or ``array``, read bare from inside it) while an append to it
    is unfinished: its arrays hold rows never committed (unwritten, or half written)."""
    committed = interrupted_append(group.attrs)
    if committed is None:
        return
    subject = f"{where}: a" if array is None else f"{array} is an array inside the store {where}; a"
    raise StoreError(
        f"{subject} `tsconv ingest --append` to this store did not finish, or is still running "
        f"({_lengths(group)}; the rows before it: {committed:,})",
        hint=f"roll it back with `tsconv repair {shlex.quote(str(where))}`, or run the append again, which rolls it back first.",
    )


def _open_enclosing(root: Path | StoreURL) -> zarr.Group | None:
    """The group at ``root`` enclosing an array opened bare; None where it cannot be opened as one (then no
    record of an append can be read from it either)."""
    try:
        node = open_zarr(root, mode="r")
    except Exception:  # noqa: BLE001 - any failure: the array itself opened, and is read as it is
        return None
    return node if isinstance(node, zarr.Group) else None


def _lengths(group: zarr.Group) -> str:
    """'values' and 'time' rows of a group, for a message."""
    parts = []
    for key in ("values", "time"):
        try:
            parts.append(f"{key!r} has {int(group[key].shape[0]):,} rows")
        except Exception:
            parts.append(f"no {key!r} array")
    return ", ".join(parts)


def _dims(array: zarr.Array) -> tuple[str, ...] | None:
    """An array's dimension names: zarr 3 ``dimension_names``, or xarray's ``_ARRAY_DIMENSIONS`` in format 2."""
    names = getattr(array.metadata, "dimension_names", None)
    if names is None:
        names = array.attrs.get("_ARRAY_DIMENSIONS")
    if not isinstance(names, (list, tuple)) or len(names) != array.ndim or None in names:
        return None
    return tuple(str(n) for n in names)


def _values_name(arrays: dict[str, zarr.Array], where: str, *, groups: tuple[str, ...] = ()) -> str:
    """The values array: ``values``, else the one 2-D data variable along the time dimension; refused where
    its dimension names put time second (a feature-major array read as [T, F] is transposed data).
    ``groups``: the group's subgroups, named where it holds no series itself (xarray's ``to_zarr(group=...)``)."""
    dims = {k: _dims(a) for k, a in arrays.items()}
    coords = {d for ds in dims.values() if ds for d in ds}  # arrays named after a dimension (xarray)
    for a in arrays.values():  # and the other coordinates, which xarray lists in this CF attribute
        listed = a.attrs.get("coordinates")
        coords.update(listed.split() if isinstance(listed, str) else ())
    time = arrays.get("time")
    if time is not None and time.ndim == 0:  # a scalar coordinate (a run's or a snapshot's time): not an axis
        time = None
    if time is not None:
        time_dims = {(dims["time"] or ("time",))[0]}
    else:  # the dimensions whose coordinate holds instants, if any
        time_dims = {d for d in coords if d in arrays and arrays[d].ndim == 1 and _holds_instants(arrays[d])}
        # xarray writes no 'time' array for a 'time' dimension without a coordinate; the name still says which
        # axis is time (as in tsconv.features), so a feature-major variable is refused, not read transposed
        if any(ds and "time" in ds for ds in dims.values()):
            time_dims.add("time")
    if "values" in arrays:
        d = dims["values"]
        if d is not None and len(d) == 2 and time_dims and d[0] not in time_dims and d[1] in time_dims:
            raise StoreError(
                f"{where}: 'values' has dimensions {d}: time is its second dimension, and tsconv reads "
                "[time, feature] arrays",
                hint=f"write it time-major, e.g. ds.transpose({d[1]!r}, {d[0]!r}).to_zarr(...).",
            )
        return "values"
    candidates = []
    for k, a in sorted(arrays.items()):
        if a.ndim != 2 or k in coords:
            continue
        d = dims[k]
        if d is not None and time_dims and d[0] not in time_dims:
            continue
        if d is None and time is not None and a.shape[0] != time.shape[0]:
            continue
        candidates.append(k)
    if len(candidates) == 1:
        return candidates[0]
    shown = ", ".join(sorted(arrays)) or "nothing"
    along = f" along {' or '.join(repr(d) for d in sorted(time_dims))}" if time_dims else ""
    if not candidates:
        second = [k for k, a in sorted(arrays.items()) if a.ndim == 2 and k not in coords and dims[k]
                  and time_dims and dims[k][1] in time_dims]  # fmt: skip
        if len(second) == 1:
            d = dims[second[0]]
            raise StoreError(
                f"{where}: {second[0]!r} has dimensions {d}: time is its second dimension, and tsconv reads "
                "[time, feature] arrays",
                hint=f"write it time-major, e.g. ds.transpose({d[1]!r}, {d[0]!r}).to_zarr(...).",
            )
        series = _one_variable_per_feature(arrays, dims, coords, time_dims)
        if series is not None:
            dim, names = series
            listed = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
            raise StoreError(
                f"{where}: the group has no 'values' array and no 2-D data variable{along}; it holds "
                f"{len(names)} 1-D data variables along {dim!r} ({listed}), one per feature, and tsconv reads "
                "one 2-D variable [time, feature]",
                hint=f"stack them into one: ds.to_dataarray('feature').transpose({dim!r}, 'feature')"
                ".to_dataset(name='values').to_zarr(...) (names the features by the variables).",
            )
        if groups:
            listed = ", ".join(repr(g) for g in sorted(groups)[:5]) + (" ..." if len(groups) > 5 else "")
            raise StoreError(
                f"{where}: the group has no 'values' array (its arrays: {shown}) and no 2-D data variable{along}; "
                f"it holds the group{'s' * (len(groups) > 1)} {listed}",
                hint=f"give the path of the group that holds the series, e.g. {where}/{sorted(groups)[0]} "
                "(xarray's to_zarr(..., group=NAME) writes a dataset into such a group).",
            )
        raise StoreError(
            f"{where}: the group has no 'values' array (it has: {shown}) and no 2-D data variable{along}",
            hint="an input group holds 'values' [T, F] (or one 2-D data variable [time, feature]), "
            "optionally 'time' [T] and the attribute 'features'.",
        )
    raise StoreError(
        f"{where}: the group has no 'values' array and {len(candidates)} 2-D data variables{along}: "
        f"{', '.join(candidates)}; expected one",
        hint="write one data variable per store (e.g. ds[['name']].to_zarr(...)), or name the one to read "
        "'values'.",
    )


def _one_variable_per_feature(
    arrays: dict[str, zarr.Array],
    dims: dict[str, tuple[str, ...] | None],
    coords: set[str],
    time_dims: set[str],
) -> tuple[str, list[str]] | None:
    """(dimension, names) where a group holds two or more numeric 1-D data variables along one dimension (time,
    where one is known), xarray's ``Dataset({symbol: series, ...})``: one variable per feature, which the refusal
    shows how to stack into the 2-D variable tsconv reads; None otherwise."""
    along: dict[str, list[str]] = {}
    for k, a in sorted(arrays.items()):
        d = dims[k]
        if a.ndim != 1 or k in coords or d is None or np.dtype(a.dtype).kind not in "fiu":
            continue
        if not time_dims or d[0] in time_dims:
            along.setdefault(d[0], []).append(k)
    found = [(d, names) for d, names in along.items() if len(names) >= 2]
    return found[0] if len(found) == 1 else None


def _refuse_names_first(
    arrays: dict[str, zarr.Array], dims: tuple[str, ...] | None, name: str, where: str
) -> None:
    """Refuse a variable whose first dimension's coordinate holds names (strings) and whose second's does not
    (none, or numbers): a feature-major array, (symbol, date), which read as [T, F] would be transposed data
    (its symbols taken as steps); ``tsconv.features`` reads a DataArray by the same rule."""
    if dims is None or len(dims) != 2:
        return
    first, second = (arrays.get(d) if d != name else None for d in dims)
    if first is None or not _holds_names(first) or (second is not None and _holds_names(second)):
        return
    raise StoreError(
        f"{where}: {name!r} has dimensions {dims} and the coordinate of its first, {dims[0]!r}, holds names "
        f"(strings): it is feature-major, and tsconv reads [time, feature] arrays",
        hint=f"write it time-major, e.g. ds.transpose({dims[1]!r}, {dims[0]!r}).to_zarr(...); if {dims[0]!r} "
        "holds times, store them as datetime64 (xarray: ds.assign_coords("
        f"{dims[0]}=pd.to_datetime(ds[{dims[0]!r}].values))).",
    )


def _holds_names(array: zarr.Array) -> bool:
    """Whether a coordinate array holds strings (feature names), by its dtype."""
    return array.ndim == 1 and np.dtype(array.dtype).kind in "USOT"


def _refuse_cf_encoding(values: zarr.Array, name: str, where: str) -> None:
    """Refuse values that xarray would decode (CF packing, unsigned flags, missing-value markers): tsconv reads
    stored values as they are, so such cells would enter the features as data."""
    attrs = values.attrs
    # a scale of 1 and an offset of 0 change no value (xarray keeps them in a variable's encoding from a netCDF
    # source, and writes them again): only packing that moves values is refused, as for the time
    identity = {"scale_factor": 1.0, "add_offset": 0.0}
    keys = [k for k, same in identity.items() if k in attrs and _cf_number(attrs[k]) != same]
    if keys:
        raise StoreError(
            f"{where}: {name!r} is CF-packed ({', '.join(f'{k}={attrs[k]!r}' for k in keys)}); "
            "tsconv reads stored values as they are",
            hint="write the store unpacked (xarray: drop scale_factor/add_offset from the variable's encoding).",
        )
    unsigned = str(attrs.get("_Unsigned", "")).lower()
    if (unsigned == "true" and values.dtype.kind == "i") or (
        unsigned == "false" and values.dtype.kind == "u"
    ):
        read_as = "unsigned" if unsigned == "true" else "signed"
        raise StoreError(
            f"{where}: {name!r} holds {values.dtype} values marked _Unsigned={attrs['_Unsigned']!r} (xarray "
            f"reads them as {read_as} integers); tsconv reads stored values as they are",
            hint=f"write the values as a {read_as} integer or a float dtype.",
        )
    marks = {
        f"{k}[{i}]" if isinstance(attrs[k], list) else k: _cf_number(v)
        for k in ("_FillValue", "missing_value")
        if k in attrs
        for i, v in enumerate(attrs[k] if isinstance(attrs[k], list) else [attrs[k]])
    }
    if getattr(values.metadata, "zarr_format", 3) == 2 and "_ARRAY_DIMENSIONS" in attrs:
        marks["fill_value"] = _cf_number(values.metadata.fill_value)  # xarray reads it as _FillValue
    marks = {k: v for k, v in marks.items() if v is not None and not np.isnan(v)}
    if marks:
        key, value = next(iter(marks.items()))
        raise StoreError(
            f"{where}: {name!r} marks missing values with {key} = {value:g}, which xarray reads as NaN; "
            "tsconv reads stored values as they are, so those cells would enter the features as data",
            hint="write missing values as NaN (xarray: encoding={'_FillValue': np.nan} for a float variable), "
            "or drop the marker where those values are data.",
        )


def _cf_number(value: Any) -> float | None:
    """A CF missing-value marker as a float (xarray writes zarr 3's ``_FillValue`` of floats as the base64 of its
    little-endian bytes); None where there is none or it is not a number."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return None
        kinds = {8: "<f8", 4: "<f4", 2: "<f2"}
        return float(np.frombuffer(raw, dtype=kinds[len(raw)])[0]) if len(raw) in kinds else None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _time_array(
    arrays: dict[str, zarr.Array], dims: tuple[str, ...] | None, values: zarr.Array, where: str
) -> TimeColumn | None:
    """``time``, else the coordinate of the values' first dimension when it holds instants (CF units or
    datetime64: an integer index coordinate is not a time); decoded to int64 ns."""
    if "time" in arrays and arrays["time"].ndim != 0:  # a scalar time coordinate is not the rows' times
        key = "time"
    elif dims is not None and dims[0] in arrays and _holds_instants(arrays[dims[0]]):
        key = dims[0]
    else:
        return None
    t = arrays[key]
    if t.ndim != 1:
        raise StoreError(
            f"{where}: {key!r} has shape {list(t.shape)}, expected [{values.shape[0]}] (one per row of values)",
            hint="store one time per row of values, as a 1-D array.",
        )
    if t.shape[0] == values.shape[1] != values.shape[0]:
        raise _feature_major(where, values, f"{key!r} holds {t.shape[0]:,} times, as many as their columns")
    if t.shape[0] != values.shape[0]:
        raise StoreError(
            f"{where}: {key!r} has {t.shape[0]:,} rows but the values have {values.shape[0]:,}; every row of "
            "the values needs one time",
            hint="the store is damaged (e.g. a writer was killed between resizing its arrays); re-create it, "
            "for a store of `tsconv ingest` with `tsconv ingest FILES -o STORE --overwrite`.",
        )
    return TimeColumn(t, where=f"{where}: {key!r}")


def _feature_major(where: str, values: zarr.Array, what: str) -> StoreError:
    """The error for values [F, T] whose times or names count their columns and rows the other way round
    (``what`` says which); the store was called damaged, or its names attribute wrong."""
    rows, cols = (int(n) for n in values.shape)
    return StoreError(
        f"{where}: the values [{rows:,}, {cols:,}] look feature-major ([feature, time]): {what}; tsconv "
        "reads [time, feature] arrays",
        hint="write the values time-major, one row per time step (numpy: x.T; xarray: "
        "ds.transpose('time', ...)), and the store again.",
    )


def _holds_instants(array: zarr.Array) -> bool:
    units = array.attrs.get("units")
    return np.dtype(array.dtype).kind == "M" or (isinstance(units, str) and " since " in units)


def _coordinate_names(coord: zarr.Array, key: str, n: int, where: str) -> tuple[str, ...]:
    """Feature names from the coordinate variable ``key`` of the values' second dimension, as strings."""
    if coord.ndim != 1 or coord.shape[0] != n:
        raise StoreError(
            f"{where}: the feature coordinate {key!r} has shape {list(coord.shape)}, expected [{n}] "
            "(one name per column of values)"
        )
    raw = np.asarray(coord[:])
    if raw.dtype.kind not in "USOT":
        raise StoreError(
            f"{where}: the feature coordinate {key!r} has dtype {raw.dtype}, expected strings",
            hint=f"name the features with strings (xarray: ds.assign_coords({key}=ds[{key!r}].astype(str))).",
        )
    names = []
    for v in raw.tolist():
        if isinstance(v, bytes):
            try:
                v = v.decode("utf-8")
            except UnicodeDecodeError:
                raise StoreError(
                    f"{where}: the feature coordinate {key!r} holds {v!r}, not UTF-8 text"
                ) from None
        if not isinstance(v, str):
            raise StoreError(f"{where}: the feature coordinate {key!r} holds {v!r}, expected strings")
        names.append(v)
    return tuple(names)


@dataclass(frozen=True)
class AbsentChunks:
    """Chunk files of an input's values that were never written, which read as a fill value other than NaN."""

    count: int  # absent chunk files, or absent inner chunks where the shards' indexes were read
    of: int  # chunk files (or inner chunks) the array's shape calls for
    first_rows: tuple[int, int]  # the first absent one's rows [start, stop)
    fill: float | int | str
    what: str = "chunk files"

    def message(self) -> str:
        """One line: which rows, how many chunk files, what they read as, and what to do."""
        a, b = self.first_rows
        fill = f"{self.fill:g}" if isinstance(self.fill, float) else str(self.fill)
        return (
            f"{self.count:,} of {self.of:,} {self.what} of the values were never written (the first: rows "
            f"{a:,}..{b - 1:,}); zarr reads them as the fill value {fill}, not as missing values; if a writer "
            f"stopped early, rewrite those rows; if those chunks really hold only {fill}, ignore this"
        )


# The most inner chunks of a sharded array whose index entries are read to tell which were written
MAX_INNER_CHUNKS = 1 << 26


def absent_chunks(store: InputStore) -> AbsentChunks | None:
    """The values' chunk files that were never written, where they read as a fill value other than NaN.

    None where every chunk file is there, where the fill value is NaN (absent chunks read as missing),
    and at a URL or in a store other than a local directory (listing one costs a request per page).
    """
    values = store.values
    fill = values.metadata.fill_value
    fill = 0 if fill is None else fill  # a format 2 array without one: zarr reads its absent chunks as 0
    if store.remote or np.isnan(np.float64(fill)):
        return None
    listed = _chunk_files(values)
    if listed is None:
        return None
    # zarr skips writing a chunk equal to the fill value (write_empty_chunks off), so an absent one may
    # also be real data.
    root, present = listed
    fill = float(fill) if np.dtype(values.dtype).kind == "f" else int(fill)
    inner = _written_inner_chunks(values, root, present) if getattr(values, "shards", None) else None
    if inner is not None:
        written, grid = inner
        if written.all():
            return None
        first = np.unravel_index(int(np.argmin(written)), written.shape)
        start = int(first[0]) * grid[0]
        stop = min(start + grid[0], int(values.shape[0]))
        return AbsentChunks(int(written.size - written.sum()), written.size, (start, stop), fill, "chunks")
    grid = tuple(int(c) for c in (getattr(values, "shards", None) or values.chunks))
    counts = tuple(-(-int(n) // c) for n, c in zip(values.shape, grid, strict=True))
    key = values.metadata.encode_chunk_key
    # Counted from the files there, not by listing every key the shape calls for: a few bytes of metadata
    # may declare 10^15 rows (np.ndindex over 10^12 chunks was a MemoryError, a billion took minutes).
    written = 0
    for name in present:
        idx = tuple(int(d) for d in re.findall(r"\d+", name))
        if (
            len(idx) == len(counts)
            and all(i < n for i, n in zip(idx, counts, strict=True))
            and key(idx) == name
        ):
            written += 1
    total = math.prod(counts)
    if written == total:
        return None
    # the first absent one lies among the first written + 1 in C order
    first = next(idx for i in range(written + 1) if key(idx := _c_index(i, counts)) not in present)
    start = first[0] * grid[0]
    stop = min(start + grid[0], int(values.shape[0]))
    return AbsentChunks(total - written, total, (start, stop), fill)


def _chunk_files(array: zarr.Array) -> tuple[Path, set[str]] | None:
    """The directory of a local array and the files below it (chunk keys relative to it); None where the
    array is not in a local directory (listing an object store costs a request per page)."""
    from zarr.storage import LocalStore

    where = getattr(getattr(array, "store_path", None), "store", None)
    if not isinstance(where, LocalStore):
        return None
    root = Path(where.root) / array.store_path.path if array.store_path.path else Path(where.root)
    # Listed once: a stat per chunk file costs far more on a store of many chunks.
    present = {
        Path(os.path.relpath(os.path.join(d, f), root)).as_posix()
        for d, _, files in os.walk(root)
        for f in files
    }
    return root, present


def absent_time_chunks(time: TimeColumn, *, start: int = 0, stop: int | None = None) -> AbsentChunks | None:
    """The chunks of a local store's time array holding rows [start, stop) that were never written.

    zarr reads such a chunk as the fill value, a run of equal (or missing) times: never a store's times,
    which increase strictly, but a writer that stopped early (an append that resized the arrays and died,
    a copy cut short). Only a chunk holding a single row of the array may be the fill value for real
    (zarr does not write a chunk equal to it), so it is left to the check of the times themselves.
    Chunks inside a shard count where the shard's index marks them never written. None where every one
    is there, or the array is not in a local directory."""
    array = time.array
    rows = int(time.shape[0])
    stop = rows if stop is None else min(stop, rows)
    if stop <= start or getattr(array, "ndim", None) != 1:
        return None
    listed = _chunk_files(array)
    if listed is None:
        return None
    root, present = listed
    inner = _written_inner_chunks(array, root, present) if getattr(array, "shards", None) else None
    if inner is not None:
        flags, (n,) = inner
        lo, hi = start // n, -(-stop // n)
        written = {int(c) for c in np.flatnonzero(flags[lo:hi]) + lo}
    else:
        n = int((getattr(array, "shards", None) or array.chunks)[0])
        lo, hi = start // n, -(-stop // n)
        key = array.metadata.encode_chunk_key
        # counted from the files there: a few bytes of metadata may declare 10^15 rows
        written: set[int] = set()
        for name in present:
            idx = tuple(int(d) for d in re.findall(r"\d+", name))
            if len(idx) == 1 and lo <= idx[0] < hi and key(idx) == name:
                written.add(idx[0])
    if n == 1:  # every chunk holds one row
        return None
    last = -(-rows // n) - 1
    single = last if rows - last * n == 1 and lo <= last < hi and last not in written else None
    count = hi - lo - len(written) - (single is not None)
    if count == 0:
        return None
    # the first absent one lies among the first len(written) + 2 from lo
    c0 = next(c for c in range(lo, hi) if c not in written and c != single)
    fill = np.asarray(0 if array.metadata.fill_value is None else array.metadata.fill_value)
    fill = str(fill) if fill.dtype.kind in "mM" else fill.item()  # NaT, not None
    return AbsentChunks(count, hi - lo, (c0 * n, min((c0 + 1) * n, rows)), fill, "chunks")


def _c_index(i: int, counts: tuple[int, ...]) -> tuple[int, ...]:
    """The ``i``-th index of a grid of ``counts`` in C order (np.unravel_index, without its int64 bound)."""
    idx = []
    for n in reversed(counts):
        i, r = divmod(i, n)
        idx.append(r)
    return tuple(reversed(idx))


def _written_inner_chunks(
    values: zarr.Array, root: Path, present: set[str]
) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """Which inner chunks of a sharded array were written (the grid of inner chunks over the array's shape),
    read from each shard file's index, and the inner chunk shape.

    zarr writes a partly filled shard with its unwritten inner chunks marked absent in the index, so the
    shard files alone miss them. Only the index bytes are read. None where the index is not the spec's
    plain one (little- or big-endian uint64 pairs, with or without a crc32c) or codecs precede sharding:
    the caller then counts shard files, as before.
    """
    index = shard_index(values)
    if index is None:
        return None
    n, dtype, at_start, size = index
    codecs = values.metadata.codecs
    inner = tuple(int(c) for c in codecs[0].chunk_shape)
    shard = tuple(int(s) for s in values.shards)
    per_shard = tuple(s // c for s, c in zip(shard, inner, strict=True))
    shards = tuple(-(-int(m) // s) for m, s in zip(values.shape, shard, strict=True))
    if math.prod(shards) * n > MAX_INNER_CHUNKS:  # a flag each: the shard files are counted instead
        return None
    written = np.zeros(tuple(a * b for a, b in zip(shards, per_shard, strict=True)), dtype=bool)
    key = values.metadata.encode_chunk_key
    for idx in np.ndindex(*shards):
        name = key(idx)
        if name not in present:
            continue
        cells = tuple(slice(i * p, (i + 1) * p) for i, p in zip(idx, per_shard, strict=True))
        try:
            fd = os.open(root / name, os.O_RDONLY)
            try:
                length = os.fstat(fd).st_size
                raw = os.pread(fd, size, 0 if at_start else max(length - size, 0))
            finally:
                os.close(fd)
        except OSError:
            raw = b""
        if len(raw) != size:  # unreadable or truncated: zarr's own read of that shard reports it
            written[cells] = True
            continue
        # The crc32c is not checked here: zarr checks it when the shard is read.
        offsets = np.frombuffer(raw, dtype, count=2 * n).reshape((*per_shard, 2))[..., 0]
        written[cells] = offsets != np.iinfo(np.uint64).max
    grid = tuple(-(-int(m) // c) for m, c in zip(values.shape, inner, strict=True))
    return written[tuple(slice(0, g) for g in grid)], inner


def warn_absent_chunks(store: InputStore) -> AbsentChunks | None:
    """Warn (:class:`TsconvWarning`) where chunk files of the values were never written and read as a fill
    value other than NaN (:func:`absent_chunks`); return what was found."""
    absent = absent_chunks(store)
    if absent is not None:
        warnings.warn(f"{store.path}: {absent.message()}", TsconvWarning, stacklevel=2)
    return absent


def unitless_early_time(store: InputStore) -> str | None:
    """One line where the time is integers without units (read as ns since the epoch) whose first and
    last rows lie within a year of the epoch (:func:`~tsconv.io.timecoding.looks_early`): epoch seconds,
    milliseconds or microseconds, or step counts, written without a unit. None otherwise; reads two rows."""
    t = store.time
    if t is None or t.coding.cf or t.coding.dtype.kind not in "iu" or t.shape[0] == 0:
        return None
    try:
        first, last = int(t[0]), int(t[-1])
    except StoreError:  # out of range: every read of the time says so
        return None
    if not looks_early(first, last):
        return None
    return (
        f"'time' holds {t.coding.dtype} without a 'units' attribute, read as nanoseconds since the epoch: "
        f"{iso_utc(first)} .. {iso_utc(last)}; if it counts seconds, milliseconds or microseconds, add CF units "
        "such as 'milliseconds since 1970-01-01' (zarr: group['time'].attrs['units'] = ...); if these are "
        "nanoseconds, ignore this"
    )


def warn_unitless_early_time(store: InputStore) -> str | None:
    """Warn (:class:`TsconvWarning`) where the time is unitless integers that read as 1970
    (:func:`unitless_early_time`); return the warning's line."""
    line = unitless_early_time(store)
    if line is not None:
        warnings.warn(f"{store.path}: {line}", TsconvWarning, stacklevel=2)
    return line


def group_attrs(store: InputStore) -> dict[str, Any]:
    """The attributes of the group holding ``store`` (a tsconv output's metadata), {} for a bare array or
    a group zarr cannot open."""
    try:
        node = open_zarr(store.path, mode="r")
    except Exception:
        return {}
    return dict(node.attrs) if isinstance(node, zarr.Group) else {}


def check_time(store: InputStore, *, start: int = 0, stop: int | None = None) -> tuple[int, int] | None:
    """Check ``time`` is strictly increasing, reading one store chunk at a time; return (first, last) in
    int64 ns since the epoch (None without time or rows). ``start``, ``stop``: check only rows [start,
    stop) (an update checks its new rows and the one before them). A time that cannot be decoded
    (missing, out of range), or a local store's time chunk never written (:func:`absent_time_chunks`), is
    a StoreError."""
    if store.time is None:
        return None
    t = store.time
    n = int(t.shape[0]) if stop is None else min(stop, int(t.shape[0]))
    if n <= 0:
        return None
    # read as the fill value, they would fail the checks below as unsorted or missing times, sending the
    # user to sort a store that is incomplete
    absent = absent_time_chunks(t, start=min(start, n), stop=n)
    if absent is not None:
        a, b = absent.first_rows
        raise StoreError(
            f"{t.where}: the store is incomplete: {absent.count:,} of the {absent.of:,} chunks of its time "
            f"rows {start:,}..{n - 1:,} {'was' if absent.count == 1 else 'were'} never written (the first: "
            f"rows {a:,}..{b - 1:,}), which zarr reads as the fill value {absent.fill}, not as times",
            hint="a writer stopped before writing them (an append or copy cut short): write those rows' times "
            "again, or re-create the store (one made by `tsconv ingest`: `tsconv ingest FILES -o STORE "
            "--overwrite`).",
        )
    reader = TimeReader(t)  # chunk files decoded by numcodecs: 0.02 s for 1M rows against zarr's 0.16 s
    step = int(t.chunks[0]) * max(1, (1 << 22) // (8 * int(t.chunks[0])))
    prev = None
    first = None
    for a in range(min(start, n) // int(t.chunks[0]) * int(t.chunks[0]), n, step):
        block = reader.read(a, min(a + step, n))
        if first is None:
            first = int(block[0])
        nat = block == _NAT
        if nat.any():  # checked apart: a difference beside the int64 minimum overflows
            raise StoreError(
                f"{t.where}: the time of row {a + int(np.argmax(nat)):,} is missing (NaT, the int64 minimum)",
                hint="every row needs a timestamp: drop or fill the rows without one.",
            )
        if prev is not None and block[0] <= prev:
            bad = a
            raise StoreError(
                f"{t.where} is not strictly increasing at row {bad:,} ({iso_utc(block[0])} after {iso_utc(prev)})",
                hint="sort the series by time and drop duplicate timestamps.",
            )
        down = block[1:] <= block[:-1]  # compared, not differenced: times centuries apart overflow int64
        if down.any():
            bad = a + int(np.argmax(down)) + 1
            raise StoreError(
                f"{t.where} is not strictly increasing at row {bad:,} "
                f"({iso_utc(block[bad - a])} after {iso_utc(block[bad - a - 1])})",
                hint="sort the series by time and drop duplicate timestamps.",
            )
        prev = int(block[-1])
    return first, prev
