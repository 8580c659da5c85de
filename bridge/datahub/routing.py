"""Routing records to shards: DataWorks' rule (`shard_for`: MD5 of the key over the topic's ACTIVE
shard ids), the writer's view of a topic and its shards, and resharding (a split or merged shard:
wait for the topic's requests in flight, list the shards again, route every waiting record anew in
the order it was put).

>>> shard_for("[10001]", ["0", "1", "2"]) in ("0", "1", "2")
True
"""
from __future__ import annotations

import collections
import hashlib

import orjson

from bridge.datahub.calls import DataHubError, shard_state, sort_shard_id
from bridge.datahub.records import Pending

__all__ = ["shard_for", "tuple_shard_key", "ShardRouting"]


def shard_for(key: str, shard_ids: list[str]) -> str:
    """The shard of a key: MD5 of the key modulo the number of shards, over the sorted ids."""
    digest = hashlib.md5(key.encode("utf-8")).digest()
    return shard_ids[int.from_bytes(digest[:8], "big") % len(shard_ids)]


def tuple_shard_key(row: dict, table: str, keys: list[str]) -> str:
    """`shard_key` for a Tuple row: the key columns' values, else the table name. DECIMAL values
    (Decimal) go in as their text, as they are written."""
    if keys:
        return orjson.dumps([row.get(k) for k in keys], default=str).decode()
    return table



class _Shard:
    __slots__ = ("topic", "shard_id", "queue", "busy", "solo", "rate", "next_at", "bytes")

    def __init__(self, topic: _Topic, shard_id: str, rate: float) -> None:
        self.topic, self.shard_id = topic, shard_id
        self.queue: collections.deque[Pending] = collections.deque()
        self.busy = False
        self.solo = 0  # records still to send one per request (after a refused request)
        self.rate = rate  # requests per second allowed (AIMD: halved on LimitExceeded, +step on success)
        self.next_at = 0.0
        self.bytes = 0  # estimated size of the records queued


class _Topic:

    def __init__(self, name: str, kind: str, schema) -> None:
        self.name, self.kind, self.schema = name, kind, schema
        self.shard_ids: list[str] = []
        self.shards: dict[str, _Shard] = {}
        self.resharding = False
        self.landed: set[str] | None = None  # positions of ours found past the commit, not yet put again
        self.scanned = False
        self.look_for: set[int] | None = None  # partitions the restart look is still to look for (None: all)


class ShardRouting:
    """The writer's routing (a mixin of `DataHubWriter`, whose state it uses: `_cv`, `_topics`,
    `_ready`, `_error`, `max_rate`, `client`, `project`)."""

    def _active_shards(self, name: str) -> list[str]:
        result = self.call(lambda: self.client.list_shard(self.project, name), "ListShard")
        ids = [s.shard_id for s in result.shards if shard_state(s) == "ACTIVE"]
        if not ids:
            raise DataHubError(f"topic {self.project}/{name} has no ACTIVE shard")
        return sorted(ids, key=sort_shard_id)

    def _route(self, info: _Topic, key: str) -> _Shard:
        shard_id = shard_for(key, info.shard_ids)
        shard = info.shards.get(shard_id)
        if shard is None:
            shard = info.shards[shard_id] = _Shard(info, shard_id, self.max_rate)
        return shard

    def _reshard(self, topic: _Topic) -> None:
        """The topic's shards changed: wait for its requests in flight, list the shards again and
        route every waiting record anew, in the order it was put."""
        with self._cv:
            if topic.resharding:
                return
            topic.resharding = True
            while any(s.busy for s in topic.shards.values()):
                self._cv.wait()
        try:
            ids = self._active_shards(topic.name)
        except BaseException as exc:  # noqa: BLE001
            with self._cv:
                topic.resharding = False
                self._error = self._error or exc
                self._cv.notify_all()
            return
        with self._cv:
            waiting = sorted((p for s in topic.shards.values() for p in s.queue), key=lambda p: p.seq)
            for shard in topic.shards.values():
                shard.queue.clear()
                if shard in self._ready:
                    self._ready.remove(shard)
            topic.shard_ids = ids
            topic.shards = {sid: s for sid, s in topic.shards.items() if sid in ids}
            for shard in topic.shards.values():
                shard.bytes = 0
            for item in waiting:
                target = self._route(topic, item.key)
                target.queue.append(item)
                target.bytes += item.size
            for shard in topic.shards.values():
                if shard.queue:
                    self._ready.append(shard)
            topic.resharding = False
            self.resplits += 1
            self._cv.notify_all()

