"""Watching a run: a progress display, a periodic status line, Prometheus metrics and the
librdkafka log, shared by `convert`, `validate`, `consume`, `deliver` and `sync`.

The API (every piece is off or silent unless asked for, and costs nothing per record then):

- `progress(total=None, unit="records", enabled=None, desc="", stream=None, describe=None)` ->
  `Progress`: a tqdm bar on `stream` (stderr). `enabled=None` shows it only when the stream is a
  terminal; it appears after a second. `wrap(items)` counts what passes (in batches, so a hot
  loop pays one integer add per item), `update(n)` adds n, `close()` removes the bar.
  `describe()` gives a short text shown after the count (e.g. rejected records);
  `follow(count)` shows a running total that a loop elsewhere keeps (from a daemon thread).
- `StatusLine(interval, stream=None, label="", render=...)`: every `interval` seconds (0: never)
  a background thread writes `label: render(status)` as one line on stderr (above a progress
  bar when there is one); `status.rate(key, total)` inside `render` gives the per-second rate of
  a running total since the previous line. `start()` / `stop()`, or use it as a context manager;
  `stop()` does not print a last line (the command prints its own summary).
- `Metrics()`: a `prometheus_client.CollectorRegistry` (`.registry`) with the bridge's
  instruments: counters `envelopes_in`, `records_in`, `records_out`, `rejected`,
  `datahub_requests` / `datahub_retries` / `datahub_throttles` (label `request`), the histogram
  `datahub_latency` (seconds, label `request`), gauges `committed_offset` and `lag` (labels
  `topic`, `partition`). `counter(name, doc, labels)`, `gauge(...)` and `histogram(...)` add more.
  Running totals kept elsewhere (a `Tally`, a sink's `retries`) are mirrored with
  `count_to(counter, total, **labels)`; `on_collect(fn)` runs `fn` before every scrape (and
  before every status line through `refresh()`), which is where such mirrors belong.
  `time_request(name)` is a context manager that counts and times one DataHub request;
  `timed_datahub_client(client)` wraps a pydatahub client so that every ListShard and
  PutRecords call is counted, timed and its throttling (LimitExceeded) counted;
  `datahub_observer()` is the same for a writer that reports its requests as events. `serve(port,
  addr="127.0.0.1")` exposes /metrics over HTTP in a daemon thread and returns the bound port
  (0 picks a free one); `close()` stops it. Names are prefixed `dts_bridge_`.
- `kafka_logger(name="dts-bridge.kafka", verbose=0, interval=60.0, stream=None)` -> a
  `logging.Logger` to pass as confluent-kafka's `logger` setting: WARNING and above by default, INFO with `verbose=1`, librdkafka's debug
  with 2. A `DedupFilter` lets the first of a run of identical messages through and holds the
  repeats for `interval` seconds, then says how many there were; a refused broker connection,
  which librdkafka reports several times a second, becomes a line or two. `flush_repeats(logger)`
  reports the held repeats (call it when the client is closed).
- `bridge_version()`: the installed package's version.

>>> m = Metrics()
>>> m.count_to(m.records_in, 5); m.count_to(m.records_in, 7)
>>> m.value("records_in_total")
7.0
"""
from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator

__all__ = ["progress", "Progress", "StatusLine", "Metrics", "kafka_logger", "DedupFilter",
           "flush_repeats", "bridge_version"]

NAMESPACE = "dts_bridge"
PACKAGE = "dts-datahub-bridge"


def bridge_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return "unknown (not installed)"


def _is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


# ---- progress ------------------------------------------------------------------------------------

class Progress:
    """A tqdm bar, or nothing. See `progress`."""

    BATCH = 256  # items counted between two calls into tqdm

    def __init__(self, bar, describe: Callable[[], str] | None = None) -> None:
        self.bar, self.describe = bar, describe

    @property
    def enabled(self) -> bool:
        return self.bar is not None

    def wrap(self, items: Iterable) -> Iterator:
        if self.bar is None:
            yield from items
            return
        pending = 0
        try:
            for item in items:
                pending += 1
                if pending == self.BATCH:
                    self.update(pending)
                    pending = 0
                yield item
        finally:
            if pending:
                self.update(pending)

    def follow(self, count: Callable[[], int], every: float = 0.5) -> Progress:
        """Show `count()` (a running total kept by a loop this code does not own) from a daemon
        thread every `every` seconds, until `close()`."""
        if self.bar is None:
            return self
        self._following = threading.Event()

        def run() -> None:
            while not self._following.wait(every):
                bar = self.bar
                if bar is None:
                    return
                grown = count() - bar.n
                if grown > 0:
                    self.update(grown)
        threading.Thread(target=run, name="dts-bridge-progress", daemon=True).start()
        return self

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            if self.describe is not None:
                self.bar.set_postfix_str(self.describe(), refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        following = getattr(self, "_following", None)
        if following is not None:
            following.set()
        if self.bar is not None:
            self.bar.leave = False
            self.bar.close()
            self.bar = None

    clear = close

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(total: float | None = None, unit: str = "records", enabled: bool | None = None, desc: str = "",
             stream=None, describe: Callable[[], str] | None = None, unit_scale: bool = False,
             delay: float = 1.0, mininterval: float = 0.25) -> Progress:
    """A progress display on a terminal; `enabled=False` (or a stream that is not a terminal
    when `enabled` is None) gives one that does nothing."""
    stream = stream if stream is not None else sys.stderr
    if enabled is None:
        enabled = _is_tty(stream)
    if not enabled:
        return Progress(None)
    from tqdm import tqdm
    bar = tqdm(total=total, unit=" " + unit if not unit_scale else unit, desc=desc or None, file=stream,
               leave=False, delay=delay, unit_scale=unit_scale, dynamic_ncols=True, mininterval=mininterval)
    return Progress(bar, describe)


# ---- the status line -------------------------------------------------------------------------------

class StatusLine:
    """Writes `label: render(self)` every `interval` seconds from a daemon thread."""

    def __init__(self, interval: float | None, stream=None, label: str = "",
                 render: Callable[[StatusLine], str] | None = None,
                 before: Callable[[], None] | None = None) -> None:
        self.interval = interval or 0
        self.stream = stream if stream is not None else sys.stderr
        self.label, self.render, self.before = label, render, before
        self._last: dict[str, tuple[float, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lines = 0

    def rate(self, key: str, total: float) -> float:
        """Per-second growth of `total` since the previous call with this key (or the start)."""
        now = time.monotonic()
        then, before = self._last.get(key, (self._started, 0))
        self._last[key] = (now, total)
        return (total - before) / (now - then) if now > then else 0.0

    def start(self) -> StatusLine:
        self._started = time.monotonic()
        if self.interval > 0 and self.render is not None:
            self._thread = threading.Thread(target=self._run, name="dts-bridge-status", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.emit()

    def emit(self) -> None:
        """Write one status line now."""
        try:
            if self.before is not None:
                self.before()
            text = self.render(self)
        except Exception as exc:  # noqa: BLE001 - a status line must never end the run
            text = f"(status unavailable: {type(exc).__name__}: {exc})"
        line = f"{self.label}: {text}" if self.label else text
        from tqdm import tqdm
        tqdm.write(line, file=self.stream)  # above any progress bar on the same stream
        self.lines += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> StatusLine:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def rate_text(value: float) -> str:
    return f"{value:,.0f}/s" if value >= 10 else f"{value:,.1f}/s"


# ---- metrics -----------------------------------------------------------------------------------

# DataHub request latencies: a PutRecords of 500 records takes tens of milliseconds, a throttled
# or retried one seconds.
# The Tally's counts of values a temporal policy substituted, one label each.
SUBSTITUTIONS = ("zero_dates", "out_of_range", "fractions")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """The bridge's Prometheus instruments in one registry of their own (see the module doc)."""

    def __init__(self, namespace: str = NAMESPACE) -> None:
        from prometheus_client import CollectorRegistry
        self.namespace = namespace
        self.registry = CollectorRegistry(auto_describe=True)
        self._hooks: list[Callable[[], None]] = []
        self._seen: dict[tuple, float] = {}
        self._lock = threading.Lock()
        self._server = None
        self.registry.register(_Hooks(self))  # first, so mirrors are fresh when the rest is read
        self.envelopes_in = self.counter("envelopes_in", "DTS Envelopes (Kafka messages) read")
        self.records_in = self.counter("records_in", "input records (Entries, Blob lines, Tuple rows)")
        self.records_out = self.counter("records_out", "records written (lines, rows, DataHub records)")
        self.rejected = self.counter("rejected", "input records rejected by the error policy")
        self.substituted = self.counter("values_substituted", "values a temporal policy changed (Options.zero_dates, "
                                        "temporal_precision): zero_dates, out_of_range, fractions", ["kind"])
        self.datahub_requests = self.counter("datahub_requests", "DataHub requests sent", ["request"])
        self.datahub_retries = self.counter("datahub_retries", "DataHub requests or records retried")
        self.datahub_throttles = self.counter("datahub_throttles", "DataHub throttling answers (LimitExceeded)",
                                              ["request"])
        self.datahub_latency = self.histogram("datahub_request_seconds", "DataHub request latency", ["request"],
                                              buckets=LATENCY_BUCKETS)
        self.committed_offset = self.gauge("committed_offset", "next offset committed, per partition",
                                           ["topic", "partition"])
        self.lag = self.gauge("lag", "messages between the committed offset and the high watermark",
                              ["topic", "partition"])
        info = self.gauge("build_info", "the bridge's version", ["version"])
        info.labels(version=bridge_version()).set(1)

    # -- instruments --------------------------------------------------------------------------------
    def counter(self, name: str, doc: str, labels: Iterable[str] = ()):
        from prometheus_client import Counter
        return Counter(name, doc, list(labels), namespace=self.namespace, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Iterable[str] = ()):
        from prometheus_client import Gauge
        return Gauge(name, doc, list(labels), namespace=self.namespace, registry=self.registry)

    def histogram(self, name: str, doc: str, labels: Iterable[str] = (), buckets=LATENCY_BUCKETS):
        from prometheus_client import Histogram
        return Histogram(name, doc, list(labels), namespace=self.namespace, registry=self.registry,
                         buckets=buckets)

    def count_to(self, counter, total: float, **labels) -> None:
        """Advance `counter` to a running total kept elsewhere (counters only go up)."""
        key = (id(counter), tuple(sorted(labels.items())))
        with self._lock:
            grown = total - self._seen.get(key, 0)
            if grown <= 0:
                return
            self._seen[key] = total
        (counter.labels(**labels) if labels else counter).inc(grown)

    def count_tally(self, tally) -> None:
        """Mirror a `bridge.stream.Tally`."""
        self.count_to(self.envelopes_in, tally.envelopes)
        self.count_to(self.records_in, tally.input)
        self.count_to(self.records_out, tally.outputs)
        self.count_to(self.rejected, tally.rejected)
        for kind in SUBSTITUTIONS:
            self.count_to(self.substituted, getattr(tally, kind, 0), kind=kind)

    def on_collect(self, hook: Callable[[], None]) -> None:
        self._hooks.append(hook)

    def refresh(self) -> None:
        for hook in list(self._hooks):
            hook()

    @contextlib.contextmanager
    def time_request(self, request: str):
        self.datahub_requests.labels(request=request).inc()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.datahub_latency.labels(request=request).observe(time.perf_counter() - start)

    def timed_datahub_client(self, client):
        return _TimedDataHubClient(client, self)

    def datahub_observer(self) -> Callable[..., None]:
        """An `observer(event, **facts)` for a DataHub writer that reports its own requests:
        "request" (op, seconds, ...) and "retry" (code, ...) events."""
        def observe(event: str, **facts) -> None:
            if event == "request":
                op = str(facts.get("op", "request"))
                self.datahub_requests.labels(request=op).inc()
                if facts.get("seconds") is not None:
                    self.datahub_latency.labels(request=op).observe(float(facts["seconds"]))
            elif event == "retry":
                self.datahub_retries.inc()
                if facts.get("code") == "LimitExceeded":
                    self.datahub_throttles.labels(request=str(facts.get("op", "PutRecords"))).inc()
        return observe

    def value(self, name: str, **labels) -> float | None:
        """A sample's current value (`records_in_total`, without the namespace), for tests and tools."""
        return self.registry.get_sample_value(f"{self.namespace}_{name}", labels or None)

    # -- exposition ---------------------------------------------------------------------------------
    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Expose /metrics on `addr:port` from a daemon thread; returns the port bound."""
        from prometheus_client import start_http_server
        try:
            server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as err:
            raise OSError(f"cannot serve metrics on {addr}:{port}: {err.strerror or err}") from None
        self._server = server
        return server.server_address[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Hooks:
    """A collector that exports nothing and runs the `on_collect` hooks before a scrape."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self):
        self.metrics.refresh()
        return iter(())

    def describe(self):
        return []


def _is_throttle(exc: BaseException) -> bool:
    return type(exc).__name__ == "LimitExceededException" or "LimitExceeded" in str(getattr(exc, "error_code", ""))


class _TimedDataHubClient:
    """A pydatahub client whose calls are counted and timed (any method; the attributes pass)."""

    def __init__(self, client, metrics: Metrics) -> None:
        self._client, self._metrics = client, metrics

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr
        request = "".join(part.capitalize() for part in name.split("_"))  # put_records -> PutRecords
        metrics = self._metrics

        def call(*args, **kwargs):
            with metrics.time_request(request):
                try:
                    result = attr(*args, **kwargs)
                except Exception as exc:
                    if _is_throttle(exc):
                        metrics.datahub_throttles.labels(request=request).inc()
                    raise
            failed = getattr(result, "failed_records", None) or []
            throttled = sum(1 for f in failed if getattr(f, "error_code", "") == "LimitExceeded")
            if throttled:
                metrics.datahub_throttles.labels(request=request).inc(throttled)
            return result
        return call


# ---- the librdkafka log ------------------------------------------------------------------------

# Parts of a librdkafka message that change between repeats of the same event.
# "(after 0ms in state CONNECT, 1 identical error(s) suppressed)" is one part: its "(s)" does not end it.
_VOLATILE = re.compile(r"\s*\(after \d+ms(?:[^()]|\(s\))*\)|,? ?\d+ identical error\(s\) suppressed|\d+ms")


class DedupFilter(logging.Filter):
    """Passes the first of identical messages, holds repeats for `interval` seconds, then lets
    the next one through saying how many were held. Identity: level and text, with librdkafka's
    timings ("after 0ms in state CONNECT") left out."""

    def __init__(self, interval: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval, self.clock = interval, clock
        self.held: dict[tuple, list] = {}  # key -> [first shown at, repeats held, last record]
        self._lock = threading.Lock()

    @staticmethod
    def key(record: logging.LogRecord) -> tuple:
        """What a reader sees: for librdkafka's (facility, client name, text) the facility and the
        text without its thread, so one event told by two clients of the process (a consumer and
        the producer or admin client beside it) or from two threads is one message."""
        args = record.args
        if isinstance(args, tuple) and len(args) == 3:
            return record.levelno, str(args[0]), _VOLATILE.sub("", _THREAD.sub("", str(args[2])))
        return record.levelno, _VOLATILE.sub("", record.getMessage())

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "dedup_summary", False):
            return True
        key, now = self.key(record), self.clock()
        with self._lock:
            seen = self.held.get(key)
            if seen is not None and now - seen[0] < self.interval:
                seen[1] += 1
                seen[2] = record
                return False
            repeats = seen[1] if seen is not None else 0
            self.held[key] = [now, 0, record]
        if repeats:
            _add_suffix(record, f" (and {repeats} more time{'s' if repeats != 1 else ''} in the last "
                                f"{self.interval:g} s)")
        return True

    def take_repeats(self) -> list[tuple[logging.LogRecord, int]]:
        with self._lock:
            out = [(rec, n) for _, n, rec in self.held.values() if n]
            for entry in self.held.values():
                entry[1] = 0
        return out


def _add_suffix(record: logging.LogRecord, suffix: str) -> None:
    record.dedup_note = getattr(record, "dedup_note", "") + suffix


def flush_repeats(logger: logging.Logger) -> None:
    """Log how often each held message repeated since it was last shown."""
    for filt in logger.filters:
        if isinstance(filt, DedupFilter):
            for record, count in filt.take_repeats():
                summary = logging.makeLogRecord(record.__dict__)
                summary.dedup_note = f" (repeated {count} more time{'s' if count != 1 else ''})"
                summary.dedup_summary = True
                logger.handle(summary)


_LEVELS = {0: logging.WARNING, 1: logging.INFO}
_THREAD = re.compile(r"^\[thrd:[^\]]*\]: ")


class _KafkaFormatter(logging.Formatter):
    """librdkafka hands confluent-kafka (facility, client name, text): `PREFIXkafka LEVEL (FAC): text`."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        args = record.args
        if isinstance(args, tuple) and len(args) == 3:
            head, text = f" ({args[0]})", _THREAD.sub("", str(args[2]))
        else:
            head, text = "", record.getMessage()
        return f"{self.prefix}kafka {record.levelname.lower()}{head}: {text}{getattr(record, 'dedup_note', '')}"


def kafka_logger(name: str = "dts-bridge.kafka", verbose: int = 0, interval: float = 60.0, stream=None,
                 prefix: str = "") -> logging.Logger:
    """A logger for confluent-kafka's `logger` setting: deduplicated, WARNING+ unless `verbose`,
    written to `stream` (stderr) as `PREFIXkafka LEVEL: text`, not passed to the root logger."""
    logger = logging.getLogger(name)
    logger.setLevel(_LEVELS.get(verbose, logging.DEBUG))
    logger.propagate = False
    for old in list(logger.handlers):
        logger.removeHandler(old)
    for old in list(logger.filters):
        logger.removeFilter(old)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(_KafkaFormatter(prefix))
    logger.addHandler(handler)
    logger.addFilter(DedupFilter(interval))
    return logger
