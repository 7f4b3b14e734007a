"""The table-property registry (lineage.properties): one definition per property, read everywhere, documented."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lineage.errors import InvalidArgumentError
from lineage.properties import (
    COMMIT_RETRIES,
    COMPACT_DELETE_RATIO,
    DELETE_MODE,
    KEY_INDEX_DEFER_ROWS,
    PREIMAGE_CAPTURE,
    RETENTION_DAYS,
    read,
    registry,
)
from lineage.properties_page import page

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "properties.md"
# Names that are also field names of the library's own JSON documents (not table properties there).
SHARED_WITH_DOCUMENTS = {"format-version"}


def test_the_reference_page_is_generated_from_the_registry():
    assert PAGE.read_text() == page(), "regenerate it: python -m lineage.properties_page"


def test_the_generator_checks_and_writes_the_page(tmp_path):
    check = subprocess.run([sys.executable, "-m", "lineage.properties_page", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    stale = subprocess.run([sys.executable, "-m", "lineage.properties_page", "--check"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert stale.returncode == 1 and "out of date" in stale.stderr
    subprocess.run([sys.executable, "-m", "lineage.properties_page"], cwd=tmp_path, check=True, env=env)
    assert (tmp_path / "docs" / "reference" / "properties.md").read_text() == page()


def test_every_property_is_spelled_in_one_module():
    """Modules import a property's name from lineage.properties; none spells it as a string literal."""
    found = []
    for path in sorted(p for pkg in ("lineage", "cdf", "index") for p in (ROOT / pkg).rglob("*.py")):
        if path == ROOT / "lineage" / "properties.py":
            continue
        text = path.read_text()
        for name in set(registry) - SHARED_WITH_DOCUMENTS:
            for m in re.finditer(r"[\"']" + re.escape(name) + r"[\"']", text):
                found.append(f"{path.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}: {name}")
    assert not found, found


def test_defaults_types_and_validation():
    assert read({}, COMMIT_RETRIES) == 20
    assert read({COMMIT_RETRIES: "3"}, COMMIT_RETRIES) == 3
    assert read({}, PREIMAGE_CAPTURE) is False
    assert read({PREIMAGE_CAPTURE: " TRUE "}, PREIMAGE_CAPTURE) is True
    assert read({}, RETENTION_DAYS) is None
    assert read({RETENTION_DAYS: "1.5"}, RETENTION_DAYS) == 1.5
    assert read({KEY_INDEX_DEFER_ROWS: "0"}, KEY_INDEX_DEFER_ROWS) == 0
    for name, bad in [(COMMIT_RETRIES, "many"), (COMMIT_RETRIES, "-1"), (PREIMAGE_CAPTURE, "yes"), (RETENTION_DAYS, "0"),
                      (COMPACT_DELETE_RATIO, "1.5"), (DELETE_MODE, "fast"), (RETENTION_DAYS, "nan")]:
        with pytest.raises(InvalidArgumentError, match=re.escape(name)):
            read({name: bad}, name)


def test_every_property_has_a_description_and_a_valid_default():
    for prop in registry.values():
        assert prop.description and prop.group, prop.name
        if prop.default is not None and prop.kind in ("int", "float", "choice"):
            assert prop.parse(str(prop.default)) == prop.default, prop.name


def test_a_table_refuses_a_bad_retry_count(tmp_path):
    import lineage
    import pyarrow as pa

    t = lineage.create_table("db.t", pa.schema([("id", pa.int64())]), warehouse=str(tmp_path), properties={COMMIT_RETRIES: "x"})
    with pytest.raises(InvalidArgumentError, match=COMMIT_RETRIES):
        t.append(pa.table({"id": [1]}))
    assert t.version == 0  # nothing was written
