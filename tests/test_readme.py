"""The README's Python examples run as written and print what their comments say."""

from __future__ import annotations

import contextlib
import io
import os
import re

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def test_readme_examples_run_and_print_what_they_claim(tmp_path, monkeypatch):
    text = open(README, encoding="utf-8").read()
    code = "\n".join(re.findall(r"```python\n(.*?)```", text, re.S))
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    printed = out.getvalue()
    # Single-line claims of the form `print(...)  # value` must match the printed line.
    for line in code.splitlines():
        m = re.match(r"\s*print\(.*\)\s+#\s*(.+?)(?:\s{2,}.*)?$", line)
        if m and not m.group(1).startswith("["):
            claim = m.group(1).split(":")[0].strip()
            assert claim in printed, f"README claims {claim!r}, output was:\n{printed}"
    assert "'_change_type': 'update_preimage'" in printed
