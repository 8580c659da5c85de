"""A DataHub topic's shards split and merged while a writer writes to it, and the topic read back:
shared by tests/test_writer_resharding_sync.py (`dts-bridge sync`) and tests/test_deliver_resharding.py
(`dts-bridge deliver`), docs/kafka.md "Writing through splits and merges".

- `Reshaper`: a thread splitting and merging the stand-in DataHub's shards at seeded random moments.
- `read_back_exact`: `dts-bridge sync --to dts` of the resharded topic into a real Kafka topic, put
  beside the Entries `convert` makes of the lines that had to land, per table in order.
"""
from __future__ import annotations

import collections
import random
import threading

from support.pipeline import bridge_cli, run_bridge
from support.sync_runs import PROJECT, no_traceback, unique_name


class Reshaper:
    """Splits and merges the topic's shards at seeded random moments, from a thread: a split of the
    ACTIVE shard holding most records, or a merge of the first two adjacent ACTIVE shards that both
    hold records (two shards closing at once, likely both under requests in flight); between 2 and
    5 ACTIVE shards."""

    def __init__(self, server, topic: str, seed: int, every: tuple[float, float] = (0.4, 1.6),
                 project: str = PROJECT) -> None:
        self.server, self.topic, self.rng, self.every = server, topic, random.Random(seed), every
        self.project = project
        self.log: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Reshaper:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def count(self, kind: str) -> int:
        """How many reshards of `kind` ("split" or "merge") happened so far."""
        return sum(line.startswith(kind) for line in list(self.log))

    def _run(self) -> None:
        while not self._stop.wait(self.rng.uniform(*self.every)):
            shards = self.server.shards(self.project, self.topic)
            active = sorted((s for s in shards if s["state"] == "ACTIVE"), key=lambda s: s["begin_hash_key"])
            merge = len(active) >= 5 or (len(active) > 2 and self.rng.random() < 0.5)
            if merge:
                pairs = [(a, b) for a, b in zip(active, active[1:]) if a["records"] and b["records"]] or \
                        list(zip(active, active[1:]))
                a, b = pairs[self.rng.randrange(len(pairs))]
                new = self.server.merge(self.project, self.topic, a["shard_id"], b["shard_id"])
                self.log.append(f"merge {a['shard_id']}+{b['shard_id']} -> {new}")
            else:
                parent = max(active, key=lambda s: s["records"])["shard_id"]
                self.log.append(
                    f"split {parent} -> {'+'.join(self.server.split(self.project, self.topic, parent))}")


def read_back_exact(kafka_broker, server, expected: dict, context: str, topic: str = "blob") -> None:
    """`sync --to dts` of the resharded topic (split and merged children, CLOSED parents) gives back
    every Entry once: per source partition, the Entries `convert` makes of its lines, in order, for
    each table only that partition carries (a table in both has no order between them: its Entries
    are compared as a whole)."""
    from bridge.options import Options
    from bridge.stream import ErrorPolicy, blob_lines_to_entries
    from support.dts_kafka import read_back

    def table(entry):
        return f"{entry.header.schemaName}.{entry.header.tableName}"
    want: dict = {}
    for partition, lines in expected.items():
        policy = ErrorPolicy("fail")
        for _, entry in blob_lines_to_entries(list(enumerate(lines, 1)), policy, Options()):
            want.setdefault(table(entry), {}).setdefault(partition, []).append(entry.SerializeToString())
    out = kafka_broker.create_topic(unique_name("reshard-back"), partitions=3)
    done = run_bridge(bridge_cli(
        "sync", "--to", "dts", "--datahub-endpoint", server.endpoint, "--project", PROJECT, "--datahub-topic", topic,
        "--brokers", kafka_broker.bootstrap, "--topic", out, "--from-beginning", "--idle-timeout", "3",
        "--no-progress", "--status-interval", "0"), timeout=300)
    no_traceback(done.stderr, "sync --to dts of the resharded topic")
    assert done.returncode == 0, f"sync --to dts exited {done.returncode}: {done.stderr[-3000:]}\n{context}"
    got = read_back(kafka_broker.bootstrap, out)
    have: dict = {}
    for partition in sorted(got):
        for entry, _, _ in got[partition]:
            have.setdefault(table(entry), []).append(entry.SerializeToString())
    assert sorted(have) == sorted(want), context
    for name, parts in want.items():
        if len(parts) == 1:
            assert have[name] == next(iter(parts.values())), f"table {name}: not convert's Entries in order\n{context}"
        else:
            assert collections.Counter(have[name]) == collections.Counter(e for es in parts.values() for e in es), \
                f"table {name}\n{context}"
