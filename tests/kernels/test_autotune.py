"""The tuner's choice without a GPU: cached winners (the user's, then the shipped ones), the default when
tuning is off, and one log line when it tunes. CUDA is faked: only the device's name and the timing are."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

from tsconv.kernels import autotune

SPACE = autotune.ConfigSpace(
    "toy",
    (autotune.Config("a", {"B": 16}), autotune.Config("b", {"B": 32}), autotune.Config("c", {"B": 64})),
    default=autotune.Config("a", {"B": 16}),
    interpreter=autotune.Config("a", {"B": 16}),
)
CUDA = torch.device("cuda", 0)


@pytest.fixture
def fake_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """A CUDA device named "Fake GPU", the user's cache and the shipped folder under tmp_path, and a tuner
    that records what it would time and picks "c"."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path / "user"))
    monkeypatch.setattr(autotune, "SHIPPED", tmp_path / "shipped")
    timed: list[str] = []

    def tune(space, bench, device, **kw):  # noqa: ANN001, ANN003, ANN202
        timed.extend(c.name for c in space.configs)
        return space.by_name("c"), {
            "config": "c",
            "tune_s": 0.0,
            "timings_ms": {"a": 3.0, "b": 2.0, "c": 1.0},
        }

    monkeypatch.setattr(autotune, "_tune", tune)
    autotune.clear_memory_cache()
    yield {"timed": timed}
    autotune.clear_memory_cache()


def _ship(folder: Path, key: str, cfg: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    full = f"toy|{key}|triton={triton.__version__}"
    doc = {"schema": 1, "gpu": "Fake GPU", "entries": {full: {"config": cfg}}}
    (folder / "autotune-Fake_GPU.json").write_text(json.dumps(doc))


def _never(cfg: autotune.Config) -> None:
    raise AssertionError("bench called")


def test_off_a_shipped_winner_is_used_without_timing(fake_gpu, tmp_path: Path) -> None:
    _ship(tmp_path / "shipped", "k=1", "b")
    assert autotune.select(SPACE, "k=1", _never, device=CUDA).name == "b"
    assert autotune.events()[-1].source == "shipped"
    assert fake_gpu["timed"] == [] and not (tmp_path / "user").exists()


def test_off_a_new_shape_class_takes_the_default_at_once(fake_gpu, tmp_path: Path) -> None:
    _ship(tmp_path / "shipped", "k=1", "b")
    assert autotune.select(SPACE, "k=2", _never, device=CUDA) == SPACE.default
    assert autotune.events()[-1].source == "default"
    assert fake_gpu["timed"] == [] and not (tmp_path / "user").exists()


def test_the_users_winner_comes_before_the_shipped_one(fake_gpu, tmp_path: Path) -> None:
    _ship(tmp_path / "shipped", "k=1", "b")
    _ship(tmp_path / "user", "k=1", "c")
    assert autotune.select(SPACE, "k=1", _never, device=CUDA).name == "c"
    assert autotune.events()[-1].source == "disk"


def test_on_a_new_shape_class_is_tuned_once_and_says_so(
    fake_gpu, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TSCONV_AUTOTUNE", "1")
    with caplog.at_level(logging.WARNING, logger="tsconv.autotune"):
        assert autotune.select(SPACE, "k=3", _never, device=CUDA).name == "c"
    lines = [r.getMessage() for r in caplog.records if r.name == "tsconv.autotune"]
    assert len(lines) == 1 and "tuning toy for a new shape class (3 candidates" in lines[0]
    assert fake_gpu["timed"] == ["a", "b", "c"]
    saved = json.loads((tmp_path / "user" / "autotune-Fake_GPU.json").read_text())["entries"]
    assert [v["config"] for v in saved.values()] == ["c"]
    autotune.clear_memory_cache()  # a later process reads the user's cache: no second tuning
    assert autotune.select(SPACE, "k=3", _never, device=CUDA).name == "c"
    assert fake_gpu["timed"] == ["a", "b", "c"]


def test_on_a_shipped_winner_is_tuned_again_on_this_machine(
    fake_gpu, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TSCONV_AUTOTUNE", "1")
    _ship(tmp_path / "shipped", "k=1", "b")
    assert autotune.select(SPACE, "k=1", _never, device=CUDA).name == "c"
    assert fake_gpu["timed"] == ["a", "b", "c"] and autotune.events()[-1].source == "tuned"


def test_the_shipped_cache_is_in_the_package_and_readable() -> None:
    files = sorted(autotune.SHIPPED.glob("autotune-*.json"))
    assert files, "no shipped tuning cache"
    for f in files:
        doc = json.loads(f.read_text())
        assert doc["schema"] == 1 and doc["entries"], f
        assert all("|triton=" in k and "config" in v for k, v in doc["entries"].items())


def test_the_tuning_cache_file_has_the_modes_the_umask_gives(tmp_path: Path) -> None:
    # mkstemp's 0600 stayed: another user of a shared cache directory read "unreadable autotune cache"
    path = tmp_path / "autotune-GPU.json"
    old = os.umask(0o022)
    try:
        autotune._umask.cache_clear()
        autotune._write_file(path, "GPU", "k", {"config": "c"})
    finally:
        os.umask(old)
        autotune._umask.cache_clear()
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert json.loads(path.read_text())["entries"] == {"k": {"config": "c"}}


_WRITER = """
import os, sys, time
from pathlib import Path
from tsconv.kernels import autotune
path, go, me = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
print("ready", flush=True)
while not go.exists():
    time.sleep(0.001)
for i in range(400):
    autotune._write_file(path, "GPU", f"{me}-{i}", {"config": "c"})
"""


def test_two_processes_writing_the_cache_at_once_keep_every_entry(tmp_path: Path) -> None:
    """Each writer read the file, then replaced it with what it read and its own entry: the entries the other
    process wrote in between were lost (a winner tuned for minutes, tuned again by the next run)."""
    path, go = tmp_path / "autotune-GPU.json", tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), str(go), me], stdout=subprocess.PIPE, text=True
        )
        for me in ("a", "b")
    ]
    for proc in procs:  # both imported and waiting: they write at once
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    go.touch()
    for proc in procs:
        assert proc.wait(timeout=300) == 0
    entries = json.loads(path.read_text())["entries"]
    assert sorted(entries) == sorted(f"{me}-{i}" for me in ("a", "b") for i in range(400))


def test_a_cache_file_nested_past_pythons_stack_is_ignored_and_rewritten(tmp_path: Path) -> None:
    # json.load raised RecursionError, which the unreadable-file path did not catch: a traceback at every write
    path = tmp_path / "autotune-GPU.json"
    path.write_text("[" * 200_000)
    autotune._write_file(path, "GPU", "k", {"config": "c"})
    assert json.loads(path.read_text())["entries"] == {"k": {"config": "c"}}
