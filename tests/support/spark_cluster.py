"""A real Spark standalone cluster for the tests: one master and two workers started from pyspark's
own jars (`spark-class org.apache.spark.deploy.master.Master` / `...worker.Worker`) on 127.0.0.1,
each worker with one core and a small memory, so an application gets two one-core executors in two
worker JVMs and its two tasks of a stage run in separate executors on separate workers.

    def test_x(spark_cluster):              # the session fixture (tests/conftest.py imports it)
        conf = spark_cluster.conf()          # spark.master, executor cores/memory, executorEnv
        ...                                  # a driver (subprocess) started with that conf
        spark_cluster.executor_hosts(app)    # which workers ran executors of an application

The daemons run in their own process groups with PR_SET_PDEATHSIG (they die with the pytest
process even when it is SIGKILLed), and the fixture stops them (SIGTERM, then SIGKILL of each group:
the workers' executors and their Python workers with them) also when a test failed. Each worker has
its own work folder under the session's temporary folder (executor logs: `<work>/<app id>/<executor
id>/stderr`). Executors run `sys.executable` (PYSPARK_PYTHON), as the driver does.
"""
from __future__ import annotations

import ctypes
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

WORKERS = 2
WORKER_MEMORY = "640m"  # each worker offers this much; one executor of EXECUTOR_MEMORY fits
EXECUTOR_MEMORY = "512m"
DAEMON_MEMORY = "256m"  # the master's and workers' own JVM heaps
START_TIMEOUT = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: a new session (its own process group) and SIGKILL when the parent dies."""
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: the fixture's teardown still stops them
        pass


def spark_home() -> pathlib.Path:
    import pyspark
    return pathlib.Path(pyspark.__file__).parent


class SparkCluster:
    """The running cluster: `master` (spark://127.0.0.1:port), `conf()` for a driver, the daemons'
    logs and work folders under `root`."""

    def __init__(self, root: pathlib.Path, workers: int = WORKERS) -> None:
        self.root = root
        self.workers = workers
        self.procs: list[subprocess.Popen] = []
        self.port, self.ui_port = _free_port(), _free_port()
        self.master = f"spark://127.0.0.1:{self.port}"
        self.work_dirs = [root / f"worker-{n}" for n in range(workers)]
        python = os.environ.get("PYSPARK_PYTHON", sys.executable)
        self.env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                        SPARK_DAEMON_MEMORY=DAEMON_MEMORY, SPARK_LOG_DIR=str(root / "logs"),
                        SPARK_NO_DAEMONIZE="1", PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python)

    # ---- start and stop ----------------------------------------------------------------------------

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - open for the daemon's life
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent))
        log.close()

    def start(self) -> SparkCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))
        for n, work in enumerate(self.work_dirs):
            work.mkdir(exist_ok=True)
            self._spawn(f"worker-{n}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                        "--cores", "1", "--memory", WORKER_MEMORY, "--webui-port", str(_free_port()),
                        "--work-dir", str(work), self.master)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a Spark daemon exited ({dead[0].args[1]}): {self.logs()}")
            try:
                if len(self.alive_workers()) == self.workers:
                    return self
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the cluster did not come up in {START_TIMEOUT} s: {self.logs()}")

    def stop(self) -> None:
        for proc in self.procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)  # the group: executors and Python workers too
            proc.wait()
        self.procs.clear()

    # ---- what drivers and tests need ---------------------------------------------------------------

    def conf(self) -> dict:
        """A driver's Spark settings for this cluster: one one-core executor per worker."""
        return {
            "spark.master": self.master,
            "spark.executor.cores": "1",
            "spark.cores.max": str(self.workers),
            "spark.executor.memory": EXECUTOR_MEMORY,
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.pyspark.python": self.env["PYSPARK_PYTHON"],
            # an executor starts only once every core is there, so both run the first stage
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
        }

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as answer:
            return json.load(answer)

    def alive_workers(self) -> list[dict]:
        return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]

    def task_logs(self, app_id: str | None = None) -> dict[int, dict[str, int]]:
        """{worker index: {application id: tasks its executors ran}}, from the executors' logs
        ("Running task" lines) in each worker's work folder (every application, or `app_id`'s)."""
        out: dict[int, dict[str, int]] = {}
        for n, work in enumerate(self.work_dirs):
            found: dict[str, int] = {}
            for app in sorted(work.glob("app-*")):
                if app_id is not None and app.name != app_id:
                    continue
                count = 0
                for stderr in app.glob("*/stderr"):
                    count += stderr.read_text(errors="replace").count("Running task")
                found[app.name] = count
            out[n] = found
        return out

    def logs(self, n: int = 3000) -> str:
        parts = []
        for path in sorted(self.root.glob("*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-n:]}")
        return "\n".join(parts)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A Spark standalone cluster (a master and two one-core workers on 127.0.0.1) for this test
    session (one per pytest-xdist worker that asks for it); stopped at the session's end, failures
    included."""
    if not os.environ.get("JAVA_HOME") and not any(
            os.access(os.path.join(d, "java"), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep)):
        pytest.skip("Spark needs Java 17")
    pytest.importorskip("pyspark")
    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
