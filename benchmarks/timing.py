"""Interleaved, repeated timing: every case runs on every chunk N times, in rotating order.

Each (case, chunk) keeps its best and its median time; a case's time is the sum over chunks.
A burst of load from other processes then hits one repetition of one chunk, not one case.
"""
from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass
class Timing:
    best: float = 0.0      # seconds: sum over chunks of the fastest repetition
    median: float = 0.0    # seconds: sum over chunks of the median repetition
    rows: int = 0
    items: int = 0         # what the case counts besides rows (messages, Entries)
    samples: list = field(default_factory=list)  # per chunk: every repetition's seconds

    def rate(self, which: str = "best") -> float:
        seconds = getattr(self, which)
        return self.rows / seconds if seconds else 0.0


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(cases: dict[str, Callable], chunks: Iterable, repeat: int,
                progress: Callable[[str], None] | None = None) -> dict[str, Timing]:
    """Time `cases[name](chunk)` (which returns the number of items it produced) on every chunk."""
    names = list(cases)
    out = {name: Timing() for name in names}
    for index, chunk in enumerate(chunks):
        seconds: dict[str, list] = {name: [] for name in names}
        items: dict[str, int] = {}
        for rep in range(repeat):
            shift = (index + rep) % len(names)
            for name in names[shift:] + names[:shift]:
                gc.collect(0)
                start = time.perf_counter()
                items[name] = cases[name](chunk)
                seconds[name].append(time.perf_counter() - start)
        for name in names:
            t = out[name]
            t.best += min(seconds[name])
            t.median += statistics.median(seconds[name])
            t.rows += chunk.rows
            t.items += items[name] or 0
            t.samples.append(seconds[name])
        if progress:
            progress(f"chunk {index + 1}: {chunk.rows} rows, "
                     + ", ".join(f"{n} {chunk.rows / min(seconds[n]):,.0f}/s" for n in names))
    return out


def log(message: str) -> None:
    """A timestamped progress line on stderr (every benchmark module writes its progress so)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
