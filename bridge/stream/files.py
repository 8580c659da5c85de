"""A file of lines as a pipeline source: the Source and the Assembler `dts-bridge deliver` plugs
into the one loop (`bridge.pipeline.run`), with no client in them.

`FileLines` reads one file through `read_lines`, so the `max_line_bytes` guard applies (a longer
line is read past and comes as its `LineTooLongError`); key 0, the position of a line is its
number (1-based, blank lines counted and read past), its value the line as read. It ends at the
end of the file (`caught_up`), so `run(idle_timeout=0)` stops there. `LineRecords` turns each
line into one record with a `parse` function under the error policy, counting the input.

>>> import os, tempfile
>>> from bridge.stream import ErrorPolicy
>>> fd, path = tempfile.mkstemp(); _ = os.write(fd, b'{"a": 1}\\n\\n{bad\\n'); os.close(fd)
>>> lines = FileLines(path); lines.open({0: None})
>>> records = lines.poll(10, 0)
>>> [(r[0], r[1], r[2]) for r in records], lines.caught_up(), lines.place(4)
([(0, 1, b'{"a": 1}\\n'), (0, 3, b'{bad\\n')], True, (3, 15))
>>> policy = ErrorPolicy("skip")
>>> list(LineRecords(lambda line, number: len(line)).entries(records, policy))
[({'line': 1}, 9), ({'line': 3}, 5)]
>>> lines.close(); os.remove(path)
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any

from bridge.errors import BridgeError
from bridge.stream import ErrorPolicy
from bridge.wire.framing import read_lines

__all__ = ["FileLines", "LineRecords"]

_SCAN_CHUNK = 1 << 20


class _Counted:
    """The file as `read_lines` reads it, counting the bytes read and the lines they end."""

    def __init__(self, fh) -> None:
        self.fh, self.offset, self.breaks, self.partial = fh, fh.tell(), 0, False

    def readline(self, size: int = -1) -> bytes:
        piece = self.fh.readline(size)
        self.offset += len(piece)
        if piece.endswith(b"\n"):
            self.breaks, self.partial = self.breaks + 1, False
        elif piece:
            self.partial = True  # a line read in pieces, or the last line without a break
        return piece

    @property
    def lines(self) -> int:
        return self.breaks + self.partial


def _offset_of_line(fh, lines: int) -> int:
    """The byte offset after the first `lines` lines of `fh` (its end if it has fewer)."""
    fh.seek(0)
    offset = 0
    while lines > 0:
        chunk = fh.read(_SCAN_CHUNK)
        if not chunk:
            break
        start = 0
        while lines > 0:
            at = chunk.find(b"\n", start)
            if at < 0:
                break
            lines, start = lines - 1, at + 1
        offset += start if lines == 0 else len(chunk)
    return offset


class FileLines:
    """A `Source` over the lines of one file (see the module docstring). `start` is where a
    resumed reading begins without a scan: (lines already read, the byte offset after them), a
    state file's; a committed position elsewhere is found by counting the file's lines. `place`
    gives the (lines, byte offset) a commit at a position stands for, to store beside it."""

    def __init__(self, path: str, *, max_line_bytes: int | None = None, start: tuple[int, int] = (0, 0),
                 key: Hashable = 0) -> None:
        self.path, self.max_line_bytes, self.start, self.key = path, max_line_bytes, start, key
        self._fh = None
        self._counted: _Counted | None = None
        self._lines: Iterator | None = None
        self._base = 0  # the line number before the first line read
        self._next = 1  # the position after the last line handed out
        self._eof = False
        self._ends: dict[int, int] = {}  # line -> the byte offset after it (the last two polls)
        self._older: dict[int, int] = {}

    @property
    def offset(self) -> int:
        """The byte offset read to (for a progress display)."""
        return self._counted.offset if self._counted is not None else self.start[1]

    def keys(self) -> list:
        return [self.key]

    def open(self, committed: Mapping[Hashable, int | None]) -> None:
        position = committed.get(self.key)
        line, offset = (0, 0) if position is None else self.start
        self._fh = open(self.path, "rb")  # closed by close()
        if position is not None and position != line + 1:
            line, offset = position - 1, _offset_of_line(self._fh, position - 1)
        self._fh.seek(offset)
        self.start = (line, offset)
        self._base, self._next = line, line + 1
        self._counted = _Counted(self._fh)
        self._lines = read_lines(self._counted, self.max_line_bytes)

    def poll(self, budget: int, timeout: float) -> list[tuple]:
        if self._eof or self._lines is None:
            return []
        self._older, self._ends = self._ends, {}
        out = []
        for number, value in itertools.islice(self._lines, budget):
            position = self._base + number
            if isinstance(value, BridgeError):
                value.where["line"] = position  # read_lines counts from where this reading began
            self._ends[position] = self._counted.offset
            out.append((self.key, position, value, None))
        if len(out) < budget:
            self._eof = True
        if out:
            self._next = out[-1][1] + 1
        return out

    def place(self, position: int) -> tuple[int, int]:
        """(lines, byte offset) before line `position`: with every line before it handed on, a
        reading resumed there starts after these lines, at this offset. Blank lines at the end of
        the file are included once it is read to its end."""
        if self._eof and position == self._next and self._counted is not None:
            return self._base + self._counted.lines, self._counted.offset
        line = position - 1
        for ends in (self._ends, self._older):
            if line in ends:
                return line, ends[line]
        if line == self.start[0]:
            return self.start
        with open(self.path, "rb") as fh:  # a position outside the last two polls: count
            return line, _offset_of_line(fh, line)

    def caught_up(self) -> bool:
        return self._eof

    def ends(self) -> dict:
        return {self.key: self._next} if self._eof else {}

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class LineRecords:
    """An `Assembler` for `FileLines`: each line is one input record; `parse(line, number)` gives
    what goes on, or raises the `BridgeError` that rejects the line under the error policy (the
    line as it came to the rejects, located at its number and `source`), as does a line over
    `max_line_bytes`. It holds nothing: each line is handed on or rejected as it comes."""

    def __init__(self, parse: Callable[[bytes, int], Any], source: str | None = None) -> None:
        self.parse, self.source = parse, source

    def entries(self, records: Iterable[tuple], policy: ErrorPolicy) -> Iterator[tuple]:
        tally = policy.tally
        for record in records:
            number, value = record[1], record[2]
            tally.input += 1
            try:
                if isinstance(value, BridgeError):  # a line over max_line_bytes, read past
                    raise value
                item = self.parse(value, number)
            except BridgeError as err:
                policy.reject(err.located(line=number, source=self.source), value)
                continue
            yield {"line": number}, item

    def resume_at(self, key: Hashable) -> None:
        pass

    def held_from(self, key: Hashable) -> int | None:
        return None

    def held(self) -> int:
        return 0
