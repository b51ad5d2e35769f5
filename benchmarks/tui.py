"""How fast is the step-through app on a big trace? Measured in one run under Textual's Pilot (headless).

A synthetic trace of 16 virtual ranks x 1,000 events: each of 100 rounds does one all-reduce in each of the
8 tensor-parallel pairs (0,1), (2,3), ... and then one reduce-scatter or all-gather in each of the two
data-parallel groups of 8 (the even ranks, the odd ranks): 200 logical steps, so the timeline scrolls.

1. First paint: from starting the app (160x50) until its first screen is ready. Goal: at most 0.5 s.
2. Time per step: press Right N times, divide. Goal: at most 50 ms of the app's own time. The wall time
   under Pilot includes Pilot's cost per key press (it sleeps in 20 ms slices until the app is idle), so
   that floor is measured on an empty app and taken off; the CPU time per step is shown beside it.

4. What-if (the k key): for every lesson that takes settings, at its default sizes, the time from enter on the
   settings form until the new run stands beside the old one (re-run, figures, both timelines painted), and
   until enter opens it. Goal: under 1 s each.

3. The same at real size: the deepseek-v3 preset's whole step on 2,048 symbolic GPUs (70,944 events),
   opened with its ranks folded by axis (one row per data-parallel group: 16 rows, never 2,048), as
   `parasim trace --symbolic --app` opens it: from the trace ready until the first screen is painted (the view
   model, then the app), the collector's pass over the view's records held until then. Goal (issue 55): 0.5 s.

5. What-if at real size: k on DeepSeek-V3's 2,048-GPU step as `parasim trace --symbolic --layout deepseek-v3
   --app` opens it, EP 64 turned to 32: the CPU seconds from enter on the form until the comparison is painted
   (the step run again, GPU 0's figures of both, the new view, both timelines), before the collector's full pass
   it leaves until then. Goal (issue 55): at most 2 s.

    python benchmarks/tui.py [--json] [--steps N] [--tiny]

--tiny (for tests/e2e/test_benchmarks.py): 10 rounds (100 events), 5 steps, the real-size case on the 27B model's
TP8 + SP + PP2 preset (16 symbolic GPUs, 4 micro-batches), the what-if of two lessons (tp-mlp, pp-zero-bubble), and
the real-size what-if on that preset (512-token sequences, micro-batches 2 turned to 4).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

import numpy as np

import parasim

WORLD, ROUNDS, SIZE = 16, 100, (160, 50)
GOAL_FIRST_PAINT, GOAL_STEP, GOAL_WHATIF, GOAL_STEP_WHATIF = 0.5, 0.050, 1.0, 2.0
# The value a what-if turns a lesson's first setting to, where the rule below (the next choice, or twice the
# default) gives one the lesson refuses at its other defaults: pp-zero-bubble's DualPipeV needs m >= 2p, so its
# 4 stages doubled to 8 at its 8 micro-batches is refused ("m >= 2 * pp = 16, got m = 8"); 2 stages run.
WHATIF_VALUES = {"pp-zero-bubble": 2}
TINY_WHATIF = ("tp-mlp", "pp-zero-bubble")


def program(ctx):
    tp = [ctx.new_group([2 * i, 2 * i + 1], "tp") for i in range(WORLD // 2)]
    dp = [ctx.new_group(list(range(j, WORLD, 2)), "dp") for j in range(2)]
    mine_tp, mine_dp = tp[ctx.rank // 2], dp[ctx.rank % 2]
    x = np.arange(4, dtype=np.float32) + ctx.rank
    for r in range(ROUNDS):
        ctx.phase(f"round {r}")
        y = ctx.comm.all_reduce(x, group=mine_tp, label="tp all-reduce")
        if r % 2 == 0:
            ctx.comm.reduce_scatter(np.tile(y, 2), group=mine_dp, label="dp reduce-scatter")
        else:
            ctx.comm.all_gather(y[:1], group=mine_dp, label="dp all-gather")


def build_trace():
    return parasim.run(program, WORLD, keep_values=4).trace


async def first_paint_and_steps(view, steps: int, painted=None) -> tuple[float, float, float, int]:
    from parasim.tui.app import ParasimApp

    seen: list[float] = []

    def on_paint() -> None:  # the first screen is painted: the time, then what open_app releases then
        seen.append(time.perf_counter())
        if painted is not None:
            painted()

    app = ParasimApp(view, painted=on_paint)
    t0 = time.perf_counter()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        first = (seen[0] if seen else time.perf_counter()) - t0
        t1, c1 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            await pilot.press("right")
        await pilot.pause()
        per_step = (time.perf_counter() - t1) / steps
        cpu_step = (time.process_time() - c1) / steps
        reached = app.index
    return first, per_step, cpu_step, reached


async def pilot_floor(presses: int) -> tuple[float, float]:
    """(wall, CPU) seconds per key press on an app with one label and one binding: what Pilot itself costs."""
    from textual.app import App
    from textual.binding import Binding
    from textual.widgets import Static

    class Empty(App):
        BINDINGS = [Binding("right", "noop", priority=True)]

        def compose(self):
            yield Static("empty")

        def action_noop(self) -> None:
            pass

    async with Empty().run_test(size=SIZE) as pilot:
        await pilot.pause()
        t, c = time.perf_counter(), time.process_time()
        for _ in range(presses):
            await pilot.press("right")
        await pilot.pause()
        return (time.perf_counter() - t) / presses, (time.process_time() - c) / presses


def symbolic_case(steps: int, floor: float, name: str = "deepseek-v3", m: int = 16) -> dict:
    """DeepSeek-V3's step on 2,048 symbolic GPUs in the app, as `parasim trace --symbolic --app` opens it (or
    another preset's: --tiny)."""
    from dataclasses import replace

    from parasim.train.step import make_step
    from parasim.layout import preset
    from parasim.engine.symbolic.fold import fold_of
    from parasim.tui.view import View
    from parasim.engine.collector import CollectorHold
    layout = preset(name)
    layout = replace(layout, model=replace(layout.model, seq=4096))
    t = time.perf_counter()
    trace = parasim.run(make_step(layout, m=m), layout.world, backend="symbolic", fold=fold_of(layout)).trace
    t_trace = time.perf_counter() - t
    # as cli/common.open_app opens it: the collector's pass over the view's records held until the first paint
    hold = CollectorHold()
    t = time.perf_counter()
    view = View(trace, {}, f"{name}, {layout.world:,} symbolic GPUs")  # over 64 GPUs it opens folded
    t_view = time.perf_counter() - t
    try:
        first, per_step, cpu_step, reached = asyncio.run(first_paint_and_steps(view, steps, hold.release))
    finally:
        hold.release()
    return {"layout": name, "ranks": trace.world, "events": len(view.events), "rows": len(view.rows),
            "folded_by": view.fold_axis,
            "trace_s": round(t_trace, 2), "view_s": round(t_view, 3), "first_paint_s": round(first, 4),
            "step_ms": round(per_step * 1e3, 2), "step_cpu_ms": round(cpu_step * 1e3, 2),
            "app_step_ms": round((per_step - floor) * 1e3, 2), "steps": steps, "reached_event": reached}


def other_value(name: str, knob) -> object:
    """A setting's value other than the post's: WHATIF_VALUES' for the lesson, or the next choice, or twice the
    default."""
    if name in WHATIF_VALUES:
        return WHATIF_VALUES[name]
    if knob.choices:
        return next(c for c in knob.choices if c != knob.default)
    return 2 * knob.default


async def whatif_times(name: str) -> dict:
    """(seconds to the side-by-side screen, seconds to open the new run) for one lesson, one knob turned."""
    from parasim.lesson import get_lesson, run_lesson
    from parasim.tui.app import ParasimApp
    from parasim.tui.screens import WhatIfScreen
    from parasim.tui.view import View
    from parasim.tui.whatif import WhatIf
    lesson = get_lesson(name)
    knob_name, knob = next(iter(lesson.knobs.items()))
    lr = run_lesson(lesson)
    app = ParasimApp(View(lr.result.trace, lesson.narrative, lesson.title), whatif=WhatIf(lesson, lr))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("k")
        await pilot.pause()
        app.screen.query_one(f"#knob-{knob_name}").value = str(other_value(name, knob))
        t = time.perf_counter()
        await pilot.press("enter")
        await pilot.pause()
        beside = time.perf_counter() - t
        assert isinstance(app.screen, WhatIfScreen), name
        t = time.perf_counter()
        await pilot.press("enter")
        await pilot.pause()
        opened = time.perf_counter() - t
    return {"lesson": name, "knob": knob_name, "value": other_value(name, knob), "beside_s": round(beside, 3),
            "open_s": round(opened, 3)}


def whatif_case(only: tuple[str, ...] | None = None) -> list[dict]:
    from parasim.lesson import load_lessons
    return [asyncio.run(whatif_times(n)) for n, lesson in load_lessons().items()
            if lesson.knobs and (only is None or n in only)]


async def step_whatif_times(name: str, knob: str, value: int, seq: int | None) -> dict:
    """CPU seconds from enter on the form to the comparison painted, for a real-size step's what-if."""
    from parasim.examples.tracing import TraceQuery, traced_step
    from parasim.layout import preset
    from parasim.tui.app import ParasimApp
    from parasim.tui import screens
    from parasim.tui.whatif import StepWhatIf

    q = TraceQuery(preset(name), name, symbolic=True, seq=seq)
    whatif = StepWhatIf(q, traced_step(q))
    painted: list[float] = []
    made = screens.WhatIfScreen.__init__

    def timed(self, *args, **kw):  # the moment the comparison is first on screen, before the collector runs
        made(self, *args, **kw)
        release = self.painted
        self.painted = lambda: (painted.append(time.process_time()), release())

    screens.WhatIfScreen.__init__ = timed
    try:
        app = ParasimApp(whatif.view(), whatif=whatif)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("k")
            await pilot.pause(0.5)  # the form open: the run on screen's figures are worked out meanwhile
            app.screen.query_one(f"#knob-{knob}").value = str(value)
            t = time.process_time()
            await pilot.press("enter")
            while not painted:
                await asyncio.sleep(0.01)
            assert isinstance(app.screen, screens.WhatIfScreen), name
    finally:
        screens.WhatIfScreen.__init__ = made
    return {"layout": name, "gpus": whatif.step.layout.world, "knob": knob, "value": value,
            "cpu_s": round(painted[0] - t, 3), "over_goal": round((painted[0] - t) / GOAL_STEP_WHATIF, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--steps", type=int, default=200, help="Right presses to time (default 200)")
    ap.add_argument("--tiny", action="store_true", help="small sizes, 5 steps, two lessons' what-if: for tests")
    args = ap.parse_args()
    global ROUNDS
    if args.tiny:
        ROUNDS, args.steps = 10, 5

    from parasim.tui.view import View

    t = time.perf_counter()
    trace = build_trace()
    t_trace = time.perf_counter() - t
    t = time.perf_counter()
    view = View(trace, {}, f"benchmark: {trace.world} ranks x {len(trace.events):,} events")
    t_view = time.perf_counter() - t
    first, per_step, cpu_step, reached = asyncio.run(first_paint_and_steps(view, args.steps))
    floor, floor_cpu = asyncio.run(pilot_floor(min(args.steps, 100)))
    fig = {
        "ranks": trace.world, "events": len(view.events), "columns": view.columns, "size": list(SIZE),
        "trace_s": round(t_trace, 3), "view_s": round(t_view, 4),
        "first_paint_s": round(first, 4), "first_paint_goal_s": GOAL_FIRST_PAINT,
        "step_ms": round(per_step * 1e3, 2), "step_goal_ms": GOAL_STEP * 1e3, "steps": args.steps,
        "step_cpu_ms": round(cpu_step * 1e3, 2), "reached_event": reached,
        "pilot_floor_ms": round(floor * 1e3, 2), "pilot_floor_cpu_ms": round(floor_cpu * 1e3, 2),
        "app_step_ms": round((per_step - floor) * 1e3, 2),
    }
    fig["symbolic"] = (symbolic_case(args.steps, floor, "27b-tp8-sp-pp2", 4) if args.tiny
                       else symbolic_case(min(args.steps, 50), floor))
    fig["whatif"] = whatif_case(TINY_WHATIF if args.tiny else None)
    fig["step_whatif"] = asyncio.run(step_whatif_times("27b-tp8-sp-pp2", "m", 4, 512) if args.tiny
                                     else step_whatif_times("deepseek-v3", "ep", 32, None))
    if args.json:
        print(json.dumps(fig, indent=1))
        return
    ok = lambda good: "ok" if good else "MISSED"  # noqa: E731
    print(f"trace: {fig['ranks']} ranks x {fig['events']} events, {fig['columns']} logical steps "
          f"(built in {t_trace:.2f} s; view model {t_view * 1e3:.1f} ms); app {SIZE[0]}x{SIZE[1]}")
    print(f"first paint     {first:7.3f} s    goal <= {GOAL_FIRST_PAINT} s    {ok(first <= GOAL_FIRST_PAINT)}")
    net = per_step - floor
    print(f"per step        {per_step * 1e3:7.1f} ms   under Pilot ({args.steps} presses, reached event {reached + 1})")
    print(f"  Pilot alone   {floor * 1e3:7.1f} ms   on an empty app ({floor_cpu * 1e3:.1f} ms CPU per press: it waits in "
          "20 ms sleeps until the app is idle)")
    print(f"  the app's own {net * 1e3:7.1f} ms   goal <= {GOAL_STEP * 1e3:.0f} ms    {ok(net <= GOAL_STEP)}   "
          f"(the step less Pilot's floor; CPU per step {cpu_step * 1e3:.1f} ms, {ok(cpu_step <= GOAL_STEP)})")
    sym = fig["symbolic"]
    print(f"real size, {sym['layout']}: {sym['ranks']:,} symbolic GPUs x {sym['events']:,} events, folded by "
          f"{sym['folded_by']} into "
          f"{sym['rows']} rows (trace {sym['trace_s']:.1f} s, view model {sym['view_s']:.2f} s)")
    ready = sym["view_s"] + sym["first_paint_s"]
    print(f"painted         {ready:7.3f} s    goal <= {GOAL_FIRST_PAINT} s    {ok(ready <= GOAL_FIRST_PAINT)}   "
          f"(from the trace ready: the view model, then the first paint {sym['first_paint_s']:.3f} s)")
    print(f"the app's own   {sym['app_step_ms']:7.1f} ms   goal <= {GOAL_STEP * 1e3:.0f} ms    "
          f"{ok(sym['app_step_ms'] <= GOAL_STEP * 1e3)}   (CPU per step {sym['step_cpu_ms']:.1f} ms)")
    print(f"what if (k), one setting turned, goal < {GOAL_WHATIF} s (under Pilot, its 20 ms waits included):")
    for w in fig["whatif"]:
        print(f"  {w['lesson']:16s} {w['knob']} = {w['value']!s:8s} side by side {w['beside_s']:6.3f} s  "
              f"{ok(w['beside_s'] < GOAL_WHATIF)}   opened {w['open_s']:6.3f} s  {ok(w['open_s'] < GOAL_WHATIF)}")
    slowest = max(w["beside_s"] + w["open_s"] for w in fig["whatif"])
    print(f"  slowest, both steps together: {slowest:.3f} s = {slowest / GOAL_WHATIF:.2f} x the goal")
    sw = fig["step_whatif"]
    print(f"what if (k) at real size, {sw['layout']} on {sw['gpus']:,} symbolic GPUs, {sw['knob']} turned to "
          f"{sw['value']}: painted after {sw['cpu_s']:.2f} s of CPU = {sw['over_goal']:.2f} x the goal of "
          f"{GOAL_STEP_WHATIF} s   {ok(sw['cpu_s'] <= GOAL_STEP_WHATIF)}")


if __name__ == "__main__":
    main()
