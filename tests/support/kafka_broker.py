"""A real Apache Kafka broker for the pipeline tests: one KRaft process that is both broker and
controller, on free ports of 127.0.0.1, with its data and logs in a temporary folder.

The jars come from Maven Central through `make install` (tools/jars/fetch.py) into
.cache/jars/kafka/; Java 17 runs them. See docs/testing-kafka.md.

    from support.kafka_broker import KafkaBroker, kafka_broker  # the fixture, session-scoped

    def test_something(kafka_broker):
        topic = kafka_broker.create_topic("t-something", partitions=2)
        Producer({"bootstrap.servers": kafka_broker.bootstrap}) ...

    with KafkaBroker() as broker:  # outside pytest
        print(broker.bootstrap)

Starting: `kafka.tools.StorageTool format` writes the metadata folder (static quorum of this one
node), then `java -cp '<jars>/*' kafka.Kafka server.properties` runs with -Xmx512m. The broker is
ready when a TCP connection to its port succeeds and an AdminClient's metadata lists it (about 2 to
4 s). A start that fails raises BrokerStartError with the tail of broker.log; the whole log stays in
the folder. `stop()` sends SIGTERM (controlled shutdown, about 3 s), then SIGKILL after a timeout;
it runs at interpreter exit too, and on Linux the JVM also dies with the Python process that
started it (PR_SET_PDEATHSIG), so no broker outlives a killed test run.
"""
from __future__ import annotations

import atexit
import base64
import glob
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[2]
JARS = pathlib.Path(os.environ.get("KAFKA_JARS_DIR") or ROOT / ".cache" / "jars" / "kafka")
HEAP_OPTS = "-Xmx512m -Xms64m"
# Serial GC and C1 only: a small, quick JVM (C1 alone starts about 30 % faster on a busy 2-core machine).
JVM_OPTS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData", "-Djava.awt.headless=true",
            "-Djava.net.preferIPv4Stack=true"]
NODE_ID = 1

# Fast single-node settings: every internal topic has one replica and one partition, new groups
# rebalance at once, and everything else (log flush, retention, segment sizes) keeps its default.
SETTINGS = {
    "process.roles": "broker,controller",
    "node.id": str(NODE_ID),
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "auto.create.topics.enable": "true",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "num.network.threads": "2",
    "num.io.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "log.cleaner.threads": "1",
}

LOG4J2 = """\
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
"""


class BrokerStartError(RuntimeError):
    """The broker did not start; the message carries the tail of its log."""


def kafka_jars() -> pathlib.Path:
    return JARS


def find_java() -> str | None:
    """Java 17 or newer: $JAVA_HOME, then /usr/lib/jvm/java-17-openjdk-*, then `java` on PATH."""
    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(os.path.join(os.environ["JAVA_HOME"], "bin", "java"))
    candidates += sorted(glob.glob("/usr/lib/jvm/java-17-openjdk-*/bin/java"))
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("java")


def missing() -> str | None:
    """Why no broker can start here (which path is missing), or None."""
    if not any(JARS.glob("kafka_2.13-*.jar")):
        return f"no Kafka jars in {JARS} (run `make install`: it fetches them from Maven Central with mvn)"
    if find_java() is None:
        return "no java: neither $JAVA_HOME/bin/java, /usr/lib/jvm/java-17-openjdk-*/bin/java nor java on PATH"
    return None


def kafka_version() -> str | None:
    for jar in JARS.glob("kafka_2.13-*.jar"):
        return jar.name[len("kafka_2.13-"):-len(".jar")]
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child before exec: the JVM gets SIGKILL if we die
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class KafkaBroker:
    """One KRaft broker+controller process on 127.0.0.1 (started by the constructor unless
    start=False). Attributes: bootstrap ("127.0.0.1:PORT"), port, controller_port, workdir (the
    temporary folder: server.properties, broker.log, format.log, data/), log_path, version,
    startup_seconds (format + start until metadata answers)."""

    def __init__(self, workdir: str | os.PathLike | None = None, *, timeout: float = 60.0,
                 settings: dict | None = None, start: bool = True) -> None:
        self._own_dir = workdir is None
        self.workdir = pathlib.Path(workdir or tempfile.mkdtemp(prefix="kafka-broker-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "broker.log"
        self.version = kafka_version()
        self.timeout = timeout
        self.extra_settings = dict(settings or {})
        self.port = self.controller_port = None
        self.bootstrap = None
        self.startup_seconds = None
        self.proc: subprocess.Popen | None = None
        self._log = None
        if start:
            self.start()

    # ---- start ---------------------------------------------------------------------------

    def _java_cmd(self, main: str, *args: str) -> list[str]:
        heap = os.environ.get("KAFKA_HEAP_OPTS", HEAP_OPTS).split()
        return [find_java(), *heap, *JVM_OPTS, f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
                "-cp", str(JARS / "*"), main, *args]

    def _write_config(self) -> pathlib.Path:
        self.port, self.controller_port = _free_port(), _free_port()
        while self.controller_port == self.port:
            self.controller_port = _free_port()
        settings = dict(SETTINGS)
        settings.update({
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.quorum.voters": f"{NODE_ID}@127.0.0.1:{self.controller_port}",
            "log.dirs": str(self.workdir / "data"),
        })
        settings.update({k: str(v) for k, v in self.extra_settings.items()})
        path = self.workdir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        (self.workdir / "log4j2.properties").write_text(LOG4J2)
        return path

    def start(self) -> KafkaBroker:
        """Format a fresh data folder and start the broker on new free ports; a port taken between
        picking and binding (`Address already in use`) is retried with other ports, twice."""
        reason = missing()
        if reason:
            raise BrokerStartError(reason)
        if self.proc is not None and self.proc.poll() is None:
            return self
        for attempt in range(3):
            try:
                return self._start_once()
            except BrokerStartError as err:
                if attempt == 2 or "Address already in use" not in str(err):
                    raise

    def _start_once(self) -> KafkaBroker:
        began = time.monotonic()
        config = self._write_config()
        shutil.rmtree(self.workdir / "data", ignore_errors=True)
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        fmt = subprocess.run(self._java_cmd("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                                            "--config", str(config)),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=self.timeout)
        (self.workdir / "format.log").write_text(fmt.stdout)
        if fmt.returncode != 0:
            raise BrokerStartError(f"kafka.tools.StorageTool format exited with {fmt.returncode} "
                                   f"({self.workdir / 'format.log'}):\n{fmt.stdout[-3000:]}")
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self._java_cmd("kafka.Kafka", str(config)), stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.workdir,
                                     preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        _LIVE.add(self)
        self.bootstrap = f"127.0.0.1:{self.port}"
        try:
            self._wait_ready(began + self.timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _wait_ready(self, deadline: float) -> None:
        while True:  # 1. the port accepts connections
            self._check_alive()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                self._check_deadline(deadline, "accept connections")
                time.sleep(0.05)
        from confluent_kafka.admin import AdminClient
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})  # no retry noise
        while True:  # 2. the metadata lists this broker (it has registered with the controller)
            self._check_alive()
            try:
                if NODE_ID in admin.list_topics(timeout=1).brokers:
                    return
            except Exception:  # KafkaException while the broker is still fencing / registering
                pass
            self._check_deadline(deadline, "answer metadata")
            time.sleep(0.05)

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BrokerStartError(f"the Kafka broker exited with {self.proc.returncode} during startup\n"
                                   + self.log_tail())

    def _check_deadline(self, deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            raise BrokerStartError(f"the Kafka broker did not {what} within {self.timeout:.0f} s\n" + self.log_tail())

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            text = []
        return f"---- last {lines} lines of {self.log_path} ----\n" + "\n".join(text[-lines:])

    # ---- use -----------------------------------------------------------------------------

    def admin(self, **config):
        from confluent_kafka.admin import AdminClient
        return AdminClient({"bootstrap.servers": self.bootstrap, **config})

    def create_topic(self, name: str, partitions: int = 1, config: dict | None = None,
                     timeout: float = 30.0) -> str:
        """Create `name` with `partitions` partitions (one replica) and wait until every partition
        has a leader and that leader answers for it (the metadata names a leader a moment before the
        broker has loaded the partition: ListOffsets then answers NOT_LEADER_FOR_PARTITION); returns
        the name."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition
        from confluent_kafka.admin import NewTopic
        admin = self.admin()
        for future in admin.create_topics([NewTopic(name, partitions, 1, config=dict(config or {}))]).values():
            future.result(timeout)
        deadline = time.monotonic() + timeout
        while True:
            topic = admin.list_topics(name, timeout=5).topics.get(name)
            if (topic is not None and topic.error is None and len(topic.partitions) == partitions
                    and all(p.leader >= 0 and p.error is None for p in topic.partitions.values())):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name}: partitions without a leader after {timeout} s")
            time.sleep(0.05)
        probe = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "create-topic-probe"})
        try:
            for p in range(partitions):
                while True:
                    try:
                        probe.get_watermark_offsets(TopicPartition(name, p), timeout=5, cached=False)
                        break
                    except KafkaException as exc:
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"topic {name} partition {p}: no offsets after {timeout} s: "
                                               f"{exc}") from None
                        time.sleep(0.05)
        finally:
            probe.close()
        return name

    # ---- stop ----------------------------------------------------------------------------

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (a controlled shutdown), SIGKILL after `timeout` s; safe to call twice."""
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._own_dir:  # the data goes, the logs and settings stay for a look afterwards
            shutil.rmtree(self.workdir / "data", ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL at once (no controlled shutdown)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self.stop()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> KafkaBroker:
        return self if self.running else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"KafkaBroker({self.bootstrap!r}, version={self.version!r}, workdir={str(self.workdir)!r})"


_LIVE: set = set()


@atexit.register
def _stop_all() -> None:
    for broker in list(_LIVE):
        broker.stop(timeout=5)


# ---- pytest fixture --------------------------------------------------------------------------

try:
    import pytest
except ImportError:  # usable without pytest
    pytest = None

_shared: dict = {"broker": None, "users": 0}

if pytest is not None:
    @pytest.fixture(scope="session")
    def kafka_broker(tmp_path_factory):
        """One real Kafka broker for the whole test session (shared by every module that imports
        this fixture). Skips, naming the missing path, only when java or the jars are absent;
        set KAFKA_BROKER_REQUIRED=1 to make that a failure instead. A broker that is there but
        fails to start is an error, with its log."""
        reason = missing()
        if reason:
            if os.environ.get("KAFKA_BROKER_REQUIRED") == "1":
                pytest.fail(f"KAFKA_BROKER_REQUIRED=1 but {reason}")
            pytest.skip(reason)
        if _shared["broker"] is None or not _shared["broker"].running:
            try:
                _shared["broker"] = KafkaBroker(tmp_path_factory.mktemp("kafka-broker"))
            except BrokerStartError as err:
                print(err, file=sys.stderr)
                raise
            broker = _shared["broker"]
            print(f"\nKafka {broker.version} broker at {broker.bootstrap} started in {broker.startup_seconds:.1f} s "
                  f"(logs: {broker.log_path})", file=sys.stderr)
        _shared["users"] += 1
        try:
            yield _shared["broker"]
        finally:
            _shared["users"] -= 1
            if _shared["users"] == 0 and _shared["broker"] is not None:
                _shared["broker"].stop()
                _shared["broker"] = None
