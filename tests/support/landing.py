"""What landed in a DataHub topic put beside what must land: `compare` checks every (shard, Kafka
partition) record for record and in order (never sorted), and that source positions (`dts.pos`)
rise strictly per (shard, partition) and never repeat in the topic. Shared by the sync tests
(tests/test_sync.py, test_sync_tables.py) and the Spark driver tests (support/spark_driver.py),
which read what landed with `by_shard_partition`; the writer and sink tests of one Blob file
(tests/test_datahub_sink.py, test_spark_datahub.py) compare `landed_per_shard` with
`expected_per_shard`."""
from __future__ import annotations

import collections

from support.pipeline import dts_pos

SHARDS = ["0", "1", "2"]  # the shards of the stand-in's 3-shard test topics


def landed_per_shard(server, topic: str = "t", project: str = "p") -> dict[str, list[bytes]]:
    """What landed, per shard in sequence order (never sorted)."""
    out: dict[str, list[bytes]] = {}
    for record in server.records(project, topic):
        out.setdefault(record["shard"], []).append(record["data"])
    return out


def expected_per_shard(lines: list[bytes], shards: list[str] = SHARDS) -> dict[str, list[bytes]]:
    """Blob lines per shard (as the writer routes their shard_key), in file order: what must land,
    in this order."""
    import orjson

    from bridge import shard_key
    from bridge.datahub.sink import shard_for
    out: dict[str, list[bytes]] = {}
    for line in lines:
        out.setdefault(shard_for(shard_key(orjson.loads(line)), shards), []).append(line)
    return out


def by_shard_partition(records: list[dict], topic: str, source: str, value) -> tuple[dict, dict]:
    """{(shard, partition): [value(record)]} and the same with positions (`dts.pos`), in each
    shard's sequence order; every record must carry `dts.topic` `source`."""
    got: dict = collections.defaultdict(list)
    positions: dict = collections.defaultdict(list)
    for record in records:
        assert record["attributes"].get("dts.topic") == source, \
            f"{topic} shard {record['shard']} seq {record['sequence']}: dts.topic is " \
            f"{record['attributes'].get('dts.topic')!r}, not {source!r}"
        pos = dts_pos(record)
        got[(record["shard"], pos[0])].append(value(record))
        positions[(record["shard"], pos[0])].append(pos)
    return got, positions


def short(value) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else repr(value)
    return text if len(text) < 300 else text[:300] + "..."


def compare(topic: str, got: dict, positions: dict, expected: dict, context: str,
            epochs: dict | None = None) -> int:
    """Every (shard, partition) equal, in order; positions strictly increasing per (shard,
    partition) and unique in the topic. Returns the number of records compared."""
    problems = []
    seen: dict = {}
    for key, pos_list in positions.items():
        for i, pos in enumerate(pos_list):
            if pos in seen:
                copies = (epochs or {}).get(pos, [])
                why = (f"; both copies of micro-batch {copies[0]}: sent twice by one attempt (a retry), "
                       "not a replay after a restart" if len(copies) == 2 and copies[0] == copies[1] is not None
                       else f"; micro-batches {copies}" if any(e is not None for e in copies) else "")
                problems.append(f"{topic}: position {':'.join(map(str, pos))} landed twice "
                                f"(shard {seen[pos][0]} #{seen[pos][1]} and shard {key[0]} #{i}{why})")
            seen[pos] = (key[0], i)
        for i, (a, b) in enumerate(zip(pos_list, pos_list[1:])):
            if not a < b:
                problems.append(f"{topic} shard {key[0]} partition {key[1]}: record #{i + 1} at "
                                f"{':'.join(map(str, b))} follows {':'.join(map(str, a))} "
                                f"({'a duplicate' if a == b else 'reordered'})")
                break
    for key in sorted(set(got) | set(expected)):
        have, want = got.get(key, []), expected.get(key, [])
        if have == want:
            continue
        first = next((i for i, (h, w) in enumerate(zip(have, want)) if h != w), min(len(have), len(want)))
        c_have, c_want = collections.Counter(map(repr, have)), collections.Counter(map(repr, want))
        extra, lost = sum((c_have - c_want).values()), sum((c_want - c_have).values())
        pos = positions.get(key, [])
        where = ":".join(map(str, pos[first])) if first < len(pos) else "-"
        problems.append(
            f"{topic} shard {key[0]} partition {key[1]}: {len(have)} records landed, {len(want)} expected; "
            f"first difference at #{first} (dts.pos {where}); {lost} lost, {extra} extra"
            f"{'; same records in another order: REORDERED' if not lost and not extra else ''}\n"
            f"    landed:   {short(have[first]) if first < len(have) else '(end)'}\n"
            f"    expected: {short(want[first]) if first < len(want) else '(end)'}")
    problems.sort(key=lambda text: "landed twice" in text or "follows" in text)
    assert not problems, f"{context}\n" + "\n".join(problems[:20]) + \
        (f"\n... and {len(problems) - 20} more" if len(problems) > 20 else "")
    return sum(len(v) for v in expected.values())
