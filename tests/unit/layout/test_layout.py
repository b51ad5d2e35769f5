"""Layouts: Megatron-Core's groups, the post's 16-GPU map, validation, the CLI and ctx.groups."""
import json

import pytest
from conftest import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import parasim
from parasim.layout import GROUP_NAMES, Layout, LayoutError, ModelSpec as Model
from parasim.layout import PRESETS, preset


def test_the_posts_16_gpu_map():
    g = preset("moe16").groups()
    node_a = lambda name: [x for x in g[name] if max(x) < 8]  # noqa: E731
    assert node_a("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert node_a("cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert node_a("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert node_a("dp-cp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert node_a("ep") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert g["expert-dp"] == g["dp"]
    assert g["pp"] == [[i, i + 8] for i in range(8)]
    assert g["expert-tp"] == [[r] for r in range(16)]
    layout = preset("moe16")
    assert [layout.experts_of(layout.coords()[r]["ep"]) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]


layouts = st.builds(
    lambda tp, cp, pp, dp, ep, etp, pp_last: _fit(tp, cp, pp, dp, ep, etp, pp_last),
    st.sampled_from([1, 2, 3, 4]), st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 3, 4]),
    st.sampled_from([1, 2, 3, 4, 6]), st.sampled_from([1, 2, 3, 4, 6]), st.sampled_from([None, 1, 2, 3]),
    st.booleans())


def _fit(tp, cp, pp, dp, ep, etp, pp_last):
    try:
        return Layout(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=etp,
                      order="tp-cp-ep-dp-pp" if pp_last else "tp-cp-ep-pp-dp")
    except LayoutError:
        return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(layouts)
def test_groups_partition_the_world_and_coords_index_them(layout):
    if layout is None:
        return
    groups, coords = layout.groups(), layout.coords()
    assert list(groups) == list(GROUP_NAMES)
    for name, lists in groups.items():
        if name in ("embedding", "position-embedding"):
            continue
        assert sorted(r for g in lists for r in g) == list(range(layout.world)), name
        assert all(g == sorted(g) for g in lists)
    for c in coords:
        for key, kind in (("tp", "tp"), ("cp", "cp"), ("dp", "dp"), ("pp", "pp"), ("ep", "ep"),
                          ("etp", "expert-tp"), ("edp", "expert-dp")):
            (mine,) = [g for g in groups[kind] if c["rank"] in g]
            assert mine.index(c["rank"]) == c[key]
    if layout.order == "tp-cp-ep-dp-pp":  # Megatron's closed form for the default order
        t, cp, dp = layout.tp, layout.cp, layout.dp
        assert all(c["rank"] == c["tp"] + t * (c["cp"] + cp * (c["dp"] + dp * c["pp"])) for c in coords)


megatron = pytest.importorskip  # (used below, per test, so the rest runs without megatron-core)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(layouts)
def test_groups_equal_megatron_cores(layout):
    megatron("megatron.core")
    if layout is None:
        return
    from megatron_ref import megatron_groups
    theirs = megatron_groups(layout.tp, layout.cp, layout.pp, layout.ep, layout.etp, layout.world, layout.order)
    assert theirs == list(layout.groups().items())  # kinds in creation order, groups in order


@pytest.mark.slow
@pytest.mark.parametrize("name", ["moe16", "27b-tp4-sp-cp2", "27b-tp8-sp-pp2"])
def test_presets_equal_megatron_cores(name):
    megatron("megatron.core")
    from megatron_ref import megatron_groups
    layout = preset(name)
    assert megatron_groups(layout.tp, layout.cp, layout.pp, layout.ep, layout.etp, layout.world,
                           layout.order) == list(layout.groups().items())


@pytest.mark.parametrize("kwargs, rule", [
    (dict(tp=0), "tp must be a positive integer"),
    (dict(tp=3, world=8), "world 8 is not divisible by tp*cp*pp = 3"),
    (dict(tp=2, dp=2, world=8), "dp 2 does not fit"),
    (dict(tp=2, world=8, ep=3, model=Model(experts=6)), "not divisible by etp*ep*pp = 6"),
    (dict(order="tp-cp-xx-dp-pp"), "unknown word 'xx' in order"),
    (dict(order="pp-tp-cp-ep-dp"), "not one Megatron-Core builds"),
    (dict(pp=2, etp=1, tp=2, world=8, order="tp-cp-ep-pp-dp"), "needs edp == dp"),
    (dict(tp=4, model=Model(heads=6)), "heads 6 do not divide by tp 4"),
    (dict(tp=8, model=Model(heads=24, kv_heads=12)), "kv-heads 12 do not divide by tp 8"),
    (dict(tp=8, model=Model(heads=24, kv_heads=3)), "tp 8 does not divide by kv-heads 3"),
    (dict(ep=4, world=4, model=Model(experts=6)), "experts 6 do not divide by ep 4"),
    (dict(ep=2, world=2, model=Model(layers=2)), "needs a model with experts"),
    (dict(pp=4, model=Model(layers=30)), "layers 30 do not divide by pp 4"),
    (dict(cp=2, model=Model(seq=6)), "does not divide by 2*cp = 4"),
    (dict(tp=2, model=Model(experts=4)), "needs sequence parallelism"),
    (dict(tp=2, model=Model(experts=2)), "needs sequence parallelism"),
])
def test_each_rule_names_itself(kwargs, rule):
    with pytest.raises(LayoutError, match=rule.replace("*", r"\*")):
        Layout(**kwargs)


def test_valid_model_rules_pass():
    Layout(tp=8, model=Model(heads=32, kv_heads=4))  # each kv head on two ranks
    Layout(tp=2, model=Model(heads=8, kv_heads=4))  # two whole kv heads per rank
    Layout(tp=4, model=Model(heads=8, kv_heads=4))  # one each
    Layout(cp=1, model=Model(seq=7))  # no CP: any length
    Layout(tp=2, model=Model(experts=1))  # one expert is a dense MLP: no SP needed
    Layout(model=Model(experts=4))  # MoE without TP needs no SP
    Layout(tp=2, cp=2, sp=True, zigzag=False, model=Model(seq=8, experts=4))  # 2 tokens per (cp, tp) rank
    assert all(isinstance(p.layout, Layout) for p in PRESETS.values() if p.layout is not None)


@pytest.mark.parametrize("kwargs, rule", [
    (dict(heads=8, kv_heads=6), "heads 8 do not divide by kv-heads 6"),
    (dict(hidden=10, heads=4), "hidden 10 does not divide by heads 4"),
    (dict(experts=4, top_k=5), "top-k must be between 1 and experts 4"),
    (dict(layers=2, dense_layers=3), "dense layers 3 exceed layers 2"),
    (dict(seq=0), "model seq must be a positive integer"),
])
def test_model_rules_hold_before_any_layout(kwargs, rule):
    """A model's own rules (no layout needed) raise LayoutError when the model is made."""
    with pytest.raises(LayoutError, match=rule):
        Model(**kwargs)


def _cli(*args):
    return cli("layout", *args)


def test_cli_json_is_exactly_the_documented_shape():
    out = _cli("--tp", "2", "--cp", "2", "--pp", "2", "--dp", "2", "--ep", "4", "--etp", "1", "--sp",
               "--experts", "8", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) == {"layout", "groups", "coords"}
    assert set(data["layout"]) == {"tp", "cp", "pp", "dp", "ep", "etp", "edp", "world", "order"}
    assert list(data["groups"]) == list(GROUP_NAMES)
    assert set(data["coords"][0]) == {"rank", "tp", "cp", "dp", "pp", "ep", "etp", "edp"}
    assert data == json.loads(json.dumps(preset("moe16").to_json()))


def test_cli_megatron_words_and_order_flag():
    a = json.loads(_cli("--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                        "--world-size", "8", "--use-tp-pp-dp-mapping", "--json").stdout)
    assert a["layout"]["order"] == "tp-cp-ep-pp-dp" and a["groups"]["pp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_cli_bad_layout_is_one_line_exit_2():
    out = _cli("--tp", "3", "--world", "8")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "not divisible by tp*cp*pp = 3" in out.stderr
    out = _cli("--layout", "nope")
    assert out.returncode == 2 and "unknown layout" in out.stderr


def test_cli_draws_moe16_with_both_nodes_groups_and_experts():
    out = _cli("--layout", "moe16")
    assert out.returncode == 0
    text = out.stdout
    assert "node 0" in text and "node 1" in text and "E7 E8" in text
    assert "[0,2,4,6]" in text and "expert-dp" in text and "[0,8]" in text


def test_ctx_groups_and_coords_on_virtual_ranks():
    layout = preset("moe16")

    def prog(ctx):
        ctx.comm.all_reduce(ctx.asarray([1.0]), group=ctx.groups["dp-cp"])
        return ctx.coords.tp, ctx.coords.ep, ctx.groups["tp"].ranks, ctx.groups["expert-dp"].ranks

    res = parasim.run(prog, layout=layout)
    assert res.values[2] == (0, 2, (2, 3), (2, 6))
    assert res.values[13] == (1, 1, (12, 13), (9, 13))
    made = [g.name for g in res.trace.groups[1:]]
    assert made == [name for name, lists in layout.groups().items() for _ in lists]


def layout_program(ctx):
    x = ctx.asarray([float(ctx.rank)])
    return ctx.comm.all_reduce(x, group=ctx.groups["dp"]), ctx.coords.dp, ctx.groups["tp"].ranks


@pytest.mark.slow
def test_ctx_groups_on_real_ranks():
    pytest.importorskip("torch")
    layout = Layout(tp=2, dp=2)
    real = parasim.run(layout_program, layout=layout, backend="gloo")
    virtual = parasim.run(layout_program, layout=layout)
    assert [(v[0].tolist(), v[1], v[2]) for v in real.values] == [(v[0].tolist(), v[1], v[2]) for v in virtual.values]


@pytest.mark.parametrize("kwargs, text", [
    (dict(), "one GPU"),
    (dict(tp=2, sp=True), "TP2 +SP on 2 GPUs"),
    (dict(tp=2, cp=3, pp=4, dp=5), "TP2 x CP3 x PP4 x DP5 on 120 GPUs"),
    (dict(dp=2, ep=2, model=Model(experts=4)), "DP2 x ETP1 x EP2 x EDP1 on 2 GPUs"),
    (dict(tp=2, etp=1, dp=2), "TP2 x DP2 x ETP1 x EP1 x EDP4 on 4 GPUs"),  # expert TP differs from TP
    (dict(tp=2, etp=2, dp=2), "TP2 x DP2 on 4 GPUs"),
])
def test_str_names_every_axis_above_one(kwargs, text):
    assert str(Layout(**kwargs)) == text


def test_experts_of_without_experts_is_empty():
    assert Layout().experts_of(0) == []
    assert Layout(model=Model(layers=2)).experts_of(0) == []
    assert Layout(ep=2, world=2, model=Model(experts=6)).experts_of(1) == [3, 4, 5]


@pytest.mark.parametrize("pp, pp_groups, embedding", [
    (1, [[0], [1]], [[0], [1]]),  # one stage holds both ends
    (2, [[0, 2], [1, 3]], [[0, 2], [1, 3]]),
    (3, [[0, 2, 4], [1, 3, 5]], [[0, 4], [1, 5]])])  # the middle stage has no embedding
def test_embedding_groups_by_hand(pp, pp_groups, embedding):
    """DP 2, pp outermost: a pipeline is one DP rank's stages; the embedding group is its first and last
    stage (tied input and output embeddings), the position-embedding group its first alone."""
    groups = Layout(pp=pp, dp=2).groups()
    assert groups["pp"] == pp_groups and groups["embedding"] == embedding
    assert groups["position-embedding"] == [[0], [1]]


def test_sizes_must_be_whole_numbers():
    with pytest.raises(LayoutError, match="tp must be a positive integer"):
        Layout(tp=2.5)


def test_the_edp_rule_of_the_second_order_needs_pp():
    """With pp not last in the order, Megatron-Core wants edp == dp only when there is a pipeline."""
    lay = Layout(dp=4, ep=2, order="tp-cp-ep-pp-dp")
    assert (lay.dp, lay.edp) == (4, 2)
    with pytest.raises(LayoutError, match="needs edp == dp"):
        Layout(dp=4, ep=2, pp=2, order="tp-cp-ep-pp-dp")


def test_the_post_s_8_gpu_folding_example_lays_out_with_etp_1():
    """`layout --tp 2 --dp 4 --ep 8 --world 8 --sp --experts 8` (the post's parallel folding: attention TP 2 x
    DP 4, MoE ETP 1 x EP 8 x EDP 1) takes etp 1 by default, as `parasim trace` does; the Layout API, which
    follows Megatron (etp = tp when not given), says so when that default is what does not divide."""
    out = _cli("--tp", "2", "--dp", "4", "--ep", "8", "--world", "8", "--sp", "--experts", "8", "--json")
    assert out.returncode == 0, out.stderr
    lay = json.loads(out.stdout)["layout"]
    assert (lay["etp"], lay["ep"], lay["edp"]) == (1, 8, 1)
    from parasim.errors import LayoutError
    with pytest.raises(LayoutError, match="etp was not given, so it follows tp = 2"):
        Layout(tp=2, dp=4, ep=8, world=8)


def test_layout_counts_pipeline_stages_from_1_as_trace_does():
    text = _cli("--layout", "moe16").stdout
    assert "pipeline stage 1 (pp rank 0)" in text and "pipeline stage 2 (pp rank 1)" in text
    assert "pipeline stage 0" not in text


@pytest.mark.parametrize("width", [60, 100, 200])
def test_layout_takes_the_pages_width(width):
    """Issue 53: `parasim layout` wrapped at 80 columns into a pipe, whatever the reader's page; --width holds
    every line of the drawing to N characters (a node's panel filling it), and a width below 60 is refused."""
    out = cli("layout", "--tp", "2", "--cp", "2", "--pp", "2", "--dp", "2", "--ep", "4", "--sp", "--width", str(width))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(map(len, lines)) == width  # the node panels span the page
    assert "EP4 x EDP2" in out.stdout.replace("\n", " ")
    if width >= 100:  # the title's two views on one line
        assert any("attention view" in line and "EDP2" in line for line in lines)
    bad = cli("layout", "--tp", "2", "--width", "59")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "at least 60" in bad.stderr
