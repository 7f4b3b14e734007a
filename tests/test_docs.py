"""The examples of the README and of every documentation page run as written and print exactly what they show.

The documents are README.md and every page under docs/ (the MkDocs site); each one that has an example is
tested on its own, as its own session. Convention for their examples (docs/development.md, "Testing the
documentation"):

* Every ```` ```python ```` block of a document runs, in document order, in **one** namespace and one fresh
  temporary working directory: a page reads as one session, so a block may use names an earlier block of
  the same page defined (never a name of another page).
  A block fenced ```` ```py ```` is shown but not run (it needs a cluster, a server or paths of your own).
* Every ``print(...)`` in a run block states its output in a comment, in one of two forms:

  - same line: ``print(x)  # OUTPUT``. OUTPUT ends at the first run of two or more spaces; what follows is
    commentary (``print(t.count())  # 3  (deleted rows are gone)``);
  - following lines: ``print(x)`` with no comment, then one or more lines starting with ``#``; each loses
    its ``#`` and one space, and together they are OUTPUT (no commentary there).

  A print that runs several times (in a loop) claims its outputs joined by newlines.
* OUTPUT is compared with what the print actually printed: when both parse as Python literals
  (``ast.literal_eval``) they must be equal value for value, type for type (``1`` is not ``1.0``, dict
  key order aside); otherwise the texts must be equal after stripping. A print without a claim, a claim
  without a print, and a print that never ran all fail the test.
* The ```` ```console ```` transcripts of a document run in order as one bash script in a fresh temporary
  directory (shown as ``/home/user/demo``), ``lineage`` on ``PATH``, stderr merged into stdout. Each
  ``$ command``'s output must equal the lines under it, except for what varies between runs and is
  replaced on both sides before comparing: timestamps (``2026-11-22 01:48:26.841Z``,
  ``2026-11-22T01:48:40.880000Z``) and sizes with a unit (``7.1 KiB``, ``0 B``: file sizes depend on the
  path lengths written into Iceberg manifests). Counts, versions, values, messages and layout must match.
* ``test_python_claims_are_sensitive`` and ``test_console_claims_are_sensitive`` change one digit (or letter) of every claim and checks that the
  comparison then fails, so no claim is checked too loosely.
"""

from __future__ import annotations

import ast
import contextlib
import io
import math
import os
import re
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
README_MAX_LINES = 200
CONSOLE_CWD = "/home/user/demo"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d+)?Z?")
SIZE = re.compile(r"\b\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|bytes per live key)\b")  # sizes depend on paths and uuids
MARKER = "@@readme-console-step@@"


# --------------------------------------------------------------------------- parsing the README
@dataclass
class Block:
    lang: str
    line: int  # document line of the block's first code line
    code: str
    source: str = "README.md"  # the document, relative to the repository


@dataclass
class Claim:
    line: int  # document line of the print statement's last line
    text: str
    printed: list[str] = field(default_factory=list)


def blocks(text: str, lang: str, source: str = "README.md") -> list[Block]:
    out = []
    for m in FENCE.finditer(text):
        if m.group(1) == lang:
            out.append(Block(lang, text.count("\n", 0, m.start(2)) + 1, m.group(2), source))
    return out


def documents() -> list[str]:
    """README.md and every page of docs/, relative to the repository, README first."""
    pages = []
    for folder, _, names in os.walk(DOCS):
        pages += [os.path.relpath(os.path.join(folder, n), ROOT) for n in names if n.endswith(".md")]
    return ["README.md", *sorted(pages)]


def read(doc: str) -> str:
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        return f.read()


def with_examples(lang: str) -> list[str]:
    """The documents that have at least one block of ``lang``."""
    return [d for d in documents() if blocks(read(d), lang, d)]


def print_statements(code: str) -> list[ast.Call]:
    """Every ``print(...)`` call in ``code``."""
    return [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"]


def claims(block: Block) -> dict[int, Claim]:
    """The claimed output of each print of ``block``, keyed by the print's last line in the block (1-based)."""
    lines = block.code.splitlines()
    out: dict[int, Claim] = {}
    for call in print_statements(block.code):
        end = call.end_lineno or call.lineno
        tail = lines[end - 1][call.end_col_offset:]
        doc_line = block.line + end - 1
        comment = tail.split("#", 1)[1] if "#" in tail else None
        if comment is not None and comment.strip():
            text = re.split(r"\s{2,}", comment.strip(), maxsplit=1)[0]
        else:
            following = []
            for nxt in lines[end:]:
                if not nxt.lstrip().startswith("#"):
                    break
                body = nxt.lstrip()[1:]
                following.append(body.removeprefix(" "))
            if not following:
                raise AssertionError(f"{block.source}:{doc_line}: print(...) without a claimed output (see tests/test_docs.py)")
            text = "\n".join(following)
        out[end] = Claim(doc_line, text)
    return out


class _Printer(ast.NodeTransformer):
    """Rewrites ``print(...)`` into ``__readme_print__(<last line>, ...)``."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "print":
            node.func = ast.copy_location(ast.Name("__readme_print__", ast.Load()), node.func)
            node.args.insert(0, ast.copy_location(ast.Constant(node.end_lineno or node.lineno), node))
        return node


# --------------------------------------------------------------------------- comparing
def _literal(text: str) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False, None


def same_value(a: Any, b: Any) -> bool:
    """Equal value for value and type for type (``1`` is not ``1.0`` or ``True``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, (set, frozenset)):
        return a == b
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))  # NaN claims NaN


def matches(claimed: str, printed: str) -> bool:
    """The README's claim against the actual output: structurally for literals, else as text."""
    ok_c, vc = _literal(claimed)
    ok_p, vp = _literal(printed)
    if ok_c and ok_p:
        return same_value(vc, vp)
    return claimed.strip() == printed.strip()


def normalize_console(text: str, cwd: str) -> list[str]:
    text = text.replace(cwd, CONSOLE_CWD)
    text = TIMESTAMP.sub("<timestamp>", text)
    text = SIZE.sub("<size>", text)
    return [line.rstrip() for line in text.strip("\n").splitlines()]


def mutate(text: str) -> str | None:
    """``text`` with one character changed where a reader would notice: the last digit, else the last letter."""
    for pattern in (r"\d", r"[A-Za-z]"):
        spots = [m.start() for m in re.finditer(pattern, text)]
        if spots:
            i = spots[-1]
            c = text[i]
            repl = str((int(c) + 1) % 10) if c.isdigit() else ("x" if c != "x" else "y")
            return text[:i] + repl + text[i + 1:]
    return None


# --------------------------------------------------------------------------- running
@dataclass
class PythonRun:
    claims: list[Claim]
    errors: list[str]
    source: str = "README.md"


@dataclass
class ConsoleStep:
    line: int
    command: str
    claimed: str
    printed: str


def run_python(text: str, workdir: str, source: str = "README.md") -> PythonRun:
    """Run every python block in order in one namespace inside ``workdir``, capturing each print's output."""
    namespace: dict[str, Any] = {"__name__": "readme"}
    all_claims: list[Claim] = []
    errors: list[str] = []
    old = os.getcwd()
    os.chdir(workdir)
    try:
        for block in blocks(text, "python", source):
            found = claims(block)
            all_claims += found.values()

            def readme_print(end: int, *args: Any, _found: dict[int, Claim] = found, **kwargs: Any) -> None:
                buf = io.StringIO()
                print(*args, **{**kwargs, "file": buf})
                _found[end].printed.append(buf.getvalue().rstrip("\n"))

            namespace["__readme_print__"] = readme_print
            tree = ast.fix_missing_locations(_Printer().visit(ast.parse(block.code)))
            ast.increment_lineno(tree, block.line - 1)
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(tree, os.path.join(ROOT, source), "exec"), namespace)  # noqa: S102 - running the examples is the point
            except Exception:  # noqa: BLE001 - report and go on: later blocks may still check their own claims
                errors.append(f"{source} block at line {block.line} raised:\n{traceback.format_exc()}")
    finally:
        os.chdir(old)
    return PythonRun(all_claims, errors, source)


def console_steps(text: str) -> list[tuple[int, str, str]]:
    """(document line, command, claimed output) of every ``$ `` line of the console blocks."""
    out = []
    for block in blocks(text, "console"):
        current: list[Any] | None = None
        for i, line in enumerate(block.code.splitlines()):
            if line.startswith("$ "):
                current = [block.line + i, line[2:], []]
                out.append(current)
            elif current is not None:
                current[2].append(line)
    return [(line, cmd, "\n".join(lines)) for line, cmd, lines in out]


def run_console(text: str, workdir: str) -> list[ConsoleStep]:
    steps = console_steps(text)
    script = ["exec 2>&1", f"cd {workdir!s}"]
    for i, (_, cmd, _) in enumerate(steps):
        script += [f"echo '{MARKER} {i}'", cmd]
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
           "LINEAGE_PROGRESS": "never", "COLUMNS": "200"}
    env.pop("LINEAGE_WAREHOUSE", None)
    proc = subprocess.run(["bash", "-c", "\n".join(script)], capture_output=True, text=True, env=env, timeout=900, check=False)
    parts = re.split(rf"^{re.escape(MARKER)} (\d+)\n", proc.stdout, flags=re.MULTILINE)
    printed = {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}
    return [ConsoleStep(line, cmd, claimed, printed.get(i, "<the transcript stopped before this command>"))
            for i, (line, cmd, claimed) in enumerate(steps)]


@pytest.fixture(scope="module", params=with_examples("python"))
def python_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> PythonRun:
    doc = request.param
    return run_python(read(doc), str(tmp_path_factory.mktemp("docs-python")), doc)


@pytest.fixture(scope="module", params=with_examples("console"))
def console_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[ConsoleStep], str, str]:
    doc = request.param
    workdir = str(tmp_path_factory.mktemp("docs-console"))
    return run_console(read(doc), workdir), workdir, doc


# --------------------------------------------------------------------------- the tests
def test_python_examples_print_what_the_document_claims(python_run: PythonRun) -> None:
    problems = list(python_run.errors)
    for c in python_run.claims:
        if not c.printed:
            problems.append(f"{python_run.source}:{c.line}: this print never ran")
        elif not matches(c.text, "\n".join(c.printed)):
            problems.append(f"{python_run.source}:{c.line}: the document claims\n{c.text}\nbut it printed\n" + "\n".join(c.printed))
    assert not problems, "\n\n".join(problems)


def test_console_transcript_prints_what_the_document_shows(console_run: tuple[list[ConsoleStep], str, str]) -> None:
    steps, workdir, doc = console_run
    problems = []
    for s in steps:
        want, got = normalize_console(s.claimed, workdir), normalize_console(s.printed, workdir)
        if want != got:
            problems.append(f"{doc}:{s.line}: $ {s.command}\n--- document\n" + "\n".join(want) + "\n--- actual\n" + "\n".join(got))
    assert not problems, "\n\n".join(problems)


def test_python_claims_are_sensitive(python_run: PythonRun) -> None:
    """A changed digit (or letter) in any claimed output makes the comparison fail."""
    loose = []
    for c in python_run.claims:
        changed = mutate(c.text)
        if c.printed and changed is not None and matches(changed, "\n".join(c.printed)):
            loose.append(f"{python_run.source}:{c.line}: {changed!r} still matches")
    assert not loose, "\n".join(loose)


def test_console_claims_are_sensitive(console_run: tuple[list[ConsoleStep], str, str]) -> None:
    """A changed digit (or letter) in any line a transcript shows makes the comparison fail."""
    steps, workdir, doc = console_run
    loose = []
    for s in steps:
        want, got = normalize_console(s.claimed, workdir), normalize_console(s.printed, workdir)
        for i, line in enumerate(want):
            changed = _mutate_outside_placeholders(line)
            if changed is not None and want[:i] + [changed] + want[i + 1:] == got:
                loose.append(f"{doc}:{s.line}: changing {line!r} to {changed!r} still matches")
    assert not loose, "\n".join(loose)


def test_the_readme_is_short_and_has_an_example_that_runs() -> None:
    text = read("README.md")
    assert text.count("\n") <= README_MAX_LINES, f"README.md has {text.count(chr(10))} lines; at most {README_MAX_LINES} (move the rest into docs/)"
    assert any(claims(b) for b in blocks(text, "python")), "the README has no python example with a claimed output"
    assert with_examples("console"), "no document has a console transcript"


def test_the_readme_and_the_home_page_show_the_same_why_table() -> None:
    def why(doc: str) -> str:
        text = read(doc)
        start = text.index("## Why")
        return text[start:text.index("\n## ", start + 1)].replace("](docs/", "](")

    assert why("README.md") == why("docs/index.md")


def test_every_document_is_found() -> None:
    found = documents()
    assert found[0] == "README.md" and "docs/getting-started.md" in found and "docs/index.md" in found


def _mutate_outside_placeholders(line: str) -> str | None:
    pieces = re.split(r"(<timestamp>|<size>)", line)
    for k in range(len(pieces) - 1, -1, -1):
        if pieces[k] not in ("<timestamp>", "<size>"):
            changed = mutate(pieces[k])
            if changed is not None:
                return "".join(pieces[:k] + [changed] + pieces[k + 1:])
    return None


def test_claim_parsing_follows_the_convention() -> None:
    code = "x = 41\nprint(x + 1)  # 42  (the answer)\nprint([x,\n       x])\n# [41,\n#  41]\nfor i in range(2):\n    print(i)  # 0\n"
    found = claims(Block("python", 10, code))
    assert {k: c.text for k, c in found.items()} == {2: "42", 4: "[41,\n 41]", 8: "0"}
    assert found[4].line == 13
    assert matches("[41,\n 41]", "[41, 41]") and not matches("[41, 42]", "[41, 41]")
    assert not matches("1", "1.0") and not matches("{'a': 1}", "{'a': True}") and matches("{'a': 1, 'b': 2}", "{'b': 2, 'a': 1}")
    assert matches("4 1 1", "4 1 1\n") and not matches("4 1 2", "4 1 1")
    with pytest.raises(AssertionError, match="without a claimed output"):
        claims(Block("python", 1, "print(1)\nx = 2\n"))
