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


def with_switches(step_us: float, saves: dict[str, tuple[bool, float]]) -> str:
    c = {
        "gpu": "H200",
        "gpus_per_node": 8,
        "overlap": [],
        "step_us": step_us,
        "switches": {name: {"on": on, "saves_us": us} for name, (on, us) in saves.items()},
        "critical_compute_us": 1.0,
        "critical_comm_us": step_us - 1.0,
    }
    return " ".join(clock_words(c).split())


def test_a_switch_saving_under_1pc_of_the_step_is_not_given_in_nanoseconds():
    """Issue 53: zero's toy run said 'grad-reduce would save 3.67 ns' of a 463 us step. A saving of 1% of the
    step or more is said with its time; smaller ones are named together as under 1% of it; a switch already
    on, or saving nothing, is not named."""
    text = with_switches(463.0, {"grad-reduce": (False, 0.00367), "prefetch": (False, 0.00122),
                                 "tp-comm": (True, 9.0), "ep": (False, 0.0)})
    assert text.endswith("; grad-reduce and prefetch would save under 1% of it.")
    assert "ns" not in text.split("would save")[0][-40:] and "tp-comm" not in text and "ep " not in text
    big = with_switches(1000.0, {"grad-reduce": (False, 10.0), "prefetch": (False, 9.99)})
    assert big.endswith("; grad-reduce would save 10 us; prefetch would save under 1% of it.")
    assert with_switches(1000.0, {}).endswith("999 us of communication.")
