"""The CLI reference page, generated from the ``lineage`` argument parser.

``render()`` walks the parser that ``lineage`` itself parses with (``lineage.cli.parser.build_parser``) and
writes one section per command (nested commands such as ``mv refresh`` included): its help text, its usage
line as argparse prints it, and a table of its arguments (name, value, default, help). The documentation
build calls it (``tools/docs_hooks.py``), so the page cannot drift from the parser; run it by hand to see
the Markdown::

    python tools/cli_reference.py
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Command:
    """One command of the parser: its words after ``lineage`` and its own parser."""

    words: tuple[str, ...]
    help: str
    parser: argparse.ArgumentParser


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:  # noqa: SLF001 - argparse has no public walk
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return action
    return None


def commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> Iterator[Command]:
    """Every command below ``parser``, depth first, in the order the parser defines them."""
    sub = _subparsers(parser)
    if sub is None:
        return
    helps = {a.dest: a.help or "" for a in sub._choices_actions}  # noqa: SLF001
    for name, child in sub.choices.items():
        yield Command((*words, name), helps.get(name, child.description or ""), child)
        yield from commands(child, (*words, name))


def _cell(text: str) -> str:
    """Text for a Markdown table cell: pipes and brackets escaped (``[GROUP BY]`` is no link)."""
    return text.replace("|", "\\|").replace("[", "\\[").replace("]", "\\]").replace("\n", " ")


def _arguments(parser: argparse.ArgumentParser) -> list[list[str]]:
    rows = []
    for a in parser._actions:  # noqa: SLF001
        if a.help == argparse.SUPPRESS or isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):  # noqa: SLF001
            continue
        if a.option_strings:
            name = ", ".join(f"`{o}`" for o in a.option_strings)
            takes = a.nargs != 0
            value = f"`{a.metavar or a.dest.upper()}`" if takes else ""
        else:
            name = f"`{a.metavar or a.dest}`"
            value = ""
        if a.nargs in ("*", "+"):
            value = (value or name) + " ..."
        default = ""
        if a.default not in (None, argparse.SUPPRESS, False) and not isinstance(a, argparse._VersionAction):  # noqa: SLF001
            default = f"`{a.default}`"
        help_text = (a.help or "") % {"default": a.default, "prog": parser.prog} if a.help and "%(" in a.help else (a.help or "")
        if a.required and a.option_strings:
            help_text = "required; " + help_text
        if a.choices and not isinstance(a.choices, dict):
            help_text += " (one of " + ", ".join(f"`{c}`" for c in a.choices) + ")"
        rows.append([name, value, default, _cell(help_text)])
    return rows


def _table(rows: list[list[str]]) -> str:
    lines = ["| argument | value | default | meaning |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=100)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)  # noqa: SLF001
    return formatter.format_help().strip()


def render() -> str:
    """The Markdown of the whole reference: the global options, then one section per command."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from lineage.cli.parser import build_parser

    parser = build_parser()
    parts = [
        parser.description or "",
        "",
        "```text",
        _usage(parser),
        "```",
        "",
        "### Global options",
        "",
        "They go before the command and are also accepted after it.",
        "",
        _table(_arguments(parser)),
        "",
    ]
    if parser.epilog:
        parts += [parser.epilog, ""]
    for cmd in commands(parser):
        title = " ".join(cmd.words)
        sentence = cmd.help[:1].upper() + cmd.help[1:] + ("" if cmd.help.endswith(".") else ".")
        parts += [f"### lineage {title}", "", _cell(sentence), "",
                  "```text", _usage(cmd.parser), "```", ""]
        rows = _arguments(cmd.parser)
        if rows:
            parts += [_table(rows), ""]
    return "\n".join(parts)


if __name__ == "__main__":
    print(render())
