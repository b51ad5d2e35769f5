"""TP and EP on the same node's links (issue 53, build item 4): attention's TP collectives and the MoE's
all-to-alls on the same 8 GPUs at the same moment, on the clock. The bytes are worked by hand; the time
together is held against each call's own time on the clock, summed here."""
import pytest

from conftest import cli

import parasim
from parasim.clock.costs import event_seconds, machine


@pytest.fixture(scope="module")
def run():
    return parasim.lesson("links-shared")


def test_every_check_holds_and_the_bytes_are_the_hand_counts(run):
    assert run.ok, [c for c in run.checks if not c.ok]
    s, d, e, b = 4096, 7168, 256, 2
    # TP: an all-gather and a reduce-scatter of the s x d activation (7/8 of it from each of 8 GPUs) and the
    # router's d x E gradient all-reduced (2 x 7/8 from each)
    tp = 8 * 2 * s * d * b * 7 // 8 + 8 * 2 * d * e * b * 7 // 8
    # EP: 4,096 tokens, 8 copies each, 7 of 8 leaving their GPU; out with d values and the 32 local gates,
    # back with d values
    copies = s * 8 * 7 // 8
    ep = copies * (d + 32) * b + copies * d * b
    study = run.lesson.study(run.result)
    assert (study["sent"]["tp"], study["sent"]["ep"]) == (tp, ep) == (873_463_808, 823_918_592)


def test_the_table_reads_the_clock(run):
    """GPU 0's calls of the paired phase, each timed alone by the clock's costs: TP's and EP's sums; together on
    one communication stream a GPU, both."""
    module_phase = next(p for p in run.lesson.narrative if "at once" in p)
    m = machine("h200", 8)
    alone = {"tp": 0.0, "ep": 0.0}
    for ev in run.result.trace.events:
        if ev.phase == module_phase and ev.kind != "compute" and 0 in ev.ranks:
            alone[ev.group.name] += event_seconds(ev, m)
    rows = dict(run.tables[0].rows)
    got = {k: v[1] for k, v in rows.items()}
    tp_row = next(k for k in got if k.startswith("TP:"))
    assert got[tp_row] == round(alone["tp"] * 1e3, 2) and got["EP's all-to-alls"] == round(alone["ep"] * 1e3, 2)
    assert got["both on the same links (the clock)"] == round((alone["tp"] + alone["ep"]) * 1e3, 2)
    assert got["if each had links of its own"] == round(max(alone.values()) * 1e3, 2)
    assert got["the paired phase, all told"] >= got["the compute they run beside"]


def test_the_walk_through_says_it_and_the_list_places_it_with_the_post_s_section():
    out = cli("lesson", "links-shared", "--plain", "--width", "100")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "Sharing costs the shorter of the two:" in text and "4 of 4 checks ok." in text
    names = list(parasim.lesson.load_lessons())
    # the post's "where they get in each other's way" says bandwidth first, then the hot expert
    assert names.index("moe-sp") < names.index("links-shared") < names.index("hot-expert")
