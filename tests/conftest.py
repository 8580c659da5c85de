"""Hypothesis profiles, the import path of tests/support/, and the fixtures several test modules share.

`HYPOTHESIS_PROFILE=quick` (the default, `make test`) runs a few dozen derandomized examples per
property, so two runs of the suite see the same inputs; `HYPOTHESIS_PROFILE=deep`
(`make test-deep`) runs 10,000 random examples per property.

Test modules share code only through tests/support/ (`from support.strategies import ...`) and the
fixtures here, never by importing each other (tests/test_layout_tests.py checks it).
"""
import os
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Every JVM the tests start (Spark drivers and executors, the standalone cluster, the Kafka broker)
# lives seconds to minutes and handles little data: C1 alone and the serial collector cost it about a
# third less CPU than the server defaults (test_spark.py: 67 s -> 43 s of CPU for the process tree),
# and the suite on 2 cores is CPU-bound. Set before any JVM starts, inherited by every child process;
# BRIDGE_TEST_JVM_DEFAULTS=1 keeps the JVM's defaults (docs/testing.md, "The suite's time").
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
if os.environ.get("BRIDGE_TEST_JVM_DEFAULTS") != "1" and TEST_JVM_OPTIONS not in os.environ.get("JAVA_TOOL_OPTIONS", ""):
    os.environ["JAVA_TOOL_OPTIONS"] = f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {TEST_JVM_OPTIONS}".strip()

# tests/ is not a package: make `from support.strategies import ...` work under any import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.kafka_broker import kafka_broker  # noqa: E402,F401  (the session fixture: one real broker)
from support.spark_cluster import spark_cluster  # noqa: E402,F401  (the session fixture: a standalone cluster)

settings.register_profile(
    "quick", max_examples=40, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "deep", max_examples=10_000, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))


# The files that take longest (killed Spark drivers and sync processes, Spark streaming), run first:
# under pytest-xdist (`make test`, a whole file to a worker) the long ones start at once and the
# short ones fill the gaps, instead of one long file starting last.
SLOW_FIRST = ("test_spark_cluster.py", "test_spark_pipeline.py", "test_sync_group.py", "test_sync.py",
              "test_spark_streaming.py", "test_sync_tables.py", "test_spark_datahub_reverse.py", "test_spark.py",
              "test_spark_tables_kill.py", "test_kafka_dts_sink.py", "test_kafka.py", "test_datahub_writer.py",
              "test_spark_tables.py", "test_sync_subscription.py", "test_spark_datahub.py", "test_sync_to_dts.py",
              "test_datahub_shard_states.py", "test_reverse_foreign_writers.py", "test_writer_resharding_sync.py",
              "test_merge_stalls.py", "test_shard_merge.py")


@pytest.fixture(scope="session")
def spark():
    """The local[2] Spark session with the `dts-kafka` source and the `datahub` sink registered (a
    module that needs other settings defines its own `spark`)."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17")
    pytest.importorskip("pyspark")
    import bridge.spark as bs
    session = bs.local_session("bridge-tests")
    session.sparkContext.setLogLevel("OFF")  # expected task failures would print Java stack traces
    bs.register(session)
    return session


def pytest_collection_modifyitems(config, items):
    """Slow files first (SLOW_FIRST, a stable sort: each file's own order is kept); `deep` tests
    (long kill loops, many rounds) run only under HYPOTHESIS_PROFILE=deep (make test-deep)."""
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    if os.environ.get("HYPOTHESIS_PROFILE") == "deep":
        return
    skip = pytest.mark.skip(reason="long-running: make test-deep")
    for item in items:
        if "deep" in item.keywords:
            item.add_marker(skip)
