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

.PHONY: install demo test test-deep bench proto clean sanitize

# Test-only jars from Maven Central (a Kafka broker, Spark's Kafka/protobuf jars) into an ignored
# cache; tools/jars/fetch.py skips a set already complete, so a repeat needs no network.
JARS := .cache/jars
JARS_STAMP := $(JARS)/.installed

install: $(STAMP) $(JARS_STAMP)

$(JARS_STAMP): $(STAMP) tools/jars/pom.xml tools/jars/fetch.py
	$(PY) tools/jars/fetch.py $(JARS)
	touch $(JARS_STAMP)

$(STAMP): pyproject.toml setup.py $(wildcard bridge/native/src/*.c bridge/native/src/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m bridge demo samples

# The suite's time goes mostly to waiting (JVM and broker start-ups, killed processes, DataHub
# round trips), so its files run on TEST_WORKERS workers (pytest-xdist), a whole file to a worker:
# module fixtures (a Kafka topic, a Spark session) stay shared within a file. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
# --no-loadscope-reorder: keep SLOW_FIRST's order (pytest-xdist would order files by their number of tests)
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# --durations: the slowest tests in every run's log, to keep the suite's time in view
test: $(STAMP) $(JARS_STAMP)
	HYPOTHESIS_PROFILE=quick $(PY) -m pytest -q $(XDIST) --durations=25 tests

test-deep: $(STAMP) $(JARS_STAMP)
	HYPOTHESIS_PROFILE=deep $(PY) -m pytest -q $(XDIST) tests

bench: $(STAMP)
	$(PY) -m pip install -q -e ".[dev,bench]"
	$(PY) -m benchmarks

# The C extension (every unit of bridge/native/src) built with AddressSanitizer and UBSan into
# build/sanitize (the .venv build stays as it is), loaded in place of it by the tests that reach the
# C path and by a short run of the fuzz target; any report fails the run. ASan must come first in
# the process, hence the preload (docs/decisions.md, "The C fast path", "The Python <-> C contract").
SANITIZE := build/sanitize
SANITIZE_TESTS := tests/test_speedups.py tests/test_native_contract.py tests/test_spark_sink.py \
  tests/test_blob_decode.py tests/test_blob_decode_native.py tests/test_laws.py tests/test_entry_api_fast.py \
  tests/test_tuple_decode_native.py tests/test_hostile_round2_native.py tests/test_shard_merge.py \
  tests/test_blob_page.py tests/test_spark_tuple_sink.py tests/test_merge_stalls.py tests/test_writer_models.py
SANITIZE_ENV := ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 HYPOTHESIS_PROFILE=quick \
  LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)"

sanitize: $(STAMP)
	mkdir -p $(SANITIZE)/corpus
	gcc -shared -fPIC -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all \
	  -I"$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
	  bridge/native/src/*.c -o $(SANITIZE)/_speedups.so
	$(SANITIZE_ENV) $(PY) -c 'import importlib.util as u, sys; s = u.spec_from_file_location("bridge.native._speedups", sys.argv[1]); \
	  m = u.module_from_spec(s); s.loader.exec_module(m); sys.modules[s.name] = m; import bridge, pytest; \
	  assert bridge.native.speedups is m, "the sanitized build is not the one in use"; \
	  sys.exit(pytest.main(sys.argv[2:]))' $(SANITIZE)/_speedups.so -q --capture=sys -p no:cacheprovider $(SANITIZE_TESTS)
	$(SANITIZE_ENV) BRIDGE_SPEEDUPS_SO=$(SANITIZE)/_speedups.so $(PY) tests/fuzz/fuzz_native.py \
	  -max_total_time=$(SANITIZE_FUZZ_SECONDS) -artifact_prefix=$(SANITIZE)/ $(SANITIZE)/corpus $(wildcard build/fuzz-corpus)
# Under gcc's ASan runtime libFuzzer gets no coverage (the runtime provides the hooks), so this run
# replays the seeds and what `make fuzz` kept (build/fuzz-corpus), then mutates blindly.
SANITIZE_FUZZ_SECONDS ?= 60

# The fuzz target (atheris, coverage-guided over the Python modules it instruments): the C path
# against the pure-Python path on Entries built from the fuzz bytes; a difference or a crash stops
# it with the input saved as crash-* (docs/decisions.md, "The Python <-> C contract").
FUZZ_SECONDS ?= 600
.PHONY: fuzz
fuzz: $(STAMP)
	mkdir -p build/fuzz-corpus
	$(PY) tests/fuzz/fuzz_native.py -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=build/fuzz- build/fuzz-corpus

# Regenerate the committed protobuf module (tests check it is current).
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=bridge/wire --pyi_out=bridge/wire proto/subscribe.proto

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
