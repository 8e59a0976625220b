"""Command line: thin wrappers that parse, call the library and print. No logic of its own."""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from tsconv import __version__
from tsconv.errors import TsconvError, first_line

DEMO_ROWS, DEMO_FEATURES = 200_000, 64


def _fail(message: str, code: int = 2) -> None:
    _to_stderr(f"tsconv: error: {message}")
    sys.exit(code)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    _to_stderr(f"tsconv: warning: {message}")


def _to_stderr(line: str) -> None:
    """``line`` on stderr, where it can be written: a stderr on a full disk (or a closed one, which click
    skips) loses the line, not the run nor its exit status."""
    with contextlib.suppress(OSError, ValueError):
        click.echo(line, err=True)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's own flush at exit does not fail on the closed pipe."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (tests capture it)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


class _Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP (a batch scheduler's stop, a closed terminal), raised as Ctrl-C is, so that the
    same clean-up runs (the lock released, temporary files removed) and the same advice is printed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
_STOP_NAMES = {"SIGTERM": "terminated (SIGTERM)", "SIGHUP": "hung up (SIGHUP)"}


def _install_stop_handlers() -> None:
    """The first SIGINT, SIGTERM or SIGHUP stops the command through its clean-up; a second one during that
    clean-up is noted and waits for it (it had broken off the clean-up with click's "Aborted!" or a
    traceback from the interpreter's thread shutdown); a third ends the process at once."""
    seen: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        seen.append(signum)
        if len(seen) == 1:
            raise KeyboardInterrupt if signum == signal.SIGINT else _Stopped(signum)
        if len(seen) == 2:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write("tsconv: finishing the clean-up first; interrupt again to stop at once\n")
                sys.stderr.flush()
            return
        os._exit(128 + signum)

    for name in _STOP_SIGNALS:
        sig = getattr(signal, name, None)  # SIGHUP: not on Windows
        if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
            signal.signal(sig, stop)


def _after_interrupt(command: str | None, args: list[str], output: str | None = None) -> str:
    """What a user does after Ctrl-C stopped ``tsconv COMMAND ARGS``; ``output``: the ``--output`` click
    parsed, where the command got that far (``-ofeats.parquet`` and ``-qo feats.parquet`` name it too)."""
    if command == "ingest":
        if "--append" in args:
            return "`tsconv repair STORE` keeps the rows the store had before the append; then append again"
        return "no store was made (it is built under a temporary name): rerun the command"
    if command == "process":
        if _parquet_output(args, parsed=output):
            return "the Parquet file was not written: rerun the command"
        if "--update" in args:
            return "rerun with --update (or --resume) to continue where it stopped"
        if "--overwrite" in args:
            return "rerun with --resume in place of --overwrite to continue where it stopped"
        return "rerun with --resume to continue where it stopped"
    return "rerun the command"


def _parquet_output(args: list[str], *, parsed: str | None = None) -> bool:
    """Whether ``tsconv process`` names a Parquet output (.parquet or .pq): ``parsed``, the output click read,
    where the command got that far; else one its arguments give as ``-o OUT``, ``--output OUT`` or
    ``--output=OUT``."""
    from tsconv.io.writers.formats import output_format

    if parsed is not None:
        outputs = [parsed]
    else:
        outputs = [b for a, b in zip(args, args[1:], strict=False) if a in ("-o", "--output")]
        outputs += [a.split("=", 1)[1] for a in args if a.startswith("--output=")]
    for out in outputs:
        try:
            if output_format(out) == "parquet":
                return True
        except TsconvError:
            continue
    return False


class _PathOption(click.Path):
    """A path option or argument that refuses ``''``: as a path it names the current directory, so
    `-o "$OUT"` with OUT unset would write (or, with --overwrite, replace) whatever directory the job runs in."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value == "":
            self.fail(
                "'' names no path (as a path it means the current directory); name one. In a script, check "
                "that the variable it reads is set.",
                param,
                ctx,
            )
        return super().convert(value, param, ctx)


class _Group(click.Group):
    """Turn the library's errors into one line on stderr and a non-zero exit, never a traceback."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["tsconv.args"] = list(args)  # the command and its arguments, for the advice after Ctrl-C
        # The group's own options (--version, -h, an unknown one) act here, before invoke(): without the same
        # handling `tsconv --version | head -0` exited 1, `tsconv -h >/dev/full` printed a traceback and
        # `tsconv --bogus` printed click's three-line usage error.
        with _one_line_errors(ctx):
            return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        with _one_line_errors(ctx):
            return super().invoke(ctx)


@contextlib.contextmanager
def _one_line_errors(ctx: click.Context) -> Iterator[None]:
    """The errors of a command (or of the group's own options) as one ``tsconv: error:`` line and the exit
    status the README gives; a defect of tsconv's keeps its traceback."""
    shown = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:  # bare `tsconv`: click prints the help, as before
        raise
    except TsconvError as exc:
        _fail(str(exc))
    except click.UsageError as exc:
        command = f"tsconv {ctx.invoked_subcommand}" if ctx.invoked_subcommand else "tsconv"
        _fail(f"{exc.format_message()} (see `{command} --help`)")
    except KeyboardInterrupt as exc:
        advice = _after_interrupt(
            ctx.invoked_subcommand, ctx.meta.get("tsconv.args", []), ctx.meta.get("tsconv.output")
        )
        if isinstance(exc, _Stopped):
            name = signal.Signals(exc.signum).name
            _fail(f"{_STOP_NAMES.get(name, name)}; {advice}", code=128 + exc.signum)
        _fail("interrupted; " + advice, code=130)
    except BrokenPipeError:
        _quiet_stdout()
        sys.exit(141)  # as a tool killed by SIGPIPE (`tsconv filters | head -1`): no error line
    except MemoryError as exc:  # numpy's allocations (a large pipeline's weights copied as it resolves)
        _fail(f"out of host memory ({first_line(exc)}); {_MEMORY_HINT}")
    except RuntimeError as exc:
        if _CPU_ALLOCATOR not in str(exc):  # torch's CPU allocator failing: the same as numpy's
            raise
        _fail(f"out of host memory ({first_line(exc)}); {_MEMORY_HINT}")
    except OSError as exc:
        _fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
    finally:
        warnings.showwarning = shown


_CPU_ALLOCATOR = "DefaultCPUAllocator: can't allocate memory"
_MEMORY_HINT = (
    "hint: free memory, or lower what a run holds: a smaller --chunk, fewer features or smaller weights."
)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="tsconv")  # the distribution is tsconv-features
def main() -> None:
    """tsconv: causal conv1d feature pipelines over long, wide time series in zarr stores."""


_EXIT_CODE: list[int] = []  # the command's exit code, once main() has ended with one
_OWN_PROCESS: list[bool] = []  # set by run(): the process is the command's own


def run() -> None:
    """The ``tsconv`` command: :func:`main`, then an exit that skips the interpreter's teardown.

    Tearing down the modules and objects of torch, zarr and numpy took 0.6-1.0 s after every command on
    a 2-core machine (wall time against ``os._exit``; benchmarks/NOTES.md, "Fixed costs around the
    loop"), which a batch job pays per store. By then the command's work is done and its files are
    closed; the atexit handlers (thread pools, temporary files, dask) still run first, and the last of
    them flushes the standard streams and ends the process with the command's code. SIGTERM and SIGHUP
    stop it as Ctrl-C does (exit status 143 and 129).
    """
    atexit.register(_exit_now)  # registered first, so it runs last
    _OWN_PROCESS.append(True)
    _install_stop_handlers()
    try:
        main()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            _EXIT_CODE.append(exc.code or 0)
        raise
    _EXIT_CODE.append(0)


def _exit_now() -> None:
    if not _EXIT_CODE:  # an uncaught exception or an interrupt: the interpreter's own exit
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # AttributeError: a closed stream is None (`>&-`)
            pass
    os._exit(_EXIT_CODE[0])


def _common_process_options(f):  # noqa: ANN001, ANN202
    f = click.option(
        "--pipeline",
        "pipeline",
        type=_PathOption(dir_okay=False),
        help="Pipeline TOML file, or a built-in pipeline's name (see `tsconv pipelines`; default: default).",
    )(f)
    f = click.option(
        "--chunk", type=click.IntRange(min=1), default=1024, show_default=True, help="Steps per chunk."
    )(f)
    f = click.option(
        "--device",
        type=click.Choice(["auto", "cpu", "cuda"]),
        default="auto",
        show_default=True,
        help="Where to compute.",
    )(f)
    f = click.option(
        "--warmup",
        type=click.Choice(["nan", "zero"]),
        default="nan",
        show_default=True,
        help="Rows whose receptive field reaches before step 0: NaN, or computed with zero history.",
    )(f)
    f = click.option(
        "--report",
        "report_path",
        type=_PathOption(dir_okay=False),
        help="Write the run report here: a short Markdown summary for a name ending in .md, else JSON.",
    )(f)
    f = click.option("--quiet", "-q", is_flag=True, help="No progress bar.")(f)
    return f


def _check_report_path(path: str, input_path: str, output: str | None, *, flag: str = "--report", pipeline: Any = None) -> None:  # fmt: skip
    """Refuse, before the run, a file path (``flag``'s) tsconv must not or cannot write: a URL (it writes local
    files only), inside the input store or the output (it would add to or replace their files), the
    ``pipeline``'s file or a weight file it names, or in a folder that does not exist (click refuses a folder
    itself)."""
    from tsconv.io.objstore import is_url, refuse_inside, shown
    from tsconv.pipeline.spec import pipeline_files

    if is_url(path):  # else Path() made 's3://b/r.json' the relative path 's3:/b/r.json'
        raise TsconvError(
            f"{flag} {shown(path)!r} is a URL; tsconv writes this file locally only",
            hint=f"name a local file (e.g. {flag} {path.rstrip('/').rsplit('/', 1)[-1] or 'run.json'}) and copy it "
            "to the object store afterwards.",
        )
    report = Path(path)
    if str(report) == "-":  # not stdout: a file named '-' appeared in the working folder
        raise TsconvError(f"{flag} '-': name a file", hint="e.g. --report run.json (or run.md for Markdown).")
    target = report.resolve()
    stores = [("input store", input_path)] + ([("output", output)] if output is not None else [])
    refuse_inside(report, stores, flag=flag)
    for f in pipeline_files(pipeline):
        if f.exists() and f.resolve() == target:
            raise TsconvError(
                f"{flag} {str(report)!r} is a file the pipeline is read from ({str(f)!r}); refusing to write over it",
                hint="write the file elsewhere.",
            )
    if not target.parent.is_dir():
        raise TsconvError(
            f"{flag} {str(report)!r}: its folder {str(target.parent)!r} does not exist",
            hint="create the folder first, or write the file elsewhere.",
        )
    if not os.access(target.parent, os.W_OK):  # else found only once the run is over
        raise TsconvError(
            f"{flag} {str(report)!r}: its folder {str(target.parent)!r} cannot be written",
            hint="write the file elsewhere.",
        )


@contextlib.contextmanager
def _imports_uncollected() -> Any:
    """Pause the garbage collector while a command imports torch, zarr and the engine, then leave every object
    made so far out of later collections (``gc.freeze``).

    The imports make about 190,000 objects and hold no garbage; the collector's passes over them while they
    load cost a fresh process 0.25-0.4 s on a 2-core machine (benchmarks/NOTES.md, "A fresh `tsconv process`
    per run"), and each full collection during the run would traverse them again (0.09 s each). Only in the
    ``tsconv`` command's own process: a caller's process (tests, scripts invoking :func:`main`) keeps its
    collector as it is."""
    if not _OWN_PROCESS:
        yield
        return
    # zarr imports cupy wherever it is installed, for GPU buffers the command never uses: 0.25 s of a fresh
    # process on the H200 machine (benchmarks/NOTES.md, "A fresh `tsconv process` per run"). A None entry makes
    # that import fail as if cupy were absent, which zarr (and xarray's checks) take as such.
    sys.modules.setdefault("cupy", None)  # type: ignore[arg-type]
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def _start_process(input_path: str, output: str | None, *, report_path: str | None, options: dict[str, Any]) -> None:  # fmt: skip
    """Refuse what can be refused before the engine's imports, and start the GPU's and the workers' start-up
    beside them."""
    from tsconv.engine.cluster import gpu_worker_here, start_early
    from tsconv.io.writers.formats import output_format
    from tsconv.kernels import early

    if output is not None:
        output_format(output)  # a mistyped output is refused at once
    if report_path is not None:
        _check_report_path(report_path, input_path, output, pipeline=options.get("pipeline"))
    workers = options.get("workers")
    # An update or resume with device auto may be a few rows the CPU computes (tsconv.engine.run.small_for_cuda):
    # the threads would only compete with it (0.51 against 0.19 s after start-up for 23,200 rows on the H200
    # machine), so the run starts them once it knows it needs the GPU.
    deferred = (options.get("update") or options.get("resume")) and options.get("device") == "auto"
    if options.get("device") == "cuda" or (
        options.get("device") == "auto" and early.gpu_present() and not deferred
    ):
        # beside the imports of torch, zarr and tsconv (tsconv.kernels.early); a client of dask worker
        # processes computes nothing on the GPU itself, but one GPU's worker runs in this process (begun by
        # its preload instead, the task waited 0.13 s for its CUDA context on the H100)
        early.start(cuda=workers is None or gpu_worker_here(workers, options.get("device") or "auto"))
    if workers is not None:  # the workers' start-up beside this process's (tsconv.engine.cluster)
        start_early(workers, options.get("device") or "auto")


def _refuse_report_in_default_output(report_path: str, input_path: str) -> None:
    """Refuse a ``--report`` inside the output a run without ``--output`` writes (beside the input, or beside the
    store holding it), as one inside a named output is: that output is known once the engine's modules are
    imported, which :func:`_start_process` does not wait for."""
    from tsconv.engine.api import default_output_path
    from tsconv.io.objstore import hierarchy_root, location, refuse_inside

    try:
        loc = location(input_path)
    except TsconvError:
        return  # the run refuses the input itself
    root = hierarchy_root(loc) if isinstance(loc, Path) else None
    refuse_inside(Path(report_path), [("output", default_output_path(loc, root=root))], flag="--report")


def _replace_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: a full disk or a kill mid-write leaves the file that was
    there (a batch job's reader never parses half a report). A path that is not a regular file (/dev/stdout,
    a pipe) is written as it is."""
    if path.exists() and not path.is_file():
        path.write_text(text)
        return
    # not named after the report: a name of 255 bytes is legal, and a longer one beside it is not
    tmp = path.with_name(f".tsconv-report-{os.getpid()}.partial")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _run_process(input_path: str, output: str | None, *, report_path: str | None, quiet: bool, **options: Any) -> None:  # fmt: skip
    workers = options.get("workers")
    try:
        with _imports_uncollected():
            _start_process(input_path, output, report_path=report_path, options=options)
            from tsconv.engine.api import process
        if report_path is not None and output is None:
            _refuse_report_in_default_output(report_path, input_path)
        report = process(input_path, output, progress=not quiet, **options)
    finally:
        if workers is not None:
            from tsconv.engine.cluster import discard_early

            discard_early()
    failed: OSError | None = None
    # before the summary line: a closed stdout (a pipe) lost the report a batch job reads
    if report_path is not None:
        path = Path(report_path)
        markdown = path.suffix.lower() == ".md"
        try:
            _replace_text(
                path, report.markdown() if markdown else json.dumps(report.to_dict(), indent=2) + "\n"
            )
        except OSError as exc:  # a full disk or /dev/full: the output is complete, only the report is lost
            failed = exc
    if report.rows == 0 and report.updated_from is not None:
        click.echo(
            f"{report.output} is up to date with its input ({report.total_rows:,} rows); nothing to do."
        )
    elif report.rows == 0 and report.resumed_from:
        click.echo(f"{report.output} is already complete ({report.total_rows:,} rows); nothing to do.")
    else:
        click.echo(report.summary())
    if failed is not None:
        raise TsconvError(
            f"--report {report_path!r} could not be written ({failed.strerror or failed}); "
            f"the output {report.output} is complete",
            hint="free space or name another file; a rerun with --overwrite writes the report again.",
        )


@main.command()
@click.option("--input", "-i", "input_path", required=True, type=_PathOption(), help="Input zarr store.")
@click.option(
    "--output",
    "-o",
    type=_PathOption(),
    help="Output zarr store, or a .parquet file (default: <input>.features.zarr beside it; for a group or array "
    "inside a store, beside that store).",
)
@_common_process_options
@click.option("--overwrite", is_flag=True, help="Replace an existing output store.")
@click.option("--resume", is_flag=True, help="Finish an interrupted run into the same output.")
@click.option(
    "--update",
    is_flag=True,
    help="Extend the output with the rows appended to the input since it was written, computing only "
    "those; the result equals a full run on the grown input. Refuses an input whose rows already computed "
    "changed or that lost rows, and another pipeline, chunk or warm-up. Zarr outputs only.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    help="Run on a local dask cluster of N worker processes (one per GPU with CUDA).",
)
@click.option("--scheduler", help="Run on an existing dask cluster: its scheduler address (tcp://host:8786).")
@click.option(
    "--transfer",
    type=click.Choice(["pinned", "mapped", "pageable"]),
    help="CUDA only: how input reaches the GPU: async copies from pinned memory (the default), zero-copy "
    "mapped host memory, or plain copies.",
)
@click.option(
    "--decode",
    type=click.Choice(["cpu", "gpu"]),
    default=None,
    help="CUDA only: where input chunks are decoded: gpu (the default: Blosc-LZ4 stores with pinned transfers; "
    "others are decoded on the CPU) or cpu (threads). dask workers decode where a single process would.",
)
@click.option(
    "--gpu-mem",
    help="CUDA only: the GPU memory the process may hold as nvidia-smi shows it, its CUDA context included "
    "(default 1.2GB; e.g. 1.5GB, 2GiB); batch sizes follow from what the context leaves.",
)
@click.option(
    "--compression",
    type=click.Choice(["auto", "lz4", "none"]),
    help="Zarr outputs: the values' codec: lz4 (Blosc-LZ4), none (uncompressed: Blosc at level 0), or auto (the default): lz4 "
    "where it saves at least 10% of a sample of the first output chunk holding a value, else none (dask runs: "
    "lz4). With nvCOMP installed (tsconv[nvcomp]) a CUDA run encodes the LZ4 chunks on the GPU.",
)
@click.option(
    "--partition-rows",
    type=click.IntRange(min=1),
    help="Rows per dask task, rounded up to whole output chunks (default: about 8 tasks per worker).",
)
def process(input_path: str, output: str | None, pipeline: str | None, chunk: int, device: str,
            warmup: str, report_path: str | None, quiet: bool, overwrite: bool, resume: bool, update: bool,
            workers: int | None, scheduler: str | None, transfer: str | None, decode: str | None,
            gpu_mem: str | None, compression: str | None, partition_rows: int | None) -> None:  # fmt: skip
    """Stream a store through a pipeline into an output store."""
    # the output as click parsed it, for the advice after Ctrl-C (meta is shared with the group's context)
    click.get_current_context().meta["tsconv.output"] = output
    given = [
        f"--{name}" for name, on in (("overwrite", overwrite), ("resume", resume), ("update", update)) if on
    ]
    if len(given) > 1:
        raise TsconvError(
            f"{' and '.join(given)} exclude each other",
            hint="--resume finishes an interrupted run; --update extends a finished one with new input rows; "
            "--overwrite starts again from scratch.",
        )
    _run_process(input_path, output, report_path=report_path, quiet=quiet, pipeline=pipeline, chunk=chunk,
                 device=device, warmup=warmup, overwrite=overwrite, resume=resume, update=update, workers=workers,
                 client=scheduler, partition_rows=partition_rows, transfer=transfer, gpu_mem=gpu_mem,
                 decode=decode, compression=compression)  # fmt: skip


@main.command()
@click.option("--rows", type=click.IntRange(min=1), default=DEMO_ROWS, show_default=True)
@click.option("--features", type=click.IntRange(min=1), default=DEMO_FEATURES, show_default=True)
@click.option("--dir", "directory", type=_PathOption(file_okay=False), default="data", show_default=True)
@_common_process_options
def demo(rows: int, features: int, directory: str, pipeline: str | None, chunk: int, device: str,
         warmup: str, report_path: str | None, quiet: bool) -> None:  # fmt: skip
    """Run the main job on a synthetic tick store, creating it first when absent."""
    from tsconv.synth import make_ticks

    src = Path(directory) / f"ticks-{rows}x{features}.zarr"
    if not src.exists():
        click.echo(f"creating {src} ({rows:,} steps x {features} features of synthetic ticks)")
        make_ticks(src, rows=rows, features=features, seed=0, progress=not quiet)
    out = Path(directory) / f"ticks-{rows}x{features}.features.zarr"
    _run_process(str(src), str(out), report_path=report_path, quiet=quiet, pipeline=pipeline, chunk=chunk,
                 device=device, warmup=warmup, overwrite=True)  # fmt: skip


@main.command()
@click.argument("store", type=_PathOption())
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option("--no-nan-count", is_flag=True, help="Skip the NaN count (it reads the whole store).")
def inspect(store: str, as_json: bool, no_nan_count: bool) -> None:
    """Print a store's shape, dtype, chunks, codecs, time span, features and NaN counts."""
    from tsconv.io.inspect import inspect_lines, inspect_store

    info = inspect_store(store, count_nans=not no_nan_count)
    click.echo(json.dumps(info, indent=2) if as_json else "\n".join(inspect_lines(info)))


@main.command()
@click.argument("store", type=_PathOption())
@click.option(
    "--features",
    "-f",
    "patterns",
    multiple=True,
    required=True,
    help="Features to draw: a glob over their names ('AAPL.*', 'x0.diff*'); repeat it for several.",
)
@click.option("--rows", help="Rows A:B as a Python slice, either side optional (1000:2000, :500, -100:).")
@click.option(
    "--output",
    "-o",
    required=True,
    type=_PathOption(dir_okay=False),
    help="Figure to write: .png, .svg or .pdf.",
)
def plot(store: str, patterns: tuple[str, ...], rows: str | None, output: str) -> None:
    """Draw a store's features against time; for a tsconv output, with the inputs they came from."""
    from tsconv.io.plot import plot_store

    _check_report_path(output, store, None, flag="--output")

    click.echo(plot_store(store, features=list(patterns), rows=rows, output=output).summary())


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def filters(as_json: bool) -> None:
    """List the built-in filters a [[conv]] stage's `filters` may name, with their parameters."""
    from tsconv.pipeline.filters import FILTER_DOCS, MAX_PARAMETER, largest_ema_span

    if as_json:
        rows = [{"kind": k, "syntax": d.syntax, "taps": d.taps, "warmup": d.warmup, "description": d.description,
                 "example": d.example} for k, d in FILTER_DOCS.items()]  # fmt: skip
        click.echo(json.dumps(rows, indent=2))
        return
    width = max(len(d.syntax) for d in FILTER_DOCS.values())
    taps = max(len(d.taps) for d in FILTER_DOCS.values())
    warm = max(len("warm-up"), *(len(d.warmup) for d in FILTER_DOCS.values()))
    click.echo(f"{'filter':<{width}}  {'taps':<{taps}}  {'warm-up':<{warm}}  meaning")
    for d in FILTER_DOCS.values():
        click.echo(f"{d.syntax:<{width}}  {d.taps:<{taps}}  {d.warmup:<{warm}}  {d.description}")
    click.echo(
        f"\nParameters are integers from 1 to {MAX_PARAMETER:,} (ema:S: S up to {largest_ema_span():,}, whose "
        "window then fills the most taps). A bank applies every filter to every input feature: "
        'filters = ["diff:1", "ma:16"] in a [[conv]] stage (the schema: pipelines/README.md in the repository). '
        "Each filter reads within its own window only (taps x the stage's dilation): its output is NaN where a "
        "value it reads is NaN (lag, diff and ret read the window's two ends, the others all of it), and its "
        "warm-up (NaN with --warmup nan) is its own."
    )


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def pipelines(as_json: bool) -> None:
    """List the built-in pipelines, which `--pipeline NAME` runs, with their description."""
    from tsconv.pipeline.spec import BUILTIN_DIR, builtin_descriptions, builtin_pipelines

    paths, descriptions = builtin_pipelines(), builtin_descriptions()
    if as_json:
        rows = [{"name": n, "description": descriptions[n], "path": str(p)} for n, p in paths.items()]
        click.echo(json.dumps(rows, indent=2))
        return
    width = max(len(n) for n in paths)
    for name in paths:
        click.echo(f"{name:<{width}}  {descriptions[name]}")
    click.echo(f"\nRun one with `tsconv process -i STORE --pipeline NAME`; the files are in {BUILTIN_DIR}.")


@main.command()
@click.argument("files", nargs=-1, required=True)
@click.option(
    "--output", "-o", required=True, type=_PathOption(), help="Zarr store to create (or append to)."
)
@click.option(
    "--layout",
    type=click.Choice(["long", "wide"]),
    default="long",
    show_default=True,
    help="long: (time, feature, value) rows; wide: a time column plus one column per feature.",
)
@click.option("--time-column", default="time", show_default=True, help="Name of the time column.")
@click.option("--feature-column", default=None, help="Feature names (long layout)  [default: feature]")
@click.option(
    "--value-column",
    multiple=True,
    help="Values (long layout); repeat it for several, which name the features SYMBOL.COLUMN (AAPL.px, "
    "AAPL.qty)  [default: value]",
)
@click.option(
    "--time-unit",
    type=click.Choice(["s", "ms", "us", "ns"]),
    default=None,
    help="Unit of integer time columns (since the epoch, UTC); refused where no file's time column holds "
    "integers.  [default: ns]",
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float64"]),
    default=None,
    help="Values dtype (default float32; an --append keeps the store's, and refuses another).",
)
@click.option(
    "--append", is_flag=True, help="Add rows later than the store's last time to an existing store."
)
@click.option("--overwrite", is_flag=True, help="Replace an existing output store.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def ingest(files: tuple[str, ...], output: str, layout: str, time_column: str, feature_column: str | None,
           value_column: tuple[str, ...], time_unit: str | None, dtype: str | None, append: bool, overwrite: bool, quiet: bool) -> None:  # fmt: skip
    """Ingest Parquet, CSV(.gz) or Arrow IPC files (paths or quoted globs) into a zarr store."""
    from tsconv.io.ingest import ingest as run_ingest

    report = run_ingest(
        list(files),
        output,
        layout=layout,
        time_column=time_column,
        feature_column=feature_column,
        value_column=list(value_column) or None,  # None: not given, which the wide layout accepts
        append=append,
        overwrite=overwrite,
        dtype=dtype,
        time_unit=time_unit,
        progress=not quiet,
    )
    click.echo(report.summary())


@main.command()
@click.argument("store", type=_PathOption())
def repair(store: str) -> None:
    """Roll back an interrupted `tsconv ingest --append`: keep the rows the store had before it."""
    from tsconv.io.ingest import repair as run_repair

    kept = run_repair(store)
    if kept is None:
        click.echo(f"nothing to repair: {store} has no interrupted append")
    else:
        click.echo(f"rolled back an interrupted append: {store} keeps its {kept:,} rows")


if __name__ == "__main__":  # pragma: no cover
    main()
