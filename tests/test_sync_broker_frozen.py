"""A frozen Kafka broker (SIGSTOP: it neither answers nor closes its connections, so the client
gets no error) is reported by `dts-bridge sync` on its status line after a timeout, and the run
goes on exactly once the broker answers again. A broker of its own, not the session's.
"""
from __future__ import annotations

import signal
import subprocess
import time

import pytest

pytest.importorskip("datahub")
pytest.importorskip("confluent_kafka")

from support.datahub_standin import StandInDataHub  # noqa: E402
from support.kafka_broker import KafkaBroker, missing  # noqa: E402
from support.pipeline import ENV, ROOT, bridge_cli  # noqa: E402
from support.sync_runs import PROJECT, produce  # noqa: E402


@pytest.mark.deep
def test_a_frozen_broker_is_reported_then_the_run_goes_on(tmp_path):
    if missing():
        pytest.skip(missing())
    broker = KafkaBroker(tmp_path / "broker")
    try:
        topic = "frozen"
        broker.create_topic(topic, partitions=1)
        produce(broker, topic, ROOT / "samples" / "mixed.pb", 0)
        with StandInDataHub() as server:
            args = bridge_cli("sync", "--brokers", broker.bootstrap, "--topic", topic, "--group", "g-frozen",
                              "--from-beginning", "--datahub-endpoint", server.endpoint, "--project", PROJECT,
                              "--datahub-topic", "blobs", "--status-interval", "0.5", "--idle-timeout", "25",
                              "--no-progress")
            proc = subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not _landed(server):
                time.sleep(0.2)
            assert _landed(server), "nothing landed before the freeze"
            broker.proc.send_signal(signal.SIGSTOP)
            try:
                time.sleep(17)  # the health check asks every 10 s and waits 5 s for an answer
            finally:
                broker.proc.send_signal(signal.SIGCONT)
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-3000:]
            # said while it lasted: the loop is caught either polling (the health check) or committing
            assert "KAFKA NOT ANSWERING" in err or "WAITING" in err and "Kafka broker answering" in err, err[-3000:]
            assert "Traceback" not in err
            landed = server.records(PROJECT, "blobs")
            positions = [r["attributes"]["dts.pos"] for r in landed]
            assert len(positions) == len(set(positions)) and positions  # nothing twice
    finally:
        broker.stop()


def _landed(server) -> int:
    try:
        return len(server.records(PROJECT, "blobs"))
    except Exception:  # noqa: BLE001 - the topic is created by the first write
        return 0
