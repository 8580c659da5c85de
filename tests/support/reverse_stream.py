"""The reverse Spark stream's kill run (issue 33): DataHub (3 shards, the forward converter's Blob
lines of the samples spread round robin so an Entry's rows and an UPDATE's halves sit on several
shards) -> `blob_to_dts` -> `dts-kafka`, the driver (tests/pipeline_jobs/reverse_driver.py)
SIGKILLed and restarted from its checkpoint with a shard split in between, then what a
read_committed consumer sees compared per Kafka partition with `convert` of the same lines, never
sorted. Shared by tests/test_spark_datahub_reverse.py (local[2]) and tests/test_spark_cluster.py
(the standalone cluster)."""
from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
import uuid

from datahub.models import BlobRecord

from bridge.blob.encode import BlobEncoder
from bridge.options import Options
from bridge.samples import build_sample_entries
from bridge.stream import ErrorPolicy, blob_lines_to_entries
from bridge.wire import subscribe_pb2 as pb
from support.dts_kafka import expected_partition, read_back, records_on
from support.pipeline import ENV, ROOT

P = "proj"
SAMPLES = ("mixed", "realistic")


def sample_lines(samples=SAMPLES):
    encoder = BlobEncoder(Options())
    out = []
    for name in samples:
        out.extend(encoder.convert_lines(e) for e in build_sample_entries()[name])
    return out


def write_round_robin(client, topic, entries, shards, first=0, attrs=True, start_turn=0):
    """Each line to the next shard in turn. Returns the lines in source order."""
    turn, lines, per = start_turn, [], collections.defaultdict(list)
    for index, entry_lines in enumerate(entries, first):
        for row, line in enumerate(entry_lines):
            r = BlobRecord(blob_data=line)
            if attrs:
                r.put_attribute("dts.topic", "k")
                r.put_attribute("dts.pos", f"0:{index}:0:{row}")
            per[shards[turn % len(shards)]].append(r)
            lines.append(line)
            turn += 1
    for shard, records in per.items():
        for i in range(0, len(records), 50):
            client.put_records_by_shard(P, topic, shard, records[i:i + 50])
    return lines


def convert(lines) -> list[bytes]:
    return [e.SerializeToString() for _, e in blob_lines_to_entries(lines, ErrorPolicy("fail"), Options())]


def table_of(raw: bytes) -> str:
    from bridge.wire import subscribe_pb2 as pb
    h = pb.Entry.FromString(raw).header
    return f"{h.schemaName}.{h.tableName}" if h.tableName else ""


def by_table(raws) -> dict:
    out: dict = {}
    for raw in raws:
        out.setdefault(table_of(raw), []).append(raw)
    return out


def _start(tmp_path, run: int, cfg: dict, trigger: str):
    config = tmp_path / f"driver-{run}.json"
    config.write_text(json.dumps(dict(cfg, trigger=trigger)))
    log = tmp_path / f"driver-{run}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "pipeline_jobs" / "reverse_driver.py"),
                                 str(config)], cwd=ROOT, env=ENV, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return proc, log


def _killpg(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _cuts_inside_entries(server, topic: str, checkpoint) -> list[int]:
    """The micro-batches whose end falls inside an Entry (some of its rows read, some not): from the
    checkpoint's offset log ({topic: {shard: next sequence}} on each entry's last line) and where
    each Entry's rows sit (the `dts.pos` attribute `0:<entry>:0:<row>` of every record)."""
    rows: dict = collections.defaultdict(list)
    for r in server.records(P, topic):
        rows[int(r["attributes"]["dts.pos"].split(":")[1])].append((r["shard"], r["sequence"]))
    return [n for n, end in enumerate(_offset_log(checkpoint, topic))
            if any(len({seq < end.get(shard, 0) for shard, seq in where}) == 2 for where in rows.values())]


def _offset_log(checkpoint, topic: str) -> list[dict]:
    folder = checkpoint / "offsets"
    if not folder.exists():
        return []
    return [json.loads(path.read_text().strip().splitlines()[-1])[topic]
            for path in sorted((x for x in folder.iterdir() if x.name.isdigit()), key=lambda x: int(x.name))]


def _committed(checkpoint) -> int:
    folder = checkpoint / "commits"
    return sum(1 for x in folder.iterdir() if x.name.isdigit()) if folder.exists() else 0


def _cluster_conf(cluster) -> dict:
    """The driver's settings for the standalone cluster; the executors read DataHub (the source's
    tasks), so they get the credentials and the import path in their environment."""
    return dict(cluster.conf(), **{f"spark.executorEnv.{k}": ENV[k]
                                   for k in ("DATAHUB_ACCESS_ID", "DATAHUB_ACCESS_KEY", "PYTHONPATH")})


def kill_run(server, client, kafka_broker, tmp_path, *, kills: int, seed: int, cluster=None, samples=SAMPLES,
             max_records: int = 56):
    """DataHub (3 shards) -> blob_to_dts -> dts-kafka, the driver SIGKILLed `kills` times inside
    micro-batches (after the first kill shard 0 is split and more lines go to the children), then
    run to the end (availableNow): a read_committed consumer sees every Entry once, in order per
    Kafka partition (so per table), equal to `convert` of the same lines; a micro-batch planned by a
    killed run ends inside an Entry, so a restart takes an open tail from the state (`max_records`
    56 or 24 cut the first micro-batch inside an Entry: the first half's 85 lines, round robin over
    3 shards, are planned 19/18/18 or 8/7/7; 60 or 25 would end it between Entries). `cluster`: the
    driver's tasks run on the Spark standalone cluster (`spark_cluster`), and both workers'
    executors ran tasks. 56 gives 5 micro-batches (24: about 10); the time goes mostly to the
    drivers' starts and each application's first micro-batch, not to the records."""
    import random
    rng = random.Random(seed)
    began = time.monotonic()
    topic = f"rev_kill_{uuid.uuid4().hex[:6]}"
    server.create_topic(P, topic, shard_count=3)
    entries = sample_lines(samples)
    half = len(entries) // 2
    lines = write_round_robin(client, topic, entries[:half], ["0", "1", "2"])
    out = kafka_broker.create_topic(f"rev-kill-{uuid.uuid4().hex[:6]}", partitions=3)
    checkpoint = tmp_path / "checkpoint"
    cfg = dict(endpoint=server.endpoint, project=P, datahub_topic=topic, bootstrap=kafka_broker.bootstrap, topic=out,
               checkpoint=str(checkpoint), maxRecordsPerTrigger=max_records, settle=0.3, markers=f"markers-{out}")
    if cluster is not None:
        cfg["conf"] = _cluster_conf(cluster)
        before = {n: set(apps) for n, apps in cluster.task_logs().items()}
    log = [f"{'standalone cluster ' + cluster.master if cluster else 'local[2]'}, seed {seed}, samples {samples}, "
           f"maxRecordsPerTrigger {max_records}; driver logs in {tmp_path}"]
    for run in range(1, kills + 1):
        before_run = records_on(kafka_broker.bootstrap, out)
        proc, path = _start(tmp_path, run, cfg, "200 milliseconds")
        started = time.monotonic()
        while proc.poll() is None and records_on(kafka_broker.bootstrap, out) <= before_run \
                and time.monotonic() - started < 120:
            time.sleep(0.1)
        time.sleep(rng.uniform(0.0, 1.5))
        alive = proc.poll() is None
        _killpg(proc)
        text = path.read_text(errors="replace")
        assert alive, f"run {run} ended by itself:\n{text[-4000:]}"
        assert "Traceback" not in text, text[-4000:]
        at = records_on(kafka_broker.bootstrap, out)
        log.append(f"run {run}: SIGKILL after {time.monotonic() - started:.1f} s, {at} Kafka records "
                   f"({at - before_run} in the run), micro-batches planned {len(_offset_log(checkpoint, topic))}, "
                   f"committed {_committed(checkpoint)}")
        if run == 1:  # a split mid-stream: shard 0 closes, later lines go to its children too
            assert at > before_run, f"run 1 wrote nothing in 120 s:\n{text[-4000:]}\n" + "\n".join(log)
            children = server.split(P, topic, "0")
            active = [x["shard_id"] for x in server.shards(P, topic) if x["state"] == "ACTIVE"]
            log.append(f"split: children {children}, active {active}")
            lines += write_round_robin(client, topic, entries[half:], active, first=half)
    killed_planned = len(_offset_log(checkpoint, topic))  # the micro-batches the killed runs planned
    proc, path = _start(tmp_path, kills + 1, cfg, "availableNow")
    started = time.monotonic()
    try:
        code = proc.wait(300)
    except subprocess.TimeoutExpired:
        _killpg(proc)
        raise AssertionError("the final run did not end:\n" + path.read_text(errors="replace")[-4000:]) from None
    text = path.read_text(errors="replace")
    assert code == 0 and "finished" in text, text[-4000:]
    log.append(f"run {kills + 1}: availableNow to the end in {time.monotonic() - started:.1f} s, "
               f"{records_on(kafka_broker.bootstrap, out)} Kafka records")
    context = "\n  ".join(log)
    got = read_back(kafka_broker.bootstrap, out)  # read_committed
    want = convert(lines)
    have = {p: [e.SerializeToString() for e, _, _ in items] for p, items in got.items()}
    assert sum(len(v) for v in have.values()) == len(want), context
    for p in sorted(have):  # each once, in order per partition (never sorted): convert's order of its tables
        wanted = [raw for raw in want if expected_partition(pb.Entry.FromString(raw), len(have)) == p]
        first = next((i for i, (a, b) in enumerate(zip(have[p], wanted)) if a != b), min(len(have[p]), len(wanted)))
        assert have[p] == wanted, (f"partition {p}: {len(have[p])} Entries, {len(wanted)} wanted, first difference "
                                   f"at {first}\n  {context}")
    assert by_table([r for p in sorted(have) for r in have[p]]) == by_table(want), context
    batches, inside = len(_offset_log(checkpoint, topic)), _cuts_inside_entries(server, topic, checkpoint)
    assert any(n < killed_planned for n in inside), \
        (f"no micro-batch planned by a killed run ({killed_planned}) ended inside an Entry (those that did: "
         f"{inside} of {batches})\n  {context}")
    tasks = None
    if cluster is not None:  # every run an application of the cluster; tasks in executors on both workers
        tasks = {n: {app: count for app, count in apps.items() if app not in before[n]}
                 for n, apps in cluster.task_logs().items()}
        runs = set().union(*(set(apps) for apps in tasks.values()))
        assert len(runs) == kills + 1, f"{kills + 1} driver runs, applications on the workers: {tasks}\n  {context}"
        assert all(sum(apps.values()) > 0 for apps in tasks.values()), \
            f"not both workers ran tasks: {tasks}\n  {context}"
        final = max(runs)
        assert all(tasks[n].get(final, 0) > 0 for n in tasks), \
            f"the last run's tasks did not run on both workers: {tasks}\n  {context}"
    print(f"\n[reverse kill run: {kills} kills, {len(want)} Entries compared per partition "
          f"({ {p: len(v) for p, v in have.items()} }), {batches} micro-batches, {inside} ending inside an Entry, "
          f"tasks per worker and application {tasks}, {time.monotonic() - began:.1f} s]\n  {context}")
    return log
