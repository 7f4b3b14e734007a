# The two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv java bench clean

demo: $(STAMP) java
	$(PY) -m lineage.demo

test: $(STAMP) java
	$(PY) -m pytest -q

venv: $(STAMP)

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

bench: $(STAMP)
	$(PY) benchmarks/write_cost.py

clean:
	rm -rf $(VENV) demo-warehouse .pytest_cache .hypothesis
