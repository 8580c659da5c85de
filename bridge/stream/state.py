"""State files written durably: the offsets and file lengths a run commits (bridge.kafka's
`FileOffsets`, the dead letters' state, `consume` and `deliver` in the CLI) are JSON documents
replaced atomically, so a crash leaves the old document or the new one, never half of either.
It sits below the ends (Kafka, the dead letters) so that each keeps its state without importing another.
"""
from __future__ import annotations

import json
import os

__all__ = ["replace_json"]


def replace_json(path, doc) -> None:
    """Write a JSON document to `path` atomically and durably: a temporary file next to it,
    fsynced, renamed over it, and the directory fsynced (a crash leaves the old or the new)."""
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
