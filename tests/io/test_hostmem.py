"""tsconv.io.hostmem: results in 4 KB pages on a VM whose host takes back free memory, numpy's pages elsewhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tsconv import config
from tsconv.io import hostmem


def _balloon(root: Path, features: str) -> Path:
    (root / "virtio3").mkdir(parents=True)
    (root / "virtio3" / "features").write_text(features + "\n")
    return root


def test_a_balloon_that_reports_free_pages_is_told_apart(tmp_path: Path) -> None:
    bits = "0110010100000000000000000000000010000000"  # this VM's balloon: bit 5 (free-page reporting) set
    assert hostmem.host_reclaims_free_memory(_balloon(tmp_path / "a", bits))
    assert not hostmem.host_reclaims_free_memory(_balloon(tmp_path / "b", bits[:5] + "0" + bits[6:]))
    assert not hostmem.host_reclaims_free_memory(tmp_path / "no-balloon")


def test_the_setting_decides_and_auto_follows_the_machine() -> None:
    with config.override(huge_pages="off"):
        assert hostmem.small_pages()
    with config.override(huge_pages="on"):
        assert not hostmem.small_pages()
    with config.override(huge_pages="auto"):
        assert hostmem.small_pages() == (
            sys.platform.startswith("linux") and hostmem.host_reclaims_free_memory()
        )


_CHECK = """
import numpy as np
from pathlib import Path
from tsconv import config
from tsconv.io import hostmem

def huge_kb(a):  # AnonHugePages of the mappings over a's bytes
    start, stop = a.ctypes.data, a.ctypes.data + a.nbytes
    inside, huge = False, 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo < stop and start < hi
        elif inside and line.startswith("AnonHugePages:"):
            huge += int(line.split()[1])
    return huge

with config.override(huge_pages="on"):  # numpy's own advice: huge pages where the kernel grants them
    b = hostmem.empty((4096, 1024), np.float32)  # 16 MB
b.fill(1.0)
with config.override(huge_pages="off"):
    a = hostmem.empty((4096, 1024), np.float32)
a.fill(1.0)
assert a.shape == (4096, 1024) and a.dtype == np.float32 and (a == 1.0).all()
print(huge_kb(b), huge_kb(a))
"""


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
def test_results_off_huge_pages_are_faulted_in_small_pages() -> None:
    """In a fresh process, where a 16 MB array is a fresh mapping (a long-running one may hand out memory that
    earlier arrays already faulted in)."""
    p = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    numpys, ours = (int(v) for v in p.stdout.split())
    if numpys == 0:
        pytest.skip("the kernel grants no huge page to numpy's advice here: nothing to tell apart")
    assert ours == 0
