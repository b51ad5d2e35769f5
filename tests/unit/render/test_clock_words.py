"""The walk-through's sentence about the run on the clock (render/walkthrough.clock_words): its critical path
in words a learner reads, "all communication" where no compute is on it (issue 53: it said "none of compute")."""

from parasim.render.walkthrough import clock_words


def said(compute_us: float, comm_us: float) -> str:
    c = {
        "gpu": "H200",
        "gpus_per_node": 8,
        "overlap": [],
        "step_us": compute_us + comm_us,
        "switches": {},
        "critical_compute_us": compute_us,
        "critical_comm_us": comm_us,
    }
    return " ".join(clock_words(c).split())


def test_a_path_of_communication_only_says_so():
    text = said(0.0, 149.0)
    assert "its critical path all communication (149 us)" in text and "none" not in text


def test_a_path_of_compute_only_says_so():
    assert "its critical path all compute (2 ms)" in said(2000.0, 0.0)


def test_both_are_named_with_their_durations():
    assert "its critical path 167 ms of compute and 328 ms of communication" in said(167e3, 328e3)


def test_a_little_compute_is_still_named():
    assert "its critical path 500 ns of compute and 100 us of communication" in said(0.5, 100.0)
