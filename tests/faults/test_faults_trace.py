"""Hostile trace files, and text from files and programs shown, never executed.

A trace file can come from anywhere. Whatever is wrong with one (nesting a hundred thousand deep, a
5,000-digit integer, a lone surrogate, UTF-16 text, a file cut short, a dtype no array has, values that do
not fit their shape, events out of order, members that are not their group) is one line naming the field,
exit 2, before anything is built. Names, labels, phases and notes from a trace or a user's program may
carry terminal escape sequences: every renderer shows them as escapes (\\x1b), never writes them raw.
"""
import codecs
import copy
import json

import pytest

import parasim
from parasim import Recv, Send, UsageError
from parasim.render.text import markup_safe, printable
from parasim.comm.trace import Trace
from tests.conftest import cli, cli_process


def _prog(ctx):
    """Every kind of field a renderer reads: phase and note fields, held bytes, a compute step, a ring with
    hops, a dim, a root, a tagged transfer."""
    ctx.phase("forward", micro_batch=1, layer=1)
    ctx.note("holds the token", watch="holds", token="cat", positions=[0])
    ctx.note("slot table", table_row=ctx.rank + 1, cells=["F1", "."])
    ctx.hold("w", 64, "weights")
    ctx.compute("matmul", 4.0)
    ring = ctx.new_group([0, 1], "ring")
    ctx.comm.all_reduce(ctx.asarray([1.0, 2.0]), group=ring, algo="ring", label="grads")
    ctx.comm.reduce_scatter(ctx.asarray([[1.0, 2.0], [3.0, 4.0]]), dim=0)
    ctx.comm.broadcast(ctx.asarray([3.0]), src=0)
    if ctx.rank == 0:
        ctx.comm.exchange([Send(ctx.asarray([1.0]), 1)], tags={"slot": 1})
    else:
        ctx.comm.exchange([Recv(0, (1,), "float64")], tags={"slot": 1})


GOOD = json.loads(parasim.run(_prog, 2, keep_values=8).trace.to_json())
# events: 0, 1 compute (ranks 0, 1); 2 ring all-reduce on group 1; 3 reduce-scatter; 4 broadcast; 5 transfer


def test_the_good_trace_has_the_fields_the_cases_break():
    assert [(e["kind"], e["op"]) for e in GOOD["events"]] == [
        ("compute", "matmul"), ("compute", "matmul"), ("collective", "all_reduce"), ("collective", "reduce_scatter"),
        ("collective", "broadcast"), ("p2p", "p2p")]
    assert [m["kind"] for m in GOOD["marks"][:4]] == ["phase", "note", "note", "held"]
    assert GOOD["events"][2]["hops"] and GOOD["events"][5]["tags"] == {"slot": 1}


def _edit(path: str, value) -> bytes:
    """GOOD with the field at dotted `path` set to `value` (KeyError: removed), as the file's bytes."""
    d = copy.deepcopy(GOOD)
    *head, last = path.split(".")
    node = d
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node[k]
    key = int(last) if isinstance(node, list) else last
    if value is KeyError:
        del node[key]
    else:
        node[key] = value
    return json.dumps(d).encode()


def _raw(old: str, new: str) -> bytes:
    """GOOD's text with its first `old` replaced by `new` (JSON a Python value cannot make: nesting past the
    reader, an escape for a lone surrogate)."""
    text = json.dumps(GOOD)
    assert old in text
    return text.replace(old, new, 1).encode()


DEEP = "[" * 100_000 + "]" * 100_000
DICTS = '{"a": ' * 100_000 + "1" + "}" * 100_000
TEXT = json.dumps(GOOD)

FILES = [  # (id, the file's bytes, the words of the one line); a path too long to print is cut at 60 characters
    # nesting past what the reader (and every printer after it) can take
    ("deep-meta", lambda: _raw('"meta": {', '"meta": {"x": ' + DEEP + ", "),
     "meta.x" + "[0]" * 17 + "...: nested more than 100 levels deep"),
    ("deep-params", lambda: _raw('"params": {', '"params": {"a": ' + DICTS + ", "),
     "events[0].params" + ".a" * 21 + "...: nested more than 100 levels deep"),
    ("deep-value", lambda: _raw('"before": [[1.0, 2.0]]', '"before": ' + DEEP),
     "events[2].members[0].before" + "[0]" * 10 + "...: nested more than 100 levels deep"),
    ("nested-150", lambda: _edit("marks.1.data.positions", json.loads("[" * 150 + "]" * 150)),
     "marks[1].data.positions" + "[0]" * 12 + "...: nested more than 100 levels deep"),
    # numbers past Python's digit limit, anywhere
    ("digits-world", lambda: _raw('"world": 2', '"world": ' + "9" * 5000),
     "world: an integer of 5,000 digits (no count needs more than 20)"),
    ("digits-rank", lambda: _raw('"ranks": [0, 1]', '"ranks": [0, -' + "1" * 5000 + "]"),
     "groups[0].ranks[1]: an integer of 5,000 digits"),
    ("digits-meta", lambda: _raw('"seed": 0', '"seed": ' + "1" * 4400), "meta.seed: an integer of 4,400 digits"),
    # text that is not text: a lone surrogate cannot be printed
    ("surrogate-name", lambda: _raw('"name": "ring"', '"name": "\\ud800"'),
     "groups[1].name: '\\ud800' holds a lone surrogate (\\ud800)"),
    ("surrogate-note", lambda: _raw('"text": "slot table"', '"text": "slot \\udfff"'), "marks[2].text: 'slot \\udfff'"),
    ("surrogate-key", lambda: _raw('"seed": 0', '"\\ud83d": 0'), "meta: a key: '\\ud83d' holds a lone surrogate"),
    # encodings: parasim writes UTF-8
    ("utf16-bom", lambda: TEXT.encode("utf-16"), "is UTF-16 text; a parasim trace is UTF-8 JSON"),
    ("utf16le", lambda: TEXT.encode("utf-16-le"), "is UTF-16 text; a parasim trace is UTF-8 JSON"),
    ("utf16be", lambda: TEXT.encode("utf-16-be"), "is UTF-16 text"),
    ("utf32", lambda: TEXT.encode("utf-32"), "is UTF-32 text"),
    ("latin1", lambda: _raw('"grads"', '"grads \xe9"').decode().encode("latin-1"),
     "is not UTF-8 text (byte 0xe9 at offset"),
    ("cut-mid-char", lambda: (TEXT[:100] + "é").encode()[:-1], "ends in the middle of a character: the file was cut short"),
    ("cut-mid-string", lambda: TEXT.encode()[:TEXT.index("grads") + 2], "(the file ends there: was it cut short?)"),
    ("empty", lambda: b"", "is empty, not a parasim trace"),
    # dtypes no collective moves
    ("dtype-float65", lambda: _edit("events.2.members.0.in.0.dtype", "float65"),
     "events[2].members[0].in[0].dtype: 'float65' is not a numeric dtype"),
    ("dtype-object", lambda: _edit("events.2.members.0.in.0.dtype", "object"), "'object' is not a numeric dtype"),
    ("dtype-str", lambda: _edit("events.3.members.1.out.0.dtype", "str"), "events[3].members[1].out[0].dtype: 'str'"),
    ("dtype-alias", lambda: _edit("events.2.members.0.in.0.dtype", "f8"), "'f8' is not a numeric dtype"),
    # values that do not fit the tensor's stated shape
    ("short-before", lambda: _edit("events.2.members.0.before", [[1.0, 2.0, 3.0]]),
     "events[2].members[0].before[0]: expected a list of 2 values (a tensor of shape [2]), got [1.0, 2.0, 3.0]"),
    ("flat-for-2d", lambda: _edit("events.3.members.0.before", [[1.0, 2.0, 3.0, 4.0]]),
     "events[3].members[0].before[0]: expected a list of 2 values (a tensor of shape [2, 2])"),
    ("2d-for-flat", lambda: _edit("events.2.members.1.after", [[[3.0], [6.0]]]),
     "events[2].members[1].after[0][0]: expected a number, got [3.0]"),
    ("string-value", lambda: _edit("events.4.members.1.after", [["3"]]), "events[4].members[1].after[0][0]: expected a number, got '3'"),
    ("values-per-tensor", lambda: _edit("events.4.members.0.before", [[3.0], [3.0]]),
     "events[4].members[0].before: 2 entries for 1 tensor(s)"),
    ("hop-value", lambda: _edit("events.2.hops.0.transfers.0.value", ["x"]),
     "events[2].hops[0].transfers[0].value[0]: expected a number or a list of numbers, got 'x'"),
    # order: seq numbers the events, each rank's clock only moves on
    ("seq-order", lambda: _edit("events.3.seq", 2), "events[3].seq: expected 3, got 2"),
    ("step-back", lambda: _edit("events.4.step", 2), "events[4].step: 2 is before step 3, where rank 0's previous event was"),
    ("mark-step-back", lambda: _edit("marks.0.step", 3), "marks[1].step: 0 is before step 3, where rank 0's previous mark was"),
    # who takes part
    ("members-swapped", lambda: _edit("events.3.members", list(reversed(GOOD["events"][3]["members"]))),
     "events[3].members: ranks [1, 0] are not the group's [0, 1]"),
    ("member-twice", lambda: _edit("events.2.members.1.rank", 0), "events[2].members: ranks [0, 0] are not the group's"),
    ("group-not-listed", lambda: _edit("events.2.group.index", 7), "events[2].group: 'ring' [0, 1] is not groups[7]"),
    ("group-renamed", lambda: _edit("events.2.group.name", "tp"), "events[2].group: 'tp' [0, 1] is not groups[1]"),
    ("group-index", lambda: _edit("groups.1.index", 4), "groups[1].index: expected 1, got 4"),
    ("p2p-ends", lambda: _edit("events.5.params.dst", 0), "events[5].params: src 0 and dst 0 are not the members' ranks [0, 1]"),
    ("p2p-to-self", lambda: _edit("events.5.members.1.rank", 0), "events[5].members: ranks [0, 0]; a transfer has two members"),
    ("p2p-no-array", lambda: _edit("events.5.members.0", {**GOOD["events"][5]["members"][0], "in": [], "before": None}),
     "events[5].members: a transfer's sender has one array in and none out"),
    ("hop-no-value", lambda: _edit("events.2.hops.1.transfers.0.value", KeyError),
     "events[2].hops[1].transfers[0]: no 'value' (null where the values were not kept)"),
    ("compute-two", lambda: _edit("events.0.members", GOOD["events"][3]["members"]),
     "events[0].members: ranks [0, 1]; a compute step has one member"),
    ("root-outside", lambda: _edit("events.4.params.src", 5), "events[4].params.src: expected a rank of the group [0, 1], got 5"),
    ("rank-outside", lambda: _edit("marks.3.rank", 2), "marks[3].rank: expected an integer from 0 to 1, got 2"),
    ("hop-outside", lambda: _edit("events.2.hops.0.transfers.0.dst", 9),
     "events[2].hops[0].transfers[0].dst: expected an integer from 0 to 1, got 9"),
    ("world-1e9", lambda: _edit("world", 10**9), "world: expected an integer from 1 to 65,536, got 1000000000"),
    # sizes: bounded before anything could be sized by them
    ("shape-product", lambda: _edit("events.3.members.0.in.0.shape", [10**7, 10**7]),
     "events[3].members[0].in[0].shape: [10000000, 10000000] is more than 1,000,000,000,000 elements"),
    ("shape-huge-dim", lambda: _edit("events.3.members.0.in.0.shape", [2**64, 0]),
     "events[3].members[0].in[0].shape[0]: expected an integer from 0 to 1,000,000,000,000, got 18446744073709551616"),
    ("shape-dims", lambda: _edit("events.3.members.0.in.0.shape", [1] * 65), "65 dimensions; an array has at most 64"),
    ("sent-huge", lambda: _edit("events.3.members.0.sent", 10**19), "events[3].members[0].sent: 10,000,000,000,000,000,000 is more"),
    ("held-huge", lambda: _edit("marks.3.data.bytes", 10**19), "marks[3].data.bytes: 10,000,000,000,000,000,000 is more"),
    ("digits-sent", lambda: _edit("events.3.members.0.sent", 10**30), "events[3].members[0].sent: an integer of 31 digits"),
    # fields the screens read, of the type they read
    ("no-dim", lambda: _edit("events.3.params.dim", KeyError), "events[3].params: no 'dim', which a reduce_scatter names"),
    ("dim-text", lambda: _edit("events.3.params.dim", "0"), "events[3].params.dim: expected an integer from -64 to 63, got '0'"),
    ("reduce-op", lambda: _edit("events.2.params.op", "mul"), "events[2].params.op: expected one of sum, avg, max, min, got 'mul'"),
    ("flops-text", lambda: _edit("events.0.params.flops", "4"), "events[0].params.flops: expected a finite number"),
    ("flops-inf", lambda: _raw('"flops": 4.0', '"flops": Infinity'), "events[0].params.flops: expected a finite number"),
    ("slot-text", lambda: _edit("events.5.tags.slot", "1"), "events[5].tags.slot: expected an integer from 0"),
    ("hop-number", lambda: _edit("events.2.hops.0.hop", "0"), "events[2].hops[0].hop: expected an integer"),
    ("cells-empty", lambda: _edit("marks.2.data.cells", ["F1", ""]), "marks[2].data.cells[1]: expected a slot label"),
    ("cells-missing", lambda: _edit("marks.2.data.cells", KeyError), "marks[2].data.cells: expected a list of slot labels"),
    ("table-row-text", lambda: _edit("marks.2.data.table_row", "1"), "marks[2].data.table_row: expected an integer"),
    ("token-missing", lambda: _edit("marks.1.data.token", KeyError), "marks[1].data.token: expected the followed token's name"),
    ("micro-batch-list", lambda: _edit("marks.0.data.micro_batch", [1]), "marks[0].data.micro_batch: expected an integer"),
    ("lesson-list", lambda: _edit("meta.lesson", ["collectives"]), "meta.lesson: expected a lesson's name, got ['collectives']"),
    ("version-escape", lambda: _edit("version", "\x1b[2J"), "trace version '\\x1b[2J' is not supported"),
]


@pytest.mark.parametrize("make, words", [c[1:] for c in FILES], ids=[c[0] for c in FILES])
def test_a_hostile_trace_file_is_one_line_naming_the_field(make, words, tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(make())
    with pytest.raises(UsageError) as info:
        Trace.load(path)
    assert words in str(info.value)
    got = cli("view", str(path), "--plain")
    assert (got.returncode, got.stdout) == (2, "")
    assert got.stderr.count("\n") == 1 and words in got.stderr and "Traceback" not in got.stderr, got.stderr


def test_the_good_trace_still_loads_and_draws(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(GOOD))
    assert Trace.load(path).to_dict() == GOOD
    got = cli("view", str(path), "--plain")
    assert got.returncode == 0 and "step   2  all_reduce  on ring[0, 1]  (op=sum, ring algorithm)  'grads'" in got.stdout
    bom = tmp_path / "bom.json"  # a UTF-8 byte-order mark, as some editors write: the same text
    bom.write_bytes(codecs.BOM_UTF8 + json.dumps(GOOD).encode())
    assert Trace.load(bom).to_dict() == GOOD


def test_a_file_cut_at_any_byte_is_refused():
    text = json.dumps(GOOD).encode()

    def loads(n: int) -> bool:
        try:
            Trace.from_json(text[:n])  # what Trace.load does with the file's bytes
        except UsageError:
            return False
        return True
    assert [n for n in range(len(text)) if loads(n)] == []  # no proper prefix of the file loads
    assert Trace.from_json(text).to_dict() == GOOD


FROM_CODE = [  # Trace.from_dict is public: a dict made in Python can hold what JSON cannot
    ("int-key", "meta", {1: "x"}, "meta: a key of type int (1); JSON's keys are strings"),
    ("set-value", "meta", {"s": {1, 2}}, "meta.s: a set ({1, 2}), which is not a JSON value"),
    ("mark-int-key", "marks.0", {**GOOD["marks"][0], 3: 1}, "marks[0]: unknown field 3"),
    ("tuple-ranks", "groups.1.ranks", (0, 1), "groups[1].ranks: expected a list of ranks, got (0, 1)"),
]


@pytest.mark.parametrize("path, value, words", [c[1:] for c in FROM_CODE], ids=[c[0] for c in FROM_CODE])
def test_a_dict_made_in_python_is_checked_the_same(path, value, words):
    d = copy.deepcopy(GOOD)
    *head, last = path.split(".")
    node = d
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[int(last) if isinstance(node, list) else last] = value
    with pytest.raises(UsageError) as info:
        Trace.from_dict(d)
    assert words in str(info.value)


# -- text shown, never executed --------------------------------------------------------------------------

SHOWN = [
    ("esc-colour", "\x1b[31mred", "\\x1b[31mred"),
    ("clear-screen", "a \x1b[2J b", "a \\x1b[2J b"),
    ("bell", "lab\x07el", "lab\\x07el"),
    ("c1-csi", "\x9b31m", "\\x9b31m"),
    ("osc52", "\x1b]52;c;aGk=\x07", "\\x1b]52;c;aGk=\\x07"),
    ("title", "\x1b]0;owned\x1b\\", "\\x1b]0;owned\\x1b\\"),
    ("newline-tab-cr", "a\nb\tc\rd", "a\\nb\\tc\\rd"),
    ("del-nul", "\x7f\x00", "\\x7f\\x00"),
    ("bidi", "abc\u202edef\u2066g\u2069\u200f", "abc\\u202edef\\u2066g\\u2069\\u200f"),
    ("line-sep", "a\u2028b", "a\\u2028b"),
    ("surrogate", "x\ud800", "x\\ud800"),
    ("plain", "tp·0 → é 中 [bold red]x[/]", "tp·0 → é 中 [bold red]x[/]"),
]


@pytest.mark.parametrize("text, shown", [c[1:] for c in SHOWN], ids=[c[0] for c in SHOWN])
def test_printable_shows_what_a_terminal_would_act_on(text, shown):
    assert printable(text) == shown
    assert printable(shown) == shown  # what it gives is already safe
    shown.encode("utf-8")  # and can be written to any UTF-8 terminal


def test_markup_is_escaped_where_it_would_be_parsed():
    from rich.console import Console
    console = Console(record=True, width=80, color_system=None)
    console.print(f"[bold]{markup_safe('[bold red]x[/] [link=http://e]y[/link] ' + chr(27) + '[2J')}[/]")
    assert console.export_text() == "[bold red]x[/] [link=http://e]y[/link] \\x1b[2J\n"


EVIL = {  # each kind of text a terminal acts on, in each place a trace or a program names something
    "group": "\x1b[31mred", "label": "lab\x07el \x9b31m", "phase": "\x1b]52;c;aGk=\x07ph",
    "note": "note \x1b[2J", "compute": "mm\u202eul", "token": "[link=http://e]tok[/link]", "cell": "\x1bF",
}
EVIL_PROGRAM = f'''
TITLE = {"evil " + EVIL["group"]!r}
NARRATIVE = {{{EVIL["phase"]!r}: "told \\x1b[2J \\u202e here"}}


def prog(ctx):
    ctx.phase({EVIL["phase"]!r})
    g = ctx.new_group([0, 1], {EVIL["group"]!r})
    ctx.note({EVIL["note"]!r})
    ctx.note("holds", watch="holds", token={EVIL["token"]!r})
    ctx.note("routes", watch="route")
    ctx.note("row", table_row=ctx.rank + 1, cells=[{EVIL["cell"]!r}])
    ctx.compute({EVIL["compute"]!r}, 1.0)
    ctx.comm.all_reduce(ctx.asarray([1.0]), group=g, label={EVIL["label"]!r})
'''
EVIL_LINES = [  # the walk-through's lines that carry them, exactly
    "== \\x1b]52;c;aGk=\\x07ph ==",
    "told \\x1b[2J \\u202e here",
    "  rank 0: note \\x1b[2J",
    "step   1  compute on rank 0: mm\\u202eul  (1 FLOPs)  ",  # then the line that called it
    "step   2  all_reduce  on \\x1b[31mred[0, 1]  (op=sum)  'lab\\x07el \\x9b31m'  ",  # then its source line
]


def _has(lines: list[str], line: str) -> bool:
    """`line` is one of `lines`; one ending in two spaces is the start of one (what follows, a source line in a
    temporary folder, may be wrapped onto the next line)."""
    return any(have == line or (line.endswith("  ") and have.startswith(line.rstrip())) for have in lines)


def _safe_bytes(out: str) -> None:
    """Written as UTF-8, the text holds no byte a terminal acts on: no C0 control but the newline, no DEL,
    no C1 control, no bidi override."""
    data = out.encode("utf-8")
    assert not [b for b in data if (b < 0x20 and b != 0x0A) or b == 0x7F]
    assert not any(chr(c) in out for c in range(0x80, 0xA0))
    assert not any(c in out for c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def test_a_user_programs_names_are_shown_not_executed(tmp_path):
    src = tmp_path / "evil.py"
    src.write_text(EVIL_PROGRAM)
    got = cli("lesson", f"{src}:prog", "--world", "2", "--plain")
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert lines[0].startswith("evil \\x1b[31mred")  # then the program's path, on the next line if long
    for line in EVIL_LINES:
        assert _has(lines, line), line
    _safe_bytes(got.stdout)


def test_a_trace_files_names_are_shown_not_executed(tmp_path):
    src = tmp_path / "evil.py"
    src.write_text(EVIL_PROGRAM)
    trace = tmp_path / "evil.json"
    assert cli("lesson", f"{src}:prog", "--world", "2", "--trace", str(trace), "--json").returncode == 0
    assert "\\u001b[31mred" in trace.read_text()  # the file carries them as JSON escapes
    got = cli_process("view", str(trace), "--plain")  # a real process writing to a real pipe
    assert got.returncode == 0, got.stderr
    for line in EVIL_LINES[:1] + EVIL_LINES[2:]:  # the narrative is the program's, not the file's
        assert _has(got.stdout.splitlines(), line), line
    _safe_bytes(got.stdout)


def test_the_app_shows_them_as_text(tmp_path):
    """The view model hands the app escaped text; the app draws it as text, not as Rich markup."""
    from parasim.tui.view import View
    src = tmp_path / "evil.py"
    src.write_text(EVIL_PROGRAM)
    from parasim.lesson import get_lesson, run_lesson
    lr = run_lesson(get_lesson(f"{src}:prog", 2))
    view = View(lr.result.trace, lr.lesson.narrative, lr.lesson.title)
    last = len(view.events) - 1
    assert view.title == "evil \\x1b[31mred"
    assert "group \\x1b[31mred [0, 1]   'lab\\x07el \\x9b31m'" in view.detail(last)
    phase, text, notes = view.phase_text(last)
    assert (phase, text) == ("\\x1b]52;c;aGk=\\x07ph", "told \\x1b[2J \\u202e here")
    assert notes[0] == "rank 0: note \\x1b[2J"
    assert view.watch(last).token == "[link=http://e]tok[/link]"
    assert view.slots(last).rows == [["\\x1bF"], ["\\x1bF"]]
    assert [w[2] for w in view.work(last)] == ["mm\\u202eul", "mm\\u202eul"]
    view.fold("\x1b[31mred")
    assert view.rows[0][0] == "\\x1b[31mred·0"


async def test_the_app_draws_markup_in_a_name_literally(tmp_path):
    from parasim.lesson import get_lesson, run_lesson
    from parasim.tui.app import ParasimApp
    from parasim.tui.view import View
    src = tmp_path / "evil.py"
    src.write_text(EVIL_PROGRAM.replace(repr(EVIL["label"]), repr("[bold red]x[/]")))
    lr = run_lesson(get_lesson(f"{src}:prog", 2))
    app = ParasimApp(View(lr.result.trace, lr.lesson.narrative, lr.lesson.title))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("end")
        assert "'[bold red]x[/]'" in str(app.query_one("#detail").render())
        # the border title is kept as Content: its markup form escapes the brackets it shows
        assert app.query_one("#watch").border_title == "following \\[link=http://e]tok\\[/link]"


def test_the_verdict_shows_a_programs_names_as_text():
    """`parasim run`'s verdict prints through Rich markup: a title, an op and a check named by a program show
    as their characters, escapes shown, brackets kept."""
    from rich.console import Console

    from parasim.engine.real import RealReport
    from parasim.lesson import Check, Lesson
    from parasim.render.verdict import print_verdict

    def prog(ctx):
        ctx.compute("[red]mm\x1b[2J", 1.0)
    trace = parasim.run(prog, 1).trace
    lesson = Lesson("x.py:prog", "[bold red]T[/] \x1b]0;t\x07", 1, prog, {}, lambda result: [])
    report = RealReport("gloo", 1, [None], trace, {(0, 0): (0.0, 5.0)}, ["rank 0 \x9b31m differs"])
    console = Console(record=True, width=100, color_system=None)
    print_verdict(lesson, report, [Check("c\x07", 1, 2, False)], console)
    shown = console.export_text()
    assert shown.startswith("[bold red]T[/] \\x1b]0;t\\x07  (x.py:prog: 1 real ranks on gloo")
    assert "[red]mm\\x1b[2J" in shown and "  rank 0 \\x9b31m differs" in shown and "FAIL c\\x07: got 1, expected 2" in shown
    _safe_bytes(shown)


def test_the_layout_picture_shows_a_configs_model_name_as_text():
    from rich.console import Console

    from parasim.layout import Layout, ModelSpec
    from parasim.render.layout_view import print_layout
    console = Console(record=True, width=120, color_system=None)
    layout = Layout(tp=2, world=2, model=ModelSpec(name="\x1b[2Jm[bold]x[/]", layers=2, hidden=8, heads=2))
    print_layout(layout, "title \x07", console=console)
    shown = console.export_text()
    assert shown.startswith("title \\x07\n") and "\\x1b[2Jm[bold]x[/]: 2 layers" in shown
    _safe_bytes(shown)


def test_a_trace_with_nan_and_inf_values_is_strict_json_and_reads_back(tmp_path):
    """Kept values JSON cannot carry are written by name ("nan", "inf") and read back as floats."""
    import json
    import math

    import parasim
    from parasim.comm.trace import Trace

    def prog(ctx):
        return ctx.comm.all_reduce(ctx.asarray([math.nan, math.inf, -math.inf, 1.5]))

    trace = parasim.run(prog, 2, keep_values=8).trace
    text = trace.to_json()
    json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))  # strict: no NaN token
    back = Trace.from_json(text.encode())
    after = back.events[0].members[0].after[0]
    assert math.isnan(after[0]) and after[1:] == [math.inf, -math.inf, 3.0]
