# The two set-up commands of README.md are `make run` and `make test`.
#
# Everything is installed into a virtualenv, never into the Python that runs make: the
# one already active in the shell ($VIRTUAL_ENV), or else the project's own .venv/,
# made with $(PYTHON) (devtools/venv.sh; it says what to install when that Python
# cannot make virtualenvs, and installs python3-venv itself when run as root).
# `make run PYTHON=/usr/bin/python3` picks the interpreter a new .venv/ is made with (an
# existing one is kept while it works: delete it to change); `make VENV=/path/to/env ...`
# installs into another virtualenv.
PYTHON ?= python3
ifdef VIRTUAL_ENV
VENV ?= $(VIRTUAL_ENV)
else
VENV ?= .venv
endif
PY := $(VENV)/bin/python
PIP_FLAGS ?= --quiet --disable-pip-version-check

.PHONY: run install venv test lint system-deps chaos model prebuild

venv:
	@sh devtools/venv.sh '$(PYTHON)' '$(VENV)'

# The editable install compiles the hot path with mypyc (setup.py, ~40 s); it is redone
# only when a source, setup.py or pyproject.toml changed since the last one, or when the
# virtualenv's amqpd is not this checkout's (the stamp, kept in the virtualenv, names the
# checkout it was made from). A compiled module whose source changed since the build is
# never used (amqpd/hotpath.py), so skipping a rebuild can cost speed, never correctness.
INSTALL_STAMP := $(VENV)/.amqpd-installed

install: venv
	@if [ -f '$(INSTALL_STAMP)' ] && [ "$$(cat '$(INSTALL_STAMP)')" = '$(CURDIR)' ] \
	    && [ -z "$$(find amqpd setup.py pyproject.toml -newer '$(INSTALL_STAMP)' \( -name '*.py' -o -name '*.toml' \) | head -1)" ] \
	    && '$(PY)' -I -c 'import os, sys, amqpd, pytest, hypothesis, xdist; sys.exit(not os.path.samefile(amqpd.__file__, sys.argv[1]))' \
	         '$(CURDIR)/amqpd/__init__.py' 2>/dev/null; then \
	  echo "amqpd is installed in $(VENV) and up to date"; \
	else \
	  echo "installing amqpd and its test tools into $(VENV)"; \
	  '$(PY)' -m pip install $(PIP_FLAGS) -e '.[test,speed]' && echo '$(CURDIR)' > '$(INSTALL_STAMP)'; \
	fi
	@'$(PY)' -c 'import amqpd.hotpath as h; print("hot path:", h.MODE)'

run: install
	'$(PY)' -m amqpd $(ARGS)

# RabbitMQ (the conformance reference), headless Chromium with its driver (the web UI's
# browser tests), etcd and HAProxy (the warren's tests: tests/support/etcdproc.py and
# haproxyproc.py) from Debian's packages, when we may install them.
system-deps:
	@if ! [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server) \
	      >/dev/null 2>&1 || echo "warning: could not install rabbitmq-server; RabbitMQ tests will skip"; \
	  else echo "note: rabbitmq-server not installed; RabbitMQ tests will skip"; fi; \
	fi
	@if ! [ -x /usr/bin/chromium ] || ! [ -x /usr/bin/chromedriver ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) \
	      >/dev/null 2>&1 || echo "warning: could not install chromium; web UI browser tests will skip"; \
	  else echo "note: chromium/chromium-driver not installed; web UI browser tests will skip"; fi; \
	fi
	@if ! command -v etcd >/dev/null || ! { command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ]; }; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server haproxy) \
	      >/dev/null 2>&1 || echo "warning: could not install etcd-server/haproxy; warren tests will skip"; \
	  else echo "note: etcd-server/haproxy not installed; warren tests will skip"; fi; \
	fi

lint: install
	'$(PY)' -m ruff check .
	'$(PY)' -m mypy
	@# lint-imports (import-linter): the layer contracts in pyproject.toml
	'$(PY)' -c 'import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())'

# The randomized fault test of issue 28, long: one run per seed (three nodes, a private
# etcd, faults one at a time for DURATION seconds, then heal and check; exit 1 if any
# seed lost a confirmed message or failed a check). Reports go to stdout; the nodes'
# data and logs stay under CHAOS_DIR/seed-N. CI runs short ones (tests/integration/
# test_chaos.py).
SEEDS ?= 1 2 3
DURATION ?= 180
PARTITION ?= netns
CHAOS_DIR ?= $(shell mktemp -d -u /tmp/amqpd-chaos-XXXXXX)
chaos: install system-deps
	'$(PY)' -m tests.chaos $(foreach s,$(SEEDS),--seed $(s)) --duration $(DURATION) \
	  --partition $(PARTITION) --workdir '$(CHAOS_DIR)'

# The Hypothesis model of the replica rules (tests/unit/cluster/test_replica_core_model.py),
# randomized and longer than CI's fixed examples: a search for new losing schedules.
MODEL_EXAMPLES ?= 2000
model: install
	AMQPD_MODEL_RANDOM=1 AMQPD_MODEL_EXAMPLES=$(MODEL_EXAMPLES) '$(PY)' -m pytest -q \
	  tests/unit/cluster/test_replica_core_model.py

# The install tests' sdist and wheel, built ahead into PREBUILT with a builder virtualenv
# of their own (tests/install/prebuild.py; needs only $(PYTHON)). .ci/run starts it beside
# `make install`, whose compile leaves the second core idle, and hands PREBUILT to the
# tests in AMQPD_TEST_PREBUILT: they take that build only if it was made by the same
# Python from the same files, and otherwise build again themselves.
prebuild:
	@test -n '$(PREBUILT)' || { echo 'usage: make prebuild PREBUILT=DIR' >&2; exit 2; }
	'$(PYTHON)' -m tests.install.prebuild '$(PREBUILT)'

# After the full suite on the installed (compiled) hot path, the same unit tests and
# conformance suite on its pure-Python sources: both must stay correct.
PURE_TESTS ?= tests/unit tests/integration/test_conformance_vs_amqpd.py

# Then the core's integration tests once more against nodes of two workers (issue 35:
# every suite must pass with workers = 2 as with 1): AMQPD_WORKERS=2 makes every broker
# these tests start a node of two worker processes, its clients placed by the node's
# round robin. (The conformance suite with two workers is a test of its own:
# tests/integration/test_conformance_vs_amqpd_workers.py.)
WORKERS_TESTS ?= tests/integration/test_core_pika.py tests/integration/test_core_aiopika.py \
	tests/integration/test_core_kombu.py tests/integration/test_core_lifecycle.py \
	tests/integration/test_core_errors.py

# All runs are spread over TEST_WORKERS pytest-xdist processes. Most tests wait on
# brokers and sockets rather than compute, so there are more workers than CPUs (never
# fewer than 2). --dist loadfile keeps each test file on one worker, so a module's shared
# broker, private RabbitMQ or built wheel is started once, not once per worker; files
# go out in collection order (--no-loadscope-reorder), where tests/conftest.py puts the
# files with slow tests first, so the longest start at once and the short fill in.
# (loadgroup, which could spread more finely, does nothing under pytest 9: xdist 3.8
# renames item._nodeid, which pytest 9 no longer reads.)
# `make test TEST_WORKERS=0` runs everything in this one process, as plain pytest does.
CPUS := $(shell nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
TEST_WORKERS ?= $(shell echo $$(( $(CPUS) + $(CPUS) / 2 > 2 ? $(CPUS) + $(CPUS) / 2 : 2 )))
XDIST_ARGS ?= -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# the slowest tests in every log (CI's included), to see where the suite's time goes
PYTEST_ARGS ?= --durations=40

test: install system-deps
	'$(PY)' -m pytest -q $(PYTEST_ARGS) $(XDIST_ARGS)
	@if [ -n "$(WORKERS_TESTS)" ]; then \
	  echo "--- again against nodes of two workers (AMQPD_WORKERS=2): $(WORKERS_TESTS)"; \
	  AMQPD_WORKERS=2 '$(PY)' -m pytest -q $(WORKERS_TESTS) $(XDIST_ARGS); \
	fi
	@if [ -n "$(PURE_TESTS)" ]; then \
	  echo "--- again on the pure-Python hot path (AMQPD_PURE_PYTHON=1): $(PURE_TESTS)"; \
	  AMQPD_PURE_PYTHON=1 '$(PY)' -m pytest -q $(PURE_TESTS) $(XDIST_ARGS); \
	fi
