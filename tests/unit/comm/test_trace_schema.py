"""A trace file from anywhere: every bad field is named by its path, in one line, exit 2; a good trace
loads back unchanged."""
import copy
import json

import pytest

import parasim
from parasim import UsageError
from parasim.cli import main
from parasim.comm.trace import Trace


def _prog(ctx):
    ctx.phase("fwd")
    ctx.compute("matmul", 4.0)
    ctx.comm.all_reduce(ctx.asarray([1.0, 2.0]), algo="ring", label="grads")
    if ctx.rank == 0:
        ctx.comm.send(ctx.asarray([1.0]), 1)
    else:
        ctx.comm.recv(0, (1,), "float64")


GOOD = json.loads(parasim.run(_prog, 2, keep_values=4).trace.to_json())


def _set(d: dict, path: str, value) -> dict:
    d = copy.deepcopy(d)
    *head, last = path.split(".")
    node = d
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node[k]
    if isinstance(node, list):
        node[int(last)] = value
    elif value is KeyError:
        del node[last]
    else:
        node[last] = value
    return d


def test_a_good_trace_loads_back_unchanged():
    assert Trace.from_dict(copy.deepcopy(GOOD)).to_dict() == GOOD
    # the events used below are what the program made: a compute, the all-reduce, the transfer
    assert [e["kind"] for e in GOOD["events"]] == ["compute", "compute", "collective", "p2p"]


BAD = [
    ("world", 0, "world: expected an integer from 1 to 65,536, got 0"),
    ("world", -3, "world: expected an integer from 1 to 65,536, got -3"),
    ("world", "2", "world: expected an integer from 1 to 65,536, got '2'"),
    ("world", 10**12, "world: expected an integer from 1 to 65,536, got 1000000000000"),
    ("world", True, "world: expected an integer"),
    ("events", {}, "events: expected a list"),
    ("groups.0.ranks", [0, 5], "groups[0].ranks[1]: expected an integer from 0 to 1, got 5"),
    ("groups.0.ranks", [1, 1], "groups[0].ranks: expected distinct ranks"),
    ("marks.0.kind", "shout", "marks[0].kind: expected phase, note, held, tensor or work, got 'shout'"),
    ("marks.0.rank", 2, "marks[0].rank: expected an integer from 0 to 1, got 2"),
    ("marks.0.extra", 1, "marks[0]: unknown field 'extra'"),
    ("events.2.kind", "magic", "events[2].kind: expected one of collective, p2p, compute, got 'magic'"),
    ("events.2.op", "all_sum", "events[2].op: 'all_sum' is not a collective operation"),
    ("events.3.op", "all_reduce", "events[3].op: 'all_reduce' is not a p2p operation"),
    ("events.2.step", 10**12, "events[2].step: expected an integer from 0 to 4, got 1000000000000"),
    ("events.2.members.1.rank", 9, "events[2].members[1].rank: expected an integer from 0 to 1, got 9"),
    ("events.2.members.0.sent", -1, "events[2].members[0].sent: expected an integer at least 0, got -1"),
    ("events.2.members.0.in", [{"shape": [-2], "dtype": "float64"}], "events[2].members[0].in[0].shape[0]"),
    ("events.2.members.0.site", None, "events[2].members[0].site: expected a string, got None"),
    ("events.2.label", 7, "events[2].label: expected a string or null, got 7"),
    ("events.2.group", KeyError, "events[2].group: expected an object, got None"),
    ("events.3.params", [1], "events[3].params: expected an object or null"),
]


def _nested(levels: int) -> list:
    v: list = []
    for _ in range(levels - 1):
        v = [v]
    return v


_SENDER = GOOD["events"][3]["members"][0]
# every check of an event, its params, hops, times and tags, and of the file's top, named by its path: the
# messages are written out from the schema's rules (a field's path, what it should be, what it was)
BAD += [
    ("backend", 5, "backend: expected a string, got 5"),
    ("meta", 5, "meta: expected an object, got 5"),
    ("meta", {"lesson": 5}, "meta.lesson: expected a lesson's name, got 5"),
    ("meta", {"tail_gemms": 5}, "meta.tail_gemms: expected a list, got 5"),
    ("meta", {"tail_gemms": [[]]}, "meta.tail_work: expected a list, got None"),
    ("meta", {"tail_gemms": [[]], "tail_work": []}, "meta.tail_gemms: one list per rank of meta.tail_work"),
    ("meta", {"tail_gemms": [[["matmul", 1, 1, 0, 1]]], "tail_work": [0]},
     "meta.tail_gemms[0][0][3]: expected an integer at least 1, got 0"),
    ("meta", {"x": _nested(99)}, "meta.x[0]"),  # meta is level 2: 99 lists inside reach level 101
    ("groups", 5, "groups: expected a list, got 5"),
    ("groups.0.index", 1, "groups[0].index: expected 0, got 1 (groups are listed in the order they were made, "
     "numbered 0, 1, 2, ...)"),
    ("marks", 5, "marks: expected a list, got 5"),
    ("events.2", 5, "events[2]: expected an object, got 5"),
    ("events.2.seq", 3, "events[2].seq: expected 2, got 3 (events are listed in the order they completed, "
     "numbered 0, 1, 2, ...)"),
    ("events.2.seq", 5, "events[2].seq: expected an integer from 0 to 4, got 5"),
    ("events.2.seq", "2", "events[2].seq: expected an integer from 0 to 4, got '2'"),
    ("events.2.step", -1, "events[2].step: expected an integer from 0 to 4, got -1"),
    ("events.2.kind", 5, "events[2].kind: expected one of collective, p2p, compute, got 5"),
    ("events.2.op", 3, "events[2].op: expected a string, got 3"),
    ("events.2.group.name", "tp", "events[2].group: 'tp' [0, 1] is not groups[0] (an event's group is one of "
     "the trace's groups)"),
    ("events.2.group.index", 1, "events[2].group: 'world' [0, 1] is not groups[1] (an event's group is one of "
     "the trace's groups)"),
    ("events.2.members", [], "events[2].members: ranks [] are not the group's [0, 1] (a collective's members are "
     "its group's ranks, in group order)"),
    ("events.2.members", {}, "events[2].members: expected a list, got {}"),
    ("events.3.members.1.rank", 0, "events[3].members: ranks [0, 0]; a transfer has two members, the sender then "
     "the receiver"),
    ("events.3.members.0", {**_SENDER, "in": [], "before": []}, "events[3].members: a transfer's sender has one "
     "array in and none out, its receiver none in and one out"),
    ("events.0.members", GOOD["events"][2]["members"], "events[0].members: ranks [0, 1]; a compute step has one "
     "member, the rank that ran it"),
    ("events.3.step", 1, "events[3].step: 1 is before step 2, where rank 0's previous event was (a rank's events "
     "are listed in the order its clock reached them)"),
    ("events.2.phase", 3, "events[2].phase: expected a string or null, got 3"),
    ("events.2.algo", [], "events[2].algo: expected a string or null, got []"),
    ("events.2.op", "all_gather", "events[2].params: no 'dim', which a all_gather names (sharded on dim {dim} / "
     "replicated)"),
    ("events.2.params", {"op": "sum", "x": _nested(97)}, "events[2].params.x[0]"),  # level 4, then 97 lists
    ("events.2.params.op", "mean", "events[2].params.op: expected one of sum, avg, max, min, got 'mean'"),
    ("events.2.params.dim", 99, "events[2].params.dim: expected an integer from -64 to 63, got 99"),
    ("events.2.params.dst", 5, "events[2].params.dst: expected a rank of the group [0, 1], got 5"),
    ("events.2.params.src", 5, "events[2].params.src: expected a rank of the group [0, 1], got 5"),
    ("events.3.params.dst", 0, "events[3].params: src 0 and dst 0 are not the members' ranks [0, 1] (the sender, "
     "then the receiver)"),
    ("events.0.params.flops", -1.0, "events[0].params.flops: expected a finite number of operations, at least 0, "
     "got -1.0"),
    ("events.0.params.flops", True, "events[0].params.flops: expected a finite number of operations, at least 0, "
     "got True"),
    ("events.0.params.flops", float("inf"), "events[0].params.flops: expected a finite number of operations, at "
     "least 0, got inf"),
    ("events.2.hops", {}, "events[2].hops: expected a list or null, got {}"),
    ("events.2.hops.0", 1, "events[2].hops[0]: expected an object, got 1"),
    ("events.2.hops.0.phase", 1, "events[2].hops[0].phase: expected a string, got 1"),
    ("events.2.hops.0.hop", -1, "events[2].hops[0].hop: expected an integer from 0 to 1,000,000,000,000, got -1"),
    ("events.2.hops.0.transfers", None, "events[2].hops[0].transfers: expected a list, got None"),
    ("events.2.hops.0.transfers.0", 1, "events[2].hops[0].transfers[0]: expected an object, got 1"),
    ("events.2.hops.0.transfers.0.src", 2, "events[2].hops[0].transfers[0].src: expected an integer from 0 to 1, "
     "got 2"),
    ("events.2.hops.0.transfers.0.dst", 2, "events[2].hops[0].transfers[0].dst: expected an integer from 0 to 1, "
     "got 2"),
    ("events.2.hops.0.transfers.0.chunk", -1, "events[2].hops[0].transfers[0].chunk: expected an integer from 0 "
     "to 1,000,000,000,000, got -1"),
    ("events.2.hops.0.transfers.0.bytes", -1, "events[2].hops[0].transfers[0].bytes: expected an integer at "
     "least 0, got -1"),
    ("events.2.hops.0.transfers.0.value", KeyError, "events[2].hops[0].transfers[0]: no 'value' (null where the "
     "values were not kept)"),
    ("events.2.hops.0.transfers.0.value", "x", "events[2].hops[0].transfers[0].value: expected a number or a "
     "list"),
    ("events.2.time", [], "events[2].time: expected an object, got []"),
    ("events.2.time", {"start_us": 2.0, "end_us": 1.0}, "events[2].time: ends at 1.0 us, before it starts at "
     "2.0 us"),
    ("events.2.time", {"start_us": 0, "end_us": 1, "before": [[5, 0, 1]]}, "events[2].time.before[0]: expected "
     "[rank, start_us, end_us] of one of the members [0, 1]"),
    ("events.2.time", {"start_us": 0, "end_us": 1, "before": [[0, 2, 1]]}, "events[2].time.before[0]: the "
     "compute ends before it starts"),
    ("events.2.tags", 5, "events[2].tags: expected an object or null, got 5"),
    ("events.2.tags", {"slot": -1}, "events[2].tags.slot: expected an integer from 0 to 1,000,000,000,000, "
     "got -1"),
    ("events.2.tags", {"x": _nested(97)}, "events[2].tags.x[0]"),  # level 4, then 97 lists
    ("marks.0.step", 5, "marks[0].step: expected an integer from 0 to 4, got 5"),
]


@pytest.mark.parametrize("path, value", [
    ("events.0.params", None),  # a compute step may have no params at all
    ("events.0.params", {}),  # nor flops: none counted
    ("events.2.params", {"op": "sum", "x": _nested(96)}),  # level 4, then 96 lists: level 100, the most allowed
    ("meta", {"x": _nested(98)}),  # level 2, then 98 lists
    ("events.2.tags", {"slot": 3}),
    ("events.2.tags", {"x": _nested(96)}),  # level 4, then 96 lists
    ("events.0.step", 0),  # a rank's first event may be at step 0
    ("events.3.step", 2),  # a rank's next event may be at the step of its last (rank 0's all-reduce)
    ("backend", KeyError),  # a trace written before the field: virtual ranks
    ("events.2.hops.0.transfers.0.value", None),  # values not kept
], ids=lambda v: f"{v!r:.30}")
def test_what_the_schema_allows_loads(path, value):
    """The other side of each rule: null params, a compute without flops, nesting to the very limit."""
    Trace.from_dict(_set(GOOD, path, value))


@pytest.mark.parametrize("path, value, message", BAD, ids=[f"{p}={v!r:.20}" for p, v, _ in BAD])
def test_a_bad_field_is_named(path, value, message, tmp_path, capsys):
    bad = _set(GOOD, path, value)
    with pytest.raises(UsageError) as info:
        Trace.from_dict(bad)
    assert str(info.value) == f"malformed parasim trace: {message}" or str(info.value).startswith(
        f"malformed parasim trace: {message}"), str(info.value)
    file = tmp_path / "t.json"
    file.write_text(json.dumps(bad))
    assert main(["view", str(file)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
