# The two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: demo test docs docs-serve venv java postgres reference-engine bench bench-peers bench-growth bench-scaling bench-cdc bench-report bench-all clean

demo: $(STAMP) java
	$(PY) -m lineage.cli demo

# Two pytest workers (pytest-xdist): CI has 2 cores; each worker starts its own local Spark session and
# reference engine on first use. TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2

test: $(STAMP) java postgres reference-engine
	$(PY) -m pytest -q -n $(TEST_WORKERS) --durations=15

venv: $(STAMP)

# The documentation site: docs/ and mkdocs.yml, built into site/ with --strict (a broken link, a missing page
# or an unresolved API reference fails). The reference pages and the benchmark plots are generated at build
# time (tools/docs_hooks.py) from the code and benchmarks/results/.
DOCS_STAMP := $(VENV)/.installed-docs

$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[test,docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(PY) -m mkdocs build --strict --site-dir site

docs-serve: $(DOCS_STAMP)
	$(PY) -m mkdocs serve

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# Spark needs a JDK (17 or newer); install one from Debian if none is on PATH.
java:
	@command -v java >/dev/null 2>&1 || { \
		echo "java not found: installing openjdk-17-jre-headless"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless) >/dev/null \
		|| { echo "could not install Java; install a JDK 17+ and retry" >&2; exit 1; }; }

# The shared-catalog tests start a throwaway PostgreSQL cluster (initdb + pg_ctl); install Debian's server if missing.
postgres:
	@command -v pg_ctl >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { \
		echo "pg_ctl not found: installing postgresql"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >/dev/null \
		|| { echo "could not install PostgreSQL; install its server (initdb, pg_ctl) and retry" >&2; exit 1; }; }

# Spark 3.5 + Iceberg 1.10, the foreign engine of the interop tests (tests/reference/): built once per machine
# into ~/.cache/iceberg-row-lineage/ (or $$LINEAGE_REFERENCE_ENGINE); when it is there this costs nothing.
reference-engine: $(STAMP) java
	$(PY) tests/reference/build.py

# Benchmarks publish their records to benchmarks/results/ (commit them) and regenerate the READMEs' figures.
bench: $(STAMP)
	$(PY) benchmarks/write_cost.py --repeat 3 --publish
	$(PY) benchmarks/write_cost.py --repeat 3 --pattern clustered --publish
	$(PY) benchmarks/report.py

# The peers of benchmarks/run.py (deltalake, pylance, the DuckLake extension) are the optional `bench` extras.
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench-peers: $(BENCH_STAMP)
	$(PY) benchmarks/run.py --publish $(if $(SCALE),--scale $(SCALE))
	$(PY) benchmarks/report.py

# The feed against table size: every system at 1M and 10M rows, ours, DuckLake and delta-rs at 30M; then the figure and reports.
bench-growth: $(BENCH_STAMP)
	$(PY) benchmarks/run.py --publish
	$(PY) benchmarks/run.py --publish --scale 10000000
	$(PY) benchmarks/run.py --publish --scale 30000000 --systems lineage,lineage-capture,ducklake,delta
	$(PY) benchmarks/report.py

# pypaimon 2.1 pins pyarrow < 20 and pandas < 3, which this project cannot use: it gets a virtual environment of
# its own, and benchmarks/cdc.py runs its Paimon child process there.
PAIMON_VENV := .venv-paimon
PAIMON_STAMP := $(PAIMON_VENV)/.installed

$(PAIMON_STAMP):
	$(PYTHON) -m venv $(PAIMON_VENV)
	$(PAIMON_VENV)/bin/python -m pip install -q "pypaimon==2.1.0"
	touch $(PAIMON_STAMP)

bench-cdc: $(BENCH_STAMP) $(PAIMON_STAMP)
	$(PY) benchmarks/cdc.py --publish $(if $(SCALE),--scale $(SCALE)) $(if $(COMMITS),--commits $(COMMITS))

bench-scaling: $(STAMP)
	$(PY) benchmarks/scaling.py --publish
	$(PY) benchmarks/report.py

# Regenerate every generated block of README.md and benchmarks/README.md from the committed records.
bench-report: $(STAMP)
	$(PY) benchmarks/report.py

# Every published benchmark at its published settings (about an hour on a quiet 2-core machine), then the reports.
bench-all: $(BENCH_STAMP) java
	$(PY) benchmarks/write_cost.py --repeat 3 --publish
	$(PY) benchmarks/write_cost.py --repeat 3 --pattern clustered --publish
	$(PY) benchmarks/run.py --publish
	$(PY) benchmarks/run.py --publish --scale 10000000
	$(PY) benchmarks/run.py --publish --scale 30000000 --systems lineage,lineage-capture,ducklake,delta
	$(PY) benchmarks/scaling.py --publish
	$(PY) benchmarks/cdf_cost.py --rows 5000000 --publish
	$(PY) benchmarks/spark_cdf.py --rows 5000000 --publish
	$(PY) benchmarks/mv_refresh.py --publish
	$(PY) benchmarks/maintenance_report.py --publish
	$(PY) benchmarks/key_index.py --publish
	$(PY) benchmarks/report.py

clean:
	rm -rf $(VENV) $(PAIMON_VENV) site demo-warehouse .pytest_cache .hypothesis
