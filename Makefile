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

.PHONY: run install venv test lint system-deps

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
	    && '$(PY)' -I -c 'import os, sys, amqpd, pytest, hypothesis; sys.exit(not os.path.samefile(amqpd.__file__, sys.argv[1]))' \
	         '$(CURDIR)/amqpd/__init__.py' 2>/dev/null; then \
	  echo "amqpd is installed in $(VENV) and up to date"; \
	else \
	  echo "installing amqpd and its test tools into $(VENV)"; \
	  '$(PY)' -m pip install $(PIP_FLAGS) -e '.[test,speed]' && echo '$(CURDIR)' > '$(INSTALL_STAMP)'; \
	fi
	@'$(PY)' -c 'import amqpd.hotpath as h; print("hot path:", h.MODE)'

run: install
	'$(PY)' -m amqpd $(ARGS)

# RabbitMQ (the conformance reference) and headless Chromium with its driver (the web UI's
# browser tests) from Debian's packages, when we may install them.
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

lint: install
	'$(PY)' -m ruff check .
	'$(PY)' -m mypy
	@# lint-imports (import-linter): the layer contracts in pyproject.toml
	'$(PY)' -c 'import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())'

# After the full suite on the installed (compiled) hot path, the same unit tests and
# conformance suite on its pure-Python sources: both must stay correct.
PURE_TESTS ?= tests/unit tests/integration/test_conformance_vs_amqpd.py

test: install system-deps
	'$(PY)' -m pytest -q $(PYTEST_ARGS)
	@if [ -n "$(PURE_TESTS)" ]; then \
	  echo "--- again on the pure-Python hot path (AMQPD_PURE_PYTHON=1): $(PURE_TESTS)"; \
	  AMQPD_PURE_PYTHON=1 '$(PY)' -m pytest -q $(PURE_TESTS); \
	fi
