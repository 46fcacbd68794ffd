"""The sentence of a run that ran out of events gives the virtual time of the last event the agents ran, exactly
(integer ns written as seconds), where they reported it; else, as before, the time of the run's last row."""
from __future__ import annotations

from controller.config import load
from controller.run import stall_sentence

PARKED = {"vworkers": 9, "first": [f"w{i} in recv(src=ps0, tag='params')" for i in range(8)]}


def _summary(**extra) -> dict:
    return {"updates": 1, "virtual_time_s": 0.013000002, "parked": PARKED, **extra}


def test_the_last_event_is_given_to_the_nanosecond():
    rc = load(["stop.updates=5"], check_data=False)
    # as a float, 123456789.012345678 s prints 123456789.012345687 (or 123456789.012346 with :.6f)
    line = stall_sentence(rc, _summary(last_event_ns=123_456_789_012_345_678))
    assert line.startswith("the run ran out of events at virtual time 123456789.012345678 s after 1 update, "
                           "before stop.updates=5: 9 vworkers wait for what nothing will send — w0 in recv(")
    assert line.endswith(" and 1 more (summary.json: parked; a message never sent, or lost for good).")
    assert stall_sentence(rc, _summary(last_event_ns=25_000_004)).startswith(
        "the run ran out of events at virtual time 0.025000004 s after 1 update")


def test_without_the_agents_report_the_sentence_gives_the_last_row_as_before():
    rc = load(["stop.updates=5"], check_data=False)
    assert stall_sentence(rc, _summary()).startswith(
        "the run ran out of events at virtual time 0.013000 s after 1 update, before stop.updates=5: 9 vworkers")
