# The two set-up commands of README.md are `make run` and `make test`.
PYTHON ?= python3
PIP_FLAGS ?= --quiet --disable-pip-version-check

.PHONY: run install test lint system-deps

install:
	$(PYTHON) -m pip install $(PIP_FLAGS) -e '.[test,speed]'

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

test: install system-deps
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)
