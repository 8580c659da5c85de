# Two commands on a fresh machine: `make demo` and `make test` (both bootstrap .venv first).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JAVA17 := $(firstword $(wildcard /usr/lib/jvm/java-17-openjdk-*/ /usr/lib/jvm/*17*/))
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
ifneq ($(JAVA17),)
export JAVA_HOME ?= $(JAVA17)
endif

.PHONY: install demo test test-deep bench proto clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py bridge/_speedups.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m bridge demo samples

test: $(STAMP)
	HYPOTHESIS_PROFILE=quick $(PY) -m pytest -q tests

test-deep: $(STAMP)
	HYPOTHESIS_PROFILE=deep $(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) -m pip install -q -e ".[dev,bench]"
	$(PY) -m benchmarks

# Regenerate the committed protobuf module (tests check it is current).
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=bridge --pyi_out=bridge proto/subscribe.proto

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
