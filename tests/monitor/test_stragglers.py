from __future__ import annotations

import logging

from kiln.monitor.stragglers import StragglerDetector


def test_named_after_consecutive_slow_intervals_and_cleared(caplog):
    det = StragglerDetector(margin=0.2, intervals=3)
    with caplog.at_level(logging.INFO, logger="kiln.monitor"):
        assert det.update(1, [10.0, 10.5, 15.0, 9.8]) == []
        assert det.update(2, [10.0, 10.5, 15.0, 9.8]) == []
        assert det.update(3, [10.0, 10.5, 15.0, 9.8]) == [2]
        assert det.update(4, [10.0, 10.5, 15.0, 9.8]) == [2]
        assert det.update(5, [10.0, 10.5, 11.0, 9.8]) == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "rank 2" in warnings[0].getMessage() and "at step 3" in warnings[0].getMessage()
    assert any("rank 2 is back" in r.getMessage() for r in caplog.records)
    assert det.ever == {2}


def test_streak_resets_when_a_slow_interval_is_followed_by_a_normal_one():
    det = StragglerDetector(margin=0.2, intervals=2)
    assert det.update(1, [10.0, 20.0]) == []
    assert det.update(2, [10.0, 10.0]) == []
    assert det.update(3, [10.0, 20.0]) == []
    assert det.update(4, [10.0, 20.0]) == [1]


def test_two_ranks_compare_with_each_other_and_margin_is_respected():
    det = StragglerDetector(margin=0.5, intervals=1)
    assert det.update(1, [10.0, 14.0]) == []  # +40% < 50%
    assert det.update(2, [10.0, 16.0]) == [1]
    assert det.update(3, [10.0, float("nan")]) == []  # an unknown value names nobody
