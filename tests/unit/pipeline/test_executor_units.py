"""pipeline/executor.py and examples/pipeline.py on the smallest pipelines, fast: what each slot's exchange
sends and says, and every schedule's loss, gradients and step equal to the unsplit model's (split backward
passes included: zb-h1 and zbv run B as I then W)."""
import pytest

import parasim
from parasim.examples.pipeline import matches_unsplit, pipeline_run, unsplit_program

BYTES = 256  # one activation or gradient: examples/pipeline.py's sequence x batch x hidden, in float64


def test_each_exchange_sends_one_activation_or_gradient_and_says_which():
    res = parasim.run(lambda ctx: pipeline_run(ctx, "1f1b", 2), 2)
    p2p = [(e.label, e.params, [(m.rank, m.sent, m.recv) for m in e.members]) for e in res.trace.events]
    assert p2p == [
        ("slot 1: send activation 1 (stage 1 -> 2)", {"src": 0, "dst": 1}, [(0, BYTES, 0), (1, 0, BYTES)]),
        ("slot 2: send activation 2 (stage 1 -> 2)", {"src": 0, "dst": 1}, [(0, BYTES, 0), (1, 0, BYTES)]),
        ("slot 3: send gradient 1 (stage 2 -> 1)", {"src": 1, "dst": 0}, [(1, BYTES, 0), (0, 0, BYTES)]),
        ("slot 5: send gradient 2 (stage 2 -> 1)", {"src": 1, "dst": 0}, [(1, BYTES, 0), (0, 0, BYTES)]),
    ]
    assert [v["has_loss"] for v in res.values] == [False, True]


@pytest.mark.parametrize("schedule, ranks, m", [("1f1b", 2, 2), ("gpipe", 2, 3), ("zb-h1", 2, 2), ("zbv", 2, 2),
                                                ("interleaved", 2, 2)])
def test_every_schedule_trains_as_the_unsplit_model(schedule, ranks, m):
    res = parasim.run(lambda ctx: pipeline_run(ctx, schedule, m), ranks)
    stages = len({s for v in res.values for s in v["grad_sq"]})
    checks = matches_unsplit(res.values, stages, m)
    assert len(checks) == 3 and all(c.ok for c in checks), checks


def test_the_unsplit_program_runs_every_layer_on_one_rank():
    (out,) = parasim.run(unsplit_program(3, 2), 1).values
    assert sorted(out) == ["grad_sq", "loss", "stepped"]
    assert sorted(out["grad_sq"]) == sorted(out["stepped"]) == [0, 1, 2]
    assert all(v > 0 for v in out["grad_sq"].values()) and out["loss"] > 0
    pipe = parasim.run(lambda ctx: pipeline_run(ctx, "gpipe", 2), 3).values
    assert pipe[2]["loss"] == pytest.approx(out["loss"], rel=1e-12)


def test_a_middle_stage_names_each_transfer_of_a_slot_alone_on_the_pipeline_group():
    """Three stages: in slot 2 the middle rank receives activation 2 and sends activation 1 on, in one
    exchange; each transfer is an event named by what it carries alone (the send on from rank 1 once carried
    both words). Every exchange is on the pipeline's group and tagged with its slot."""
    res = parasim.run(lambda ctx: pipeline_run(ctx, "1f1b", 3), 3)
    by_pair = {(e.tags["slot"], e.params["src"], e.params["dst"]): e.label for e in res.trace.events}
    assert by_pair[(2, 0, 1)] == "slot 2: send activation 2 (stage 1 -> 2)"
    assert by_pair[(2, 1, 2)] == "slot 2: send activation 1 (stage 2 -> 3)"
    assert by_pair[(6, 1, 2)] == "slot 6: send activation 3 (stage 2 -> 3)"
    assert by_pair[(6, 2, 1)] == "slot 6: send gradient 2 (stage 3 -> 2)"
    assert not any("," in label for label in by_pair.values())
    for e in res.trace.events:
        assert e.group.name == "pp" and e.tags == {"slot": int(e.label.split(":")[0].split()[1])}, e.label
