"""DTS over Kafka: the pipeline's Kafka end.

- `client`: librdkafka settings (SASL as DTS asks for it), metadata, `.pb` files produced in order;
- `positions`: where a Kafka source's offsets are committed (`GroupOffsets`, `FileOffsets`);
- `source`: a DTS topic as a pipeline `Source` (`KafkaSource`); `bridge.pipeline.consume` runs the
  loop with it (the commit rule is the loop's: docs/kafka.md, "The commit rule");
- `sink`: DTS Envelopes out (`DtsKafkaSink`), exactly once with Kafka transactions, and
  `transactions`: the source positions committed in the same transaction (`TransactionalPositions`)
  or, without transactions, beside a tail look (`TailPositions`): docs/kafka.md, "DataHub -> Kafka".

confluent-kafka is imported lazily; without it the functions raise `KafkaError` naming the
package to install.

>>> client_config("h:9092", sasl_username="u", sasl_password="p")["security.protocol"]
'SASL_PLAINTEXT'
"""
from __future__ import annotations

from bridge.kafka.client import (
    SASL_PASSWORD_ENV,
    SASL_USERNAME_ENV,
    KafkaError,
    client_config,
    confluent,
    partitions_of,
    produce_file,
)
from bridge.kafka.positions import FileOffsets, GroupOffsets
from bridge.kafka.sink import DtsKafkaSink, transactional_id_for
from bridge.kafka.source import KafkaSource
from bridge.kafka.transactions import TailPositions, TransactionalPositions

__all__ = ["KafkaError", "confluent", "client_config", "produce_file", "KafkaSource",
           "GroupOffsets", "FileOffsets", "partitions_of", "SASL_USERNAME_ENV", "SASL_PASSWORD_ENV",
           "DtsKafkaSink", "transactional_id_for", "TransactionalPositions", "TailPositions"]
