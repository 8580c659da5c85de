"""The Kafka client: librdkafka settings for a DTS topic, metadata, and `.pb` files produced in order.

confluent-kafka is imported lazily; without it the functions raise `KafkaError` naming the
package to install.

>>> client_config("h:9092", sasl_username="u", sasl_password="p")["security.protocol"]
'SASL_PLAINTEXT'
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from bridge.errors import BridgeError
from bridge.wire.framing import read_pb

__all__ = ["KafkaError", "confluent", "client_config", "produce_file", "partitions_of", "retrying", "raise_for",
           "SASL_USERNAME_ENV", "SASL_PASSWORD_ENV"]

SASL_USERNAME_ENV = "DTS_BRIDGE_SASL_USERNAME"
SASL_PASSWORD_ENV = "DTS_BRIDGE_SASL_PASSWORD"
# What Tencent DTS consumer groups ask for; either can be overridden.
DEFAULT_SASL = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512"}


class KafkaError(BridgeError):
    """The broker or the client failed: connection, unknown topic, delivery, commit."""


def confluent():
    try:
        import confluent_kafka
    except ImportError:
        raise KafkaError("Kafka needs confluent-kafka: pip install 'dts-datahub-bridge[kafka]'") from None
    return confluent_kafka


def client_config(brokers: str, *, security_protocol: str | None = None, sasl_mechanism: str | None = None,
                  sasl_username: str | None = None, sasl_password: str | None = None,
                  extra: dict | None = None) -> dict:
    """librdkafka settings for a DTS topic: SASL (SCRAM-SHA-512 over SASL_PLAINTEXT unless told
    otherwise) as soon as a user name is given."""
    config: dict[str, Any] = {"bootstrap.servers": brokers}
    if sasl_username or sasl_password:
        config.update(DEFAULT_SASL)
        config["sasl.username"] = sasl_username or ""
        config["sasl.password"] = sasl_password or ""
    if security_protocol:
        config["security.protocol"] = security_protocol
    if sasl_mechanism:
        config["sasl.mechanism"] = sasl_mechanism
    config.update(extra or {})
    return config


def raise_for(err, what: str) -> None:
    if err is not None:
        raise KafkaError(f"{what}: {err.str() if hasattr(err, 'str') else err}")


def partitions_of(client, topic: str, timeout: float = 10.0) -> list[int]:
    """The topic's partition ids, from the broker's metadata."""
    try:
        meta = client.list_topics(topic, timeout=timeout)
    except confluent().KafkaException as exc:
        raise KafkaError(f"cannot read the metadata of topic {topic!r}: {exc.args[0]}") from None
    info = meta.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        reason = info.error.str() if info is not None and info.error is not None else "no partitions"
        raise KafkaError(f"topic {topic!r} is not available ({reason})")
    return sorted(info.partitions)


# ---- produce ------------------------------------------------------------------------------------

def produce_file(path, config: dict, topic: str, partition: int | None = None, timeout: float = 30.0) -> int:
    """Send a `.pb` file's Envelopes, in order, to one partition; returns how many were sent.

    Each Envelope is acknowledged before the next is sent (synchronous), so the partition holds
    them in file order even across retries, and a failure stops at a known Envelope. Without
    `partition` every message carries the file's name as key, which the partitioner maps to one
    partition.
    """
    ck = confluent()
    producer = ck.Producer({**config, "linger.ms": 0})
    key = None if partition is not None else os.path.basename(os.fspath(path)).encode()
    failure: list = []

    def delivered(err, msg) -> None:
        if err is not None:
            failure.append(err)

    count = 0
    for number, _, raw in read_pb(path):
        kwargs = {"partition": partition} if partition is not None else {}
        try:
            producer.produce(topic, value=raw, key=key, on_delivery=delivered, **kwargs)
        except (BufferError, ck.KafkaException) as exc:
            raise KafkaError(f"cannot send Envelope {number} of {path}: {exc}") from None
        if producer.flush(timeout) or failure:
            reason = failure[0].str() if failure else f"not acknowledged within {timeout:g} s"
            raise KafkaError(f"Envelope {number} of {path} was not delivered ({reason}); {count} were")
        count += 1
    return count


def retrying(call: Callable[[], Any], what: str, timeout: float):
    """`call()`, again while the broker answers with a retriable error (a group coordinator that is
    still loading or moving, as on a fresh broker; a partition whose leader is not ready yet, as
    just after the topic was created or while leadership moves) for up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except confluent().KafkaException as exc:
            err = exc.args[0]
            ck = confluent()
            moving = getattr(err, "code", lambda: None)() in (  # librdkafka does not flag these retriable
                ck.KafkaError.NOT_COORDINATOR, ck.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                ck.KafkaError.COORDINATOR_NOT_AVAILABLE, ck.KafkaError._WAIT_COORD,
                ck.KafkaError.NOT_LEADER_FOR_PARTITION, ck.KafkaError.LEADER_NOT_AVAILABLE)
            if (moving or getattr(err, "retriable", lambda: False)()) and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise KafkaError(f"{what}: {err}") from None
