"""The settings object: read from the environment in one place, one boolean parser, overridable in code."""

from __future__ import annotations

import ast
import re
import threading
from dataclasses import fields
from pathlib import Path

import pytest

import tsconv
from tsconv import config
from tsconv.errors import TsconvError

ROOT = Path(tsconv.__file__).parent
README = ROOT.parent / "README.md"


@pytest.mark.parametrize(("text", "value"), [("1", True), ("true", True), ("YES", True), ("on", True),
                                             ("0", False), ("False", False), ("no", False), (" off ", False)])  # fmt: skip
def test_every_boolean_reads_the_same_words(text, value):
    s = config.from_env({"TSCONV_MMAP": text, "TSCONV_CUDA_GRAPH": text, "TSCONV_AUTOTUNE": text})
    assert s.mmap is value and s.cuda_graph is value and s.autotune is value


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"TSCONV_MMAP": "maybe"}, "TSCONV_MMAP must be a boolean, got 'maybe'"),
        ({"TSCONV_DECODE_THREADS": "many"}, "TSCONV_DECODE_THREADS must be a whole number"),
        ({"TSCONV_HEAD_PATH": "cudnn"}, "TSCONV_HEAD_PATH must be one of unfused, gemm, fused, auto"),
        ({"TSCONV_ENGINE": "fast"}, "TSCONV_ENGINE must be one of auto, chunked, batched"),
    ],
)
def test_a_bad_value_is_an_error_naming_the_variable(env, match):
    with pytest.raises(TsconvError, match=match):
        config.from_env(env)


def test_defaults_and_values():
    s = config.from_env({})
    assert s == config.Settings()
    assert not s.autotune and s.mmap and s.cuda_graph and s.native_read and s.empty_cache
    assert s.head_path == "gemm" and s.engine == "auto" and s.decode_threads is None
    s = config.from_env(
        {"TSCONV_DECODE_THREADS": "3", "TSCONV_CACHE_DIR": "~/x", "CC": "clang", "TSCONV_MMAP": ""}
    )
    assert (
        s.decode_threads == 3 and s.cache_dir == Path("~/x").expanduser() and s.compiler == "clang" and s.mmap
    )


def test_the_environment_is_read_when_the_settings_are_and_never_at_import(monkeypatch):
    monkeypatch.setenv("TSCONV_WRITE_THREADS", "5")
    assert config.current().write_threads == 5
    monkeypatch.setenv("TSCONV_WRITE_THREADS", "2")
    assert config.current().write_threads == 2


def test_override_replaces_settings_process_wide_and_nests(monkeypatch):
    monkeypatch.setenv("TSCONV_DECODE_THREADS", "7")
    seen = []
    with config.override(decode_threads=2, mmap=False) as s:
        assert s is config.current() and s.decode_threads == 2 and not s.mmap
        t = threading.Thread(target=lambda: seen.append(config.current().decode_threads))
        t.start()
        t.join()
        with config.override(mmap=True):
            assert config.current().mmap and config.current().decode_threads == 2
        assert not config.current().mmap
    assert seen == [2]  # the engine's threads see it too
    assert config.current().decode_threads == 7 and config.current().mmap


def test_an_inner_override_equal_to_an_outer_one_gives_back_the_block_it_is_in():
    # the block that ended took the first equal settings off the stack, the outer block's: inside the
    # middle block decode_threads was 4 again, not its 2
    with config.override(decode_threads=4):
        with config.override(decode_threads=2):
            with config.override(decode_threads=4):
                assert config.current().decode_threads == 4
            assert config.current().decode_threads == 2
        assert config.current().decode_threads == 4


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"threads": 2}, "unknown setting 'threads'"),
        ({"mmap": "no"}, "setting mmap must be bool"),
        ({"head_path": "cudnn"}, "setting head_path must be unfused, gemm, fused, auto"),
        ({"decode_threads": -1}, "setting decode_threads must be int"),
    ],
)
def test_override_checks_names_and_values(changes, match):
    with pytest.raises(TsconvError, match=match), config.override(**changes):
        pass


def _environment_reads(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                lines.append(node.lineno)
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(a.name in ("environ", "getenv") for a in node.names):
                lines.append(node.lineno)
    return lines


def test_nothing_but_config_reads_the_environment():
    found = {
        str(p.relative_to(ROOT.parent)): lines
        for p in sorted(ROOT.rglob("*.py"))
        if p.name != "config.py" and (lines := _environment_reads(p))
    }
    # the dask client starts GPU workers with CUDA_VISIBLE_DEVICES set: writing a child's environment is
    # not reading settings
    assert found == {}, f"environment reads outside tsconv/config.py: {found}"


def test_every_tsconv_variable_the_code_and_docs_name_is_a_setting():
    """An error's hint said TSCONV_GPU_DECODE=0 decodes on the CPU: that variable was removed (--decode cpu
    took its place), so following the advice changed nothing, silently."""
    known = {f.metadata["env"] for f in fields(config.Settings)}
    texts = [*sorted(ROOT.rglob("*.py")), README, ROOT.parent / "pipelines" / "README.md"]
    named = {
        (str(p.relative_to(ROOT.parent)), name)
        for p in texts
        for name in re.findall(r"\bTSCONV_[A-Z0-9_]+", p.read_text())
        if name not in known
    }
    assert named == set(), f"TSCONV_ variables named but not settings: {sorted(named)}"


def test_the_readme_settings_table_is_generated_from_the_dataclass():
    text = README.read_text()
    begin, end = (
        "<!-- settings table: generated by tsconv.config.settings_table() -->",
        "<!-- end of settings -->",
    )
    assert begin in text and end in text, "the README lacks the settings table markers"
    table = text.split(begin, 1)[1].split(end, 1)[0].strip("\n") + "\n"
    assert table == config.settings_table(), (
        "regenerate it: python -c 'import tsconv; print(tsconv.config.settings_table())'"
    )


def test_the_public_api():
    for name in ("process", "features", "Stream", "conv1d", "gemm", "conv1d_head", "load_pipeline", "open_store",
                 "iter_chunks", "ingest", "Report", "TsconvError", "TsconvWarning", "StoreError",
                 "OutputBusyError", "config"):  # fmt: skip
        assert name in tsconv.__all__ and getattr(tsconv, name) is not None
    assert tsconv.config is config
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tsconv.nope  # noqa: B018


def test_a_lock_ttl_below_one_second_is_refused():
    # TSCONV_LOCK_TTL=0 renewed an object-store lock in a busy loop (wait(ttl / 4)) and let a second
    # writer take over the live lock
    with pytest.raises(TsconvError, match="TSCONV_LOCK_TTL must be a whole number from 1 to 604800, got '0'"):
        config.from_env({"TSCONV_LOCK_TTL": "0"})
    with (
        pytest.raises(TsconvError, match="setting lock_ttl must be int >= 1, got 0"),
        config.override(lock_ttl=0),
    ):
        pass


def test_a_lock_ttl_beyond_a_week_is_refused():
    # TSCONV_LOCK_TTL=100000000000 was taken: the object-store lock's renewal thread died on its first wait
    # (OverflowError: wait(ttl / 4) past threading.TIMEOUT_MAX), a traceback in the middle of the run
    with pytest.raises(
        TsconvError, match="TSCONV_LOCK_TTL must be a whole number from 1 to 604800, got '1000"
    ):
        config.from_env({"TSCONV_LOCK_TTL": "100000000000"})
    assert config.from_env({"TSCONV_LOCK_TTL": "604800"}).lock_ttl == 604_800
    with (
        pytest.raises(TsconvError, match="setting lock_ttl must be int <= 604800, got 100000000000"),
        config.override(lock_ttl=10**11),
    ):
        pass
    assert config.from_env({"TSCONV_LOCK_TTL": "1"}).lock_ttl == 1


def test_an_override_reads_choices_and_paths_as_the_environment_does():
    # TSCONV_HEAD_PATH=GEMM was taken and override(head_path="GEMM") refused; override(cache_dir="") gave Path('.'),
    # the current directory, where TSCONV_CACHE_DIR='' means the default
    with config.override(head_path="GEMM") as s:
        assert s.head_path == "gemm"
    with pytest.raises(TsconvError, match="setting cache_dir must be a path, got ''"):
        with config.override(cache_dir=""):
            pass
