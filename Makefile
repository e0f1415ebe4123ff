# The two set-up commands of README.md are `make run` and `make test`.
PYTHON ?= python3
PIP_FLAGS ?= --quiet --disable-pip-version-check

.PHONY: run install test lint system-deps

# The editable install compiles the hot path with mypyc (setup.py, ~40 s); it is redone
# only when a source, setup.py or pyproject.toml changed since the last one, or when this
# Python cannot import amqpd. A compiled module whose source changed since the build is
# never used (amqpd/hotpath.py), so skipping a rebuild can cost speed, never correctness.
INSTALL_STAMP := build/.installed

install:
	@if [ -f $(INSTALL_STAMP) ] \
	    && [ -z "$$(find amqpd setup.py pyproject.toml -newer $(INSTALL_STAMP) \( -name '*.py' -o -name '*.toml' \) | head -1)" ] \
	    && $(PYTHON) -c 'import amqpd, pytest, hypothesis' 2>/dev/null; then \
	  echo "amqpd is installed and up to date ($(INSTALL_STAMP))"; \
	else \
	  $(PYTHON) -m pip install $(PIP_FLAGS) -e '.[test,speed]' && mkdir -p build && touch $(INSTALL_STAMP); \
	fi
	@$(PYTHON) -c 'import amqpd.hotpath as h; print("hot path:", h.MODE)'

run: install
	$(PYTHON) -m amqpd $(ARGS)

# RabbitMQ (the conformance reference) from Debian's package, when we may install it.
system-deps:
	@if ! [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server) \
	      >/dev/null 2>&1 || echo "warning: could not install rabbitmq-server; RabbitMQ tests will skip"; \
	  else echo "note: rabbitmq-server not installed; RabbitMQ tests will skip"; fi; \
	fi

lint: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy
	@# lint-imports (import-linter): the layer contracts in pyproject.toml
	$(PYTHON) -c 'import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())' 

# After the full suite on the installed (compiled) hot path, the same unit tests and
# conformance suite on its pure-Python sources: both must stay correct.
PURE_TESTS ?= tests/unit tests/integration/test_conformance_vs_amqpd.py

test: install system-deps
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)
	@if [ -n "$(PURE_TESTS)" ]; then \
	  echo "--- again on the pure-Python hot path (AMQPD_PURE_PYTHON=1): $(PURE_TESTS)"; \
	  AMQPD_PURE_PYTHON=1 $(PYTHON) -m pytest -q $(PURE_TESTS); \
	fi
