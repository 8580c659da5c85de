"""`Pairing.pending` is a counter kept up to date where the pairing state changes (the stream layer
asks for it after every record, so it may not be a scan); it must always equal what the scan over
the four containers holding messages said: update halves and open events' rows, of the Python path
and of the C lane (on bytes).

Lines of one table's events (1 to 3 rows; INSERT, UPDATE halves, DELETE), disturbed (reordered,
repeated, dropped, going the Python way in the middle of what the lane holds, halves a second apart)
are fed one at a time, as lines or as dicts, with the C lane and without it, with small and large
pairing windows, `finish` sometimes in the middle; after every step, whether it raised or not, the
counter is compared with the scan.
"""
from __future__ import annotations

import copy

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bridge
from bridge.errors import BridgeError
from support.blob_strategies import event_messages, shuffled_windows


def _scan(pairing) -> int:
    """What `Pairing.pending` summed before it was a counter."""
    return (len(pairing.halves) + sum(e.messages for e in pairing.events.values())
            + len(pairing.lane_halves) + sum(e[1] for e in pairing.lane_events.values()))


@st.composite
def _steps(draw, messages: list[dict]) -> list[tuple[str, dict | None]]:
    out = shuffled_windows(draw, messages)
    for msg in out:
        if msg["payload"]["op"] not in ("INSERT", "DELETE", "UPDATE_BEFOR", "UPDATE_AFTER") or draw(st.integers(0, 4)):
            continue
        ext = msg.setdefault("dts", {})
        what = draw(st.integers(0, 3))
        if what == 0:
            ext["rowProperties"] = [["k", "v"]]  # the Python way, in the middle of what the lane holds
        elif what == 1 and msg["payload"]["op"].startswith("UPDATE"):
            stamp = msg["payload"]["timestamp"]
            stamp["eventTime"] = stamp["checkpointTime"] = stamp["eventTime"] + 1000
        elif what == 2:
            ext.pop("header", None)
        else:
            ext["row"] = [0, 2]  # a row of another event
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, len(out) - 1))
        if draw(st.integers(0, 2)):
            out.insert(draw(st.integers(i, min(len(out), i + 4))), copy.deepcopy(out[i]))
        else:
            del out[i]
    steps = [(draw(st.sampled_from(["line", "line", "line", "dict"])), msg) for msg in out]
    for _ in range(draw(st.integers(0, 2))):
        steps.insert(draw(st.integers(0, len(steps))), ("finish", None))
    return steps


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(seed=st.integers(0, 10_000), native=st.booleans(), max_pending=st.sampled_from([1, 2, 3, 100_000]),
       options=st.sampled_from([bridge.DEFAULT_OPTIONS, bridge.Options(strict=True)]),
       data=st.data())
def test_pending_counts_what_the_pairing_holds(seed, native, max_pending, options, data):
    steps = data.draw(_steps(event_messages(seed, events=6)))
    decoder = bridge.BlobDecoder(options, max_pending=max_pending)
    decoder._native = native
    for number, (how, msg) in enumerate(steps):
        try:
            if how == "finish":
                decoder.finish()
            elif how == "dict":
                decoder.feed(copy.deepcopy(msg), line=number)
            else:
                decoder.feed_line(orjson.dumps(msg), line=number)
        except BridgeError:
            pass
        assert decoder.pending == decoder.pending_messages == _scan(decoder._pairing), f"step {number} ({how})"
    decoder.finish()
    assert decoder.pending == _scan(decoder._pairing) == 0


def test_pending_counts_the_lanes_and_the_python_paths_holdings():
    """A fixed run through both ways of holding (no hypothesis): rows and halves the lane holds on
    bytes, a line that hands them to the Python state, an evicted half; the counter and the scan
    agree after every line, and both were above one somewhere."""
    messages = event_messages(1, events=6)
    odd = copy.deepcopy(messages[5])
    odd.setdefault("dts", {})["rowProperties"] = []
    decoder = bridge.BlobDecoder(max_pending=2)
    seen = []
    for number, msg in enumerate(messages[:5] + [odd] + messages[6:] + messages[3:9]):
        try:
            decoder.feed_line(orjson.dumps(msg), line=number)
        except BridgeError:
            pass
        seen.append(decoder.pending)
        assert decoder.pending == _scan(decoder._pairing), number
    assert max(seen) > 1
    decoder.finish()
    assert decoder.pending == 0
