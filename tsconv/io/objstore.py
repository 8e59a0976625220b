"""Stores at URLs: ``s3://bucket/ticks.zarr`` and the other schemes fsspec knows (gs://, az://, memory://, ...).

A store is named by a local path or a URL. :func:`location` tells them apart: a string with a scheme
other than ``file`` is a :class:`StoreURL`; a plain path or a ``file://`` URL is a local
:class:`~pathlib.Path`, which keeps the fast readers and writers (they read and write chunk files
directly). A URL's store is read and written through zarr's ``FsspecStore``.

Credentials, region and endpoint are the filesystem's own business: for S3, s3fs and botocore read
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, ``AWS_REGION``,
``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3`` and ``~/.aws``; tsconv passes no options of its own, and
refuses a URL holding a password (``user:password@``) or a query (``?token=...``), which messages and the
output's ``source`` would show (:func:`shown` masks them in its refusal). The
errors of a missing package (s3fs), a missing bucket or store, refused credentials or an unreachable
endpoint become a :class:`~tsconv.errors.StoreError` that says which (:func:`remote_error`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from tsconv.errors import StoreError, TsconvError

__all__ = [
    "StoreURL",
    "hierarchy_root",
    "is_url",
    "location",
    "open_group",
    "open_zarr",
    "overlaps",
    "refuse_inside",
    "remote_error",
    "shown",
]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# The extra that installs a scheme's filesystem package, where tsconv declares one.
_EXTRAS = {"s3": "s3", "s3a": "s3"}
# Schemes that name the same filesystem as another (fsspec registers them to the same class): comparing two
# locations (an output inside its input) sees through the alias. A location keeps the scheme it was given,
# which outputs' fingerprints hold.
_ALIASES = {"s3a": "s3", "gcs": "gs", "abfs": "az"}


def is_url(target: object) -> bool:
    """Whether ``target`` is a URL naming an object-store location (a scheme other than ``file://``)."""
    if not isinstance(target, str | StoreURL):
        return False
    m = _SCHEME.match(str(target))
    return m is not None and m.group(1).lower() != "file"


def location(target: str | os.PathLike[str] | StoreURL) -> Path | StoreURL:
    """A store's location: a :class:`StoreURL` for a URL, else the local path (``~`` expanded, made
    absolute; ``file:///path`` and ``file://localhost/path`` are local paths, ``file://other/path`` is refused)."""
    if isinstance(target, StoreURL):
        return target
    text = os.fspath(target)
    if is_url(text):
        return StoreURL.parse(text)
    if isinstance(text, str) and text.lower().startswith("file://"):
        # file://HOST/path: the host was dropped, so file://~/t.zarr and file://data/t.zarr named /t.zarr
        host, _, path = text[len("file://") :].partition("/")
        if host not in ("", "localhost"):
            raise StoreError(
                f"{text!r} names the host {host!r}: a file:// URL's path starts at its third slash",
                hint=f"write the path itself ({unquote(f'{host}/{path}')!r}) or file:///absolute/path.",
            )
        text = unquote(f"/{path}")  # '?' and '#' are part of the name, as fsspec reads them
    return Path(text).expanduser().absolute()


@dataclass(frozen=True)
class StoreURL:
    """A location in an object store: ``url`` is ``scheme://bucket/key...`` without a trailing slash."""

    url: str

    @classmethod
    def parse(cls, text: str) -> StoreURL:
        """The URL ``text``, checked and normalised (no trailing slash, no empty parts)."""
        m = _SCHEME.match(text)
        if m is None:
            raise StoreError(
                f"{shown(text)!r} is not a URL", hint="write it as scheme://bucket/path, e.g. s3://b/t.zarr."
            )
        after = text[m.end() :]
        if _password(text) is not None:
            # user:password@: messages, reports and the output's `source` would show it
            raise StoreError(
                f"{shown(text)!r} holds a password: tsconv takes no credentials in a URL",
                hint="remove them from the URL and give them as the filesystem reads them: the environment "
                "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, for s3://) or fsspec's configuration.",
            )
        if "?" in after:
            # a token or signature (?sig=..., ?X-Amz-...) or an option (?versionId=...): it would be printed
            # and recorded, and the store's objects are other URLs, below the path, that it cannot follow to
            raise StoreError(
                f"{shown(text)!r} holds a query (?...): tsconv reads a store's objects below the URL's path "
                "and takes no query",
                hint="remove it; give credentials as the filesystem reads them (the environment or fsspec's "
                "configuration).",
            )
        rest = "/".join(p for p in after.split("/") if p not in ("", "."))
        if ".." in rest.split("/"):
            raise StoreError(f"{shown(text)!r}: '..' is not allowed in a store URL")
        if not rest:
            raise StoreError(f"{shown(text)!r} names no bucket", hint="write it as scheme://bucket/path.")
        return cls(f"{m.group(1).lower()}://{rest}")

    def __str__(self) -> str:
        return self.url

    @property
    def protocol(self) -> str:
        return self.url.split("://", 1)[0]

    @property
    def key(self) -> str:
        """Everything after ``scheme://``: ``bucket/path``."""
        return self.url.split("://", 1)[1]

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> StoreURL:
        head = self.key.rsplit("/", 1)[0] if "/" in self.key else self.key
        return StoreURL(f"{self.protocol}://{head}")

    def child(self, key: str) -> StoreURL:
        """The location ``key`` (``a/b``) below this one."""
        return StoreURL.parse(f"{self.url}/{key}")

    def with_name(self, name: str) -> StoreURL:
        return self.parent.child(name)

    @property
    def canonical(self) -> str:
        """The URL with its scheme's alias resolved (``s3a://b/k`` is ``s3://b/k``): for comparing locations."""
        return f"{_ALIASES.get(self.protocol, self.protocol)}://{self.key}"

    def is_relative_to(self, other: Path | StoreURL) -> bool:
        """Whether this location is ``other`` or lies inside it, through scheme aliases (never for a local
        path)."""
        if not isinstance(other, StoreURL):
            return False
        a, b = self.canonical, other.canonical
        return a == b or a.startswith(b + "/")

    # -- the filesystem --------------------------------------------------------------------------

    def filesystem(self) -> tuple[Any, str]:
        """(the fsspec filesystem, this location's path in it); fsspec keeps one instance per set of options."""
        try:
            import fsspec

            fs, path = fsspec.url_to_fs(self.url)
        except Exception as exc:
            raise remote_error(exc, self, "open") from None
        return fs, path.rstrip("/")

    def zarr_store(self, *, read_only: bool) -> Any:
        """zarr's store at this location (``FsspecStore``; fsspec's asynchronous filesystem)."""
        from zarr.storage import FsspecStore

        try:
            return FsspecStore.from_url(self.url, read_only=read_only)
        except Exception as exc:
            raise remote_error(exc, self, "open") from None

    def read_bytes(self, key: str = "") -> bytes | None:
        """The object at ``key`` below this location (``""``: this one), or None when there is none."""
        fs, path = self.filesystem()
        try:
            return fs.cat_file(f"{path}/{key}" if key else path)
        except FileNotFoundError:
            return None

    def write_bytes(self, key: str, data: bytes) -> None:
        """Store ``data`` as the object ``key`` below this location: one PUT, which readers see whole or not
        at all."""
        fs, path = self.filesystem()
        fs.pipe_file(f"{path}/{key}" if key else path, data)

    def objects(self, *, limit: int | None = None) -> list[str]:
        """Keys of the objects below this location, relative to it (sorted; at most ``limit``)."""
        fs, path = self.filesystem()
        try:
            found = fs.find(path, maxdepth=None, withdirs=False)
        except FileNotFoundError:
            return []
        keys = sorted(p[len(path) + 1 :] for p in found if p.startswith(path + "/"))
        return keys[:limit] if limit is not None else keys

    def children(self) -> list[str]:
        """Names directly below this location (objects and prefixes): one listing request, not cached."""
        fs, path = self.filesystem()
        try:
            found = fs.ls(path, detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in found if p.rstrip("/") != path)

    def exists(self) -> bool:
        """Whether an object or objects below it are at this location."""
        fs, path = self.filesystem()
        return bool(fs.exists(path))

    def is_file(self) -> bool:
        """Whether one object (not a prefix) is at this location."""
        fs, path = self.filesystem()
        try:
            return bool(fs.isfile(path))
        except FileNotFoundError:
            return False

    def missing(self, what: str) -> StoreError:
        """The error for a store that is not at this location: the bucket is missing, or the store."""
        fs, path = self.filesystem()
        bucket = path.split("/", 1)[0]
        # a bucket where the filesystem's path is bucket/key (s3, gs, az); http's path is the whole URL
        if bucket and "/" in path and path == self.key:
            try:
                bucket_there = bool(fs.exists(bucket))
            except Exception:
                bucket_there = True  # say what is known for sure: the store is not there
            if not bucket_there:
                return StoreError(
                    f"{what} {self.url!r}: the bucket {bucket!r} does not exist",
                    hint="check the bucket's name, and the endpoint (AWS_ENDPOINT_URL) and region it is in.",
                )
        return StoreError(f"{what} {self.url!r} does not exist", hint="check the URL.")


def _password(text: str) -> tuple[int, int] | None:
    """Where the password of ``scheme://user:password@host/...`` lies in ``text`` (start, end), or None. The
    password may hold an unencoded ``/`` (AWS secret keys do); ``host:8080/a@b`` is a port, not a password."""
    m = _SCHEME.match(text)
    if m is None:
        return None
    before, at, _ = text[m.end() :].partition("@")
    first = before.split("/", 1)[0]
    if not at or ":" not in first or ("/" in before and first.rpartition(":")[2].isdigit()):
        return None
    start = m.end() + first.index(":") + 1
    return start, m.end() + len(before)


def shown(text: object) -> str:
    """``text`` (a location as given) as messages may show it: a URL's password (``user:***@``) and query
    (``?***``) masked."""
    text = str(text)
    if (span := _password(text)) is not None:
        text = f"{text[: span[0]]}***{text[span[1] :]}"
    if _SCHEME.match(text) and "?" in text:
        text = text.partition("?")[0] + "?***"
    return text


def overlaps(a: Path | StoreURL, b: Path | StoreURL) -> bool:
    """Whether one location is the other or lies inside it (a local path never overlaps a URL); local
    paths are compared resolved."""
    if isinstance(a, StoreURL) or isinstance(b, StoreURL):
        return (
            isinstance(a, StoreURL)
            and isinstance(b, StoreURL)
            and (a.is_relative_to(b) or b.is_relative_to(a))
        )
    a, b = a.resolve(), b.resolve()
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def hierarchy_root(loc: Path | StoreURL) -> Path | StoreURL:
    """The outermost zarr hierarchy holding a store or array (``ticks.zarr/px`` is an array inside
    ``ticks.zarr``: tsconv writes among neither's files); a local path resolved."""
    if isinstance(loc, StoreURL):
        root = loc
        while "/" in root.key and _zarr_group_at(root.parent):
            root = root.parent
        return root
    root = Path(loc).resolve()
    while any((root.parent / marker).is_file() for marker in ("zarr.json", ".zgroup")):
        root = root.parent
    return root


def _zarr_group_at(url: StoreURL) -> bool:
    """Whether a zarr group's metadata is at ``url`` (False where it cannot be read: a prefix the credentials
    do not reach holds nothing tsconv writes among)."""
    try:
        return any(url.child(marker).is_file() for marker in ("zarr.json", ".zgroup"))
    except Exception:  # noqa: BLE001 - any filesystem error: not known to be a group
        return False


def refuse_inside(file: Path, stores: list[tuple[str, Any]], *, flag: str) -> None:
    """Refuse ``file`` (what ``flag`` names) inside any of ``stores``, (what, location) pairs: tsconv never
    writes among a store's files. A store named as ``file://`` or with ``~`` is the local store the run reads;
    one at another URL holds no local file; one whose location cannot be read is skipped."""
    target = file.resolve()
    for what, where in stores:
        try:
            loc = location(where)
        except StoreError:
            continue
        if not isinstance(loc, Path):
            continue
        root = hierarchy_root(loc)
        if target == root or root in target.parents:
            raise TsconvError(
                f"{flag} {str(file)!r} lies inside the {what} {str(root)!r}: tsconv never writes among a "
                "store's files",
                hint="write the file outside the stores, e.g. beside them.",
            )


def open_zarr(loc: Path | StoreURL, *, mode: str = "r") -> Any:
    """``zarr.open`` of the node at a local path or URL; a group from its arrays' own metadata, not a
    consolidated copy (rows appended by zarr without consolidating again would stay unseen)."""
    import zarr

    if isinstance(loc, StoreURL):
        return zarr.open(store=loc.zarr_store(read_only=mode == "r"), mode=mode, use_consolidated=False)
    return zarr.open(str(loc), mode=mode, use_consolidated=False)


def open_group(loc: Path | StoreURL, *, mode: str, use_consolidated: bool | None = None) -> Any:
    """``zarr.open_group`` of the group at a local path or URL."""
    import zarr

    if isinstance(loc, StoreURL):
        store = loc.zarr_store(read_only=mode == "r")
        return zarr.open_group(store=store, mode=mode, use_consolidated=use_consolidated)
    return zarr.open_group(str(loc), mode=mode, use_consolidated=use_consolidated)


def remote_error(exc: BaseException, url: StoreURL, doing: str) -> StoreError:
    """A user's error for ``exc``, raised while trying to ``doing`` (e.g. "open") the store at ``url``."""
    if isinstance(exc, StoreError):  # said already (the filesystem's own error, made one by filesystem())
        return exc
    name = type(exc).__name__
    text = str(exc) or name
    if isinstance(exc, ImportError):
        extra = _EXTRAS.get(url.protocol)
        hint = (
            f"install it: pip install 'tsconv-features[{extra}]'"
            if extra
            else "install the fsspec filesystem package for this scheme (the message names it)."
        )
        return StoreError(f"cannot {doing} {url.url!r}: {url.protocol}:// needs a package: {text}", hint=hint)
    if isinstance(exc, ValueError) and "protocol" in text.lower():
        return StoreError(
            f"cannot {doing} {url.url!r}: fsspec knows no scheme {url.protocol!r}",
            hint="use a local path, or a scheme fsspec knows (s3://, gs://, az://, memory://, ...).",
        )
    if name == "NoCredentialsError" or (
        "credentials" in text.lower() and not isinstance(exc, PermissionError)
    ):
        return StoreError(
            f"cannot {doing} {url.url!r}: no credentials found ({text})",
            hint="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment.",
        )
    if isinstance(exc, PermissionError) or (name == "ClientError" and "denied" in text.lower()):
        return StoreError(
            f"cannot {doing} {url.url!r}: access denied ({text})",
            hint="check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE) and the bucket's "
            "permissions.",
        )
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ConnectionError"):
        return StoreError(
            f"cannot {doing} {url.url!r}: the endpoint cannot be reached ({text})",
            hint="check AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3) and the network.",
        )
    if isinstance(exc, FileNotFoundError):
        return url.missing(f"cannot {doing}")
    return StoreError(f"cannot {doing} {url.url!r}: {name}: {text}")
