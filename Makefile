# lockstep — two commands: `make run` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: run test setup system-deps venv clean bench kind-e2e k8s-binaries helm

run: setup
	$(VENV)/bin/lockstep run

# the tests run on TEST_WORKERS pytest-xdist workers, a file (or a server's tests) per worker at a time, the
# longest first (tests/conftest.py): 29 min instead of ~90 on this project's 2-core machines (README, "Tests")
TEST_WORKERS ?= 2

test: setup $(TEST_STAMP)
	bash scripts/test-deps.sh
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

setup: system-deps venv

# Debian packages: the Fashion-MNIST data set (and Prometheus for the metric tests).
system-deps:
	bash scripts/system-deps.sh

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# make test also installs the ray extra (launcher=ray, hydra/launcher=ray and their tests); pip check keeps
# its pins honest (hydra-ray-launcher's boto3 needs python-dateutil<3, hence kubernetes<37).
$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev,ray]'
	$(PY) -m pip check
	touch $(TEST_STAMP)

bench: setup
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache

# Kubernetes (docs/kubernetes.md): helm + kubectl, the test API server binaries, the kind end-to-end run.
helm:
	bash scripts/install-helm.sh

k8s-binaries:
	bash scripts/build-k8s.sh

kind-e2e:
	bash scripts/kind-e2e.sh
