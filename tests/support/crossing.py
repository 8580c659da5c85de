"""A DataHub topic whose shard heads hold each other back (docs/kafka.md, "Reading DataHub:
stalls"), for both faces' stall tests (tests/test_reverse_foreign_writers.py, the CLI;
tests/test_spark_merge_stalls.py, Spark)."""
from __future__ import annotations

from datahub.models import BlobRecord

from bridge.blob.encode import BlobEncoder
from bridge.datahub.calls import make_client
from bridge.options import Options
from bridge.samples import build_sample_entries


def single_row_lines(count: int) -> list:
    """Lossless lines of the first `count` Entries of mixed.pb that make one line each."""
    encoder = BlobEncoder(Options())
    out = []
    for entry in build_sample_entries()["mixed"]:
        lines = encoder.convert_lines(entry)
        if len(lines) == 1:
            out.append(lines[0])
        if len(out) == count:
            return out
    raise AssertionError("too few one-line Entries in mixed.pb")


def write_crossing(server, project: str, topic: str) -> None:
    """Two source partitions whose records cross between two shards of `topic` (a writer that
    routed them by a rule that changed): shard 0 holds partition 0's second record before partition
    1's first, shard 1 partition 1's second before partition 0's first. Each head waits for a record
    behind the other's: no read can end that, so the merge must decide."""
    a, b, c, d = single_row_lines(4)
    client = make_client(server.endpoint, "id", "key")

    def rec(line, pos):
        r = BlobRecord(blob_data=line)
        r.put_attribute("dts.topic", "src")
        r.put_attribute("dts.pos", pos)
        return r
    client.put_records_by_shard(project, topic, "0", [rec(b, "0:2:0:0"), rec(c, "1:1:0:0")])
    client.put_records_by_shard(project, topic, "1", [rec(d, "1:2:0:0"), rec(a, "0:1:0:0")])
