"""Where a benchmark figure comes from: the commit and the machine, recorded beside every result.

A helper the scripts import (it measures nothing); ``python benchmarks/provenance.py`` prints both as JSON.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    """``TSCONV_COMMIT`` if set (the GPU machine's copy of the tree may carry stale git metadata), else HEAD."""
    if os.environ.get("TSCONV_COMMIT"):
        return os.environ["TSCONV_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def machine() -> dict:
    """CPU model, cores, RAM and Python version of this machine."""
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        cpu = platform.processor()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(mem / 2**30, 1), "python": platform.python_version()}  # fmt: skip


if __name__ == "__main__":
    import json

    print(json.dumps({"commit": commit(), **machine()}))
