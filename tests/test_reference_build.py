"""The reference engine's builder (tests/reference/build.py): caching, locking and its error messages.

The real build downloads and runs Spark; these tests replace its steps with a fake and check the machinery
around them, so they are fast and need no network.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest
from reference import build


def _fake_build(calls: list[float], delay: float = 0.3):  # noqa: ANN202
    """A stand-in for build._build: makes the files a finished engine has, slowly, and counts its calls."""

    def fake(root: Path, say) -> dict:  # noqa: ANN001
        calls.append(time.monotonic())
        time.sleep(delay)
        (root / "venv" / "bin").mkdir(parents=True)
        (root / "venv" / "bin" / "python").write_text("")
        (root / "jars").mkdir()
        (root / "jars" / "a.jar").write_text("")
        return {"recipe": build.RECIPE, "jars": ["a.jar"]}

    return fake


def test_engine_dir_follows_the_override_and_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv(build.ENV_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.engine_dir() == tmp_path / "xdg" / "iceberg-row-lineage" / f"reference-engine-{build.RECIPE}"
    monkeypatch.setenv(build.ENV_DIR, str(tmp_path / "mine"))
    assert build.engine_dir() == tmp_path / "mine"


def test_concurrent_builds_build_once_and_a_built_engine_costs_nothing(monkeypatch, tmp_path):
    calls: list[float] = []
    monkeypatch.setattr(build, "_build", _fake_build(calls))
    root = tmp_path / "engine"
    engines: list[build.Engine] = []
    threads = [threading.Thread(target=lambda: engines.append(build.ensure_built(root, log=lambda m: None))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1, "the lock must make the waiting builders reuse the first one's result"
    assert len(engines) == 3 and {e.root for e in engines} == {root}
    manifest = json.loads((root / build.MANIFEST).read_text())
    assert manifest["recipe"] == build.RECIPE and "build_seconds" in manifest
    started = time.monotonic()
    build.ensure_built(root, log=lambda m: None)
    assert len(calls) == 1 and time.monotonic() - started < 0.2


def test_an_unfinished_build_is_wiped_and_built_again(monkeypatch, tmp_path):
    calls: list[float] = []
    monkeypatch.setattr(build, "_build", _fake_build(calls, delay=0))
    root = tmp_path / "engine"
    (root / "venv").mkdir(parents=True)
    (root / "leftover").write_text("from a build that was killed")
    assert build.load(root) is None
    engine = build.ensure_built(root, log=lambda m: None)
    assert len(calls) == 1 and not (root / "leftover").exists() and engine.python.exists()


def test_a_failed_build_leaves_no_folder(monkeypatch, tmp_path):
    def broken(root: Path, say) -> dict:  # noqa: ANN001
        (root / "half").write_text("")
        raise build.ReferenceBuildError("no network")

    monkeypatch.setattr(build, "_build", broken)
    root = tmp_path / "engine"
    with pytest.raises(build.ReferenceBuildError, match="no network"):
        build.ensure_built(root, log=lambda m: None)
    assert not root.exists()


def test_missing_java_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(build.ReferenceBuildError, match="Java not found.*make java"):
        build._check_java()


def test_a_java_spark_cannot_run_on_is_refused(monkeypatch, tmp_path):
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text('#!/bin/sh\necho \'openjdk version "21.0.2" 2024-01-16\' >&2\n')
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(build.ReferenceBuildError, match="Java 21.*needs Java 17"):
        build._check_java()


def test_missing_debian_packages_without_root_name_the_command(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(build.ReferenceBuildError, match="apt-get install -y libnothing-java"):
        build._debian_files([(str(tmp_path / "nothing.jar"), "libnothing-java")], lambda m: None)
