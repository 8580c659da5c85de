"""Fetch the test-only jar sets of tools/jars/pom.xml from Maven Central into a cache folder
(`make install` runs `python tools/jars/fetch.py .cache/jars`); see docs/testing-kafka.md.

    kafka/           org.apache.kafka:kafka_2.13 and its runtime dependencies: the test broker
    spark-kafka/     org.apache.spark:spark-sql-kafka-0-10_2.13, for a local session's spark.jars
    spark-protobuf/  org.apache.spark:spark-protobuf_2.13, likewise

Each set is copied by `mvn dependency:copy-dependencies` (offline from ~/.m2 first, then online)
into FOLDER.tmp and renamed into place with a `.complete` marker (JSON: the version asked for, the
version fetched, the jar names). A folder whose marker matches the version asked for and whose jars
are all there is left alone, so a second run does no Maven work and needs no network.

The Spark sets ask for the installed pyspark's version. Maven Central may not serve it yet (pyspark
reaches PyPI first): then the newest version in SPARK_FALLBACKS that resolves is taken and said so.
Jars that pyspark already ships (scala-library, slf4j, hadoop-client, spark-tags, ...) are left out
of the Spark sets: pyspark's own copies are on the class path already and must win.
A Spark set that no version resolves is reported and skipped (exit 0); the Kafka set must resolve.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
POM = HERE / "pom.xml"
KAFKA_VERSION = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text()).group(1)
# Newest Spark 4 release Maven Central served when this was written (2026-11); tried after pyspark's.
SPARK_FALLBACKS = ["4.2.0"]
MARKER = ".complete"
_VERSION_TAIL = re.compile(r"^(.*?)-(\d+(?:\.\d+)+.*)\.jar$")


def artifact_of(jar_name: str) -> str:
    """The artifact id of a Maven-named jar.

    >>> artifact_of("spark-sql-kafka-0-10_2.13-4.2.0.jar"), artifact_of("zstd-jni-1.5.6-10.jar")
    ('spark-sql-kafka-0-10_2.13', 'zstd-jni')
    """
    match = _VERSION_TAIL.match(jar_name)
    return match.group(1) if match else jar_name[:-4]


def _complete(folder: pathlib.Path, requested: str) -> bool:
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("requested") != requested:
        return False
    return marker.get("available") is False or all((folder / jar).is_file() for jar in marker.get("jars", ()))


def _mvn(profile: str, props: dict, out: pathlib.Path) -> tuple[bool, str]:
    mvn = shutil.which("mvn")
    if mvn is None:
        return False, "mvn is not on PATH (apt-get install maven)"
    cmd = [mvn, "-B", "-q", "-f", str(POM), "-P", profile, "dependency:copy-dependencies",
           f"-DoutputDirectory={out}", *(f"-D{k}={v}" for k, v in props.items())]
    last = ""
    for offline in (True, False):  # ~/.m2 first: a repeat needs no network
        shutil.rmtree(out, ignore_errors=True)
        # online: -U, or Maven repeats a failure it cached in ~/.m2 on an earlier day without asking again
        proc = subprocess.run(cmd + (["-o"] if offline else ["-U"]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        if proc.returncode == 0 and any(out.glob("*.jar")):
            return True, ""
        last = proc.stdout
    last = re.sub(r"\x1b\[[0-9;]*m", "", last)
    errors = [line for line in last.splitlines() if line.startswith("[ERROR] Failed")][:1]
    return False, "\n".join(errors) or last[-2000:]


def fetch(dest: pathlib.Path, name: str, profile: str, prop: str, versions: list[str], requested: str,
          prune: set[str] = frozenset(), required: bool = True) -> bool:
    folder = dest / name
    if _complete(folder, requested):
        print(f"jars: {folder} is complete ({requested})")
        return True
    tmp = dest / f"{name}.tmp"
    dest.mkdir(parents=True, exist_ok=True)
    failures = []
    for version in dict.fromkeys(versions):
        ok, why = _mvn(profile, {prop: version}, tmp)
        if ok:
            break
        failures.append(f"{version}: {why}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
        message = f"jars: no version of the {name} set resolved from Maven Central ({', '.join(versions)})"
        print(message + "\n  " + "\n  ".join(failures), file=sys.stderr)
        if required:
            return False
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        (folder / MARKER).write_text(json.dumps({"requested": requested, "available": False,
                                                 "tried": versions}, indent=1) + "\n")
        print(f"jars: {name} skipped (recorded in {folder / MARKER}; delete it to try again)", file=sys.stderr)
        return True
    pruned = sorted(p.name for p in tmp.glob("*.jar") if artifact_of(p.name) in prune)
    for jar in pruned:
        (tmp / jar).unlink()
    jars = sorted(p.name for p in tmp.glob("*.jar"))
    (tmp / MARKER).write_text(json.dumps({"requested": requested, "version": version, "jars": jars,
                                          "left_out_as_shipped_by_pyspark": pruned}, indent=1) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    note = "" if version == requested else f" (Maven Central does not serve {requested})"
    print(f"jars: {folder}: {len(jars)} jars at {version}{note}")
    return True


def main(argv: list[str]) -> int:
    dest = pathlib.Path(argv[0] if argv else ".cache/jars").resolve()
    ok = fetch(dest, "kafka", "kafka", "kafka.version", [KAFKA_VERSION], KAFKA_VERSION)
    try:
        import pyspark
    except ImportError:
        print("jars: pyspark is not installed: the Spark jar sets are skipped", file=sys.stderr)
        return 0 if ok else 1
    spark = os.environ.get("SPARK_JARS_VERSION") or pyspark.__version__
    shipped = {artifact_of(p.name) for p in (pathlib.Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    for name in ("spark-kafka", "spark-protobuf"):
        ok &= fetch(dest, name, name, "spark.version", [spark, *SPARK_FALLBACKS], spark, prune=shipped,
                    required=False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
