"""README.md's Python snippets run as doctests (`doctest.testfile`), so what the README shows is what
the code does: the "From Python" walk through the library, and the "From Spark" one on local[2].

Only the fenced ```pycon blocks are examples (`ReadmeBlocks` hands doctest nothing else, keeping
line numbers); the shell blocks are the `--help` examples tests/test_cli.py already holds to the
README. The snippets read `samples/` relative to the working directory: each test runs in a
temporary directory holding a link to the repository's samples/, so whatever a snippet writes lands
there.
"""
from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def sections() -> dict[str, list[tuple[str, str, int]]]:
    """{"## heading": [(language, body, line of the body)]} of README.md's fenced blocks."""
    text = README.read_text(encoding="utf-8")
    out: dict[str, list] = {}
    for match in FENCE.finditer(text):
        heading = [line for line in text[:match.start()].splitlines() if line.startswith("## ")][-1]
        line = text.count("\n", 0, match.start(2))
        out.setdefault(heading, []).append((match.group(1), match.group(2), line))
    return out


class ReadmeBlocks(doctest.DocTestParser):
    """The ```pycon blocks under one heading, at their line numbers in README.md (everything else blank)."""

    def __init__(self, heading: str) -> None:
        self.heading = heading

    def get_doctest(self, string, globs, name, filename, lineno):
        lines = [""] * string.count("\n")
        for language, body, first in sections().get(self.heading, []):
            if language == "pycon":
                lines[first:first + body.count("\n")] = body.splitlines()
        return super().get_doctest("\n".join(lines) + "\n", globs, f"{name} ({self.heading})", filename, lineno)


@pytest.fixture
def in_scratch(tmp_path, monkeypatch) -> Path:
    (tmp_path / "samples").symlink_to(ROOT / "samples", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_readme(heading: str) -> doctest.TestResults:
    return doctest.testfile(str(README), module_relative=False, parser=ReadmeBlocks(heading), encoding="utf-8",
                            optionflags=doctest.ELLIPSIS, raise_on_error=False, report=True)


def test_every_python_snippet_is_a_doctest():
    for heading, blocks in sections().items():
        for language, body, line in blocks:
            assert language in ("sh", "pycon"), f"README.md line {line} ({heading}): a ```{language} block"
            if language == "pycon":
                assert body.startswith(">>> "), f"README.md line {line}: a pycon block starts with a prompt"


def test_from_python_runs_as_shown(in_scratch):
    result = run_readme("## From Python")
    assert result.attempted >= 20
    assert result.failed == 0, "README.md's From Python example does not print what it shows (see above)"
    assert sorted(p.name for p in in_scratch.iterdir()) == ["samples"]  # it writes nothing


@pytest.mark.spark
def test_from_spark_runs_as_shown(spark, in_scratch):
    """`spark` (tests/conftest.py) skips without Java or pyspark; the snippet's `local_session()`
    then gets that very session, as a worker's other Spark tests do."""
    result = run_readme("## From Spark")
    assert result.attempted >= 6
    assert result.failed == 0, "README.md's From Spark example does not print what it shows (see above)"
