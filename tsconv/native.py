"""Small C sources of the package compiled on first use with the system C compiler, cached per machine.

Used where a measured bottleneck has no library call (:mod:`tsconv.io.readers.fileread`,
:mod:`tsconv.kernels.filterbank_native`): the library goes into the user cache directory under a name that hashes
the source, the flags, the machine, its C library and the compiler command, and is loaded through ctypes
(which releases the GIL during each call). Without a compiler, or when it fails, callers get the reason and
keep their Python path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from tsconv import config

__all__ = ["NativeLibrary", "build_library", "cpu_tag", "damaged"]

log = logging.getLogger("tsconv.native")
T = TypeVar("T")


def cpu_tag() -> str:
    """The instruction-set extensions of this CPU (Linux: /proc/cpuinfo's flags), for libraries built with
    ``-march=native``: a cache directory shared by machines of different CPUs keeps one library per kind."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return hashlib.sha256(line.encode()).hexdigest()[:12]
    except OSError:
        pass
    return platform.processor() or "unknown"


def build_library(
    source: Path, *, flags: tuple[str, ...], machine: str = ""
) -> tuple[ctypes.CDLL | None, str | None]:
    """``source`` compiled as a shared library with ``flags`` (built once per source, flags and machine into
    the cache directory, and again where the cached one is damaged: :func:`damaged`) and loaded; or None and
    why not. The library's name hashes the source, the flags, the platform, its C library (glibc's version),
    ``machine`` and the ``CC`` setting."""
    text = source.read_bytes()
    # A library loads only where its C library does (one built against a newer glibc asks for symbols an older
    # one lacks) and is what its compiler command made (CC='gcc -m32', a cross compiler): a cache directory
    # shared by such hosts or commands keeps one library each, where one name made every other host refuse
    # the library, never built again, on every run.
    host = f"{sys.platform}-{platform.machine()}-{'-'.join(platform.libc_ver())}-{machine}"
    key = text + " ".join(flags).encode() + host.encode() + (config.current().compiler or "").encode()
    tag = hashlib.sha256(key).hexdigest()[:16]
    lib_path = config.cache_dir() / f"{source.stem}-{tag}.so"
    exists = lib_path.exists()
    broken = damaged(lib_path) if exists else None
    if not exists or broken is not None:
        try:  # a command with its arguments, as make and setuptools read CC ("ccache gcc", "gcc -m64")
            command = shlex.split(config.current().compiler or "")
        except ValueError as exc:
            return None, f"the CC setting {config.current().compiler!r} is no command ({exc}): fix its quotes"
        found = shutil.which("cc") or shutil.which("gcc")
        if not command and found is None:
            return None, f"no C compiler (cc) to build tsconv's {source.name}"
        command = command or [found]
        cc = " ".join(command)
        try:
            lib_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return None, f"cannot create the cache directory {str(lib_path.parent)!r}: {exc.strerror or exc}"
        # a first run on a machine pays the build (seconds): said on one line, as tuning is
        if broken is None:
            log.warning(
                "compiling tsconv's %s for this machine (once; cached in %s)", source.name, lib_path.parent
            )
        else:
            log.warning(
                "compiling tsconv's %s again: the library cached as %s %s", source.name, lib_path, broken
            )
        work = None
        try:
            # Built beside its final name and renamed in: processes building at once each install a whole file.
            # The compiler makes the file (in a folder of this build's own): its modes are the umask's, where a
            # mkstemp file it wrote into stayed rwx--x--x, which no other user of the cache could load.
            work = tempfile.mkdtemp(prefix=".build-", dir=lib_path.parent)
            tmp = os.path.join(work, lib_path.name)
            done = subprocess.run(
                [*command, *flags, "-shared", "-fPIC", "-o", tmp, str(source), "-lm"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if done.returncode != 0:
                return None, f"{cc} failed on {source.name}: {done.stderr.strip()[-300:]}"
            with open(tmp, "rb") as fh:  # on the disk before its name is: a crash leaves no library cut short
                os.fsync(fh.fileno())
            os.replace(tmp, lib_path)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"cannot build {source.name}: {type(exc).__name__}: {exc}"
        finally:
            if work is not None:  # a compiler that failed, or could not be started: no file left behind
                shutil.rmtree(work, ignore_errors=True)
    try:
        return ctypes.CDLL(str(lib_path)), None
    except OSError as exc:
        return None, f"cannot load {lib_path}: {exc}"


def damaged(path: Path) -> str | None:
    """How the library at ``path`` is damaged, or None: shorter than its ELF headers say (the segments that
    dlopen maps, the section headers the linker writes last), or, on Linux, no ELF library at all. Loading a
    library cut short (a crash before its data reached the disk, a copy of the cache broken off) ended the
    process with SIGBUS as dlopen touched pages past the file's end; the file is checked first instead."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(64)
            if head[:4] != b"\x7fELF":
                return "is no ELF library" if sys.platform.startswith("linux") else None
            wide, order = head[4:5] == b"\x02", "<" if head[5:6] == b"\x01" else ">"
            if len(head) < (64 if wide else 52):
                return f"is cut short ({size:,} bytes)"
            if wide:
                phoff, shoff = struct.unpack_from(order + "QQ", head, 0x20)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 0x36)
            else:
                phoff, shoff = struct.unpack_from(order + "II", head, 0x1C)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 0x2A)
            if phnum and phentsize < (56 if wide else 32):
                return "has damaged headers"
            end = max(phoff + phnum * phentsize, shoff + shnum * shentsize)
            fh.seek(phoff)
            table = fh.read(phnum * phentsize)
    except OSError:
        return None  # unreadable: dlopen says why
    word, at_offset, at_filesz = (order + "Q", 8, 32) if wide else (order + "I", 4, 16)
    for at in range(0, len(table) - phentsize + 1, phentsize or 1):
        if struct.unpack_from(order + "I", table, at)[0] == 1:  # PT_LOAD: mapped from the file
            (offset,), (filesz,) = (
                struct.unpack_from(word, table, at + at_offset),
                struct.unpack_from(word, table, at + at_filesz),
            )
            end = max(end, offset + filesz)
    return f"is cut short ({size:,} of {end:,} bytes)" if size < end else None


class NativeLibrary(Generic[T]):
    """A C source of the package, built (:func:`build_library`) and wrapped by ``wrap`` on first use, once
    per process and thread-safe; ``setting``: the boolean setting that turns it off."""

    def __init__(
        self,
        source: Path,
        *,
        flags: tuple[str, ...],
        wrap: Callable[[ctypes.CDLL], T],
        setting: str,
        per_cpu: bool = False,
    ) -> None:
        self.source, self.flags, self.setting = source, flags, setting
        self._wrap, self._per_cpu = wrap, per_cpu
        self._lock = threading.Lock()
        self._loaded: tuple[T | None, str | None] | None = None

    def get(self) -> tuple[T | None, str | None]:
        """(the wrapped library, None), or (None, why not: the setting off, no compiler, a failed build)."""
        if not getattr(config.current(), self.setting):
            return None, f"the {self.setting} setting is off"
        with self._lock:
            if self._loaded is None:
                self._loaded = self._load()
            return self._loaded

    def forget(self) -> None:
        """Load again at the next :meth:`get`, as a new process would (the cache directory may have changed)."""
        with self._lock:
            self._loaded = None

    def _load(self) -> tuple[T | None, str | None]:
        lib, why = build_library(self.source, flags=self.flags, machine=cpu_tag() if self._per_cpu else "")
        if lib is None:
            # once a process: the run goes on by a slower path, and the user can mend the cause
            env = "TSCONV_" + self.setting.upper()
            log.warning(
                "%s; tsconv goes on without it, more slowly (%s=0 takes that path without this warning)",
                why,
                env,
            )
            return None, why
        try:
            return self._wrap(lib), None
        except AttributeError as exc:  # a library without the expected symbol
            return None, f"cannot load {self.source.name}'s library: {exc}"
