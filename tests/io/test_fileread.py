"""The native batch file reader (tsconv.io.readers.fileread): files read into place, and what happens when it
cannot be built."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tsconv import native
from tsconv.io.readers import fileread


@pytest.fixture
def reloaded() -> Iterator[None]:
    """The library loaded again at its next use, as by a new process, and again after the test."""
    fileread.LIBRARY.forget()
    yield
    fileread.LIBRARY.forget()


def test_the_native_reader_reads_files_into_place(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("TSCONV_NATIVE_READ", raising=False)
    nr = fileread.native_reader()
    if nr is None:
        pytest.skip(f"no native reader here: {fileread.unavailable_reason()}")
    rng = np.random.default_rng(0)
    blobs = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (0, 1, 4097, 70000, 3)]
    paths = []
    for i, blob in enumerate(blobs):
        (tmp_path / f"f{i}").write_bytes(blob)
        paths.append(os.fsencode(tmp_path / f"f{i}"))
    paths.append(os.fsencode(tmp_path / "missing"))
    sizes = np.array([len(b) for b in blobs] + [8])
    sizes[4] = 10  # asks for more than the file holds: reads what is there
    offsets = np.concatenate([[0], np.cumsum(sizes[:-1] + 5)])
    for threads, part in [(3, 1 << 20), (1, 1 << 20), (4, 1000), (8, 4096), (2, 1)]:  # parts: whole or cut
        buf = np.full(int(offsets[-1] + 16), 0xEE, dtype=np.uint8)
        status = nr.read(paths, buf.ctypes.data, offsets, sizes, threads=threads, part=part)
        assert status.tolist() == [0, 1, 4097, 70000, 3, -2]
        for i, blob in enumerate(blobs):
            assert buf[offsets[i] : offsets[i] + len(blob)].tobytes() == blob
            assert (buf[offsets[i] + len(blob) : offsets[i] + len(blob) + 5] == 0xEE).all()  # nothing past it
    monkeypatch.setenv("TSCONV_NATIVE_READ", "0")
    assert (
        fileread.native_reader() is None and fileread.unavailable_reason() == "the native_read setting is off"
    )


@pytest.mark.parametrize("how", ["no compiler", "compiler fails"])
def test_without_a_working_compiler_the_reader_says_why(tmp_path: Path, monkeypatch, how, reloaded) -> None:
    monkeypatch.delenv("TSCONV_NATIVE_READ", raising=False)
    monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path / "cache"))  # nothing built there yet
    if how == "no compiler":
        monkeypatch.delenv("CC", raising=False)
        monkeypatch.setattr(native.shutil, "which", lambda name: None)
        want = "no C compiler"
    else:
        monkeypatch.setenv("CC", "false")  # runs, fails
        want = "false failed on fileread.c"
    assert fileread.native_reader() is None
    assert want in fileread.unavailable_reason()
    assert not list((tmp_path / "cache").glob("*.so"))  # no half-built library left behind


def test_the_library_is_built_once_into_the_cache(tmp_path: Path, monkeypatch, reloaded, caplog) -> None:
    monkeypatch.delenv("TSCONV_NATIVE_READ", raising=False)
    monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path))
    if fileread.native_reader() is None:
        pytest.skip(f"no native reader here: {fileread.unavailable_reason()}")
    built = list(tmp_path.glob("fileread-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    said = [r.getMessage() for r in caplog.records if r.name == "tsconv.native"]
    assert len(said) == 1 and said[0].startswith("compiling tsconv's fileread.c for this machine (once")
    fileread.LIBRARY.forget()  # a new process: loads, does not rebuild, says nothing
    assert fileread.native_reader() is not None
    assert built[0].stat().st_mtime_ns == stamp
    assert len([r for r in caplog.records if r.name == "tsconv.native"]) == 1


_LOAD = "from tsconv.io.readers import fileread; print(fileread.native_reader() is not None)"


@pytest.mark.parametrize("damage", ["cut short", "emptied"])
def test_a_damaged_cached_library_is_built_again(tmp_path: Path, monkeypatch, reloaded, damage) -> None:
    """A cached library cut short (a crash before its data reached the disk, a copy of the cache broken off)
    killed every later process with SIGBUS as it was loaded (dlopen maps pages past the file's end); an
    emptied one was refused, with a warning, by every later process and never built again. Both are built
    again, once, and loaded (in a fresh process: a SIGBUS would end this one)."""
    monkeypatch.delenv("TSCONV_NATIVE_READ", raising=False)
    monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path))
    if fileread.native_reader() is None:
        pytest.skip(f"no native reader here: {fileread.unavailable_reason()}")
    (lib,) = tmp_path.glob("fileread-*.so")
    whole = lib.stat().st_size
    # the damaged bytes take the cached name by a rename: truncating the file in place would cut the pages
    # this process has mapped, and its exit died with SIGBUS
    broken = tmp_path / "broken.tmp"
    broken.write_bytes(lib.read_bytes()[: whole // 2] if damage == "cut short" else b"")
    os.replace(broken, lib)
    for said in (1, 0):  # built again and said once; then loaded as it is, quietly
        done = subprocess.run([sys.executable, "-c", _LOAD], capture_output=True, text=True, timeout=300)
        assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stderr
        assert len(done.stderr.splitlines()) == said, done.stderr
        assert "compiling tsconv's fileread.c again" in done.stderr or not said
        assert lib.stat().st_size == whole


@pytest.mark.parametrize("other", ["C library", "compiler command"])
def test_a_library_another_host_or_compiler_built_is_not_taken(
    tmp_path: Path, monkeypatch, reloaded, other
) -> None:
    """A cache directory shared by hosts of other C libraries (a home directory on NFS: a library built where
    glibc is 2.34 or later asks for pthread_create@GLIBC_2.34, which an older glibc lacks) or by another
    compiler command (CC='gcc -m32', a cross compiler) took the other's library under the same name: this
    host refused it on every run, with a warning, and never built its own. Each keeps a library of its own."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler here")
    monkeypatch.delenv("TSCONV_NATIVE_READ", raising=False)
    monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", cc)
    src = Path(fileread.__file__).with_name("fileread.c")
    with monkeypatch.context() as there:  # the other host, or the other compiler command
        if other == "C library":
            there.setattr(native.platform, "libc_ver", lambda *a, **kw: ("glibc", "9.99"))
        else:
            there.setenv("CC", f"{cc} -g")  # stands for one that builds what this host cannot load
        assert native.build_library(src, flags=fileread.LIBRARY.flags)[0] is not None
        # what it built loads there, not here: a library linked to one this host lacks stands in for it
        (theirs,) = (tmp_path / "cache").glob("fileread-*.so")
        (tmp_path / "dep.c").write_text("int tsconv_test_dep(void) { return 1; }\n")
        subprocess.run(
            [cc, "-shared", "-fPIC", "-o", tmp_path / "libtsdep.so", tmp_path / "dep.c"], check=True
        )
        subprocess.run(
            [cc, "-shared", "-fPIC", "-o", tmp_path / "foreign.so", src, "-pthread", "-L", tmp_path,
             "-Wl,--no-as-needed", "-ltsdep"],
            check=True,
        )  # fmt: skip
        os.replace(tmp_path / "foreign.so", theirs)
    assert fileread.native_reader() is not None, fileread.unavailable_reason()
    assert len(list((tmp_path / "cache").glob("fileread-*.so"))) == 2


def test_a_built_library_has_the_modes_the_umask_gives(tmp_path: Path, monkeypatch, reloaded) -> None:
    """A library is built as the compiler makes its outputs (rwxr-xr-x under umask 022), so another user of a
    shared cache directory loads it: built into a mkstemp file it stayed rwx--x--x, which no one else could
    read, load or build again (the file was there)."""
    monkeypatch.delenv("TSCONV_NATIVE_READ", raising=False)
    monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path))
    umask = os.umask(0o022)
    try:
        if fileread.native_reader() is None:
            pytest.skip(f"no native reader here: {fileread.unavailable_reason()}")
    finally:
        os.umask(umask)
    (lib,) = tmp_path.glob("fileread-*.so")
    assert oct(lib.stat().st_mode & 0o777) == oct(0o755)
    assert [p.name for p in tmp_path.iterdir()] == [lib.name]  # nothing else left behind


def test_a_compiler_setting_with_arguments_is_a_command(tmp_path: Path, monkeypatch, reloaded) -> None:
    """CC names a command with its arguments, as make and setuptools read it ("ccache gcc", "gcc -m64"):
    it was run as one program name, not found, and the reader fell back to Python with a warning."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler here")
    monkeypatch.delenv("TSCONV_NATIVE_READ", raising=False)
    monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", f"{cc} -Wall")
    assert fileread.native_reader() is not None, fileread.unavailable_reason()
