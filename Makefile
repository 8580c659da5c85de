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

# Test-only jars from Maven Central (a Kafka broker, Spark's Kafka/protobuf jars) into an ignored
# cache; tools/jars/fetch.py skips a set already complete, so a repeat needs no network.
JARS := .cache/jars
JARS_STAMP := $(JARS)/.installed

install: $(STAMP) $(JARS_STAMP)

$(JARS_STAMP): $(STAMP) tools/jars/pom.xml tools/jars/fetch.py
	$(PY) tools/jars/fetch.py $(JARS)
	touch $(JARS_STAMP)

$(STAMP): pyproject.toml setup.py bridge/_speedups.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m bridge demo samples

test: $(STAMP) $(JARS_STAMP)
	HYPOTHESIS_PROFILE=quick $(PY) -m pytest -q tests

test-deep: $(STAMP) $(JARS_STAMP)
	HYPOTHESIS_PROFILE=deep $(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) -m pip install -q -e ".[dev,bench]"
	$(PY) -m benchmarks

# Regenerate the committed protobuf module (tests check it is current).
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=bridge --pyi_out=bridge proto/subscribe.proto

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
