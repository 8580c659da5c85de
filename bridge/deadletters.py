"""Dead letters of `dts-bridge sync`: what a run could not deliver, kept whole for a later replay.

One JSON Lines file (`--dead-letters PATH`), one line per rejected Entry or refused record:

    {"entry_base64": "<the Entry's bytes, whole>", "source": "<Kafka topic>", "partition": 0,
     "offset": 1200, "entry": 3, "row": null, "table": "shop.orders", "datahub_topic": "shop_orders",
     "error": "..."}

`row` is null when the whole Entry was rejected (its conversion failed, its table is halted), else
the index of the one record DataHub refused among the Entry's outputs. The file follows the commit
rule of `consume` (docs/kafka.md): lines are appended and fsynced before every offset commit, and
the file's committed length goes to a state file next to it (PATH.state.json, written atomically)
before the offsets are stored; a restart cuts the file back to that length, so the Entries read
again after a crash are dead-lettered again exactly once. The state also keeps the tables halted
under `--on-table-error halt-table`, so a restart keeps them halted.

>>> letter_position({"partition": 1, "offset": 7, "entry": 2, "row": None})
'1:7:2'
"""
from __future__ import annotations

import base64
import os
import threading
from typing import Any

import orjson

from bridge.errors import BridgeError
from bridge.stream.letters import letter_line, letter_position

__all__ = ["DeadLetters", "read_dead_letters", "letter_position", "letter_line", "STATE_SUFFIX"]

STATE_SUFFIX = ".state.json"


class DeadLetters:
    """The dead-letter file of one run (see the module docstring); `write` is thread-safe (the
    DataHub writer's workers hand refused records over)."""

    def __init__(self, path: str, identity: dict) -> None:
        self.path, self.state_path, self.identity = path, path + STATE_SUFFIX, identity
        self.length = 0
        self.offsets: dict[int, int] = {}
        self.halted: dict[str, str] = {}  # table -> why (committed with the offsets)
        self.written = 0
        self._fh = None
        self._lock = threading.Lock()

    def restore(self) -> dict[int, int]:
        """Cut the file back to its committed length; the offsets committed with it."""
        from bridge.stream.state import replace_json
        try:
            with open(self.state_path, "rb") as fh:
                doc = orjson.loads(fh.read())
        except FileNotFoundError:
            doc = None
        except (OSError, orjson.JSONDecodeError) as err:
            raise BridgeError(f"cannot read the dead letters' state file {self.state_path}: {err}") from None
        if doc is not None:
            mine = {k: doc.get(k) for k in self.identity}
            if mine != self.identity:
                raise BridgeError(f"the dead letters {self.path} belong to another run ({mine}; this one: "
                                  f"{self.identity}): pass another --dead-letters")
            self.length = int(doc.get("length", 0))
            self.offsets = {int(p): off for p, off in doc.get("partitions", {}).items()}
            self.halted = dict(doc.get("halted", {}))
        else:
            self.length = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        try:
            self._fh = open(self.path, "ab")
            size = os.fstat(self._fh.fileno()).st_size
            if size < self.length:
                raise BridgeError(f"{self.path} holds {size} bytes, less than the {self.length} bytes committed "
                                  f"(changed outside dts-bridge?); remove {self.state_path} and start again")
            if size > self.length:  # dead letters of Entries after the last commit: written again
                self._fh.truncate(self.length)
                os.fsync(self._fh.fileno())
        except OSError as err:
            raise BridgeError(f"cannot write the dead letters {self.path}: {err.strerror}") from None
        if doc is None:
            replace_json(self.state_path, self._doc())
        return dict(self.offsets)

    def write(self, **letter) -> None:
        line = letter_line(**letter) + b"\n"
        with self._lock:
            self._fh.write(line)
            self.written += 1

    def sync(self) -> None:
        with self._lock:
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def mark(self, offsets: dict[int, int], halted: dict[str, str]) -> None:
        """After `sync`, before the offsets are stored: the file's length goes with them."""
        from bridge.stream.state import replace_json
        with self._lock:
            self.length = self._fh.tell()
        self.offsets = {**self.offsets, **offsets}
        self.halted = dict(halted)
        try:
            replace_json(self.state_path, self._doc())
        except OSError as err:
            raise BridgeError(f"cannot write {self.state_path}: {err.strerror}") from None

    def _doc(self) -> dict:
        return {**self.identity, "length": self.length, "halted": self.halted,
                "partitions": {str(p): off for p, off in sorted(self.offsets.items())}}

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()


def read_dead_letters(path: str) -> list[dict[str, Any]]:
    """The dead letters of a file, in order, each with its Entry's bytes decoded (`entry_bytes`)."""
    out = []
    try:
        with open(path, "rb") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    letter = orjson.loads(line)
                    letter["entry_bytes"] = base64.b64decode(letter["entry_base64"], validate=True)
                    letter["line"] = number
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                    raise BridgeError(f"{path} line {number} is not a dead letter: {err}") from None
                out.append(letter)
    except OSError as err:
        raise BridgeError(f"cannot read {path}: {err.strerror}") from None
    return out
