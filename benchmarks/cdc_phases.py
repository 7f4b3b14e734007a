"""Where a change-stream commit's time goes: wall time per phase of ``Table.apply_changelog``.

``cdc.py --phases`` installs a :class:`PhaseTimer` in the child process of the
``lineage`` and ``lineage-v3`` systems. It wraps the functions that make up a
commit (planning and the key-index lookup, the deletes, the data files, the
lineage and key-index files, the manifests, the metadata file, the catalog
swap) wherever a module holds them, and records each call's wall time under
its call path (``apply_changelog/_materialize_and_commit/write_vectors``), per
commit. The report gives the mean per commit of each path and, for the
slowest commits, the phases that took longest: periodic work (a fold of small
files, a manifest or key-index merge) shows up there, where it sets p99.

Only calls on the main thread are timed; work a phase hands to threads counts
in the phase that waits for it.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

# module:function, in call order; a class method is module:Class.method
PHASES = (
    "lineage.writes.changelog:apply_changelog",
    "lineage.writes.live_images:live_images_for_keys",
    "lineage.writes.changelog_arrow:collapse",
    "lineage.writes.loop:_materialize_and_commit",
    "lineage.storage.deletion_vectors:write_vectors",
    "lineage.storage.merged_deletes:write_merged_deletes",
    "lineage.storage.writer:write_data_files",
    "lineage.writes.small_files:rewrite_kept",
    "lineage.writes.small_files:untouched_fold",
    "index.key_index:_merged",
    "index.key_index:file_entries",
    "lineage.commits.producer:LineageSnapshotProducer._carried_manifests",
    "lineage.commits.producer:LineageSnapshotProducer._manifests",
    "lineage.commits.commit:commit_change",
    "lineage.commits.commit:build_lineage",
    "lineage.storage.metadata:write_segment",
    "index.deleted_rows:write_index_segment",
    "index.key_index:next_key_index",
    "lineage.commits.commit:commit_files",
    "lineage.commits.producer:LineageSnapshotProducer.updates_and_requirements",
    "lineage.catalog:write_metadata",
    "lineage.catalog:swap_metadata",
)


@dataclass
class PhaseTimer:
    """Wall time of the :data:`PHASES` per commit; :meth:`next_commit` starts a new one."""

    per_commit: list[dict[str, float]] = field(default_factory=list)
    _stack: list[str] = field(default_factory=list)
    _main: threading.Thread = field(default_factory=threading.main_thread)

    def install(self, phases: tuple[str, ...] = PHASES) -> PhaseTimer:
        """Wrap each phase's function in every loaded module that holds it (so ``from x import f`` is timed too)."""
        for spec in phases:
            module_name, name = spec.split(":")
            module = importlib.import_module(module_name)
            if "." in name:
                cls_name, method = name.split(".")
                cls = getattr(module, cls_name)
                setattr(cls, method, self._wrap(getattr(cls, method), method))
                continue
            fn = getattr(module, name)
            wrapped = self._wrap(fn, name)
            for m in list(sys.modules.values()):
                if getattr(m, name, None) is fn:
                    setattr(m, name, wrapped)
        return self

    def _wrap(self, fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not self._main or not self.per_commit:
                return fn(*args, **kwargs)
            self._stack.append(label)
            path = "/".join(self._stack)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.per_commit[-1][path] += time.perf_counter() - start
                self._stack.pop()
        return timed

    def next_commit(self) -> None:
        """Time the calls that follow as the next commit's."""
        self.per_commit.append(defaultdict(float))

    def summary(self, latencies_ms: list[float], slowest: int = 8) -> dict[str, Any]:
        """Mean ms per commit of each call path, and the five longest phases of the ``slowest`` commits."""
        n = max(len(self.per_commit), 1)
        paths = sorted({p for c in self.per_commit for p in c})
        mean = {p: 1000 * sum(c.get(p, 0.0) for c in self.per_commit) / n for p in paths}
        first, last = self.per_commit[:50], self.per_commit[-50:]
        ends = {p: [1000 * sum(c.get(p, 0.0) for c in part) / max(len(part), 1) for part in (first, last)] for p in paths}
        order = sorted(range(len(latencies_ms)), key=lambda i: -latencies_ms[i])[:slowest]
        slow = []
        for i in order:
            inner = sorted(((v, p.rsplit("/", 1)[-1]) for p, v in self.per_commit[i].items() if "/" in p), reverse=True)[:5]
            slow.append({"commit": i, "ms": latencies_ms[i], "phases": {name: round(v * 1000, 1) for v, name in inner}})
        # what the commits slower than twice the median spend their time on: the innermost phase that took longest
        median = float(sorted(latencies_ms)[len(latencies_ms) // 2]) if latencies_ms else 0.0
        heavy: dict[str, int] = defaultdict(int)
        for i, ms in enumerate(latencies_ms):
            if ms > 2 * median and i < len(self.per_commit):
                c = self.per_commit[i]
                inner = [(v, p.rsplit("/", 1)[-1]) for p, v in c.items() if not any(q.startswith(p + "/") for q in c)]
                heavy[max(inner)[1] if inner else "?"] += 1
        return {"mean_ms": mean, "first_last_50_ms": ends, "slowest": slow, "over_twice_median": dict(heavy)}


def report(system: str, phases: dict[str, Any]) -> list[str]:
    """Lines of the report: the phase tree with mean ms per commit, then the slowest commits."""
    lines = ["", f"{system}: mean ms per commit by phase (wall, main thread); mean of the first and last 50 commits", ""]
    ends = phases.get("first_last_50_ms", {})
    for path, ms in phases["mean_ms"].items():
        depth = path.count("/")
        first, last = ends.get(path, (float("nan"), float("nan")))
        lines.append(f"    {'  ' * depth}{path.rsplit('/', 1)[-1]:<{48 - 2 * depth}} {ms:7.2f} {first:7.2f} {last:7.2f}")
    heavy = phases.get("over_twice_median", {})
    lines.append(f"{system}: {sum(heavy.values())} commits over twice the median, by longest inner phase: "
                 + ", ".join(f"{k} {v}" for k, v in sorted(heavy.items(), key=lambda kv: -kv[1])))
    lines.append(f"{system}: slowest commits and their longest phases")
    for s in phases["slowest"]:
        lines.append(f"    commit {s['commit']:4d} {s['ms']:6.0f} ms: " + ", ".join(f"{k} {v:.0f}" for k, v in s["phases"].items()))
    return lines
