"""The wheel: built from a copy of the source tree, its file list checked both ways (everything the
package needs at run time is in, nothing else is), then installed into a bare directory and imported
from there in a fresh process (docs/decisions.md, "Packaging").

One build and one install serve every test here (about 5 s: the C extension is compiled once).
"""
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Not one of these may be in the wheel: the sample streams and the demo's data, tests, benchmarks,
# the C sources, and build leftovers.
FORBIDDEN = ("samples/*", "tests/*", "benchmarks/*", "tools/*", "docs/*", "proto/*", "out/*", "*.pb", "*.jsonl",
             "*.c", "*.h", "*.pyc", "*/__pycache__/*", "*.o")


def source_files() -> list[str]:
    """The files a clean clone has, plus new ones not yet committed (what `git status` would show)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the source tree to build from is unknown")
    return [name for name in listed.decode().split("\0") if name and (ROOT / name).is_file()]


@pytest.fixture(scope="module")
def copied(tmp_path_factory) -> tuple[Path, list[str]]:
    """A copy of the source tree (the working copy's build/ may hold stale objects) and its file list."""
    src = tmp_path_factory.mktemp("wheel") / "src"
    files = source_files()
    for name in files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    return src, files


@pytest.fixture(scope="module")
def wheel(copied) -> Path:
    src, _ = copied
    dist = src.parent / "dist"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(dist), str(src)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = dist.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def names(wheel) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


@pytest.fixture(scope="module")
def expected(copied) -> set[str]:
    """Every file the package needs at run time, read off the tree the wheel was built from."""
    _, files = copied
    wanted = {name for name in files if name.startswith("bridge/") and name.endswith((".py", ".pyi"))}
    return wanted | {"bridge/py.typed", "bridge/blob/blob.schema.json"}


def test_wheel_holds_every_module_stub_and_data_file(names, expected):
    missing = expected - names
    assert not missing, f"the wheel lacks {sorted(missing)}"
    extensions = [name for name in names if fnmatch.fnmatch(name, "bridge/native/_speedups.*.so")]
    assert len(extensions) == 1, f"the compiled C extension is not in the wheel (gcc and the Python headers?): {extensions}"


def test_wheel_holds_nothing_else(names, expected):
    package = {name for name in names if not name.startswith("dts_datahub_bridge-")}
    extension = {name for name in package if fnmatch.fnmatch(name, "bridge/native/_speedups.*.so")}
    extra = package - expected - extension
    assert not extra, f"the wheel ships files the package does not need: {sorted(extra)}"
    forbidden = sorted(name for name in names if any(fnmatch.fnmatch(name, pattern) for pattern in FORBIDDEN))
    assert not forbidden, f"the wheel ships {forbidden}"


def test_one_json_schema_in_the_tree(copied):
    _, files = copied
    assert sorted(name for name in files if name.endswith(".schema.json")) == ["bridge/blob/blob.schema.json"]


def test_installed_wheel_imports_and_validates(wheel, tmp_path):
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                           "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    probe = """
import json, sys
import bridge
from bridge.blob.validation import blob_schema
from bridge.native import _speedups
good = {"schema": {}, "payload": {"op": "MHEARTBEAT", "sequenceId": "1", "timestamp": {"eventTime": 1605339932000}}}
bridge.validate_blob(good)
try:
    bridge.validate_blob(dict(good, payload=dict(good["payload"], op="HEARTBEAT")))
    refused = None
except bridge.BridgeError as err:
    refused = str(err)
print(json.dumps({"bridge": bridge.__file__, "speedups": _speedups.__file__, "refused": refused,
                  "schema": blob_schema()["$schema"]}))
"""
    env = dict(os.environ, PYTHONPATH=str(target), BRIDGE_PURE_PYTHON="")
    # cwd outside the repository: `bridge` may only come from the installed copy
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert Path(seen["bridge"]).is_relative_to(target), seen
    assert Path(seen["speedups"]).is_relative_to(target), seen
    assert "payload/op" in seen["refused"], seen
    assert seen["schema"].startswith("https://json-schema.org/"), seen
    assert (target / "bridge" / "py.typed").is_file()
