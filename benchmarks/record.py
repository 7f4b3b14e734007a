"""The record every benchmark writes: what ran, where, when, under what load, and its raw figures.

One JSON file per run (format ``benchmark-record`` v1). A benchmark script does::

    rec = record.Recorder("write_cost", scale=1_000_000, variant="scattered", argv=argv, settings=vars(args))
    ... rec.step("update", fn) ...             # optional: wall time, peak RSS and load of one call
    path = rec.finish({"scenarios": [...]}, publish=args.publish, out=args.out)

``finish`` fills in the envelope and writes the file:

* ``benchmark``, ``variant``, ``scale`` (rows), ``command`` (without any path), ``settings``;
* ``date`` (UTC day) and ``started_at`` / ``finished_at`` (UTC, ISO-8601), ``seconds``;
* ``git``: the commit the code ran from and whether the work tree had uncommitted changes;
* ``machine``: a short ``name`` (cores, memory, CPU family; or ``$BENCH_MACHINE``), ``cores``,
  ``memory_gib``, ``cpu``, ``os``, ``python``;
* ``packages``: versions of this project, its engines and the peers the benchmark compares with;
* ``load``: the 1-minute load average at start and end, and min / mean / max of samples taken every
  second during the run (the machine may be shared: read timings against it);
* ``steps``: what ``Recorder.step`` measured; ``results``: the benchmark's own raw figures;
* ``merged_from``: absent for a single run; for a record combined from several runs (``merge``), one
  entry per part with its own date, load, commit, command and what it contributed.

Records are written to ``benchmarks/results/`` with ``--publish`` (tracked by git; ``benchmarks/report.py``
renders the READMEs from them) and to ``benchmarks/results/scratch/`` (ignored) otherwise. File names are
``<benchmark>[-<variant>]-<scale>-<date>-<machine>.json``, e.g. ``run-1m-2026-11-23-2c-23g-amd-epyc.json``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

FORMAT = "benchmark-record"
FORMAT_VERSION = 1
HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(HERE, "results")
SCRATCH_DIR = os.path.join(RESULTS_DIR, "scratch")
# Versions worth knowing for every run: this project and the engines it runs on.
BASE_PACKAGES = ("iceberg-row-lineage", "pyiceberg", "pyiceberg-core", "duckdb", "pyarrow", "numpy", "pyroaring")


# --------------------------------------------------------------------------- machine and environment facts
def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def _cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    first = _read("/proc/meminfo").split("\n", 1)[0].split()
    return round(int(first[1]) / 1024 / 1024, 1) if len(first) > 1 else None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def machine_name(cores: int | None, memory_gib: float | None, cpu: str) -> str:
    """A short name for file names: ``$BENCH_MACHINE`` if set, else cores, memory and CPU family."""
    override = os.environ.get("BENCH_MACHINE")
    if override:
        return _slug(override)[:40] or "machine"
    words = [w for w in _slug(re.sub(r"\(.*?\)", "", cpu)).split("-") if w not in ("processor", "cpu", "core")]
    family = "-".join(words[:2]) or "cpu"
    return f"{cores or 0}c-{round(memory_gib or 0)}g-{family}"


def machine() -> dict[str, Any]:
    """Cores, memory, CPU model, OS and Python of this machine, with its short name."""
    cores, mem, cpu = os.cpu_count(), _memory_gib(), _cpu_model()
    return {
        "name": machine_name(cores, mem, cpu), "cores": cores, "memory_gib": mem, "cpu": cpu,
        "os": f"{platform.system()} {platform.release()}", "arch": platform.machine(), "python": platform.python_version(),
    }


def packages(extra: Iterable[str] = ()) -> dict[str, str]:
    """Installed versions of the base packages and of ``extra`` (peers), ``not installed`` if absent."""
    out = {}
    for name in dict.fromkeys([*BASE_PACKAGES, *extra]):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def git_state() -> dict[str, Any]:
    """The commit the benchmark code ran from, and whether tracked code (not docs or records) had uncommitted changes."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", HERE, *args], capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", ":/", ":(exclude,top)*.md", ":(exclude,top)benchmarks/results")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages, rounded."""
    return [round(x, 2) for x in os.getloadavg()]


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------- measuring
class LoadSampler:
    """Samples the 1-minute load average every ``interval`` seconds in a daemon thread."""

    def __init__(self, interval: float = 1.0) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        s = self.samples
        return {"min": round(min(s), 2), "mean": round(sum(s) / len(s), 2), "max": round(max(s), 2), "samples": len(s)}


def _status_kb(field: str) -> int:
    for line in _read("/proc/self/status").splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class PeakRss:
    """Peak RSS of this process during a step: the kernel's high-water mark ``VmHWM``, reset per step.

    Falls back to sampling ``VmRSS`` every 5 ms where ``/proc/self/clear_refs`` is not writable.
    """

    def __init__(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.method = "VmHWM reset per step"
        except OSError:
            self.method = "VmRSS sampled every 5 ms"
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Reset the high-water mark; returns the current RSS in KiB."""
        rss = _status_kb("VmRSS")
        if self.method.startswith("VmHWM"):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        else:
            self._peak = rss
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return rss

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self._peak = max(self._peak, _status_kb("VmRSS"))

    def stop(self) -> int:
        """The peak RSS in KiB since ``start``."""
        if self.method.startswith("VmHWM"):
            return _status_kb("VmHWM")
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        return max(self._peak, _status_kb("VmRSS"))


def files_under(root: str) -> dict[str, int]:
    """Every file under ``root`` with its size (files removed while walking are skipped)."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            try:
                out[p] = os.path.getsize(p)
            except FileNotFoundError:
                pass
    return out


def measure(fn: Callable[[], Any], rss: PeakRss | None = None, root: str | None = None) -> tuple[dict[str, Any], Any]:
    """Run ``fn`` once: wall time, CPU time of this process (all threads), peak RSS (with ``rss``), load and,
    with ``root``, bytes written under it. On a loaded machine the CPU time varies far less than the wall time."""
    before = files_under(root) if root else None
    load1 = os.getloadavg()[0]
    rss_before = rss.start() if rss else None
    cpu = time.process_time()
    start = time.perf_counter()
    value = fn()
    wall = time.perf_counter() - start
    rec: dict[str, Any] = {"wall_s": round(wall, 4), "cpu_s": round(time.process_time() - cpu, 4), "load1": round(load1, 2)}
    if rss:
        rec["peak_rss_mb"] = round(rss.stop() / 1024, 1)
        rec["rss_before_mb"] = round((rss_before or 0) / 1024, 1)
    if before is not None and root:
        after = files_under(root)
        new = [s for p, s in after.items() if p not in before]
        grown = sum(max(0, s - before[p]) for p, s in after.items() if p in before)
        rec.update(bytes_written=sum(new) + grown, files_written=len(new), bytes_grown_in_place=grown)
    return rec, value


# --------------------------------------------------------------------------- the record
def scale_label(rows: int | None) -> str:
    """``1m``, ``10m``, ``100k``, ``1500`` for file names."""
    if rows is None:
        return "na"
    for unit, size in (("m", 1_000_000), ("k", 1_000)):
        if rows >= size and rows % size == 0:
            return f"{rows // size}{unit}"
    return str(rows)


def command_line(script: str, argv: list[str] | None) -> str:
    """``python benchmarks/<script> ARGS`` with path-like arguments reduced to their base name."""
    args = sys.argv[1:] if argv is None else argv
    shown = [os.path.basename(a) if os.sep in a and os.path.isabs(a) else a for a in args]
    return " ".join(["python", f"benchmarks/{script}", *shown])


def add_arguments(parser: Any) -> None:
    """The options every benchmark script shares: ``--publish`` and ``--out``."""
    parser.add_argument("--publish", action="store_true",
                        help="write the record to benchmarks/results/ (tracked; the READMEs are rendered from there); default: results/scratch/")
    parser.add_argument("--out", default=None, help="write the record to this path instead")


class Recorder:
    """Collects one benchmark run's envelope (machine, load, date, commit) and writes its record."""

    def __init__(self, benchmark: str, *, scale: int | None, argv: list[str] | None = None, variant: str | None = None,
                 settings: dict[str, Any] | None = None, peers: Iterable[str] = (), script: str | None = None) -> None:
        self.benchmark, self.variant, self.scale = benchmark, variant, scale
        self.command = command_line(script or f"{benchmark}.py", argv)
        self.settings = {k: v for k, v in (settings or {}).items() if k not in ("out", "workdir", "publish", "warehouse")}
        self.peers = list(peers)
        self.started_at = utc_now()
        self.git = git_state()  # before the run: the code that ran
        self.load_start = load_average()
        self._t0 = time.perf_counter()
        self._sampler = LoadSampler()
        self.rss = PeakRss()
        self.steps: list[dict[str, Any]] = []

    def step(self, name: str, fn: Callable[[], Any], *, root: str | None = None, **extra: Any) -> Any:
        """Run ``fn`` as a named step (wall time, peak RSS, load, bytes under ``root``) and return its value."""
        rec, value = measure(fn, self.rss, root)
        self.steps.append({"step": name, **rec, **extra})
        return value

    def envelope(self) -> dict[str, Any]:
        """Everything but the results, measured now (ends the load sampling)."""
        load = self._sampler.stop()
        return {
            "format": FORMAT, "format-version": FORMAT_VERSION,
            "benchmark": self.benchmark, "variant": self.variant, "scale": self.scale,
            "command": self.command, "settings": self.settings,
            "date": self.started_at[:10], "started_at": self.started_at, "finished_at": utc_now(),
            "seconds": round(time.perf_counter() - self._t0, 1),
            "git": self.git, "machine": machine(), "packages": packages(self.peers),
            "load": {"start": self.load_start, "end": load_average(), "during": load},
        }

    def finish(self, results: dict[str, Any], *, publish: bool = False, out: str | None = None) -> str:
        """Write the record (see the module docstring for where) and return its path."""
        doc = {**self.envelope(), "steps": self.steps, "results": results}
        return write(doc, publish=publish, out=out)


def record_name(doc: dict[str, Any]) -> str:
    """``<benchmark>[-<variant>]-<scale>-<date>-<machine>``, without extension."""
    parts = [doc["benchmark"].replace("_", "-")]
    if doc.get("variant"):
        parts.append(_slug(str(doc["variant"])))
    parts += [scale_label(doc.get("scale")), doc["date"], doc["machine"]["name"]]
    return "-".join(parts)


def write(doc: dict[str, Any], *, publish: bool = False, out: str | None = None) -> str:
    """Write ``doc`` to ``out``, or under the results (``publish``) or scratch folder with a fresh name."""
    if out is None:
        folder = RESULTS_DIR if publish else SCRATCH_DIR
        os.makedirs(folder, exist_ok=True)
        base = os.path.join(folder, record_name(doc))
        out, n = base + ".json", 2
        while os.path.exists(out):
            out, n = f"{base}-{n}.json", n + 1
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(scrub_paths(json.dumps(doc, indent=1, default=str)) + "\n")
    return out


def scrub_paths(text: str) -> str:
    """Replace this machine's directories (virtualenv, repository, temp dir, home) in ``text`` by placeholders.

    Records are committed: an error's traceback or a table location must not carry a local path.
    """
    places = [(sys.prefix, "<venv>"), (os.path.dirname(HERE), "<repo>"), (tempfile.gettempdir(), "<tmp>"),
              (os.path.expanduser("~"), "<home>")]
    for path, placeholder in sorted(places, key=lambda p: -len(p[0])):
        if len(path) > 1:
            text = text.replace(json.dumps(path)[1:-1], placeholder)
    return text


def read(path: str) -> dict[str, Any]:
    """Load a record, refusing other files and newer format versions."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path} is not a benchmark record (format {doc.get('format')!r})")
    if doc.get("format-version", 0) > FORMAT_VERSION:
        raise ValueError(f"{path} has record format version {doc['format-version']}; this code reads up to {FORMAT_VERSION}")
    return doc


def part_of(doc: dict[str, Any], contributed: Any) -> dict[str, Any]:
    """One ``merged_from`` entry: a run's own date, load, commit and command, and what it contributed."""
    if doc.get("merged_from"):
        raise ValueError("a merged record is merged again part by part: pass its parts")
    return {key: doc.get(key) for key in ("date", "started_at", "finished_at", "command", "git", "load")} | {"contributed": contributed}


def merge(parts: list[tuple[dict[str, Any], Any]], results: dict[str, Any]) -> dict[str, Any]:
    """A record combined from several runs: the newest part's envelope, each part's own facts in ``merged_from``.

    ``parts`` pairs each run's record (unmerged) or an already-built ``merged_from`` entry list with what it
    contributed; ``results`` are the combined figures.
    """
    entries: list[dict[str, Any]] = []
    for doc, contributed in parts:
        if doc.get("merged_from"):  # keep an earlier merge's parts, narrowed to what survives
            entries += [e | {"contributed": [c for c in e["contributed"] if c in contributed]} if isinstance(e["contributed"], list)
                        else e for e in doc["merged_from"] if not isinstance(e["contributed"], list) or set(e["contributed"]) & set(contributed)]
        else:
            entries.append(part_of(doc, contributed))
    newest = max((doc for doc, _ in parts), key=lambda d: d["started_at"])
    loads = [e["load"]["during"] for e in entries]
    merged = dict(newest)
    merged.update(
        date=max(e["date"] for e in entries),
        command=" ; then ".join(e["command"] for e in entries),
        load={"start": None, "end": None, "during": {"min": min(x["min"] for x in loads), "mean": None, "max": max(x["max"] for x in loads),
                                                    "samples": sum(x["samples"] for x in loads)}},
        merged_from=entries, results=results,
    )
    return merged
