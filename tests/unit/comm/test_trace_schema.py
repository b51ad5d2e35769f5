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
