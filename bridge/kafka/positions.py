"""Where a Kafka source's committed offsets live: the consumer group (`GroupOffsets`) or a local
file (`FileOffsets`). Both are `bridge.stream.pipeline.Positions`: per partition the committed
offset and how far the committing run had read (to count what a restart reads again).
"""
from __future__ import annotations

import json
import os
import time

from bridge.kafka.client import KafkaError, confluent, raise_for, retrying
from bridge.stream.pipeline import KeysLost
from bridge.stream.state import replace_json

# a commit the group refuses because this member no longer owns what it commits
_NOT_OURS = ("UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION", "REBALANCE_IN_PROGRESS", "Unknown member",
             "Specified group generation id is not valid", "Group rebalance in progress")

__all__ = ["GroupOffsets", "FileOffsets"]


class GroupOffsets:
    """Offsets committed to the consumer group; the commit metadata also records how far the run
    had read, so that the next run can count what it reads again (brokers may drop it: Tansu does)."""

    def __init__(self, consumer, topic: str, timeout: float = 10.0) -> None:
        self.consumer, self.topic, self.timeout = consumer, topic, timeout
        self.times: dict[int, int] = {}  # when each partition was last committed (epoch ms), if kept

    def load(self, partitions: list[int]) -> dict[int, tuple[int | None, int | None]]:
        TopicPartition = confluent().TopicPartition
        got = retrying(lambda: self.consumer.committed([TopicPartition(self.topic, p) for p in partitions],
                                                        timeout=self.timeout),
                        "cannot read the group's committed offsets", max(self.timeout, 30.0))
        out = {}
        for tp in got:
            offset = tp.offset if tp.offset >= 0 else None
            out[tp.partition] = (offset, _read_mark(tp.metadata))
            at = _read_mark(tp.metadata, "at")
            if at is not None:
                self.times[tp.partition] = at
        return out

    def save(self, commit: dict[int, int], read: dict[int, int]) -> None:
        TopicPartition = confluent().TopicPartition
        at = int(time.time() * 1000)
        offsets = [TopicPartition(self.topic, p, off, metadata=json.dumps({"read": read[p], "at": at}))
                   for p, off in sorted(commit.items())]
        try:
            result = retrying(lambda: self.consumer.commit(offsets=offsets, asynchronous=False),
                              "offset commit failed", max(self.timeout, 30.0))
        except KafkaError as err:
            if any(name in str(err) for name in _NOT_OURS):
                raise KeysLost(f"the group took partitions {', '.join(map(str, sorted(commit)))} from this member "
                               f"before it could commit them ({err}): the next owner reads them from the last "
                               f"commit") from None
            raise
        for tp in result or []:
            raise_for(tp.error, f"offset commit of partition {tp.partition} failed")


def _read_mark(metadata: str | None, key: str = "read") -> int | None:
    try:
        return int(json.loads(metadata)[key]) if metadata else None
    except (ValueError, KeyError, TypeError):
        return None


class FileOffsets:
    """Offsets in a local JSON file, for brokers (or ACLs) without consumer-group commits. The
    file is replaced atomically and fsynced, like the output it vouches for."""

    def __init__(self, path, topic: str) -> None:
        self.path, self.topic = os.fspath(path), topic
        self.times: dict[int, int] = {}  # when each partition was last committed (epoch ms)

    def load(self, partitions: list[int]) -> dict[int, tuple[int | None, int | None]]:
        try:
            with open(self.path, "rb") as fh:
                doc = json.load(fh)
        except FileNotFoundError:
            return {p: (None, None) for p in partitions}
        except (OSError, ValueError) as exc:
            raise KafkaError(f"cannot read the offsets file {self.path}: {exc}") from None
        if doc.get("topic") != self.topic:
            raise KafkaError(f"the offsets file {self.path} is for topic {doc.get('topic')!r}, not {self.topic!r}")
        known = doc.get("partitions", {})
        self.times = {p: known[str(p)]["at"] for p in partitions
                      if isinstance(known.get(str(p), {}).get("at"), int)}
        return {p: (known[str(p)]["commit"], known[str(p)].get("read")) if str(p) in known else (None, None)
                for p in partitions}

    def save(self, commit: dict[int, int], read: dict[int, int]) -> None:
        doc = {"topic": self.topic, "partitions": {}}
        if os.path.exists(self.path):
            with open(self.path, "rb") as fh:
                doc = json.load(fh)
        at = int(time.time() * 1000)
        for p, off in commit.items():
            doc["partitions"][str(p)] = {"commit": off, "read": read[p], "at": at}
        replace_json(self.path, doc)
