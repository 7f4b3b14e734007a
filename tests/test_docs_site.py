"""The generated parts of the documentation site cover what they are generated from.

The site (``make docs``: ``mkdocs build --strict``) generates its CLI reference from the argument parser,
its error hierarchy from the exception classes, and its benchmark plots from the committed records
(``tools/docs_hooks.py``). These tests check the generators without building the site: every command and
option of the parser is in the CLI reference, every exception class in the hierarchy, every plot is a PNG,
and every page under ``docs/`` is in the site's navigation.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (os.path.join(ROOT, "tools"), os.path.join(ROOT, "benchmarks")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import cli_reference  # noqa: E402
import docs_hooks  # noqa: E402

import lineage  # noqa: E402
from lineage.cli.parser import build_parser  # noqa: E402


def test_the_cli_reference_has_every_command_and_option() -> None:
    text = cli_reference.render()
    found = list(cli_reference.commands(build_parser()))
    assert {" ".join(c.words) for c in found} >= {"create", "changes", "mv refresh", "maintain", "verify"}
    for cmd in found:
        assert f"### lineage {' '.join(cmd.words)}\n" in text
        for action in cmd.parser._actions:  # noqa: SLF001
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):  # noqa: SLF001
                continue
            for option in action.option_strings:
                assert f"`{option}`" in text, f"lineage {' '.join(cmd.words)}: {option} is not in the CLI reference"


def test_the_cli_reference_escapes_what_markdown_would_read_as_links() -> None:
    text = cli_reference.render()
    assert "[GROUP BY]" not in text.replace("\\[GROUP BY\\]", "")


def test_the_error_hierarchy_has_every_exception_class() -> None:
    import lineage.errors

    text = docs_hooks.error_hierarchy()
    classes = [c for c in vars(lineage.errors).values() if isinstance(c, type) and issubclass(c, lineage.LineageError)]
    assert len(classes) > 10
    for cls in classes:
        assert f"[`lineage.{cls.__name__}`](#lineage.{cls.__name__})" in text, cls
        assert f"::: lineage.{cls.__name__}\n" in text
    assert "::: cdf.mv.ViewQueryError\n" in text
    # nesting follows inheritance: a subclass is indented below its base
    lines = text.splitlines()
    depth = {re.search(r"`([\w.]+)`", line).group(1): (len(line) - len(line.lstrip())) // 4 for line in lines if line.lstrip().startswith("- [")}
    assert depth["lineage.LineageError"] == 0 and depth["lineage.InvalidArgumentError"] == 1
    assert depth["lineage.HistoryGapError"] == depth["lineage.RetentionError"] + 1


def test_every_plot_is_a_png() -> None:
    pytest.importorskip("matplotlib")
    import docs_plots

    plots = docs_plots.draw_all()
    assert {"peers-1m.png", "cdc.png", "history.png", "feed-stream.png", "feed-growth.png"} <= set(plots)
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") for png in plots.values())


def test_every_page_is_in_the_navigation_and_every_image_is_drawn() -> None:
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        nav = set(re.findall(r":\s*([\w./-]+\.md)\s*$", f.read(), flags=re.MULTILINE))
    pages = set()
    for folder, _, names in os.walk(os.path.join(ROOT, "docs")):
        pages |= {os.path.relpath(os.path.join(folder, n), os.path.join(ROOT, "docs")) for n in names if n.endswith(".md")}
    assert pages == nav, f"pages not in the nav: {sorted(pages - nav)}; nav entries without a page: {sorted(nav - pages)}"
    import docs_plots

    for page in pages:
        with open(os.path.join(ROOT, "docs", page), encoding="utf-8") as f:
            for image in re.findall(r"\]\(img/([\w.-]+\.png)\)", f.read()):
                assert image[:-4] in docs_plots.PLOTS, f"docs/{page} shows img/{image}, which no plot draws"
