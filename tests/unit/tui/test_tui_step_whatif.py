"""What-if on a real-size step (issue 55, build item 4): `parasim trace --symbolic --app`'s k turns the layout's
sizes and the micro-batches, runs the step again (each stage's layers once per shape, train/repeat.py) and sets
GPU 0's figures from both runs side by side. The plain model (tui/whatif.StepWhatIf) first, then the app."""

import gc

import pytest

from parasim.errors import LayoutError, UsageError
from parasim.examples.tracing import TraceQuery, gpu_view, traced_step
from parasim.layout import preset
from parasim.tui.app import ParasimApp
from parasim.tui.screens import KnobsScreen, WhatIfScreen
from parasim.tui.timeline import Timeline
from parasim.tui.whatif import StepWhatIf

NAME = "27b-tp8-sp-pp2"  # the 27B model at real size: TP 8 x PP 2, 16 GPUs


@pytest.fixture(scope="module")
def opened() -> StepWhatIf:
    q = TraceQuery(preset(NAME), NAME, symbolic=True, seq=512)
    return StepWhatIf(q, traced_step(q))


def screen_text(app) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def test_the_form_offers_the_layout_s_sizes_and_the_micro_batches(opened):
    # m: PP's count, the step's default; the clock's switches: none
    assert opened.settings == {"tp": 8, "cp": 1, "dp": 1, "pp": 2, "ep": 1, "m": 2, "overlap": "none"}
    assert [(f.flag, f.value, f.post) for f in opened.fields()] == [
        ("--tp", 8, 8),
        ("--cp", 1, 1),
        ("--dp", 1, 1),
        ("--pp", 2, 2),
        ("--ep", 1, 1),
        ("-m", 2, 2),
        ("--overlap", "none", "none"),
    ]
    assert all(f.hint.endswith(f"the preset's: {f.post}") for f in opened.fields()[:-1])
    assert opened.fields()[-1].hint == (
        "a comma-separated list of grad-reduce, prefetch, dualpipe, or all, or none; the step's default: none"
    )
    assert opened.parse({"m": "4", "tp": " "}) == {
        "tp": 8,
        "cp": 1,
        "dp": 1,
        "pp": 2,
        "ep": 1,
        "m": 4,
        "overlap": "none",
    }
    assert opened.title == f"{NAME}: one training step on 16 symbolic GPUs"


@pytest.mark.parametrize(
    "typed,error,needle",
    [
        ({"m": "two"}, UsageError, "-m takes a positive integer"),
        ({"tp": "0"}, UsageError, "--tp takes a positive integer"),
        ({"overlap": "tp"}, UsageError, "--overlap tp: not modelled here"),
        ({"ep": "3"}, LayoutError, r"world 16 is not divisible by etp\*ep\*pp = 48"),
        (
            {"dp": "300", "m": "14"},
            UsageError,
            r"GPUs x micro-batches of a real-size step in the app \(4,800 x 14\): "
            r"67,200 is more than the limit of 65,536",
        ),
    ],
)
def test_a_setting_that_cannot_run_is_refused_before_any_run(opened, typed, error, needle):
    with pytest.raises(error, match=needle):
        opened.parse(typed)


def test_the_new_run_s_figures_are_gpu_0_s(opened):
    new = opened.rerun(opened.parse({"m": "4"}))
    assert new.step.microbatches == 4 and new.settings["m"] == 4 and new.origin is opened.query.layout
    old_f, new_f = opened.figures(), new.figures()
    # the pipeline hands one activation and one gradient per micro-batch on: twice the micro-batches, twice the bytes
    assert new_f["bytes GPU 0 sent on p2p"] == 2 * old_f["bytes GPU 0 sent on p2p"] > 0
    # stage 0 sends each micro-batch's activation on: its SP share of the 512 tokens, hidden wide, in BF16
    assert new_f["bytes GPU 0 sent on p2p"] == 4 * (512 // 8) * preset(NAME).model.hidden * 2
    assert new_f["GPUs"] == old_f["GPUs"] == 16
    # the same figures as GPU 0's own view of each run (`parasim trace --gpu 0`), worked out the other way
    view = gpu_view(new.query, 0, new.step).view
    assert new_f["GPU 0's peak memory (B)"] == view["peak"]["bytes"]
    assert new_f["step on the clock (s, H200)"] == round(view["time"]["step_s"], 4)
    assert new_f["MFU (%)"] == round(100 * view["time"]["mfu"], 1)
    table = opened.changes(new)
    rows = dict(table.rows)
    assert rows["* micro-batches"] == [2, 4] and rows["GPUs"] == [16, 16]
    assert "--tp 8 --cp 1 --dp 1 --pp 2 --ep 1 -m 2 --overlap none" in table.title and "-m 4" in table.title
    assert new.checks_line() == "16 GPUs, 2 run on symbolic ranks, GPU 0 holds 28.0 GB at its peak"


def test_more_data_parallel_ranks_make_a_bigger_world_and_share_the_optimizer(opened):
    new = opened.rerun(opened.parse({"dp": "2"}))
    old_f, new_f = opened.figures(), new.figures()
    assert new.step.layout.world == 32 and new.title.endswith("on 32 symbolic GPUs")
    assert old_f["bytes GPU 0 sent on dp-cp"] == 0 < new_f["bytes GPU 0 sent on dp-cp"]
    assert new_f["GPU 0's peak memory (B)"] < old_f["GPU 0's peak memory (B)"]  # ZeRO-1 halves its share
    assert [f.hint for f in new.fields()][2].endswith("the preset's: 1")  # offered against the layout opened
    with pytest.raises(LayoutError, match="sequence 512 does not divide by cp x tp = 3"):  # said by the run itself
        opened.rerun(opened.parse({"tp": "3"}))
    again = new.rerun(new.parse({"tp": "4"}))
    assert again.step.layout.etp == 4  # expert TP follows TP where it was TP's
    assert again.origin is opened.query.layout and again.fields()[2].hint.endswith("the preset's: 1")


async def test_k_on_a_real_size_step_runs_it_again_and_enter_opens_it(opened):
    opened = StepWhatIf(opened.query, opened.step)  # its figures not worked out yet
    app = ParasimApp(opened.view(), whatif=opened)
    async with app.run_test(size=(100, 30)) as pilot:
        assert "(--tp 8 --cp 1 --dp 1 --pp 2 --ep 1 -m 2 --overlap none)" in app.sub_title
        await pilot.press("k")
        await pilot.pause()
        assert isinstance(app.screen, KnobsScreen)
        text = screen_text(app)
        assert "change the step's settings" in text and "the step runs again" in text
        assert opened._figures is not None  # the run on screen's figures, worked out while the form is open
        app.screen.query_one("#knob-pp").value = "4"  # 1F1B over 4 stages needs 4 micro-batches: said on the form
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, KnobsScreen) and "at least 4 micro-batches" in screen_text(app)
        assert gc.isenabled()  # a refused run hands the collector back at once
        app.screen.query_one("#knob-m").value = "4"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, WhatIfScreen)
        await pilot.pause()
        assert gc.isenabled()  # held while the step ran, handed back once the comparison was on screen
        text = " ".join(screen_text(app).split())  # the head wraps at 100 columns
        assert (
            f"{NAME} at --tp 8 --cp 1 --dp 1 --pp 4 --ep 1 -m 4 --overlap none: 32 GPUs, 4 run on symbolic ranks"
            in text
        )
        assert "* GPUs" in text
        after = app.screen.query_one("#whatif-after", Timeline)
        assert after.view.trace.world == 32
        await pilot.press("enter")
        await pilot.pause()
        assert (
            app.view.trace.world == 32 and "(--tp 8 --cp 1 --dp 1 --pp 4 --ep 1 -m 4 --overlap none)" in app.sub_title
        )
        assert app.view.title == f"{NAME}: one training step on 32 symbolic GPUs"


def test_the_clock_s_switches_alone_lay_the_same_step_out_again(opened):
    """--overlap grad-reduce on the form: no step is run; the same trace is timed again with the switch on, as the
    clock's report times it (clock/report.py works it out its own way). The training step sums its gradients after
    its last backward, so the switch hides nothing there, and the table says why no figure changed."""
    from parasim.clock.report import ClockChoice, clock_report

    base = opened.rerun(opened.parse({"dp": "2"}))  # data parallel: a gradient reduce-scatter the switch moves
    first = base.view()  # the app opens on it (cli/common.open_app), its time view shown
    assert first.clock.tl.overlap == ()
    new = base.rerun(base.parse({"overlap": "grad-reduce"}))
    assert new.step is base.step and new.overlap == ("grad-reduce",) and new.settings["overlap"] == "grad-reduce"
    key = "step on the clock (s, H200)"
    saved = clock_report(base.step.result.trace, ClockChoice("h200"))["switches"]["grad-reduce"]
    assert base.figures()[key] == round(saved["step_off_us"] / 1e6, 4)
    assert new.figures()[key] == round(saved["step_on_us"] / 1e6, 4) and saved["saves_us"] == 0
    table = base.changes(new)
    assert table.title.endswith("--overlap grad-reduce (bytes in B, every figure from a run)")
    assert table.notes == [
        "no figure changed",
        "the same step, laid out again on the clock",
        "the switches hide nothing on this step: its gradient sums and gathers run after its last "
        "backward, with no compute beside them",
    ]
    view = new.view()  # the view of the step on screen, on the new clock: nothing written out again
    assert view.events is first.events and view.clock_choice.overlap == ("grad-reduce",)
    assert view.clock.tl.overlap == ("grad-reduce",) and first.clock.tl.overlap == ()  # each on its own clock
    assert opened.parse({"overlap": "all"})["overlap"] == "grad-reduce,prefetch,dualpipe"


def test_trace_app_opens_the_step_on_the_clock_of_its_gpu_type(monkeypatch):
    from parasim.cli import main

    shown = {}
    monkeypatch.setattr(ParasimApp, "run", lambda self: shown.update(view=self.view, whatif=self.whatif))
    monkeypatch.setattr("parasim.cli.trace.need_terminal", lambda flag: None)  # pytest's stdin is no terminal
    args = ["trace", "--symbolic", "--layout", NAME, "--seq", "512", "--gpu-model", "h100", "--app"]
    assert main(args) == 0
    assert shown["view"].clock_choice.gpu == "h100" and shown["view"] is shown["whatif"].shown
