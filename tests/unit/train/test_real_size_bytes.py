"""At real size the bytes a learner sees are the job's: a run on symbolic ranks computes each kind of tensor in
its precision's dtype (layout/precision.py), so every event's recorded bytes are what the wire carries, and
the clock times exactly those bytes (no float64 left to convert). Held over every event of the real-size
lessons and of a Megatron job's step, with the dtype each kind of transfer must have written out by hand."""
from __future__ import annotations

import json

import pytest

from parasim.clock.costs import value_bytes, wire_scale
from parasim.lesson import get_lesson, run_lesson
from parasim.megatron.job import plan_of, read_job
from tests.conftest import cli


def _every_event_is_sent_as_timed(trace) -> None:
    """No event carries float64 (an exact run's stand-in), so the clock's bytes are the recorded ones."""
    memo = {"value_bytes": value_bytes(trace)}
    moved = [e for e in trace.events if e.kind != "compute"]
    assert moved
    for e in moved:
        dtypes = {t.dtype for m in e.members for t in (*m.ins, *m.outs)}
        assert "float64" not in dtypes, (e.label, dtypes)
        assert wire_scale(e, memo) == 1.0, e.label


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tp-across-nodes", "all-to-all-hidden", "at-scale", "node-limited", "hot-expert"])
def test_a_real_size_lessons_bytes_are_its_precisions_and_the_clocks(name):
    result = run_lesson(get_lesson(name)).result
    assert result.trace.meta["precision"] == {"name": "post", "exact": False}
    _every_event_is_sent_as_timed(result.trace)
    floats = {t.dtype for e in result.trace.events for m in e.members for t in (*m.ins, *m.outs)} - {"int64"}
    assert floats == {"bfloat16"}, floats  # the post's precision: every value moves in BF16


def _job(tmp_path, precision_flags: str) -> str:
    path = tmp_path / "job.sh"
    path.write_text(
        "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 512 --num-attention-heads 8 "
        "--seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 4 "
        "--vocab-size 1024 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel "
        f"--use-distributed-optimizer {precision_flags}\n")
    return str(path)


@pytest.mark.parametrize("flags, reduced", [("--bf16", "float32"), ("--bf16 --grad-reduce-in-bf16", "bfloat16")])
def test_a_megatron_jobs_step_sends_each_kind_in_megatrons_dtype(tmp_path, flags, reduced):
    """Megatron's --bf16 reduces FP32 gradients and gathers BF16 weights (--grad-reduce-in-bf16: BF16 both
    ways); activations move in BF16 over TP and PP."""
    from parasim.train.against import run_plan
    job = read_job(_job(tmp_path, flags))
    model = job.model_spec()
    plan = plan_of(job, model)
    trace = run_plan(model, plan, job.seq, 0)
    _every_event_is_sent_as_timed(trace)
    kinds = {(e.group.name, e.op): {t.dtype for m in e.members for t in (*m.ins, *m.outs)}
             for e in trace.events if e.kind != "compute"}
    assert kinds[("dp-cp", "reduce_scatter")] == {reduced}
    assert kinds[("dp-cp", "all_gather")] == {"bfloat16"}
    assert kinds[("tp", "all_gather")] == {"bfloat16"} and kinds[("pp", "p2p")] == {"bfloat16"}


def test_trace_of_a_megatron_job_sends_at_its_precision(tmp_path):
    """`parasim trace --megatron FILE --gpu 0`: the data-parallel reduce-scatter of a --bf16 job moves 4 bytes a
    gradient value, twice what the BF16 all-gather of the weights moves (the same values)."""
    r = cli("trace", "--megatron", _job(tmp_path, "--bf16"), "--gpu", "0", "--json")
    assert r.returncode == 0, r.stderr
    does = {(d["group"], d["op"]): d for d in json.loads(r.stdout)["does"]}
    rs, ag = does[("dp-cp", "reduce_scatter")], does[("dp-cp", "all_gather")]
    assert rs["sent"] == 2 * ag["sent"]


@pytest.mark.slow
def test_deepseek_v3s_step_on_2048_gpus_sends_at_its_precision():
    """`parasim trace --symbolic --layout deepseek-v3`'s step (PP 16 x EP 64, folded): every event sent as timed,
    in BF16 at the post's precision; at DeepSeek-V3's own, its EP dispatch in FP8 and the combine in BF16."""
    from parasim.estimate import Plan, get_model
    from parasim.train.against import run_plan
    model = get_model("deepseek-v3")
    for name, toward in (("post", "bfloat16"), ("deepseek-v3", "float8_e4m3fn")):
        trace = run_plan(model, Plan(pp=16, ep=64, dp=128, precision=name), 1024, 0)
        _every_event_is_sent_as_timed(trace)
        a2a = {e.label.split(" ", 2)[-1].split(":")[0]: {t.dtype for m in e.members for t in m.ins}
               for e in trace.events if e.op == "all_to_all"}
        assert a2a["dispatch"] == {toward} and a2a["combine"] == {"bfloat16"}, a2a
