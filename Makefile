# The two commands: `make demo` and `make test`. Each does all of its own set-up on a fresh
# machine: the virtual environment, the Kafka jars, redis-server, and the running services.
PY := .venv/bin/python
VENV_STAMP := .venv/.installed
# The demo's and the tests' files (archive, outboxes, rollup data, pid and token files) live in
# the checkout, next to the services' own; an installed rhumbatron defaults to the XDG state dir.
export RHUMBATRON_STATE_DIR ?= $(CURDIR)/.local

.PHONY: demo test test-slow chaos up down check bench venv unit browser node helm jaeger image-tools

$(VENV_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(VENV_STAMP)

venv: $(VENV_STAMP)

up: venv
	infra/local.sh up

down:
	infra/local.sh down

demo: up
	.venv/bin/rhumbatron demo

browser:
	infra/local.sh browser

node:
	infra/local.sh node

# Helm, built from source at a pinned version, for the chart's tests (tests/router/test_helm_chart.py).
helm:
	infra/local.sh helm

# podman, runc and mmdebstrap from Debian, for the image's build-and-run test.
image-tools:
	infra/local.sh image-tools

# Jaeger v2, built from source once per machine (a few minutes), for the traces-in-Jaeger test.
jaeger:
	infra/local.sh jaeger

# Tests run in three worker processes: most of their time is spent waiting on real servers and
# subprocesses, not on the CPU, and each test has its own environment on the shared broker.
test: up browser node
	$(PY) -m pytest -q -n 3 --dist loadfile -m "not slow"

# The heavier suites: property soaks with many more generated examples, traces in Jaeger.
test-slow: up node jaeger helm image-tools
	$(PY) -m pytest -q -n 2 -m slow

# The chaos matrix (tests/chaos/matrix, docs/reliability.md): one row per fault scenario against
# the real servers (private ones for a row that kills a server), `chaos: N/M rows passed` at the
# end, the matrix as JSON in .local/chaos.json; non-zero when any row fails.
chaos: up
	$(PY) -m tests.chaos.matrix

unit: venv
	$(PY) -m pytest -q -m "not integration and not chaos and not slow"

check: venv
	.venv/bin/ruff format --check .
	.venv/bin/ruff check .
	.venv/bin/mypy
	$(PY) -m streams.catalog.docs --check
	$(PY) -m streams.partitioning --check
	$(PY) -m streams.catalog.schemas --check

bench: up
	.venv/bin/rhumbatron bench
