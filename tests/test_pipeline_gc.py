"""The one loop's collector spacing (bridge.pipeline.gc_spaced, docs/performance.md "The collector"):
the first threshold is raised while runs go and restored when the last ends, a user's own
setting (higher, or collection off) is left alone, and a run that raises still restores it."""
from __future__ import annotations

import gc
import threading

import pytest

from bridge import pipeline
from bridge.pipeline import GC_THRESHOLD0, gc_spaced


@pytest.fixture(autouse=True)
def _thresholds():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_raised_inside_and_restored_after():
    gc.set_threshold(700, 10, 10)
    with gc_spaced():
        assert gc.get_threshold() == (GC_THRESHOLD0, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)


def test_nested_and_overlapping_runs_restore_once_the_last_ends():
    gc.set_threshold(900, 7, 5)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def other():
        with gc_spaced():
            second_in.set()
            first_out.wait(10)
            seen.append(gc.get_threshold())  # the first run ended: still raised for this one

    with gc_spaced():
        first_in.set()
        t = threading.Thread(target=other)
        t.start()
        second_in.wait(10)
    first_out.set()
    t.join(10)
    assert seen == [(GC_THRESHOLD0, 7, 5)]
    assert gc.get_threshold() == (900, 7, 5)


def test_a_run_that_raises_restores():
    gc.set_threshold(700, 10, 10)
    with pytest.raises(RuntimeError), gc_spaced():
        raise RuntimeError("boom")
    assert gc.get_threshold() == (700, 10, 10) and pipeline._gc_runs[0] == 0


@pytest.mark.parametrize("user", [(0, 10, 10), (100_000, 10, 10)], ids=["collection-off", "higher"])
def test_a_users_own_setting_is_left_alone(user):
    gc.set_threshold(*user)
    with gc_spaced():
        assert gc.get_threshold() == user
    assert gc.get_threshold() == user


def test_a_threshold_changed_during_the_run_is_not_overwritten():
    gc.set_threshold(700, 10, 10)
    with gc_spaced():
        gc.set_threshold(1234, 10, 10)  # the user's own, while the run goes
    assert gc.get_threshold() == (1234, 10, 10)


def test_the_older_generations_thresholds_set_during_the_run_are_kept():
    """(review) Only the first threshold is the run's: the others, changed while it goes, stay."""
    gc.set_threshold(700, 10, 10)
    with gc_spaced():
        gc.set_threshold(GC_THRESHOLD0, 3, 4)
    assert gc.get_threshold() == (700, 3, 4)
