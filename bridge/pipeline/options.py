"""The pipeline options, declared once: how records are delivered (DataHub requests, retries,
topics, routing, the table-error and schema-change policies) and how often a run commits.

Like the conversion `Options`, each option is one field with its type, default, choices and help;
the CLI flags (`--batch-size`, `--no-create-topics`, ...) and the Spark `datahub` sink's options
(`batchSize`, `createTopics`, ...) are generated from these declarations (`cli_flag`,
`spark_key`), so both faces have the same names, the same defaults and one validation.

>>> PipelineOptions(batch_size=0)
Traceback (most recent call last):
...
bridge.errors.OptionsError: option 'batch_size' must be an integer >= 1: 0
>>> spark_key("on_table_error"), cli_flag("create_topics")
('onTableError', '--no-create-topics')
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from bridge.errors import OptionsError

__all__ = ["PipelineOptions", "pipeline_option_specs", "spark_key", "cli_flag", "SCHEMA_CHANGE_POLICIES",
           "TABLE_ERROR_POLICIES", "COMPRESSIONS", "FETCH_PROCESS"]

SCHEMA_CHANGE_POLICIES = ("evolve", "lenient", "ignore", "fail")
TABLE_ERROR_POLICIES = ("dlq", "halt-table", "halt-all")
COMPRESSIONS = ("lz4", "deflate", "zlib", "none")
# how `sync --to dts` fetches DataHub pages (`sync_to_dts(fetch_process=...)`, docs/kafka.md "Reading
# DataHub"): auto: reader threads, then the fetch process after DataHubSource.process_after pages;
# always: the fetch process from the first page; never: reader threads only
FETCH_PROCESS = ("auto", "always", "never")


def _opt(default, help: str, choices=None, minimum=None, faces=("cli", "spark")):
    return field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum, "faces": faces})


@dataclass(frozen=True)
class PipelineOptions:
    batch_size: int = _opt(1000, "records per request at most (and at most 4 MB)", minimum=1)
    max_retries: int = _opt(12, "retries of a transient DataHub failure (throttling, 5xx, lost answers), with "
                                "jittered backoff up to 10 s", minimum=0)
    workers: int = _opt(4, "shards written in parallel", minimum=1)
    compress: str = _opt("lz4", "request body compression", COMPRESSIONS)
    create_topics: bool = _opt(True, "create a missing DataHub topic (Blob, or Tuple with the rows' RecordSchema); "
                                     "off: a missing topic is an error")
    shards: int = _opt(1, "shards of a created topic", minimum=1)
    lifecycle: int = _opt(7, "lifecycle (days) of a created topic", minimum=1)
    schema_change: str = _opt(
        "evolve", "Tuple: a row whose columns differ from its topic's (DDL). evolve: new or renamed columns appended "
                  "as nullable fields, dropped ones NULL, a changed type the Entry's error; lenient: a changed type "
                  "goes to a STRING field <column>__<newtype>; ignore: the topic is never altered, values it has no "
                  "field for are left out and counted; fail: stop, naming the table, fields and position",
        SCHEMA_CHANGE_POLICIES)
    on_table_error: str | None = _opt(
        None, "an Entry of a table that cannot be converted or written, or a record DataHub refuses as malformed: "
              "dlq (dead letter, go on), halt-table (dead letter it and every later record of its table), halt-all "
              "(stop). Default: as the error policy (fail: halt-all)", TABLE_ERROR_POLICIES)
    oversized: str = _opt("fail", "a record over DataHub's limits (4 MB a request, 2 MB a STRING): stop (fail) or "
                                  "dead letter its Entry (dlq)", ("fail", "dlq"))
    retry_timeout: float = _opt(-1.0, "seconds a failing DataHub request is retried, with backoff, before the run "
                                      "fails naming it (-1: keep trying, as Kafka Connect's errors.retry.timeout=-1; "
                                      "the run says it is degraded meanwhile)", minimum=-1, faces=("cli",))
    max_buffered: int = _opt(20_000, "records waiting for DataHub at most; beyond that reading waits", minimum=1,
                             faces=("cli",))
    max_held: int = _opt(100_000, "sync --to dts: records the shard merge may hold waiting for the other shards "
                                  "before it decides a stall (hands the oldest head on; docs/kafka.md, \"Reading "
                                  "DataHub: stalls\")", minimum=1, faces=("cli",))
    stall_seconds: float = _opt(300.0, "sync --to dts: seconds with records held and none handed on before the "
                                       "merge decides a stall", minimum=1, faces=("cli",))
    commit_interval: float = _opt(5.0, "also commit (after the sink acknowledged everything) this often, in "
                                       "seconds, besides every CHECKPOINT entry (0: only at checkpoints and the end)",
                                  minimum=0, faces=("cli",))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value, meta = getattr(self, f.name), f.metadata
            if value is None and f.default is None:
                continue
            if meta["choices"] is not None and value not in meta["choices"]:
                raise OptionsError(f"option {f.name!r} must be one of {', '.join(meta['choices'])}", value=value)
            kind = _kind(f)
            if kind is bool and not isinstance(value, bool):
                raise OptionsError(f"option {f.name!r} must be true or false", value=value)
            if kind in (int, float):
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                if not number or (kind is int and not isinstance(value, int)) or value < meta["minimum"]:
                    raise OptionsError(f"option {f.name!r} must be {'an integer' if kind is int else 'a number'} "
                                       f">= {meta['minimum']}", value=value)

    def replace(self, **changes) -> PipelineOptions:
        return dataclasses.replace(self, **changes)


def _kind(f: dataclasses.Field) -> type:
    text = str(f.type)
    return bool if text.startswith("bool") else int if text.startswith("int") else \
        float if text.startswith("float") else str


def pipeline_option_specs(face: str | None = None) -> list[tuple[str, type, object, tuple | None, int | None, str]]:
    """(name, type, default, choices, minimum, help) of every pipeline option (of one face's)."""
    return [(f.name, _kind(f), f.default, f.metadata["choices"], f.metadata["minimum"], f.metadata["help"])
            for f in dataclasses.fields(PipelineOptions) if face is None or face in f.metadata["faces"]]


def spark_key(name: str) -> str:
    """A Spark option's key: the name in camelCase (batch_size -> batchSize)."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def cli_flag(name: str) -> str:
    """A CLI flag: --kebab-case; an option that is on by default is turned off by --no-<name>."""
    flag = name.replace("_", "-")
    default = PipelineOptions.__dataclass_fields__[name].default
    return f"--no-{flag}" if default is True else f"--{flag}"
