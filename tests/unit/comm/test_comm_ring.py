"""The ring algorithm's hops on two and three members, worked out by hand: who sends which chunk, its
bytes and (when kept) its values; and the kernel playing a schedule it is given, step by step."""
import numpy as np

from parasim.comm.ring import RingStep, ring_all_gather, ring_all_reduce, ring_reduce_scatter


def _add(a, b):
    return a + b


def test_reduce_scatter_on_two_members():
    x0, x1 = np.array([1.0, 2.0]), np.array([10.0, 20.0])
    outs, hops = ring_reduce_scatter([x0, x1], (4, 7), 0, _add, None, 64)
    assert [o.tolist() for o in outs] == [[11.0], [22.0]]
    # one hop: member i passes chunk i-1 on; ranks are named by the group's global ranks
    assert hops == [{"phase": "reduce-scatter", "hop": 0, "transfers": [
        {"src": 4, "dst": 7, "chunk": 1, "bytes": 8, "value": [2.0]},
        {"src": 7, "dst": 4, "chunk": 0, "bytes": 8, "value": [10.0]}]}]
    avg, hops = ring_reduce_scatter([x0.astype(np.float32), x1.astype(np.float32)], (0, 1), 0, _add, 2.0, 0)
    assert [o.tolist() for o in avg] == [[5.5], [11.0]] and avg[0].dtype == np.float32
    assert [t["value"] for t in hops[0]["transfers"]] == [None, None]  # keep 0: values not recorded


def test_all_gather_on_three_members():
    outs, hops = ring_all_gather([np.array([1.0]), np.array([2.0]), np.array([3.0])], (0, 1, 2), 0, 1)
    assert [o.tolist() for o in outs] == [[1.0, 2.0, 3.0]] * 3
    # hop k: member i passes chunk i-k on
    assert [[(t["src"], t["dst"], t["chunk"], t["value"]) for t in h["transfers"]] for h in hops] == [
        [(0, 1, 0, [1.0]), (1, 2, 1, [2.0]), (2, 0, 2, [3.0])],
        [(0, 1, 2, [3.0]), (1, 2, 0, [1.0]), (2, 0, 1, [2.0])]]


def test_all_reduce_average_keeps_the_dtype():
    outs, hops = ring_all_reduce([np.float32([1, 2]), np.float32([3, 4])], (0, 1), _add, 2.0, 0)
    assert [o.tolist() for o in outs] == [[2.0, 3.0]] * 2 and outs[1].dtype == np.float32
    assert [h["phase"] for h in hops] == ["reduce-scatter", "all-gather"]


def test_all_reduce_keeps_values_up_to_its_limit():
    """keep is a size limit: chunks of 2 are recorded under keep = 2 and dropped under keep = 1."""
    x0, x1 = np.array([1.0, 2.0, 3.0, 4.0]), np.array([10.0, 20.0, 30.0, 40.0])
    outs, hops = ring_all_reduce([x0, x1], (0, 1), _add, None, 2)
    assert [o.tolist() for o in outs] == [[11.0, 22.0, 33.0, 44.0]] * 2
    # reduce-scatter: member 0 passes its chunk 1, member 1 its chunk 0; all-gather: the sums come back
    assert [[t["value"] for t in h["transfers"]] for h in hops] == [[[3.0, 4.0], [10.0, 20.0]],
                                                                     [[11.0, 22.0], [33.0, 44.0]]]
    _, hops = ring_all_reduce([x0, x1], (0, 1), _add, None, 1)
    assert [t["value"] for h in hops for t in h["transfers"]] == [None] * 4


def test_the_kernel_plays_the_steps_it_is_given():
    """The ring the other way round, written out by hand for 3 members: member i sends to i-1. Reduce-scatter:
    at step k member i sends chunk i+1+k (so member i still ends up with chunk i); all-gather: chunk i+k.
    The kernel follows it: the hops go backwards and the sums are the same."""
    to, source = (2, 0, 1), (1, 2, 0)
    mirrored = (RingStep("reduce-scatter", 0, True, (1, 2, 0), to, (2, 0, 1), source),
                RingStep("reduce-scatter", 1, True, (2, 0, 1), to, (0, 1, 2), source),
                RingStep("all-gather", 0, False, (0, 1, 2), to, (1, 2, 0), source),
                RingStep("all-gather", 1, False, (1, 2, 0), to, (2, 0, 1), source))
    xs = [np.array([1.0, 2.0, 3.0]) * 10 ** i for i in range(3)]
    outs, hops = ring_all_reduce(xs, (5, 6, 7), _add, None, 8, mirrored)
    assert [o.tolist() for o in outs] == [[111.0, 222.0, 333.0]] * 3
    assert [[(t["src"], t["dst"], t["chunk"], t["value"]) for t in h["transfers"]] for h in hops] == [
        [(5, 7, 1, [2.0]), (6, 5, 2, [30.0]), (7, 6, 0, [100.0])],
        [(5, 7, 2, [33.0]), (6, 5, 0, [110.0]), (7, 6, 1, [202.0])],  # running sums: own part + what came
        [(5, 7, 0, [111.0]), (6, 5, 1, [222.0]), (7, 6, 2, [333.0])],
        [(5, 7, 1, [222.0]), (6, 5, 2, [333.0]), (7, 6, 0, [111.0])]]
    outs, _ = ring_reduce_scatter(xs, (5, 6, 7), 0, _add, None, 0, mirrored[:2])
    assert [o.tolist() for o in outs] == [[111.0], [222.0], [333.0]]
