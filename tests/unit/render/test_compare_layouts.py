"""`parasim compare layout`: the post's MoE example on several layouts, the same figures side by side, and
`compare --plot` (issue 33, build item 4). Expected values are worked out here from the layout."""
import json

import pytest
from conftest import cli

MOE16 = ("--tp", "2", "--cp", "2", "--pp", "2", "--sp", "--world", "16", "--routing", "post")


@pytest.fixture(scope="module")
def ep_4_and_8():
    out = cli("compare", "layout", *MOE16, "--ep", "4,8", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_moe16_against_its_ep_8_variant(ep_4_and_8):
    """The post's routing sends 'contract' (on g2, then g10) to E3 and E8. EP 4 puts two experts on each GPU of
    g0-g3 in order (E3 on g1, E8 on g3): both copies leave g2, 2 a layer x 4 layers. EP 8 puts one expert on each
    of g0-g7 (E3 on g2 itself, E8 on g7): one copy leaves a layer."""
    rows = ep_4_and_8["rows"]
    assert [r["settings"]["ep"] for r in rows] == [4, 8] and all(r["ok"] for r in rows)
    copies = [r["figures"]["copies the dispatch sends off the token's GPU, all layers"] for r in rows]
    assert copies == [2 * 4, 1 * 4]
    assert [r["figures"]["layer 1: its experts (on GPU)"] for r in rows] == ["E3 (g1), E8 (g3)", "E3 (g2), E8 (g7)"]
    assert "ep: bytes inside a node, all GPUs" in ep_4_and_8["differ"]
    # the busiest GPU per axis, as a lesson's compare gives it: 8 GPUs a stage over EP 8 leave each expert one
    # copy (expert-DP 1), so its gradients are summed with no one; over EP 4 two copies are summed
    busiest = [r["figures"]["bytes sent by the busiest GPU on expert-dp"] for r in rows]
    assert busiest[0] > 0 and busiest[1] == 0
    assert all(r["figures"]["loss and gradients equal the unsplit model's"] is True for r in rows)
    from parasim.render.plot_compare import plotted  # the picture draws numbers only: where experts live stays words
    drawn = plotted(rows)
    assert "copies the dispatch sends off the token's GPU, all layers" in drawn
    assert "layer 1: its experts (on GPU)" in ep_4_and_8["differ"] and "layer 1: its experts (on GPU)" not in drawn


def test_two_picks_on_one_gpu_leave_as_one_copy():
    """The dispatch sends a token once to a GPU holding two of its experts (notes as the holders leave them)."""
    from types import SimpleNamespace
    from parasim.examples.moe16_path import token_figures
    notes = [("data", 2, "", {"watch": "holds"}),
             ("forward mb1 layer 1", 2, "", {"watch": "route", "layer": 1, "experts": [3, 4], "gpus": [1, 1]}),
             ("forward mb1 layer 2", 2, "", {"watch": "route", "layer": 2, "experts": [5, 8], "gpus": [2, 3]})]
    fig = token_figures(SimpleNamespace(notes=lambda kind: notes))
    assert fig["copies the dispatch sends off the token's GPU, all layers"] == 1 + 1
    assert fig["layer 1: its experts (on GPU)"] == "E3 (g1), E4 (g1)"


def test_a_ring_over_two_nodes_crosses_on_half_its_hops():
    """DP 4 of a dense model: one ring over ranks 0-3. With 2 GPUs a node its hops 1->2 and 3->0 cross, half of
    them; with 4 a node none does. Every hop carries the same bytes."""
    out = cli("compare", "layout", "--tp", "1", "--cp", "1", "--pp", "1", "--ep", "1", "--dp", "4", "--experts", "0",
              "--gpus-per-node", "2,4", "--json")
    assert out.returncode == 0, out.stderr
    two, four = (r["figures"] for r in json.loads(out.stdout)["rows"])
    inside, across = two["dp-cp: bytes inside a node, all GPUs"], two["dp-cp: bytes across nodes, all GPUs"]
    assert across == inside > 0
    assert four["dp-cp: bytes across nodes, all GPUs"] == 0
    assert four["dp-cp: bytes inside a node, all GPUs"] == inside + across


def test_the_table_names_what_every_run_shares_and_marks_what_changes():
    out = cli("compare", "layout", *MOE16, "--ep", "4,8")
    assert out.returncode == 0, out.stderr
    assert "TP 2 CP 2 PP 2 GPUs 16" in out.stdout and "EP 4" in out.stdout and "EP 8" in out.stdout
    assert "* copies the dispatch" in out.stdout


def test_plot_draws_a_panel_per_changing_number(tmp_path):
    from matplotlib.image import imread
    from parasim.render.plot_compare import plotted
    png = tmp_path / "c.png"
    out = cli("compare", "pp-1f1b", "--pp", "2,4", "-m", "4", "--plot", str(png), "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    names = plotted(rows)
    # the bubble (a fraction) and the sends change with pp; the checks' count (words) is never drawn
    assert "bubble (idle share of the step)" in names and "checks ok" not in names
    assert imread(png).shape[0] > 100


@pytest.mark.parametrize("args, needle", [
    (("layout",), "give the layout sizes"),
    (("layout", "--tp", "3", "--world", "16"), "TP 3 GPUs 16:"),
    (("sp", "--etp", "2"), "--etp is a layout size"),
    (("sp", "--ep", "4"), "has no --ep"),  # --ep is also a lesson's setting (at-scale)
    (("layout", "--tp", "2", "--chunks", "2"), "--chunks is a lesson's setting"),
])
def test_bad_layouts_are_one_line_exit_2(args, needle):
    out = cli("compare", *args)
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1 and needle in out.stderr, out.stderr


def test_a_refused_layout_says_what_to_give():
    """The MoE rule's refusal names the flag compare takes (--sp, or --sequence-parallel, which every command
    takes), and a size left out is 1, not the example's: the refusal gives the example's own sizes."""
    sp = cli("compare", "layout", "--tp", "2", "--cp", "2", "--pp", "2", "--ep", "4", "--world", "16")
    assert sp.returncode == 2 and "add --sp (--sequence-parallel)" in sp.stderr
    for flag in ("--sp", "--sequence-parallel"):
        assert cli("compare", "layout", "--tp", "2", "--cp", "2", "--pp", "2", "--ep", "4", "--world", "16", flag,
                   "--json").returncode == 0
    left = cli("compare", "layout", "--example", "moe16", "--etp", "1,2")
    assert left.returncode == 2 and len(left.stderr.strip().splitlines()) == 1
    assert "a size not given is 1, not the example's; its own: --tp 2 --cp 2 --dp 2 --pp 2 --ep 4 --sp --world 16" in left.stderr
