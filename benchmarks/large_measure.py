"""What ``benchmarks/large.py`` measures besides wall time: the memory of other processes, and table sizes.

* :class:`TreeSampler` samples, every ``interval`` seconds, the resident set size (``VmRSS`` in
  ``/proc/<pid>/status``) of the processes below a root process, sorted into the JVM (``java``), Spark's
  Python workers (``pyspark.daemon`` / ``pyspark.worker`` and their forks) and other Python processes. A
  peak between two samples is missed, so the figures are lower bounds (at 0.1 s, a JVM's heap cannot grow
  much unseen).
* :func:`table_sizes` sorts the files under a table's folder by what they are (data, position deletes,
  manifests, manifest lists, metadata JSON, lineage segments and lists, deleted-rows index, key index).
* :func:`planning_memory` runs the driver's planning of a table in a fresh Python process and reports how
  much its resident memory grew.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

KINDS = ("data", "position_deletes", "manifests", "manifest_lists", "metadata_json", "lineage_segments",
         "lineage_lists", "deleted_rows_index", "key_index", "other")


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (children, their children, ...), from the parent ids in ``/proc``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kind_of(pid: int) -> str:
    """``jvm``, ``worker`` (a Spark Python worker) or ``python`` (another Python process) or ``other``."""
    cmd = _cmdline(pid)
    if "java" in cmd.split(" ", 1)[0] or " org.apache.spark" in cmd:
        return "jvm"
    if "pyspark.daemon" in cmd or "pyspark.worker" in cmd:
        return "worker"
    return "python" if "python" in cmd else "other"


@dataclass
class TreeSampler:
    """Peak RSS (MiB) of a process tree by kind, sampled in a thread between :meth:`start` and :meth:`stop`."""

    root: int
    interval: float = 0.1
    include_root: bool = False
    peaks: dict[str, float] = field(default_factory=dict)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    METHOD = "VmRSS of the process tree, sampled every 0.1 s (a lower bound of the peak)"

    def sample(self) -> dict[str, float]:
        """The RSS (MiB) of the tree now, summed per kind, with ``executor`` = JVM + Spark Python workers."""
        pids = descendants(self.root) + ([self.root] if self.include_root else [])
        now: dict[str, float] = {"jvm": 0.0, "worker": 0.0, "python": 0.0}
        for pid in pids:
            kind = kind_of(pid)
            if kind in now:
                now[kind] += _rss_kb(pid) / 1024
        now["executor"] = now["jvm"] + now["worker"]
        return now

    def _run(self) -> None:
        while True:
            for k, v in self.sample().items():
                self.peaks[k] = max(self.peaks.get(k, 0.0), v)
            self.samples += 1
            if self._stop.wait(self.interval):
                return

    def start(self) -> TreeSampler:
        """Start sampling (peaks from zero)."""
        self.peaks, self.samples = {}, 0
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        """Stop sampling; the peaks in MiB by kind (``jvm``, ``worker``, ``python``, ``executor``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return {f"{k}_peak_mb": round(v, 1) for k, v in self.peaks.items()}


def file_kind(path: str) -> str:
    """What a file under a table folder is, from its name and folder (see :data:`KINDS`)."""
    name = os.path.basename(path)
    parent = os.path.basename(os.path.dirname(path))
    if parent == "_lineage":
        return "lineage_segments" if name.endswith("-segment.parquet") else "lineage_lists"
    if parent == "_index":
        if name.endswith("-deleted-rows.parquet"):
            return "deleted_rows_index"
        return "key_index" if name.endswith(".kix") else "other"
    if name.endswith(".metadata.json"):
        return "metadata_json"
    if name.endswith(".avro"):
        return "manifest_lists" if name.startswith("snap-") else "manifests"
    if name.endswith("-deletes.parquet") or name.endswith(".puffin"):
        return "position_deletes"
    if name.endswith(".parquet"):
        return "data"
    return "other"


def table_sizes(files: dict[str, int]) -> dict[str, dict[str, int]]:
    """``{kind: {"bytes": ..., "files": ...}}`` of ``files`` (path -> size), every kind present."""
    out = {k: {"bytes": 0, "files": 0} for k in KINDS}
    for path, size in files.items():
        entry = out[file_kind(path)]
        entry["bytes"] += size
        entry["files"] += 1
    return out


def new_files(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The files of ``after`` that ``before`` lacks (what a step wrote)."""
    return {p: s for p, s in after.items() if p not in before}


# The start of every fresh-process script: the repository on the path (argv[1]), the imports counted before
# the baseline, and rss(field) reading a /proc/self/status field in KiB (VmRSS now, VmHWM the peak).
_PRELUDE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import lineage
def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
import pyarrow, duckdb, pyiceberg.table  # imports before the baseline
"""

_PLAN = _PRELUDE + r"""
from index.key_index import KeyIndex
base = rss("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
t = lineage.open_table(sys.argv[3], warehouse=sys.argv[2])
state = t.state()
files = state.live_files()
planned = rss("VmHWM")
index = KeyIndex.open(state)
peak = rss("VmHWM")
print(json.dumps({"files": len(files), "baseline_mb": round(base / 1024, 1), "plan_grew_mb": round((planned - base) / 1024, 1),
                  "with_key_index_grew_mb": round((peak - base) / 1024, 1), "peak_mb": round(peak / 1024, 1),
                  "key_index_segments": len(index.segments) if index is not None else 0}))
"""


def planning_memory(repo: str, warehouse: str, name: str) -> dict[str, Any]:
    """Peak RSS growth of a fresh Python process that opens the table, plans its live files (with their
    lineage) and opens its key index: the driver's planning memory, apart from the interpreter and imports."""
    return in_fresh_process(_PLAN, repo, warehouse, name)


def referenced_sizes(table: Any) -> dict[str, dict[str, int]]:
    """The files the table's current snapshot refers to, by kind (what a vacuum keeps; see :func:`table_sizes`).

    Data and delete files from the live files, manifests and the manifest list from the snapshot, lineage
    segments and key index segments from the lineage list.
    """
    from lineage.storage.fileio import local_path
    from lineage.storage.metadata import is_inline_segment

    def size(path: str) -> int:
        return os.path.getsize(local_path(path))

    state = table.state()
    files = state.live_files()
    snapshot = table.iceberg.current_snapshot()
    manifests = snapshot.manifests(table.iceberg.io)
    deletes = {d for f in files for d in f.delete_paths}
    lin = state.lineage
    keys = lin.key_index or ()
    return {
        "data": {"files": len(files), "bytes": sum(int(f.data_file.file_size_in_bytes) for f in files)},
        "position_deletes": {"files": len(deletes), "bytes": sum(size(d) for d in deletes)},
        "manifests": {"files": len(manifests), "bytes": sum(int(m.manifest_length) for m in manifests)},
        "manifest_lists": {"files": 1, "bytes": size(snapshot.manifest_list)},
        # a small commit's segment is inside its lineage list (format 4): the bytes the list records for it
        "lineage_segments": {"files": len(lin.segments),
                             "bytes": sum(lin.segment_bytes.get(s, 0) if is_inline_segment(s) else size(s) for s in lin.segments)},
        "key_index": {"files": len(keys), "bytes": sum(size(k) for k in keys)},
    }


_REINDEX = _PRELUDE + r"""
t = lineage.open_table(sys.argv[3], warehouse=sys.argv[2])
t.state().live_files()
base = rss("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
start = time.perf_counter()
t.reindex()
print(json.dumps({"seconds": round(time.perf_counter() - start, 2), "baseline_mb": round(base / 1024, 1),
                  "peak_mb": round(rss("VmHWM") / 1024, 1), "grew_mb": round((rss("VmHWM") - base) / 1024, 1)}))
"""


def reindex_memory(repo: str, warehouse: str, name: str) -> dict[str, Any]:
    """Time and peak RSS growth of a fresh Python process rebuilding the table's key index (``Table.reindex``,
    one process holding every key). It commits: the caller puts the table back where it was."""
    return in_fresh_process(_REINDEX, repo, warehouse, name)


def in_fresh_process(script: str, *args: str) -> dict[str, Any]:
    """Run ``script`` in a new Python process; the JSON object its last line prints, or ``{"error": ...}``."""
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])
