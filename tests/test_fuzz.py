"""The fuzz target tests/fuzz/fuzz_native.py, briefly: the C path against the Python path.

`make fuzz` runs it for FUZZ_SECONDS (600 by default); here it runs a few thousand inputs from a
fixed seed (about ten seconds), and once with a planted difference (BRIDGE_FUZZ_PLANT flips a byte
of the C path's output) to show that a difference fails the run. Inputs it once failed on are kept
in tests/fuzz_seeds as fuzz-* (libFuzzer's crash files, renamed); the target reads them with its
seeds, so the short run here replays them every time.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.native import NATIVE

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "tests" / "fuzz" / "fuzz_native.py"

needs_native = pytest.mark.skipif(not NATIVE, reason="C extension switched off (BRIDGE_PURE_PYTHON)")


def _fuzz(tmp_path: Path, *flags: str, seeds: bool = True, **env: str) -> subprocess.CompletedProcess:
    """The target run from a fixed seed; with `seeds`, from a corpus dir (it then reads the seeds)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, str(TARGET), "-seed=19", f"-artifact_prefix={tmp_path}/", *flags,
                           *([str(corpus)] if seeds else [])], cwd=tmp_path, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)


@needs_native
def test_the_c_path_and_the_python_path_agree_on_fuzzed_entries(tmp_path):
    done = _fuzz(tmp_path, "-runs=2000", "-max_total_time=8")
    tail = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, tail
    assert "Done" in tail and not list(tmp_path.glob("crash-*")), tail


@needs_native
def test_a_planted_difference_fails_the_run(tmp_path):
    done = _fuzz(tmp_path, "-runs=300", seeds=False, BRIDGE_FUZZ_PLANT="1")  # the empty input: an INSERT
    assert done.returncode != 0
    output = done.stdout + done.stderr  # atheris prints the uncaught exception to stdout
    assert "Differ: DTS -> Blob lines" in output and '"dataColumn"' in output, output[-3000:]
    assert list(tmp_path.glob("crash-*")), "libFuzzer keeps the input that failed"

