"""The import structure of ``lineage``, ``cdf`` and ``index``: no cycle, and every arrow points down a layer.

The graph is read from the source (``ast``), so it sees every import,
including those inside functions; imports under ``if TYPE_CHECKING:`` are
left out (they never run). ``from pkg import name`` is an arrow to the
package ``pkg`` (its ``__init__`` runs) and, when ``name`` is a module, to
that module as well. The layers and their rules are those of
``docs/architecture.md``.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("lineage", "cdf", "index")

# Layers, lowest first: a module may import modules of its own layer or of a lower one. The first matching
# pattern wins ("x.*" matches the package x and everything under it). docs/architecture.md draws the same picture.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", (
        "lineage.errors", "lineage.properties", "lineage.properties_page", "lineage.columns", "lineage.arrays", "lineage.memory",
        "lineage.catalog", "lineage.duck", "lineage.decoded_cache", "lineage.identity_cache",
        "lineage.storage", "lineage.storage.fileio", "lineage.storage.rle", "lineage.storage.puffin",
        # the object store: settings, file systems, pyiceberg FileIO, DuckDB and Spark-worker access
        "lineage.storage.settings", "lineage.storage.files", "lineage.storage.store_fileio", "lineage.storage.duckdb_s3",
        "lineage.storage.objects", "lineage.storage.s3_get", "lineage.storage.s3_reader", "lineage.storage.puts",
        "lineage.storage.s3_ranges", "lineage.storage.prefetch", "lineage.storage.removals",
        "lineage.storage.spark_read",
        "lineage.iceberg", "lineage.iceberg.schema", "lineage.iceberg.v3_metadata",
        "lineage.commits", "lineage.commits.merge_rule",
        "lineage.read", "lineage.sql", "lineage.sql.allowlist",
        "lineage.writes.changelog_sql", "cdf.dialect",
    )),
    ("format", (
        "lineage.storage.*", "lineage.storage.merged_deletes", "lineage.storage.v3_parquet", "lineage.iceberg.planning", "lineage.iceberg.v3_tables",
        "index", "index.deleted_rows", "index.deleted_rows_stream", "index.key_entries", "index.key_delta", "index.segment_rows", "index.purged", "index.key_hash", "index.key_merge_policy", "index.key_segment",
        "index.key_store", "index.key_legacy", "index.key_packed", "index.key_build", "index.key_merge",
    )),
    ("state", (
        "lineage.state", "lineage.context", "lineage.retention", "lineage.outcome", "lineage.spark", "lineage.spark_match",
        "lineage.commits.*",
        "lineage.read.*", "lineage.read.arrow_scan", "lineage.read.chunk_ranges", "lineage.sql.*", "lineage.iceberg.equality", "lineage.iceberg.row_lineage", "index.key_index",
    )),
    ("reconcile", ("lineage.reconcile.*",)),
    ("operations", ("lineage.writes.*", "lineage.maintenance.*", "cdf.retention", "cdf.pointers", "cdf.plan", "cdf.output",
                    "cdf.threads", "cdf.engine_duckdb", "cdf.engine_spark", "cdf.stream", "cdf.groups", "cdf.spark_groups",
                    "cdf.captured")),
    ("facade", ("lineage", "lineage.table", "lineage.adoption", "lineage.streaming", "cdf", "cdf.api", "cdf.follow", "cdf.views",
                "cdf.spark", "cdf.spark_source", "cdf.mv", "cdf.mv.api", "cdf.mv.engines", "cdf.mv.query", "cdf.mv.sql",
                "cdf.mv.stored", "cdf.mv.view")),
    ("cli", ("lineage.cli.*", "cdf.mv.cli", "cdf.mv.__main__")),
]

# Inside the operations layer the three kinds of operation stay apart: none imports another's modules.
OPERATION_GROUPS = {
    "writes": ("lineage.writes.*",),
    "maintenance": ("lineage.maintenance.*",),
    "feed": ("cdf.retention", "cdf.pointers", "cdf.plan", "cdf.output", "cdf.threads", "cdf.engine_duckdb", "cdf.engine_spark", "cdf.stream",
             "cdf.groups", "cdf.spark_groups", "cdf.captured"),
}

# Arrows allowed against the rules above, each with the reason. Keep this list short.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    # The package re-exports main, the entry point of `python -m cdf.mv`, as a public name; cdf.mv.cli imports
    # cdf.mv.api and cdf.mv.view, never the package, so the arrow closes no cycle.
    ("cdf.mv", "cdf.mv.cli"): "public name cdf.mv.main",
}


def _matches(module: str, pattern: str) -> bool:
    if pattern.endswith(".*"):
        base = pattern[:-2]
        return module == base or module.startswith(base + ".")
    return module == pattern


def _first_match(module: str, table: list[tuple[str, tuple[str, ...]]]) -> str | None:
    for name, patterns in table:
        if any(_matches(module, p) for p in patterns):
            return name
    return None


def modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the three packages: name -> (file, is a package)."""
    out: dict[str, tuple[Path, bool]] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            out[".".join(parts)] = (path, is_pkg)
    return out


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _type_checking(child):
            for stmt in child.orelse:
                if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    yield stmt
                yield from _imports(stmt)
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from _imports(child)


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (at any depth of its code, TYPE_CHECKING blocks left out).

    Parsed once per test session and shared by the tests that read it: do not modify it.
    """
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in mods.items():
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(t for t in (resolve(a.name) for a in node.names) if t)
                continue
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            package = resolve(source)
            if package:
                targets.add(package)
            targets.update(f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in mods)
        targets.discard(name)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Arrows that point up a layer, or between two kinds of operation, and are not in ALLOWED_UPWARD."""
    rank = {name: i for i, (name, _) in enumerate(LAYERS)}
    groups = list(OPERATION_GROUPS.items())
    bad = []
    for source, targets in sorted(graph.items()):
        s_layer = _first_match(source, LAYERS)
        s_group = _first_match(source, groups)
        for target in sorted(targets):
            if (source, target) in ALLOWED_UPWARD:
                continue
            t_layer = _first_match(target, LAYERS)
            if rank[t_layer] > rank[s_layer]:  # type: ignore[index]
                bad.append(f"{source} ({s_layer}) imports {target} ({t_layer})")
                continue
            t_group = _first_match(target, groups)
            if s_group and t_group and s_group != t_group:
                bad.append(f"{source} ({s_group}) imports {target} ({t_group}): operations do not import each other")
    return bad


def test_every_module_has_a_layer():
    unplaced = [m for m in modules() if _first_match(m, LAYERS) is None]
    assert not unplaced, f"add these modules to a layer in tests/test_architecture.py and docs/architecture.md: {unplaced}"


def test_the_import_graph_has_no_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles (imports inside functions count):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_imports_point_down_the_layers():
    bad = layer_violations(import_graph())
    assert not bad, "imports against docs/architecture.md:\n" + "\n".join(bad)


def test_allowed_upward_arrows_are_still_needed():
    graph = import_graph()
    stale = [f"{s} -> {t}" for s, t in ALLOWED_UPWARD if t not in graph.get(s, set())]
    assert not stale, f"remove these entries of ALLOWED_UPWARD, the imports are gone: {stale}"


def test_the_checker_sees_cycles_and_upward_arrows():
    graph = {"lineage.errors": {"lineage.table"}, "lineage.table": {"lineage.errors"}}
    assert cycles(graph) == [["lineage.errors", "lineage.table"]]
    assert layer_violations(graph) == ["lineage.errors (foundation) imports lineage.table (facade)"]
    assert layer_violations({"lineage.maintenance.purge": {"cdf.retention"}, "cdf.retention": set()}) == [
        "lineage.maintenance.purge (maintenance) imports cdf.retention (feed): operations do not import each other"
    ]


def test_function_level_and_package_imports_are_edges():
    graph = import_graph()
    # lineage.table imports lineage.writes.spark with `from lineage.writes import spark`: both the package and the module.
    assert {"lineage.writes", "lineage.writes.spark"} <= graph["lineage.table"]
    # lineage.cli.tables imports lineage.cli.demo inside a function (the CLI starts fast).
    assert "lineage.cli.demo" in graph["lineage.cli.tables"]


# One interpreter imports every module in turn, after dropping the library's modules from sys.modules, so each
# module's import runs the library's code from scratch. The library's code objects are compiled once and reused
# (keyed by path and source): running a module does not depend on it, and recompiling each module for each of the
# ~170 imports was most of the test's time (when no bytecode is written).
IMPORT_EACH_FIRST = """
import importlib, importlib.machinery, json, sys
compiled = {}
compile_source = importlib.machinery.SourceFileLoader.source_to_code
def source_to_code(self, data, path, *, _optimize=-1):
    key = (path, data, _optimize)
    if key not in compiled:
        compiled[key] = compile_source(self, data, path, _optimize=_optimize)
    return compiled[key]
importlib.machinery.SourceFileLoader.source_to_code = source_to_code
failed = {}
names = json.loads(sys.argv[1])
for name in names:
    for loaded in [m for m in sys.modules if m.split(".")[0] in ("lineage", "cdf", "index")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""


def test_each_module_imports_first():
    """No import order is forced: every module imports in a process that loaded no other module of the library."""
    names = [m for m in modules() if not m.endswith("__main__")]
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH_FIRST, json.dumps(names)], cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failed, failed
