"""Pilot tests: keys step the app, prompts filter and focus, clicks select, and the panels show the run."""
import parasim
from parasim.lesson import get_lesson, run_lesson
from parasim.tui.app import ParasimApp
from parasim.tui.timeline import Timeline
from parasim.tui.view import View


def make(name: str) -> ParasimApp:
    lr = run_lesson(get_lesson(name))
    return ParasimApp(View(lr.result.trace, lr.lesson.narrative, lr.lesson.title))


def text(app, selector: str) -> str:
    return str(app.query_one(selector).render())


async def test_keys_step_and_panels_follow():
    app = make("tp-mlp")
    last = len(app.view.events) - 1  # the backward all-reduce 'f backward'
    async with app.run_test(size=(120, 40)) as pilot:
        assert app.index == 0 and "[1 2 2 2]" in text(app, "#holdings")
        await pilot.press(*["right"] * last)
        assert app.index == last
        assert "[-1 3]" in text(app, "#holdings") and "f backward" in text(app, "#detail")
        assert "backward" in text(app, "#narrative")
        await pilot.press("left")
        assert app.index == last - 1
        await pilot.press("home")
        assert app.index == 0
        await pilot.press("end", "right")
        assert app.index == last  # clamped at the last event
        await pilot.press("p", "n", "n")
        assert app.index == last


async def test_filter_focus_and_goto_prompts():
    app = make("collectives")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("slash", *"all_gather", "enter")
        assert app.view.filter_text == "all_gather"
        assert app.view.events[app.index].op == "all_gather"
        await pilot.press("right")
        assert app.view.events[app.index].op == "all_gather"
        await pilot.press("slash", "enter")  # empty filter: everything again
        await pilot.press("r", "6", "enter")
        assert app.view.focus_rank == 6 and 6 in app.view.events[app.index].ranks
        await pilot.press("r", "enter", "g", "2", "enter")
        assert app.view.focus_rank is None and app.index == 1
        await pilot.press("slash", "escape")  # a cancelled prompt changes nothing
        assert not app.screen.is_modal and app.index == 1


async def test_hops_toggle_and_click():
    app = make("collectives")
    async with app.run_test(size=(120, 40)) as pilot:
        ring = next(i for i, e in enumerate(app.view.events) if e.algo == "ring")
        await pilot.press("g", *str(ring + 1), "enter", "t")
        assert "hop 1 reduce-scatter" in text(app, "#detail")
        await pilot.click(Timeline, offset=(8 + 1 + 1, 2))  # border, label, first column; rank 0
        assert app.index == app.view.at(0, 1)


def many(ctx):
    pairs = [ctx.new_group([2 * i, 2 * i + 1], "tp") for i in range(ctx.world // 2)]
    x = ctx.asarray([1.0])
    for _ in range(60):
        ctx.comm.all_reduce(x, group=pairs[ctx.rank // 2])
        ctx.comm.all_reduce(x)


async def test_arrow_keys_step_even_when_the_timeline_scrolls():
    trace = parasim.run(many, 16).trace
    app = ParasimApp(View(trace))
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("end")
        last = app.index
        await pilot.press("left", "left")
        assert app.index == app.view.move(last, -2)
        assert app.query_one(Timeline).scroll_offset.x > 0
        await pilot.press("q")


async def test_fold_key_cycles_row_grouping():
    trace = parasim.run(many, 16).trace
    app = ParasimApp(View(trace))
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("f")
        assert app.view.fold_axis == "tp" and len(app.view.rows) == 8
        await pilot.press("f")
        assert app.view.fold_axis is None and len(app.view.rows) == 16


async def test_memory_panel_shows_held_bytes_at_the_event():
    """The zero lesson tells the trace what each rank holds: at ZeRO-3's gather before the second layer's
    backward a rank holds its eighth of the state (2 B per parameter), the first layer's gathered weights
    are gone and the second's are being gathered (2 B per value of one layer), and the activations of
    both layers are kept. Lessons that hold nothing show no memory panel."""
    app = make("zero")
    trace = app.view.trace
    gathers = [i for i, e in enumerate(app.view.events) if e.phase == "ZeRO-3" and "L1" in e.label
               and "before backward" in e.label]
    async with app.run_test(size=(140, 50)) as pilot:
        app.index = gathers[0]
        await pilot.pause()
        shown = text(app, "#memory")
        row = app.view.held(gathers[0])[0]
        assert row.by_kind["gathered"] == 2 * 544 and row.by_kind["weights"] == 2 * 1088 // 8
        assert f"gath {2 * 544:,}" in shown
        assert f"peak, {trace.peak(0, phase='ZeRO-3')['bytes']:,} B)" in app.query_one("#memory").border_title
        assert app.query_one("#memory").display
        assert "gathered weights" not in text(app, "#narrative")  # held marks are not notes
    plain = make("tp-mlp")
    async with plain.run_test(size=(120, 40)):
        assert not plain.query_one("#memory").display


async def test_the_first_divergence_is_marked_and_d_jumps_to_it():
    """parasim check --tui: the pinned event's cells are marked, its detail says what differs (both values
    when small), and d selects it from anywhere."""
    from parasim.engine import run
    from parasim.engine.divergence import first_divergence
    from parasim.lesson import get_lesson
    lesson = get_lesson("silent-bugs")
    res = run(lesson.variants["dense-over-dp"], 8, keep_values=10 ** 6)
    found = first_divergence(res, run(lesson.reference, 1, keep_values=10 ** 6))
    view = View(res.trace, lesson.narrative, lesson.title, divergence=found)
    pinned = view.diverged()
    assert view.events[pinned].label.startswith("sum the attention shard's gradient") and view.events[pinned].group.name == "dp"
    e = view.events[pinned]
    row = next(i for i, (_, ranks) in enumerate(view.rows) if e.ranks[0] in ranks)
    assert view.diverged_at(row, e.step) and not view.diverged_at(row, e.step + 1)
    app = ParasimApp(view)
    async with app.run_test(size=(140, 50)) as pilot:
        assert app.index == 0
        await pilot.press("d")
        assert app.index == pinned
        detail = text(app, "#detail")
        assert "FIRST DIVERGENCE: 'attn.grad'" in detail and "all_reduce over dp-cp instead of dp would match" in detail
        assert "this run:" in detail and "reference:" in detail  # 32 values: both shown
        assert "first divergence at #" in text(app, "#status")
        await pilot.press("right")
        assert "FIRST DIVERGENCE" not in text(app, "#detail")


def screen_text(app) -> str:
    """What the terminal shows now, line by line (the screen as composed, without colours)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def ruler_marks(timeline) -> list[tuple[int, int]]:
    """(step written, step of the column it is written over) for each number on the timeline's ruler."""
    from parasim.tui.timeline import CELL_W, LABEL_W
    line = timeline.render_line(0).text
    first = timeline.scroll_offset.x // CELL_W
    marks, at = [], LABEL_W
    while at < len(line):
        if line[at].isdigit():
            end = at
            while end < len(line) and line[end].isdigit():
                end += 1
            assert (at - LABEL_W) % CELL_W == 0, f"a number starts inside a column: {line!r}"
            marks.append((int(line[at:end]), first + (at - LABEL_W) // CELL_W + 1))
            at = end
        else:
            at += 1
    return marks


def long(ctx):
    x = ctx.asarray([1.0])
    for _ in range(1100):
        ctx.comm.all_reduce(x)


async def test_the_timeline_opens_on_the_first_event_and_numbers_its_columns():
    """moe16 at 100x30: the first column shown is step 1 (the selected event #0's), the ruler writes each
    number over its own column, Home comes back to step 1 after End, and past step 1,000 (numbers of four
    digits) the numbers still sit over their columns."""
    from parasim.tui.timeline import CELL_W, LABEL_W
    app = make("moe16")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        timeline = app.query_one(Timeline)
        assert timeline.scroll_offset.x == 0
        first = app.view.events[0]
        row = timeline.render_line(1 + first.ranks[0]).text  # the ruler is line 0, rank r is line r + 1
        assert row[LABEL_W:LABEL_W + 2] == app.view.cell(first.ranks[0], first.step)[0] and first.step == 1
        marks = ruler_marks(timeline)
        assert marks and all(written == column for written, column in marks), marks
        await pilot.press("end")
        assert timeline.scroll_offset.x > 0 and all(w == c for w, c in ruler_marks(timeline))
        await pilot.press("home")
        assert app.index == 0 and timeline.scroll_offset.x == 0
    app = ParasimApp(View(parasim.run(long, 2).trace))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("end")
        timeline = app.query_one(Timeline)
        marks = ruler_marks(timeline)
        assert any(written >= 1000 for written, _ in marks) and all(w == c for w, c in marks), marks
        last = app.view.events[-1].step  # the selected column is in view, whole
        shown = (timeline.scrollable_content_region.width - LABEL_W) // CELL_W
        assert timeline.scroll_offset.x // CELL_W < last <= timeline.scroll_offset.x // CELL_W + shown


async def test_at_100x30_the_selected_event_and_the_keys_show():
    for name in ("collectives", "tp-mlp", "moe16"):
        app = make(name)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            screen = screen_text(app)
            assert "selected event" in screen and app.view.detail(0)[0][:30] in screen, (name, screen)
            assert "z quiz  ? help" in screen.splitlines()[-1], (name, screen)


async def test_at_200x50_every_line_of_what_each_rank_holds_shows():
    for name in ("zero", "moe16"):
        app = make(name)
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause()
            screen = screen_text(app)
            held = text(app, "#holdings").splitlines()
            assert len(held) > 3 and all(line.strip() in screen for line in held), (name, screen)


async def test_t_on_a_point_to_point_event_says_why_no_hops_show():
    app = make("moe16")
    p2p = next(i for i, e in enumerate(app.view.events) if e.kind == "p2p")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("g", *str(app.view.visible.index(p2p) + 1), "enter", "t")
        assert app.index == p2p
        assert "point-to-point" in text(app, "#status") and "no ring hops" in text(app, "#status")
        await pilot.press("t")
        assert "no ring hops" not in text(app, "#status")


async def test_help_is_a_screen_of_its_own_over_the_app():
    from parasim.tui.screens import HelpScreen
    app = make("tp-mlp")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "go to event k" in screen_text(app)
        await pilot.press("right")  # the step keys are off under the help
        assert app.index == 0
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("right")
        assert app.index == 1


async def test_the_timeline_scrolls_down_to_the_selected_events_ranks():
    """moe16 at 100x30 shows 7 of its 16 ranks: selecting an event of ranks 6 and 7 brings both rows into view."""
    app = make("moe16")
    pick = next(i for i, e in enumerate(app.view.events) if sorted(e.ranks) == [6, 7])
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("g", *str(app.view.visible.index(pick) + 1), "enter")
        timeline = app.query_one(Timeline)
        shown = [timeline.render_line(y).text.split()[:2] for y in range(1, timeline.scrollable_content_region.height)]
        assert ["rank", "6"] in shown and ["rank", "7"] in shown, shown


async def test_the_lesson_s_tables_open_on_T():
    """T opens the lesson's tables over the app (cp-causal: each rank's work in blocks, the post's units and
    shares); a lesson without tables says so."""
    from parasim.lesson import get_lesson, run_lesson
    from parasim.tui.app import ParasimApp
    from parasim.tui.screens import TablesScreen
    from parasim.tui.view import View
    lr = run_lesson(get_lesson("cp-causal"))
    app = ParasimApp(View(lr.result.trace, lr.lesson.narrative, lr.lesson.title, tables=lr.tables))
    async with app.run_test(size=(100, 30)) as pilot:
        assert " T tables" in screen_text(app)  # the footer names the key
        await pilot.press("T")
        assert isinstance(app.screen, TablesScreen)
        text = screen_text(app)
        assert "Causal work per CP rank" in text and "contiguous" in text and "share %" in text  # header wrapped
        await pilot.press("escape")
        assert not isinstance(app.screen, TablesScreen)
    bare = make("tp-mlp")
    async with bare.run_test(size=(100, 30)) as pilot:
        await pilot.press("T")
        assert not isinstance(bare.screen, TablesScreen)


async def test_the_tables_overlay_reads_across_at_100x30():
    """Issue 53: moe16's tables in the T overlay at 100x30: each row of "every parallelism" on one line, its
    axis, size and bytes together (before, every row was stacked as "column: value" lines)."""
    from parasim.tui.screens import TablesScreen
    lr = run_lesson(get_lesson("moe16"))
    app = ParasimApp(View(lr.result.trace, lr.lesson.narrative, lr.lesson.title, tables=lr.tables))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("T")
        assert isinstance(app.screen, TablesScreen)
        widget = app.screen.query_one("#tables")
        await pilot.pause()
        shown = str(widget.render())
        lines = shown.splitlines()
        # every line within the box as laid out (its border, padding and scrollbar taken): none wraps
        assert max(map(len, lines)) <= widget.content_region.width, (max(map(len, lines)), widget.content_region)
        row = next(line for line in lines if line.lstrip().startswith("DP + ZeRO-1"))
        assert row.split()[3:5] == ["4", "g0"] and row.split()[-1] == "5,376"
        assert not any(line.startswith("      size: ") for line in lines)


async def test_the_tables_overlay_holds_a_pipelines_slot_table_whole():
    """Issue 53: pp-1f1b at 100x30 showed its schedule only wrapped in the narrative (its slots panel below
    the fold); T now holds it as a table, one GPU a row, one slot a column, on a line each. The expected rows
    are the post's 1F1B table for 4 stages and 4 micro-batches, written out here."""
    from parasim.tui.screens import TablesScreen
    lr = run_lesson(get_lesson("pp-1f1b"))
    app = ParasimApp(View(lr.result.trace, lr.lesson.narrative, lr.lesson.title, tables=lr.tables))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("T")
        assert isinstance(app.screen, TablesScreen)
        widget = app.screen.query_one("#tables")
        await pilot.pause()
        lines = str(widget.render()).splitlines()
        assert max(map(len, lines)) <= widget.content_region.width
        assert "Micro-batches whose activations" in lines[0]  # the lesson's own table first
        rows = {line.split()[1]: line.split()[2:] for line in lines if line.lstrip().startswith("GPU ")}
        assert rows["1"] == "F1 F2 F3 F4 . . . B1 . B2 . B3 . B4".split()
        assert rows["4"] == ". . . F1 B1 F2 B2 F3 B3 F4 B4 . . .".split()
        assert any(line.split()[:3] == ["GPU", "1", "2"] for line in lines)  # the slots numbered


async def test_at_100x30_the_status_line_says_whether_it_plays_before_the_clock():
    """Issue 53: the status line at 100 columns in time mode: where it is and whether it plays, then the clock's
    step, a column and the critical path, whole (a walk found it cut mid-word); the GPU, overlap and the range
    runs like it measured are the timeline's title."""
    app = make("tp-across-nodes")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("u")
        line = next(x for x in screen_text(app).splitlines() if x.startswith(" event "))
        assert line.index("paused") < line.index("step ") and line.rstrip().endswith(" comm")
        assert "s/step" not in line  # the speed is said while playing only
        title = str(app.query_one(Timeline).border_title)
        assert "on the clock: H200, no overlap; runs like it" in title and len(title) < 96


async def test_the_app_says_once_when_its_first_screen_is_painted():
    """open_app holds the collector's pass over a real-size view until the first screen is up (`painted`)."""
    import gc

    from parasim.engine.collector import CollectorHold

    lr = run_lesson(get_lesson("tp-mlp"))
    seen: list[bool] = []
    hold = CollectorHold()
    assert not gc.isenabled()

    def painted() -> None:
        seen.append(app.query_one(Timeline).size.width > 0)  # the timeline is laid out by then
        hold.release()

    app = ParasimApp(View(lr.result.trace, lr.lesson.narrative, lr.lesson.title), painted=painted)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            await pilot.press("right", "right")
            assert seen == [True] and gc.isenabled()
    finally:
        hold.release()


async def test_the_footer_names_the_time_tables_and_quiz_keys_and_fits_100_columns():
    """A walk found u (time), T (tables) and z (quiz) in the help only: a learner never met them. The footer
    line at 100 columns holds them whole, each with its word."""
    from parasim.tui.panels import KeyLine

    app = make("pp-1f1b")
    async with app.run_test(size=(100, 30)):
        line = str(app.query_one(KeyLine).render())
    assert len(line) <= 100
    for key, word in (("u", "time"), ("T", "tables"), ("z", "quiz"), ("k", "what if"), ("?", "help")):
        assert f" {key} {word}" in line
