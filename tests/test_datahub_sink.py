"""The DataHub sink (docs/kafka.md, "DataHub out"). DataHub has no local emulator, so a loopback
HTTP server plays it: it answers ListShard and PutRecords as DataHub's JSON protocol does,
records every request, and the test decodes the bodies with pydatahub's own classes
(its decompressor, BlobRecord, TupleRecord, RecordSchema).
"""
import json
import pathlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest

pytest.importorskip("datahub")
pytestmark = pytest.mark.datahub

from datahub.models import BlobRecord, RecordSchema, TupleRecord  # noqa: E402
from datahub.models.compress import get_compressor  # noqa: E402

from bridge import shard_key  # noqa: E402
from bridge.cli import main  # noqa: E402
from bridge.datahub_sink import DataHubSink, shard_for, tuple_shard_key  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARDS = ["0", "1", "2"]


class FakeDataHub(ThreadingHTTPServer):
    """Records PutRecords bodies; `script` holds canned answers for the next PutRecords calls:
    (HTTP status, JSON body) or the string "partial" (the first record of the batch fails)."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.puts: list[dict] = []
        self.headers_seen: list[dict] = []
        self.script: list = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("x-datahub-request-id", "test")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.endswith("/shards"):
            shards = [{"ShardId": s, "State": "ACTIVE", "ClosedTime": 0, "BeginHashKey": "", "EndHashKey": "",
                       "ParentShardIds": [], "LeftShardId": "", "RightShardId": ""} for s in SHARDS]
            shards.append({**shards[0], "ShardId": "9", "State": "CLOSED"})
            return self._answer(200, {"Shards": shards, "Protocol": "http1.1", "Interval": 500})
        self._answer(404, {"ErrorCode": "NoSuchTopic", "ErrorMessage": self.path})

    def do_POST(self):
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        encoding = self.headers.get("Content-Encoding")
        if encoding:
            compressor = get_compressor(encoding)
            raw = compressor.decompress(raw, int(self.headers["x-datahub-content-raw-size"]))
        body = json.loads(raw)
        server: FakeDataHub = self.server
        answer = server.script.pop(0) if server.script else None
        if answer == "partial":
            server.puts.append({**body, "Records": body["Records"][1:]})
            return self._answer(200, {"FailedRecordCount": 1, "FailedRecords": [
                {"Index": 0, "ErrorCode": "LimitExceeded", "ErrorMessage": "slow down"}]})
        if answer is not None:
            return self._answer(*answer)
        server.puts.append(body)
        server.headers_seen.append(dict(self.headers))
        self._answer(200, {"FailedRecordCount": 0, "FailedRecords": []})


@pytest.fixture
def datahub(monkeypatch):
    server = FakeDataHub()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    monkeypatch.setenv("DATAHUB_ACCESS_ID", "test-id")
    monkeypatch.setenv("DATAHUB_ACCESS_KEY", "test-secret")
    monkeypatch.setattr("time.sleep", lambda s: None)  # backoff without waiting
    yield server
    server.shutdown()
    server.server_close()


def blob_file(tmp_path) -> pathlib.Path:
    out = tmp_path / "mixed.jsonl"
    assert main(["convert", str(ROOT / "samples" / "mixed.pb"), "-o", str(out)]) == 0
    return out


def records_of(server) -> list[dict]:
    return [record for body in server.puts for record in body["Records"]]


def test_deliver_blob_batches_routes_and_retries(datahub, tmp_path, capsys):
    path = blob_file(tmp_path)
    capsys.readouterr()
    lines = path.read_bytes().splitlines()
    datahub.script = [(429, {"ErrorCode": "LimitExceeded", "ErrorMessage": "throttled"}), "partial"]
    code = main(["deliver", str(path), "--datahub-endpoint", datahub.endpoint, "--project", "p", "--topic", "t",
                 "--batch-size", "40"])
    assert code == 0, capsys.readouterr().err
    assert "(2 retries)" in capsys.readouterr().err
    assert all(body["Action"] == "pub" for body in datahub.puts)
    assert all(len(body["Records"]) <= 40 for body in datahub.puts)
    got = records_of(datahub)
    assert len(got) == len(lines)
    # the throttled and the partly failed record are sent again, so only per-shard order holds
    for shard in SHARDS:
        sent = [BlobRecord(values=r["Data"]).blob_data for r in got if r["ShardId"] == shard]
        expected = [line for line in lines if shard_for(shard_key(orjson.loads(line)), SHARDS) == shard]
        assert sorted(sent) == sorted(expected)
    for record in got:
        data = BlobRecord(values=record["Data"]).blob_data
        assert record["ShardId"] == shard_for(shard_key(orjson.loads(data)), SHARDS)
    assert {r["ShardId"] for r in got} <= set(SHARDS)  # the CLOSED shard gets nothing
    assert datahub.headers_seen[0]["Authorization"].startswith("DATAHUB test-id:")


def test_sink_keeps_order_without_failures(datahub, tmp_path):
    lines = blob_file(tmp_path).read_bytes().splitlines()
    sink = DataHubSink(datahub.endpoint, "p", "t", batch_size=7, compress="none")
    for line in lines:
        sink.put_blob(line, shard_key(orjson.loads(line)))
    sink.close()
    assert [BlobRecord(values=r["Data"]).blob_data for r in records_of(datahub)] == lines
    assert sink.records == len(lines) and sink.requests == 1 + -(-len(lines) // 7)


def test_deliver_tuple_rows(datahub, tmp_path):
    folder = tmp_path / "tuple"
    assert main(["convert", str(ROOT / "samples" / "mixed.pb"), "-o", str(folder / "{table}.jsonl"), "--to", "tuple",
                 "--on-error", "skip"]) in (0, 1)
    path = sorted(p for p in folder.glob("*.jsonl") if ".v" not in p.name)[0]
    side = json.loads(path.with_name(path.name[:-len(".jsonl")] + ".schema.json").read_text())
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    code = main(["deliver", str(path), "--from", "tuple", "--datahub-endpoint", datahub.endpoint, "--project", "p",
                 "--topic", "t"])
    assert code == 0
    schema = RecordSchema.from_json({"fields": side["fields"]})
    got = [TupleRecord(schema=schema, values=r["Data"]) for r in records_of(datahub)]
    assert len(got) == len(rows)
    keys = [c["name"] for c in side["dtsColumns"] if c.get("isKey")]
    for record, row, raw in zip(got, rows, records_of(datahub)):
        assert [f.name for f in record.field_list] == list(row)
        for name, value in row.items():
            decoded = record.get_value(name)
            assert (str(decoded) if decoded is not None else None) == (str(value) if value is not None else None)
        assert raw["ShardId"] == shard_for(tuple_shard_key(row, side["table"], keys), SHARDS)


def test_fatal_error_is_one_line_exit_1(datahub, tmp_path, capsys):
    path = blob_file(tmp_path)
    capsys.readouterr()
    datahub.script = [(400, {"ErrorCode": "InvalidParameter", "ErrorMessage": "record too large"})]
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

    import bridge.datahub_sink
    assert doctest.testmod(bridge.datahub_sink).failed == 0
