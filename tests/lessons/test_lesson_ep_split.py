"""The ep-split lesson: one MoE layer of 256 experts, top 8, at EP 8. Its checks hold, and its figures are
re-derived here from the layer's inputs alone: the routing by numpy (top 8 of the router's scores), each
GPU's 32 experts and the rows and bytes of the dispatch by counting, the output and every gradient by torch
autograd (float64), the ZeRO-3 bytes from the shapes. Nothing expected is read from the lesson's own code;
only the layer's inputs (its weights and tokens) are taken from it."""

import importlib.util
import json

import numpy as np
import pytest
from conftest import cli

import parasim
from parasim.lesson import get_lesson, run_lesson

H, F, E, K, WORLD, T, B = 16, 8, 256, 8, 8, 4, 8  # the lesson's sizes, as its docstring states them


@pytest.fixture(scope="module")
def ran():
    return run_lesson(get_lesson("ep-split"))


@pytest.fixture(scope="module")
def inputs():
    """The layer's weights and tokens, made by the lesson's own `weights` on one rank (inputs, not answers)."""
    spec = importlib.util.spec_from_file_location("ep_split_lesson", get_lesson("ep-split").source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    w = parasim.run(module.weights, 1).values[0]
    return {
        "router": np.asarray(w["router"]),
        "w1": np.stack([np.asarray(e["w1"]) for e in w["experts"]]),
        "w2": np.stack([np.asarray(e["w2"]) for e in w["experts"]]),
        "x": np.stack([np.asarray(a) for a in w["x"]]),
        "dy": np.stack([np.asarray(a) for a in w["dy"]]),
    }


def top8(inputs) -> np.ndarray:
    """[GPU, token, 8]: each token's experts, best first, by its router scores."""
    scores = inputs["x"] @ inputs["router"]
    return np.argsort(-scores, axis=-1, kind="stable")[..., :K]


def table(ran, start: str) -> dict:
    t = next(t for t in ran.tables if t.title.startswith(start))
    return {label: dict(zip(t.columns[1:], values)) for label, values in t.rows}


def test_every_check_holds(ran):
    assert ran.ok, [c.name for c in ran.checks if not c.ok]
    assert len(ran.checks) >= 12


def test_each_gpu_holds_256_over_8_experts_in_order(ran):
    per = E // WORLD
    rows = table(ran, "The layer's 256 experts")
    assert list(rows) == [f"g{r}" for r in range(WORLD)]
    for r in range(WORLD):
        assert rows[f"g{r}"]["count"] == per == 32
        assert rows[f"g{r}"]["experts held"] == f"E{r * per + 1}-E{(r + 1) * per}"


def test_the_followed_token_goes_once_to_each_of_the_four_gpus_of_its_eight_experts(ran, inputs):
    picks = top8(inputs)[1, 1]  # t2 of g1
    owners = sorted(set((picks // (E // WORLD)).tolist()))
    assert len(owners) == 4 and 1 not in owners  # four GPUs, none of them its own: four rows leave g1
    where = table(ran, "Where t2 of g1 goes")
    assert list(where) == [f"g{g}" for g in owners]
    for g in owners:
        here = sorted(int(e) + 1 for e in picks if e // (E // WORLD) == g)
        assert where[f"g{g}"]["its experts there"] == " ".join(f"E{e}" for e in here)
        assert where[f"g{g}"]["rows sent"] == 1  # however many of its experts the GPU holds
        assert where[f"g{g}"]["bytes out"] == (H + E // WORLD) * B and where[f"g{g}"]["bytes back"] == H * B
    # its GPU's dispatch: a row per (token, other GPU holding one of its picks), d values and 32 gates each
    (dispatch,) = [e for e in ran.result.trace.events if e.op == "all_to_all" and e.phase == "dispatch"]
    counts = [c.shape[0] for c in dispatch.member(1).ins]
    mine = top8(inputs)[1] // (E // WORLD)  # [token, 8]: g1's tokens' GPUs
    assert counts == [int((mine == d).any(axis=1).sum()) for d in range(WORLD)]


def test_dispatch_and_combine_bytes_by_counting_rows(ran, inputs):
    owners = top8(inputs) // (E // WORLD)  # [GPU, token, 8]
    crossing = [sum(int((owners[s] == d).any(axis=1).sum()) for d in range(WORLD) if d != s) for s in range(WORLD)]
    sent = {
        p: sum(m.sent for e in ran.result.trace.events if e.op == "all_to_all" and e.phase == p for m in e.members)
        for p in ("dispatch", "combine", "backward")
    }
    assert sent["dispatch"] == sum(crossing) * (H + E // WORLD) * B
    assert sent["combine"] == sum(crossing) * H * B
    assert sent["backward"] == sent["dispatch"] + sent["combine"]
    mirror = table(ran, "Mirror images")
    assert mirror["EP: dispatch + combine (the run)"]["bytes"] == sent["dispatch"] + sent["combine"]
    # ZeRO-3 instead: each of 8 GPUs sends its 32 experts' two h x f matrices to 7 others
    zero3 = WORLD * (WORLD - 1) * (E // WORLD) * 2 * H * F * B
    assert mirror["ZeRO-3: gather every expert to every GPU"]["bytes"] == zero3 == 3_670_016
    assert zero3 > 10 * (sent["dispatch"] + sent["combine"])



def test_the_post_s_formulas_at_this_size_beside_the_run(ran, inputs):
    """The post's 'numbers' at E 256, P_e = 2 x 16 x 8, EP 8, T 4, K 8, d 16, float64: experts a GPU holds
    256 x 256 / 8 = 8,192 values; all-to-alls forward 2 x 4 x 8 x 16 x 8 x 7/8 = 7,168 B; TP's two all-reduces
    2 x 4 x 16 x 8 x 2 x 7/8 = 1,792 B. The run's all-to-all: rows counted from numpy's top 8, each out as 16
    values and 32 gates, back as 16 values; the gates' bytes are half of it (32 of 64 values a row, out and back),
    and 8 gates a row instead of 32 would shrink the dispatch to (16 + 8) / (16 + 32) of it."""
    rows = table(ran, "The post's EP numbers")
    memory, a2a, tp = rows.values()
    assert memory["the post's formula"] == "E x P_e/(EP x ETP x PP)"
    assert memory["at this size"] == memory["the run"] == 256 * 2 * 16 * 8 // 8 == 8192
    assert a2a["at this size"] == 2 * 4 * 8 * 16 * 8 * 7 // 8 == 7168
    owners = top8(inputs) // (E // WORLD)
    crossing = sum(int((owners[s] == d).any(axis=1).sum()) for s in range(WORLD) for d in range(WORLD) if d != s)
    assert a2a["the run"] == crossing * (16 + 32 + 16) * B / WORLD
    assert tp["at this size"] == tp["the run"] == 2 * 4 * 16 * 8 * 2 * 7 // 8 == 1792
    (t,) = [t for t in ran.tables if t.title.startswith("The post's EP numbers")]
    gates = crossing * 32 * B
    assert f"{gates:,} of the {crossing * 64 * B:,} bytes forward (50%; 67% of the dispatch)" in t.notes[1]
    assert f"this dispatch {crossing * 24 * B:,} bytes, not {crossing * 48 * B:,}" in t.notes[1]
    assert "parasim's packing" in t.notes[1] and f"r = {crossing / (WORLD * T):.2f}" in t.notes[0]

def test_output_and_gradients_equal_torch_autograd_on_one_device(ran, inputs):
    torch = pytest.importorskip("torch")
    t = lambda a: torch.tensor(a, dtype=torch.float64, requires_grad=True)  # noqa: E731
    x, router, w1, w2 = t(inputs["x"].reshape(-1, H)), t(inputs["router"]), t(inputs["w1"]), t(inputs["w2"])
    scores = x @ router
    top = torch.topk(scores, K, dim=1).indices
    gates = torch.softmax(torch.gather(scores, 1, top), dim=1)
    y = torch.zeros_like(x)
    for j in range(K):
        e = top[:, j]
        h = torch.einsum("th,thf->tf", x, w1[e])
        y = y + gates[:, j : j + 1] * torch.einsum("tf,tfh->th", torch.nn.functional.gelu(h, approximate="tanh"), w2[e])
    dy = torch.tensor(inputs["dy"].reshape(-1, H), dtype=torch.float64)
    (y * dy).sum().backward()
    got_y = np.concatenate([np.asarray(v["y"]) for v in ran.result.values])
    got_dx = np.concatenate([np.asarray(v["dx"]) for v in ran.result.values])
    np.testing.assert_allclose(got_y, y.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got_dx, x.grad.numpy(), rtol=1e-11, atol=1e-13)
    # the gradients as the run gives them: a probe (a fixed random array's dot) of each, made the lesson's way
    probes = parasim.run(
        lambda ctx: {
            k: ctx.shared_rng(f"probe.{k}").normal(s)
            for k, s in [("router", (H, E))]
            + [(f"expert{e + 1}.w{i}", (H, F) if i == 1 else (F, H)) for e in range(E) for i in (1, 2)]
        },
        1,
    ).values[0]
    got = {}
    for v in ran.result.values:
        for k, g in v["grads"].items():
            got[k] = got.get(k, 0.0) + g  # the router's partial sums add up; each expert is on one GPU
    assert got["router"] == pytest.approx(float((router.grad.numpy() * probes["router"]).sum()), rel=1e-11)
    for e in range(E):
        for i, g in ((1, w1.grad[e]), (2, w2.grad[e])):
            key = f"expert{e + 1}.w{i}"
            assert got[key] == pytest.approx(float((g.numpy() * probes[key]).sum()), rel=1e-10, abs=1e-12), key


def test_its_phases_are_the_four_steps_then_backward(ran):
    phases = [m.text for m in ran.result.trace.marks if m.kind == "phase" and m.rank == 0]
    assert phases == ["route", "dispatch", "compute", "combine", "backward"]
    a2a = [(e.phase, len(e.ranks)) for e in ran.result.trace.events if e.op == "all_to_all"]
    assert a2a == [("dispatch", 8), ("combine", 8), ("backward", 8), ("backward", 8)]


def test_json_and_list(tmp_path):
    out = cli("lesson", "ep-split", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert all(c["ok"] for c in doc["checks"]) and len(doc["tables"]) == 5
    rows = {r["name"]: r for r in json.loads(cli("lesson", "--list", "--json").stdout)}
    assert rows["ep-split"]["section"].startswith("Expert parallelism") and rows["ep-split"]["no_picture"]
