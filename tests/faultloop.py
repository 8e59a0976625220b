"""The fault-injection loop: tsconv's CLI killed with SIGKILL at seeded points, then recovered, then compared.

Each round takes one operation (``process``, ``process --resume``, ``process --overwrite``,
``process --update``, ``ingest``, ``ingest --append``) on tiny stores, kills it right after (or right before) its n-th file-system change
(:func:`tests.io.crashpoints.install_fs`; n drawn from the round's seed, below the number of changes an
uninterrupted run makes), checks that what the kill left never reads as complete unless it is the old
or the finished data, runs the next step a user would (``--resume``, ``--overwrite`` again, ``--append``
again or ``tsconv repair``), and compares the result with an uninterrupted reference byte for byte.

Steps run as child processes of a server process that imported tsconv once and forks one child per step
(importing torch takes seconds here; a fork, milliseconds). A child is a separate process running the
CLI's ``main`` on its arguments, as ``python -m tsconv`` would, and is killed for real. ``exec=True``
starts a fresh interpreter per step instead.

Used by tests/test_faults.py (a few rounds) and benchmarks/faults.py (hundreds).
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OPS = ("process", "process --resume", "process --overwrite", "process --update", "ingest", "ingest --append")
GROWN_FROM = 2100  # rows of the grown input when its output was written; an update adds the rest (to 3000)

# Tiny stores with many changes: output chunks of one engine chunk (256 rows: 12 of a 3000-row output),
# ingest chunks of 16 rows written one per band.
CHUNK, OUT_CHUNK_ROWS = 256, 256
INGEST_CHUNK_BYTES, INGEST_BAND_BYTES = 16 * 4 * 4, 1
PIPE = '[[conv]]\nfilters = ["ma:64", "diff:32"]\n'  # halo 63: a resume reads back into the last chunk
OLD_PIPE = '[[conv]]\nfilters = ["ma:4", "diff:1"]\n'  # what the store an --overwrite replaces came from
STEP_TIMEOUT_S = 120


class StepFailed(Exception):
    """A step that was not killed exited non-zero, or gave no answer in time."""


# ------------------------------------------------------------------------------- the child's side


def _child(job: dict[str, Any]) -> int:
    """Run one CLI step as ``job`` says (in this process): the test-only sizes set, the crash point
    installed. Returns the exit code; a kill never returns."""
    import tsconv.engine.outputs
    import tsconv.io.ingest
    from tests.io import crashpoints
    from tsconv.cli import main

    tsconv.engine.outputs.output_chunk_rows = lambda chunk, n_outputs: OUT_CHUNK_ROWS
    tsconv.io.ingest._CHUNK_BYTES, tsconv.io.ingest._BAND_BYTES = INGEST_CHUNK_BYTES, INGEST_BAND_BYTES
    os.environ["TSCONV_WRITE_THREADS"] = str(job["threads"])

    def kill(what: str) -> None:
        Path(job["killed_at"]).write_text(what)
        crashpoints.kill_now()

    log, _ = crashpoints.install_fs(job["at"], kill, before=job["when"] == "before")
    try:
        main(job["argv"], prog_name="tsconv", standalone_mode=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if job["at"] >= 0 and not Path(job["killed_at"]).exists() and log:
        # The step made fewer changes than its reference run (two writer threads finishing chunks close
        # together write one progress update for both), so its kill point never came: it is killed after
        # its last change instead, a real crash point, and the round still tests a recovery.
        kill(f"exit {log[-1].split(' ', 1)[1]}")
    Path(job["changes"]).write_text(json.dumps(log))
    return code


def _serve() -> None:
    """Read one job per line on stdin, run each in a forked child, answer its exit code per line."""
    import tsconv.cli  # noqa: F401  the slow imports, once, before any fork
    import tsconv.engine.api  # noqa: F401

    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with open(job["stdout"], "wb") as out, open(job["stderr"], "wb") as err:
                    os.dup2(out.fileno(), 1)
                    os.dup2(err.fileno(), 2)
                code = _child(job)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)


class Runner:
    """Runs CLI steps in children of one server process (or, ``exec``, each in a fresh interpreter)."""

    def __init__(self, *, exec: bool = False) -> None:
        self.exec = exec
        self._server: subprocess.Popen[str] | None = None
        if not exec:
            self._start()  # its imports overlap with the caller's making the inputs

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}

    def run(self, job: dict[str, Any]) -> int:
        """The step's exit code (-9 when it was killed)."""
        if self.exec:
            try:
                with open(job["stdout"], "wb") as out, open(job["stderr"], "wb") as err:
                    proc = subprocess.run([sys.executable, "-m", "tests.faultloop", "step", json.dumps(job)],
                                          cwd=REPO, env=self._env(), stdout=out, stderr=err,
                                          timeout=STEP_TIMEOUT_S)  # fmt: skip
            except subprocess.TimeoutExpired:
                raise StepFailed(f"step {job['argv']} ran past {STEP_TIMEOUT_S} s") from None
            return proc.returncode
        if self._server is None:
            self._start()
        server = self._server
        assert server is not None and server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps(job) + "\n")
        server.stdin.flush()
        ready, _, _ = select.select([server.stdout], [], [], STEP_TIMEOUT_S)
        line = server.stdout.readline() if ready else ""
        if not line:
            self.close()
            raise StepFailed(f"step {job['argv']} gave no answer within {STEP_TIMEOUT_S} s")
        return int(json.loads(line)["rc"])

    def _start(self) -> None:
        self._server = subprocess.Popen(
            [sys.executable, "-m", "tests.faultloop", "serve"],
            cwd=REPO,
            env=self._env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def close(self) -> None:
        """Stop the server (and a child still running)."""
        if self._server is not None:
            if self._server.poll() is None:
                os.killpg(self._server.pid, signal.SIGKILL)
            self._server.wait()
            self._server = None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------------- the world


@dataclass
class World:
    """The inputs and the uninterrupted references, made once per loop under ``root``."""

    root: Path
    src: Path  # the input store of every process run
    old: Path  # a complete output of OLD_PIPE, what an --overwrite replaces
    pipe: Path
    ticks: list[Path]  # the tick files of an ingest: the first half and the second half
    base: Path  # the store of the first half, what an --append adds to
    grown: Path | None = None  # an input of GROWN_FROM rows when ``short`` was computed from it, 3000 since
    short: Path | None = None  # that output: what an --update extends
    refs: dict[str, Path] = field(default_factory=dict)  # op -> its uninterrupted result
    changes: dict[str, int] = field(default_factory=dict)  # op -> file-system changes of an uninterrupted run


def _process_argv(w: World, out: Path, *flags: str, pipe: Path | None = None, src: Path | None = None) -> list[str]:  # fmt: skip
    return ["process", "-i", str(src or w.src), "-o", str(out), "--chunk", str(CHUNK), "--pipeline",
            str(pipe or w.pipe), "--device", "cpu", "-q", *flags]  # fmt: skip


def _ingest_argv(w: World, out: Path, *flags: str) -> list[str]:
    files = [w.ticks[1]] if "--append" in flags else w.ticks
    return ["ingest", *map(str, files), "-o", str(out), "-q", *flags]


def _argv(w: World, op: str, out: Path) -> list[str]:
    name, *flags = op.split()
    if op == "process --update":
        return _process_argv(w, out, *flags, src=w.grown)
    return _process_argv(w, out, *flags) if name == "process" else _ingest_argv(w, out, *flags)


def _prices() -> np.ndarray:
    """3000 x 3 prices with NaN runs: one crossing most resume points, others short and scattered."""
    from tests.helpers import price_series

    x = price_series(3000, 3, seed=11, nan_fraction=0.002)
    x[900:1700, 0] = np.nan
    x[1500:1560, 1] = np.nan
    return x


def _tick_files(root: Path) -> list[Path]:
    """Two long-layout Parquet files: 200 timestamps of 4 features (some cells missing), split in half."""
    import polars as pl

    rng = np.random.default_rng(5)
    names = ["px_b", "px_a", "vol_a", "1234"]
    times = 1_767_346_200_000_000_000 + np.arange(200, dtype=np.int64) * 250_000_000
    t = np.repeat(times, len(names))
    f = np.tile(np.asarray(names, dtype=object), times.size).tolist()
    v = np.round(100 + rng.normal(size=t.size).cumsum() * 0.01, 2)
    keep = rng.random(t.size) >= 0.2
    df = pl.DataFrame({"time": t[keep], "feature": [n for n, k in zip(f, keep, strict=True) if k],
                       "value": v[keep]})  # fmt: skip
    paths = [root / "ticks_a.parquet", root / "ticks_b.parquet"]
    df.filter(pl.col("time") < times[100]).write_parquet(paths[0])
    df.filter(pl.col("time") >= times[100]).write_parquet(paths[1])
    return paths


def _step(runner: Runner, w: World, dir: Path, argv: list[str], *, at: int = -1, when: str = "after",
          threads: int = 0) -> tuple[int, str | None, list[str] | None]:  # fmt: skip
    """Run one CLI step: (exit code, the change it was killed at or None, its changes when it finished)."""
    n = len(list(dir.glob("step*.out")))
    files = {k: dir / f"step{n}.{k}" for k in ("out", "err", "killed", "changes")}
    job = {"argv": argv, "at": at, "when": when, "threads": threads, "stdout": str(files["out"]),
           "stderr": str(files["err"]), "killed_at": str(files["killed"]), "changes": str(files["changes"])}  # fmt: skip
    rc = runner.run(job)
    killed = files["killed"].read_text() if files["killed"].exists() else None
    changes = json.loads(files["changes"].read_text()) if files["changes"].exists() else None
    if killed is None and rc != 0:
        raise StepFailed(f"`tsconv {' '.join(argv)}` exited {rc}: {files['err'].read_text().strip()[-2000:]}")
    return rc, killed, changes


def make_world(root: Path, runner: Runner, ops: tuple[str, ...] = OPS) -> World:
    """Inputs, the old output, the ingest base, and each of ``ops``' reference with its number of changes."""
    from tests.helpers import write_store

    root.mkdir(parents=True, exist_ok=True)
    (root / "pipe.toml").write_text(PIPE)
    (root / "old_pipe.toml").write_text(OLD_PIPE)
    src = write_store(root / "in.zarr", _prices(), chunks=(500, 3))
    w = World(root=root, src=src, old=root / "old.zarr", pipe=root / "pipe.toml", ticks=_tick_files(root),
              base=root / "base.zarr")  # fmt: skip
    logs = root / "logs"
    logs.mkdir()
    _step(runner, w, logs, _process_argv(w, w.old, pipe=root / "old_pipe.toml"))
    _step(runner, w, logs, ["ingest", str(w.ticks[0]), "-o", str(w.base), "-q"])
    if "process --update" in ops:
        import zarr

        x = _prices()
        w.grown, w.short = (
            write_store(root / "grown.zarr", x[:GROWN_FROM], chunks=(500, 3)),
            root / "short.zarr",
        )
        _step(runner, w, logs, _process_argv(w, w.short, src=w.grown))
        g = zarr.open_group(str(w.grown), mode="r+")
        g["values"].resize(x.shape)
        g["values"][GROWN_FROM:] = x[GROWN_FROM:]
        t = np.asarray(zarr.open_group(str(w.src), mode="r")["time"][:])  # write_store's times
        g["time"].resize(t.shape)
        g["time"][GROWN_FROM:] = t[GROWN_FROM:]
    for op in ops:
        out = root / "refs" / op.replace(" --", "_") / ("out.zarr" if op.startswith("process") else "st.zarr")
        out.parent.mkdir(parents=True)
        _prepare(w, op, out)
        _, _, changes = _step(runner, w, logs, _argv(w, op, out))
        assert changes is not None
        w.refs[op], w.changes[op] = out, len(changes)
    return w


def _prepare(w: World, op: str, out: Path) -> None:
    """What ``out`` holds before the op: the old output for --overwrite, the output of the shorter input
    for --update, the base store for --append."""
    if op == "process --overwrite":
        shutil.copytree(w.old, out)
    elif op == "process --update":
        assert w.short is not None
        shutil.copytree(w.short, out)
    elif op == "ingest --append":
        shutil.copytree(w.base, out)


# ------------------------------------------------------------------------------------ the checks


def _read(path: Path) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The arrays (as raw bytes with dtype and shape) and attributes of a zarr store."""
    import zarr

    g = zarr.open_group(str(path), mode="r", use_consolidated=False)
    arrays = {}
    for name, a in g.arrays():
        v = np.asarray(a[:])
        arrays[name] = (
            (f"{v.dtype}{v.shape}".encode() + v.tobytes()) if v.dtype != object else repr(v.tolist()).encode()
        )
    return arrays, dict(g.attrs)


# tsconv's output metadata that must match the reference; the run_id names the run that made it
_PROCESS_META = ("version", "format", "complete", "rows", "rows_done", "chunk", "warmup", "halo",
                 "fingerprint", "input_digest")  # fmt: skip


def compare(op: str, got: Path, want: Path, *, leftovers: bool = True) -> list[str]:
    """How ``got`` differs from the reference ``want`` (empty: equal); ``leftovers``: a process output's
    lock or temporary store beside it counts as a difference (none may stay once a run has ended)."""
    if not got.exists():
        return [f"{got.name} does not exist"]
    (ga, gm), (wa, wm) = _read(got), _read(want)
    diffs = [f"array {n} differs" for n in sorted(set(ga) | set(wa)) if ga.get(n) != wa.get(n)]
    if op.startswith("process"):
        for key in ("features", "pipeline", "source"):
            if gm.get(key) != wm.get(key):
                diffs.append(f"attribute {key} differs")
        gt, wt = gm.get("tsconv", {}), wm.get("tsconv", {})
        diffs += [
            f"tsconv.{k}: {gt.get(k)!r} != {wt.get(k)!r}" for k in _PROCESS_META if gt.get(k) != wt.get(k)
        ]
        if "partitions_done" in gt:
            diffs.append("tsconv.partitions_done left in a complete output")
        digest = "values/.tsconv-input.json"
        # the fill state recorded beside it too; not the hash of the input rows kept for the next update, a
        # shortcut a run keeps only where its engine passed their first row (a resume may not)
        mine, theirs = (
            {k: v for k, v in json.loads((root / digest).read_bytes()).items() if k != "tail"}
            for root in (got, want)
        )
        if mine != theirs:
            diffs.append("the input digest differs")
        if leftovers:
            diffs += [f"left beside it: {n}" for n in _leftovers(got)]
    elif gm != wm:
        diffs.append(f"attributes differ: {gm} != {wm}")
    return diffs


def _leftovers(out: Path) -> list[str]:
    """tsconv's files beside ``out``: a lock, a store being created or deleted (none once a run ends)."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def _reads_as(op: str, out: Path, w: World) -> str:
    """What a reader sees at ``out`` after a kill: 'nothing', 'incomplete' (refused as input), 'old' or
    'new' (complete, equal to the state before the op or to the reference); raises if it reads as
    complete but is neither."""
    import tsconv
    from tsconv.errors import TsconvError

    if not out.exists():
        return "nothing"
    try:
        tsconv.open_input(out)
    except TsconvError:
        return "incomplete"
    if not compare(op, out, w.refs[op], leftovers=False):
        return "new"
    before = {"process --overwrite": w.old, "process --update": w.short, "ingest --append": w.base}.get(op)
    if before is not None and _read(out) == _read(before):
        return "old"
    raise AssertionError(f"after the kill {out} reads as complete but is neither the old data nor the new")


# ------------------------------------------------------------------------------------- the rounds


@dataclass
class Round:
    """One round's record."""

    round: int
    seed: int
    op: str
    threads: int
    steps: list[dict[str, Any]] = field(default_factory=list)
    ok: bool = False
    error: str | None = None
    leftovers: list[str] = field(default_factory=list)  # hidden entries left in the round's directory
    seconds: float = 0.0


def _kill_point(rng: np.random.Generator, changes: int) -> tuple[int, str]:
    """A change number below ``changes`` and whether the kill comes right after it or right before it."""
    return int(rng.integers(0, max(1, changes))), str(rng.choice(["after", "before"]))


def run_round(runner: Runner, w: World, k: int, seed: int, op: str | None = None) -> Round:
    """Round ``k`` of the loop seeded ``seed``: its op is ``op`` (default OPS[k % len(OPS)]), its kill points,
    threads and recovery drawn from the seed (seed, k)."""
    rng = np.random.default_rng([seed, k])
    op = op or OPS[k % len(OPS)]
    r = Round(round=k, seed=seed, op=op, threads=int(rng.choice([0, 2])))
    t0 = time.perf_counter()
    d = w.root / f"round{k}"
    d.mkdir()
    out = d / ("out.zarr" if op.startswith("process") else "st.zarr")
    _prepare(w, op, out)

    def step(argv: list[str], name: str, *, kill: str | None) -> None:
        # a step after a killed one makes about the changes the kill cut short, and a few of its own
        done = sum(s["at"] + 1 for s in r.steps if s["killed"])
        at, when = _kill_point(rng, w.changes[kill] - done + (5 if done else 0)) if kill else (-1, "after")
        rc, killed, _ = _step(runner, w, d, argv, at=at, when=when, threads=r.threads)
        r.steps.append({"step": name, "at": at if kill else None, "when": when if kill else None,
                        "killed": killed is not None, "point": killed and _point(killed), "rc": rc})  # fmt: skip
        if killed is not None:
            r.steps[-1]["left"] = "mixed"  # until _reads_as says otherwise
            r.steps[-1]["left"] = _reads_as(op, out, w)

    try:
        if op in ("process", "process --resume"):
            step(_process_argv(w, out), "process", kill=op)
            if op == "process --resume":
                step(_process_argv(w, out, "--resume"), "process --resume", kill=op)
            step(_process_argv(w, out, "--resume"), "process --resume", kill=None)
        elif op == "process --overwrite":
            step(_process_argv(w, out, "--overwrite"), op, kill=op)
            how = str(rng.choice(["overwrite", "resume"]))
            # a resume finishes the new output; the old one still there (a different pipeline) is refused
            if how == "resume" and r.steps[-1].get("left") != "old":
                step(_process_argv(w, out, "--resume"), "process --resume", kill=None)
            else:
                step(_process_argv(w, out, "--overwrite"), op, kill=None)
        elif op == "process --update":
            step(_argv(w, op, out), op, kill=op)
            if rng.random() < 0.5:  # a resume finishes the rows the killed update set out to write
                step(_process_argv(w, out, "--resume", src=w.grown), "process --resume", kill=None)
            step(_argv(w, op, out), op, kill=None)
        elif op == "ingest":
            step(_ingest_argv(w, out), op, kill=op)
            step(_ingest_argv(w, out, *(["--overwrite"] if out.exists() else [])), "ingest again", kill=None)
        else:
            step(_ingest_argv(w, out, "--append"), op, kill=op)
            if r.steps[-1]["killed"] and r.steps[-1]["left"] != "new":  # a finished append is not redone
                if rng.random() < 0.5:
                    step(["repair", str(out)], "repair", kill=None)
                step(_ingest_argv(w, out, "--append"), op, kill=None)
        diffs = compare(op, out, w.refs[op])
        r.ok, r.error = not diffs, "; ".join(diffs) or None
    except (StepFailed, AssertionError) as exc:
        r.error = str(exc)
    r.seconds = round(time.perf_counter() - t0, 3)
    r.leftovers = sorted(p.name for p in d.iterdir() if p.name.startswith("."))
    if r.ok:
        shutil.rmtree(d)
    return r


def _point(change: str) -> str:
    """A kill point's kind: the call and what it changed (a chunk, metadata, the digest, a store, a lock,
    a file of the old store being deleted)."""
    call, path = change.split(" ", 1)
    if call == "exit":
        return "exit (after its last change)"
    name = Path(path).name
    if call in ("unlink", "rmdir") and not os.path.isabs(path):
        what = "a store's files (rmtree)"  # shutil.rmtree names them relative to their directory
    elif name == "zarr.json" or name.endswith(".partial") and "zarr.json" in name:
        what = "metadata"
    elif name == ".tsconv-input.json":
        what = "digest"
    elif name.endswith("tsconv-lock"):
        what = "lock"
    elif name.endswith(".zarr") or ".tsconv-" in name or ".ingest-" in name:
        what = "store"
    elif name.isdigit():
        what = "chunk"
    else:
        what = "other"
    return f"{call} {what}"


def run_loop(root: Path, *, rounds: int, seed: int, exec: bool = False,
             deadline: float | None = None) -> dict[str, Any]:  # fmt: skip
    """``rounds`` rounds (fewer when ``deadline``, a time.monotonic(), passes first) under ``root``."""
    t0 = time.perf_counter()
    with Runner(exec=exec) as runner:
        w = make_world(root, runner)
        done: list[Round] = []
        for k in range(rounds):
            if deadline is not None and time.monotonic() > deadline:
                break
            done.append(run_round(runner, w, k, seed))
    kills = [(r.op, s["point"]) for r in done for s in r.steps if s["killed"]]
    return {
        "rounds": len(done),
        "rounds_asked": rounds,
        "seed": seed,
        "seconds": round(time.perf_counter() - t0, 1),
        "changes_per_op": w.changes,
        "by_op": dict(Counter(r.op for r in done)),
        "kills": len(kills),
        "kills_by_op_and_point": {f"{op}: {p}": n for (op, p), n in sorted(Counter(kills).items())},
        "not_killed": sum(1 for r in done for s in r.steps if s["at"] is not None and not s["killed"]),
        "left_after_kill": dict(
            Counter(f"{r.op}: {s['left']}" for r in done for s in r.steps if s["killed"])
        ),
        "failures": [r.__dict__ for r in done if not r.ok],
        "rounds_with_leftovers": dict(Counter(r.op for r in done if r.leftovers)),
        "leftovers": sorted({re.sub(r"\d+$", "<pid>", n) for r in done for n in r.leftovers}),
    }


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        _serve()
    elif sys.argv[1] == "step":
        sys.exit(_child(json.loads(sys.argv[2])))
