"""`dts-bridge sync` (Kafka -> DataHub Blob) SIGKILLed at seeded random points and restarted while the
DataHub topic's shards are split and merged under it (docs/kafka.md, "Writing through splits and
merges"), on the real parts of tests/test_sync.py: a real Kafka broker, `sync` as a subprocess, the
stand-in DataHub with chaos faults and PutRecordsByShard slowed.

Checked afterwards, never sorted within a shard: per (shard, Kafka partition) the positions
(`dts.pos`) rise record by record (order per shard, what the reverse reader needs), no position
lands twice in the topic, and per Kafka partition the records in position order are exactly the
lines `dts-bridge convert` makes of the files produced (nothing lost, nothing twice). Where a
record lands cannot be predicted (routing follows the shards of the moment), so content is
compared per partition, order per shard. SYNC_TEST_SEED changes the seed.
"""
from __future__ import annotations

import collections
import time

import pytest

pytest.importorskip("datahub")
pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.datahub

from support.datahub_standin import StandInDataHub  # noqa: E402
from support.landing import compare  # noqa: E402
from support.pipeline import ROOT, fault_summary  # noqa: E402
from support.resharding import Reshaper  # noqa: E402
from support.resharding import read_back_exact as _read_back_exact  # noqa: E402
from support.sync_runs import (  # noqa: E402
    PROJECT,
    SEED,
    Sync,
    chaos,
    committed_offsets,
    convert_blob,
    end_offsets,
    kill_loop,
    landed_by_shard_partition,
    no_traceback,
    produce,
    repack,
    unique_name,
    warm_group_coordinator,
)

SAMPLES = ROOT / "samples"


def _kill_loop_through_reshards(kafka_broker, tmp_path, *, kills: int, seed: int, layout: list, stages: list,
                                max_delay: float, max_step: int) -> None:
    began = time.monotonic()
    topic = kafka_broker.create_topic(unique_name("sync-reshard"), partitions=2)
    warm_group_coordinator(kafka_broker, topic)
    expected: dict[int, list[bytes]] = {0: [], 1: []}

    def produce_stage(stage):
        for path, partition in stage:
            produce(kafka_broker, topic, path, partition)
            expected[partition].extend(convert_blob(path, tmp_path))

    log: list[str] = []
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "blob", shard_count=3)
        produce_stage(layout)
        chaos(server, seed, 0.5)
        server.faults.delay("PutRecordsByShard", seconds=0.03)  # a distant region's answers
        sync = Sync(tmp_path, kafka_broker, topic, "g-reshard", server, "--to", "blob", "--datahub-topic", "blob",
                    "--idle-timeout", "2")
        with Reshaper(server, "blob", seed) as reshaper:
            killed = kill_loop(sync, server, kills=kills, seed=seed, stages=stages, produce_stage=produce_stage,
                               max_delay=max_delay, max_step=max_step, log=log)
            code, report, err = sync.run(timeout=240)
        server.faults.clear()
        shards = server.shards(PROJECT, "blob")
        context = (f"seed {seed}; stderr of every run in {tmp_path}; faults: {fault_summary(server)}\n  reshards: "
                   f"{reshaper.log}\n  " + "\n  ".join(log))
        no_traceback(err, "the final sync run")
        assert code == 0, f"final sync run exited {code}: {err[-3000:]}\n{context}"
        assert report["stopped"] == "idle" and report["rejected"] == 0, (report, context)
        assert server.errors == [], f"the stand-in's own errors: {server.errors}"
        assert sum(line.startswith("merge") for line in reshaper.log) >= 2, context
        assert sum(line.startswith("split") for line in reshaper.log) >= 2, context
        got, positions = landed_by_shard_partition(server, "blob", topic, lambda r: r["data"])
        # order per shard: positions rise per (shard, partition); none twice in the topic
        compare("blob", got, positions, got, context)
        # exactly once: per partition, what landed, in position order, is the conversion of what was produced
        per_partition: dict = collections.defaultdict(list)
        for (shard, partition), values in got.items():
            per_partition[partition].extend(zip(positions[(shard, partition)], values))
        for partition, lines in expected.items():
            landed = [value for _, value in sorted(per_partition[partition])]
            if landed != lines:
                first = next((i for i, (a, b) in enumerate(zip(landed, lines)) if a != b), min(len(landed), len(lines)))
                raise AssertionError(f"partition {partition}: {len(landed)} records landed, {len(lines)} expected; "
                                     f"first difference at #{first}\n{context}")
        assert committed_offsets(kafka_broker, topic, "g-reshard", [0, 1]) == end_offsets(kafka_broker, topic, [0, 1])
        assert len(killed) >= kills and any(k["landed_in_run"] > 0 for k in killed), context
        _read_back_exact(kafka_broker, server, expected, context)
        used = {s["shard_id"] for s in shards if s["records"]}
        print(f"\n[sync kill loop through reshards, seed {seed}: {len(killed)} kills in {sync.runs} runs, "
              f"{sum(map(len, expected.values()))} records over {len(used)} shards ({len(shards)} in all), "
              f"{time.monotonic() - began:.1f} s]\n  reshards: {reshaper.log}\n  " + "\n  ".join(log))


def test_sync_killed_while_shards_are_split_and_merged(kafka_broker, tmp_path):
    """3 SIGKILLs while shards are split and merged every 0.4-1.6 s; chaos at half the sync tests'
    rates, PutRecordsByShard held 30 ms."""
    small = {n: repack(SAMPLES / f"{n}.pb", tmp_path / f"{n}-1200.pb", 1200, times=2) for n in ("mixed", "types")}
    _kill_loop_through_reshards(kafka_broker, tmp_path, kills=3, seed=SEED,
                                layout=[(small["mixed"], 0), (SAMPLES / "large.pb", 1)],
                                stages=[[(small["types"], 0)], [(small["mixed"], 1)]],
                                max_delay=3.0, max_step=80)


@pytest.mark.deep
def test_sync_killed_many_times_while_shards_are_split_and_merged(kafka_broker, tmp_path):
    """12 SIGKILLs, bigger streams."""
    files = {n: repack(SAMPLES / f"{n}.pb", tmp_path / f"{n}-800x3.pb", 800, times=3) for n in ("mixed", "types", "large")}
    stages = [[(files["types"], 0)], [(files["mixed"], 1)], [(files["large"], 0)], [(SAMPLES / "types.pb", 1)]]
    _kill_loop_through_reshards(kafka_broker, tmp_path, kills=12, seed=SEED + 1,
                                layout=[(SAMPLES / "mixed.pb", 0), (SAMPLES / "large.pb", 1)], stages=stages,
                                max_delay=4.0, max_step=150)
