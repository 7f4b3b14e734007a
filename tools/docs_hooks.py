"""MkDocs hooks (``mkdocs.yml``: ``hooks``): the parts of the site generated from the code and the records.

* ``<!-- generated: cli-reference -->`` in a page becomes the CLI reference (``tools/cli_reference.py``, from
  the argument parser ``lineage`` itself uses);
* ``<!-- generated: error-hierarchy -->`` becomes the tree of the project's exception classes, walked from
  the classes the packages ``lineage`` and ``cdf.mv`` export, with an API entry for each;
* every plot of ``benchmarks/docs_plots.py`` is drawn from ``benchmarks/results/`` into
  ``benchmarks/img/<name>.png`` of the site (the files exist only in the built site).

The benchmark tables and sentences are not generated here: they are generated blocks in the pages
themselves, rewritten by ``benchmarks/report.py`` and checked against the records by the tests.
"""

from __future__ import annotations

import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _importable() -> None:
    """The repository, tools/ and benchmarks/ on sys.path (MkDocs restores sys.path after loading a hook module)."""
    for path in (ROOT, os.path.join(ROOT, "tools"), os.path.join(ROOT, "benchmarks")):
        if path not in sys.path:
            sys.path.insert(0, path)

CLI_MARKER = "<!-- generated: cli-reference -->"
ERRORS_MARKER = "<!-- generated: error-hierarchy -->"


def error_classes() -> list[tuple[str, type]]:
    """``(public name, class)`` of every exception class ``lineage`` and ``cdf.mv`` export, base first."""
    import cdf.mv
    import lineage

    found = {}
    for module, prefix in ((lineage, "lineage"), (cdf.mv, "cdf.mv")):
        for name in getattr(module, "__all__", dir(module)):
            obj = getattr(module, name, None)
            if isinstance(obj, type) and issubclass(obj, lineage.LineageError):
                found.setdefault(obj, f"{prefix}.{name}")
    return sorted(((n, c) for c, n in found.items()), key=lambda nc: len(nc[1].__mro__))


def error_hierarchy() -> str:
    """The exception tree as a nested list (first docstring line each), then one API entry per class."""
    import lineage

    classes = error_classes()
    names = {c: n for n, c in classes}

    def children(parent: type) -> list[type]:
        return [c for _, c in classes if c is not parent and _nearest_listed_base(c, names) is parent]

    lines: list[str] = []

    def walk(cls: type, depth: int) -> None:
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        extra = [b.__name__ for b in cls.__bases__ if b not in names and b is not Exception]
        also = f" (also a `{'`, `'.join(extra)}`)" if extra else ""
        lines.append(f"{'    ' * depth}- [`{names[cls]}`](#{names[cls]}){also}: {doc}")
        for child in children(cls):
            walk(child, depth + 1)

    walk(lineage.LineageError, 0)
    entries = [f"::: {n}\n    options:\n      heading_level: 3\n      show_root_full_path: true\n      members: false" for n, _ in classes]
    return "\n".join(lines) + "\n\n## The classes\n\n" + "\n\n".join(entries) + "\n"


def _nearest_listed_base(cls: type, listed: dict[type, str]) -> type | None:
    for base in cls.__mro__[1:]:
        if base in listed:
            return base
    return None


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:  # noqa: ARG001 - MkDocs' hook signature
    """Replace the generation markers of a page with what they stand for."""
    _importable()
    if CLI_MARKER in markdown:
        import cli_reference

        markdown = markdown.replace(CLI_MARKER, cli_reference.render())
    if ERRORS_MARKER in markdown:
        markdown = markdown.replace(ERRORS_MARKER, error_hierarchy())
    return markdown


def on_files(files: Any, config: Any) -> Any:
    """Add the benchmark plots, drawn from the committed records, to the site."""
    _importable()
    from mkdocs.structure.files import File

    import docs_plots

    for name, png in docs_plots.draw_all().items():
        files.append(File.generated(config, f"benchmarks/img/{name}", content=png))
    return files
