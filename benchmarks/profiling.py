"""cProfile summaries of the bridge's two Blob directions: where (b) and (d) spend their time."""
from __future__ import annotations

import cProfile
import linecache
import os
import pstats
from collections.abc import Callable

import bridge

_ROOTS = (os.path.dirname(os.path.dirname(bridge.__file__)) + os.sep,)


def _enclosing(path: str, line: int) -> str | None:
    """The top-level function around a nested one (the codec factory of a `to_blob`)."""
    for number in range(line - 1, 0, -1):
        text = linecache.getline(path, number)
        if text.startswith(("def ", "class ")):
            return text.split()[1].split("(")[0].rstrip(":")
    return None


def _where(func: tuple) -> str:
    path, line, name = func
    if path == "~":  # a builtin or a C method
        return name.strip("<>")
    full = path
    parts = path.split(os.sep)
    if "site-packages" in parts:
        path = os.sep.join(parts[parts.index("site-packages") + 1:])
    else:
        for root in _ROOTS:
            if path.startswith(root):
                path = path[len(root):]
                break
        else:
            path = os.path.basename(path)
    text = linecache.getline(full, line)
    if text.startswith((" ", "\t")) and text.lstrip().startswith("def "):
        outer = _enclosing(full, line)
        if outer and outer != name:
            name = f"{outer}.{name}"
    return f"{path}:{line} {name}"


def hot_spots(run: Callable[[], object], top: int = 12) -> dict:
    """The `top` functions by own time (tottime) with their share of the profiled total."""
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # func -> (primitive calls, calls, tottime, cumtime, callers)
    total = sum(s[2] for s in stats.values()) or 1.0
    ranked = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    return {
        "total_seconds": round(total, 4),
        "functions": [{"function": _where(func), "calls": s[1], "tottime": round(s[2], 4),
                       "share": round(s[2] / total, 4), "cumtime": round(s[3], 4)} for func, s in ranked],
    }
