"""What a dead letter says (one JSON document: the Entry's bytes whole, its source position, table,
error and DataHub topic), shared by the ends that keep them: a file (bridge/deadletters.py) and a
Kafka topic (bridge/kafka/deadletters.py).

>>> letter_position({"partition": 1, "offset": 7, "entry": 2, "row": None})
'1:7:2'
"""
from __future__ import annotations

import base64

import orjson

__all__ = ["letter_line", "letter_position"]


def letter_position(letter: dict) -> str:
    """"partition:offset:entry[:row]" of a dead letter."""
    base = f"{letter['partition']}:{letter['offset']}:{letter['entry']}"
    return base if letter.get("row") is None else f"{base}:{letter['row']}"


def letter_line(*, entry_bytes: bytes, source: str, partition: int, offset: int, entry: int, row: int | None,
                table: str, error: str, datahub_topic: str | None) -> bytes:
    """One dead letter as JSON (a line of the file, a record of a DataHub dead-letter topic)."""
    return orjson.dumps({"entry_base64": base64.b64encode(entry_bytes).decode("ascii"), "source": source,
                         "partition": partition, "offset": offset, "entry": entry, "row": row, "table": table,
                         "datahub_topic": datahub_topic, "error": error})
