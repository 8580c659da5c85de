"""The DataHub writer and `dts-bridge deliver` (docs/kafka.md, "The DataHub writer"), against the
loopback stand-in DataHub (tests/support/datahub_standin.py) that the real pydatahub client talks to
over HTTP, with faults injected at the HTTP level.
"""
import json
import pathlib

import orjson
import pytest

pytest.importorskip("datahub")
pytestmark = pytest.mark.datahub

from bridge import shard_key  # noqa: E402
from bridge.cli.main import main  # noqa: E402
from bridge.datahub.sink import DataHubSink, DataHubWriter, Position, make_client, shard_for, tuple_shard_key  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.landing import SHARDS, expected_per_shard, landed_per_shard  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def datahub(monkeypatch):
    with StandInDataHub() as server:
        server.create_topic("p", "t", shard_count=3)
        monkeypatch.setenv("DATAHUB_ACCESS_ID", "test-id")
        monkeypatch.setenv("DATAHUB_ACCESS_KEY", "test-secret")
        monkeypatch.setattr("time.sleep", lambda s: None)  # backoff without waiting
        yield server


def blob_file(tmp_path) -> pathlib.Path:
    out = tmp_path / "mixed.jsonl"
    assert main(["convert", str(ROOT / "samples" / "mixed.pb"), "-o", str(out)]) == 0
    return out


def test_deliver_blob_in_order_through_throttling_5xx_and_lost_answers(datahub, tmp_path, capsys):
    path = blob_file(tmp_path)
    capsys.readouterr()
    lines = path.read_bytes().splitlines()
    datahub.faults.fail_next("PutRecordsByShard", 429, "LimitExceeded", "throttled", times=2)
    datahub.faults.fail_next("PutRecordsByShard", 503, "ServiceUnavailable", "busy")
    datahub.faults.reset_connection("PutRecordsByShard", after_apply=True)  # landed, answer lost
    code = main(["deliver", str(path), "--datahub-endpoint", datahub.endpoint, "--project", "p", "--topic", "t",
                 "--batch-size", "7"])
    assert code == 0, capsys.readouterr().err
    assert datahub.faults.pending == 0
    assert landed_per_shard(datahub) == expected_per_shard(lines), _debug(datahub, lines)  # in order, once each


def test_a_retried_record_never_lands_after_a_later_one(datahub):
    """The reorder of the old sink: record 1 of a shard throttled, record 2 accepted first. Each
    shard has one request in flight and a retry resends from the first record that did not land."""
    client = make_client(datahub.endpoint)
    writer = DataHubWriter(client, "p", batch_records=1, workers=4, sleep=lambda s: None)
    datahub.faults.fail_next("PutRecordsByShard", 429, "LimitExceeded", "throttled", times=3)
    for i in range(40):
        writer.put("t", "same-key", b"r%02d" % i, Position("src", 0, i))
    writer.close()
    (shard, got), = landed_per_shard(datahub).items()
    assert got == [b"r%02d" % i for i in range(40)]
    assert writer.retries == 3


def test_writer_follows_a_split_shard_in_order(datahub):
    client = make_client(datahub.endpoint)
    writer = DataHubWriter(client, "p", batch_records=5, sleep=lambda s: None)
    keys = [f"k{i % 11}" for i in range(300)]
    for i, key in enumerate(keys[:150]):
        writer.put("t", key, f"{key}:{i}".encode(), Position("src", 0, i))
    writer.flush()
    datahub.split("p", "t", "0")
    for i, key in enumerate(keys[150:], 150):
        writer.put("t", key, f"{key}:{i}".encode(), Position("src", 0, i))
    writer.close()
    assert writer.resplits >= 1
    per_key: dict[str, dict[str, list[int]]] = {}
    for record in datahub.records("p", "t"):
        key, _, i = record["data"].decode().partition(":")
        per_key.setdefault(key, {}).setdefault(record["shard"], []).append(int(i))
    for key, shards in per_key.items():
        # a key may move to another shard at the reshard, once: within each shard its records are in
        # order, and the ranges of two shards do not interleave
        assert all(v == sorted(v) for v in shards.values()), key
        spans = sorted((min(v), max(v)) for v in shards.values())
        assert all(a[1] < b[0] for a, b in zip(spans, spans[1:])), (key, spans)
    assert sorted(i for s in per_key.values() for v in s.values() for i in v) == list(range(300))


def test_restart_skips_what_landed_after_the_last_commit(datahub):
    client = make_client(datahub.endpoint)
    first = DataHubWriter(client, "p", sleep=lambda s: None)
    first.resume("src", {0: None, 1: None})
    for i in range(100):
        first.put("t", f"k{i % 5}", b"a%03d" % i, Position("src", i % 2, i))
    first.close()
    before = datahub.records("p", "t")
    # the commit had reached offset 40 of both partitions: 40.. are read and put again
    second = DataHubWriter(client, "p", sleep=lambda s: None)
    second.resume("src", {0: 40, 1: 40})
    for i in range(40, 130):
        second.put("t", f"k{i % 5}", b"a%03d" % i, Position("src", i % 2, i))
    second.close()
    assert second.skipped == 60
    for shard in {r["shard"] for r in before}:  # what landed before stays first, then the rest, in order
        got = [r["data"] for r in datahub.records("p", "t", shard)]
        assert got[:len([r for r in before if r["shard"] == shard])] == [r["data"] for r in before if r["shard"] == shard]
        assert got == sorted(got)
    data = sorted(r["data"] for r in datahub.records("p", "t"))
    assert data == [b"a%03d" % i for i in range(130)]


def test_sink_keeps_order_without_failures(datahub, tmp_path):
    lines = blob_file(tmp_path).read_bytes().splitlines()
    sink = DataHubSink(datahub.endpoint, "p", "t", batch_size=7, compress="none")
    for line in lines:
        sink.put_blob(line, shard_key(orjson.loads(line)))
    sink.close()
    assert landed_per_shard(datahub) == expected_per_shard(lines)
    assert sink.records == len(lines)


def test_deliver_tuple_rows(datahub, tmp_path):
    folder = tmp_path / "tuple"
    assert main(["convert", str(ROOT / "samples" / "mixed.pb"), "-o", str(folder / "{table}.jsonl"), "--to", "tuple",
                 "--on-error", "skip"]) in (0, 1)
    path = sorted(p for p in folder.glob("*.jsonl") if ".v" not in p.name)[0]
    side = json.loads(path.with_name(path.name[:-len(".jsonl")] + ".schema.json").read_text())
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    datahub.create_topic("p", "tt", shard_count=3, record_type="TUPLE", schema={"fields": side["fields"]})
    code = main(["deliver", str(path), "--from", "tuple", "--datahub-endpoint", datahub.endpoint, "--project", "p",
                 "--topic", "tt"])
    assert code == 0
    got = datahub.records("p", "tt")
    assert len(got) == len(rows)
    keys = [c["name"] for c in side["dtsColumns"] if c.get("isKey")]
    order = {}
    for row in rows:
        order.setdefault(shard_for(tuple_shard_key(row, side["table"], keys), SHARDS), []).append(row)
    for shard, expected in order.items():
        values = [r["values"] for r in got if r["shard"] == shard]
        assert len(values) == len(expected)
        for value, row in zip(values, expected):
            assert [None if v is None else str(v) for v in value] == \
                [None if row[f["name"]] is None else str(row[f["name"]]) for f in side["fields"]]


def test_fatal_error_is_one_line_exit_1(datahub, tmp_path, capsys):
    path = blob_file(tmp_path)
    capsys.readouterr()
    datahub.faults.fail_next("PutRecordsByShard", 400, "InvalidParameter", "record too large")
    code = main(["deliver", str(path), "--datahub-endpoint", datahub.endpoint, "--project", "p", "--topic", "t"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "InvalidParameter" in err[0]


def test_missing_credentials(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("DATAHUB_ACCESS_ID", raising=False)
    monkeypatch.delenv("DATAHUB_ACCESS_KEY", raising=False)
    path = blob_file(tmp_path)
    capsys.readouterr()
    code = main(["deliver", str(path), "--datahub-endpoint", "http://127.0.0.1:9", "--project", "p",
                 "--topic", "t"])
    assert code == 1 and "DATAHUB_ACCESS_ID" in capsys.readouterr().err


def test_doctests():
    import doctest

    import bridge.datahub.sink
    assert doctest.testmod(bridge.datahub.sink).failed == 0


def _debug(datahub, lines):  # the per-shard counts, shown when an order check fails
    got, want = landed_per_shard(datahub), expected_per_shard(lines)
    return {s: (len(got.get(s, [])), len(want.get(s, []))) for s in set(got) | set(want)}


def test_a_replayed_epoch_skips_what_its_first_attempt_wrote(datahub):
    """Spark's micro-batches: batch 7 lands whole, batch 8's first attempt lands a part and dies;
    the replay of batch 8 writes only the rest, in order."""
    client = make_client(datahub.endpoint)
    done = DataHubWriter(client, "p", sleep=lambda s: None)
    done.resume("src", epoch=7)
    for i in range(50):
        done.put("t", f"k{i % 3}", b"b%03d" % i, Position("src", 0, i))
    done.close()
    attempt = DataHubWriter(client, "p", sleep=lambda s: None)
    attempt.resume("src", epoch=8)
    for i in range(50, 80):  # the first 30 of batch 8's 60 records
        attempt.put("t", f"k{i % 3}", b"b%03d" % i, Position("src", 0, i))
    attempt.close()
    replay = DataHubWriter(client, "p", sleep=lambda s: None)
    replay.resume("src", epoch=8)
    for i in range(50, 110):
        replay.put("t", f"k{i % 3}", b"b%03d" % i, Position("src", 0, i))
    replay.close()
    assert replay.skipped == 30
    for shard, got in landed_per_shard(datahub).items():
        assert got == sorted(got) and len(got) == len(set(got))
    assert sorted(r["data"] for r in datahub.records("p", "t")) == [b"b%03d" % i for i in range(110)]
    assert {r["attributes"]["dts.epoch"] for r in datahub.records("p", "t")} == {"7", "8"}


def test_a_lost_answer_then_a_throttled_retry_still_checks_before_sending_again(datahub):
    """The first attempt lands but its answer is lost; the retry is throttled (it did not land, but
    the first one did): the next retry must still look for the batch before sending it again."""
    client = make_client(datahub.endpoint)
    writer = DataHubWriter(client, "p", batch_records=50, sleep=lambda s: None)
    datahub.faults.reset_connection("PutRecordsByShard", after_apply=True)
    datahub.faults.fail_next("PutRecordsByShard", 429, "LimitExceeded", "throttled")
    for i in range(20):
        writer.put("t", "one-key", b"x%02d" % i, Position("src", 0, i))
    writer.close()
    (shard, got), = landed_per_shard(datahub).items()
    assert got == [b"x%02d" % i for i in range(20)]
