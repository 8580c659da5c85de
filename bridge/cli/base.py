"""What the command-line modules share: the usage error, output files renamed into place on
success and one-line messages (numbered input lines come from `_wire.read_lines`)."""
from __future__ import annotations

import os
import pathlib
import sys
from typing import Any

PROG = "dts-bridge"
DEBUG_ENV = "DTS_BRIDGE_DEBUG"  # set: unexpected exceptions keep their traceback (the tests set it)


class UsageError(Exception):
    """A wrong command line: exit 2 with the message."""


class _Outputs:
    """Output files written under temporary names and renamed into place only when the run
    ends without an error, so a failed run never leaves a half-written file that looks whole."""

    def __init__(self) -> None:
        self._open: list[tuple[Any, pathlib.Path | None, pathlib.Path]] = []

    def open(self, path: str):
        if path == "-":
            return sys.stdout.buffer
        target = pathlib.Path(path)
        if target.exists() and not target.is_file():
            # a device or pipe (/dev/null, a FIFO): written as it is, never renamed over
            try:
                fh = open(target, "wb")
            except OSError as err:
                raise UsageError(f"cannot write {path}: {err.strerror}") from None
            self._open.append((fh, None, target))
            return fh
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
            fh = open(tmp, "wb")
        except OSError as err:
            raise UsageError(f"cannot write {path}: {err.strerror}") from None
        self._open.append((fh, tmp, target))
        return fh

    def reserve(self, path: str) -> str:
        """A temporary path for a writer that takes a path; renamed into place on commit."""
        fh = self.open(path)
        fh.close()
        tmp = self._open[-1][1]
        return str(tmp if tmp is not None else path)

    def commit(self) -> None:
        for fh, tmp, target in self._open:
            fh.close()
            if tmp is not None:
                os.replace(tmp, target)
        self._open.clear()

    def abort(self) -> None:
        for fh, tmp, _ in self._open:
            fh.close()
            if tmp is not None:
                tmp.unlink(missing_ok=True)
        self._open.clear()


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
