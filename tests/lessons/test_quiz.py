"""Predict, then see (issue 53, build item 5): `parasim lesson NAME --quiz` asks for a figure before showing it,
grades the answer against the run and shows how the figure comes out. Each question's answer is held here
against the figure worked by hand from the lesson's settings; the grading reads a learner's ways of writing a
number; the walk-through, --json, the app and the browser ask the same questions."""

import argparse
import json
import shlex
import sys
from fractions import Fraction

import pytest

from conftest import cli

import parasim
from parasim.errors import UsageError
from parasim.examples.quiz import Graded, Question, grade, parse_number, quiz_lines
from parasim.lesson import get_lesson, load_lessons


@pytest.mark.parametrize(
    "typed, value",
    [
        ("7168", 7168),
        ("7,168", 7168),
        ("1,024,000", 1024000),
        ("7.2e3", 7200),
        ("7k", 7000),
        ("7 KB", 7000),
        ("7 KiB", 7168),
        ("7Ki", 7168),
        ("2 GB", 2e9),
        ("1,5", 1),  # a comma groups thousands only before three digits: "1,5" is 1 and what follows it
        ("1.5M", 1.5e6),
        ("3/7", 3 / 7),
        ("3 / 7", 3 / 7),
        ("0.43", 0.43),
        ("43%", 0.43),
        ("7168 B", 7168),
        ("3.75 bytes", 3.75),
        ("4 micro-batches", 4),
        ("-1", -1),
    ],
)
def test_a_learner_s_number_is_read_as_written(typed, value):
    assert parse_number(typed) == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("typed", ["", "abc", "g2", "micro", "1/0"])
def test_what_holds_no_number_is_none(typed):
    assert parse_number(typed) is None


def test_grading_a_number_allows_the_post_s_rounding_and_says_how_far_off():
    q = Question("the bubble?", Fraction(3, 7), "of the step", "(p - 1)/(m + p - 1) = 3/7")
    assert [Graded(q, a).right for a in ("3/7", "0.43", "43%", "0.42", "0.44", "0.5", "x", "", None)] == [
        True,
        True,
        True,
        True,
        False,
        False,
        False,
        None,
        None,
    ]
    assert Graded(q, "0.43").verdict() == "right: the run's is 3/7 (0.429) of the step"
    assert Graded(q, "3").verdict() == "not quite (yours 3, 7x the run's); the run's: 3/7 (0.429) of the step"
    assert Graded(q, "0.5").verdict() == ("not quite (yours 0.5, over by 0.0714); the run's: 3/7 (0.429) of the step")
    assert Graded(q, None).verdict() == "no answer; the run's: 3/7 (0.429) of the step"
    assert Graded(q, "x").verdict() == "not quite (not a number); the run's: 3/7 (0.429) of the step"
    # the worked formula only where the answer was not right
    assert quiz_lines(Graded(q, "0.43")) == ["  right: the run's is 3/7 (0.429) of the step"]
    assert quiz_lines(Graded(q, "1"))[1] == "  how: (p - 1)/(m + p - 1) = 3/7"
    assert len(quiz_lines(Graded(q, None))) == 2
    assert [g.given for g in grade([q, q, q], ["1", "2"])] == ["1", "2", None]


def test_grading_names_ignores_order_case_and_the_word_gpu():
    q = Question("which GPUs?", "g1, g3", "", "E3 on g1, E8 on g3")
    assert [Graded(q, a).right for a in ("g1, g3", "G3 g1", "gpu 3 and gpu 1", "g1", "g1, g2, g3")] == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert Graded(q, "g1").verdict() == "not quite (you said g1); the run's: g1, g3"


def _asked(name: str, **knobs) -> list[Question]:
    return parasim.lesson(name, **knobs).questions()


def test_collectives_asks_the_ring_s_bytes_worked_by_hand():
    """8 ranks, a 1,024-value float32 buffer (4,096 B): an all-reduce sends 2 x 7/8 of it, an all-gather 7/8;
    on 4 ranks 3/4 of it."""
    assert [q.answer for q in _asked("collectives")] == [7168, 3584]
    assert [q.answer for q in parasim.lesson("collectives", world=4).questions()] == [6144, 3072]
    assert "8 ranks run an all-reduce of a 4,096-byte float32 buffer" in _asked("collectives")[0].ask
    assert _asked("collectives")[0].worked.endswith("2 x 7/8 x 4,096 B = 7,168 B")


def test_zero_asks_the_bytes_a_parameter_at_rest_worked_by_hand():
    """2 + 2 + 12/N under ZeRO-1 and 16/N under ZeRO-3 (the post's bytes: bf16 weights and gradients, fp32
    state), at N = 8 and 4."""
    assert [q.answer for q in _asked("zero")] == pytest.approx([2 + 2 + 12 / 8, 16 / 8], rel=1e-12)
    assert [q.answer for q in _asked("zero", dp=4)] == pytest.approx([2 + 2 + 12 / 4, 16 / 4], rel=1e-12)
    assert _asked("zero")[0].worked.endswith("2 + 2 + 12/8 = 5.5")


def test_the_pipelines_ask_the_bubble_and_what_stage_1_holds_worked_by_hand():
    """(p - 1)/(m + p - 1): 3/7 at p = m = 4, 3/11 at m = 8; stage 1 holds min(p, m) under 1F1B, m under
    GPipe."""
    assert [q.answer for q in _asked("pp-1f1b")] == [Fraction(3, 7), 4]
    assert [q.answer for q in _asked("pp-1f1b", m=8)] == [Fraction(3, 11), 4]
    assert [q.answer for q in _asked("pp-gpipe", m=8)] == [Fraction(3, 11), 8]
    assert [q.answer for q in _asked("pp-1f1b", pp=2, m=8)] == [Fraction(1, 9), 2]
    assert _asked("pp-1f1b", m=8)[1].worked.endswith("min(p, m) = min(4, 8) = 4")


def test_moe16_asks_where_contract_lands():
    """With the post's routing, "contract" picks E3 and E8 of the first stage's 8 experts; EP 4 over g0-g3
    gives each GPU two experts in order (E1-E2 on g0, ..., E7-E8 on g3): E3 is on g1, E8 on g3."""
    (q,) = _asked("moe16", routing="post")
    assert q.answer == "g1, g3" and "'contract' sits on g2" in q.ask
    assert "E3 (gate 0.60) on g1 and E8 (gate 0.40) on g3" in q.worked


def test_the_walk_through_asks_first_reads_stdin_and_grades():
    out = cli("lesson", "pp-1f1b", "--plain", "--quiz", input="3/7\n2\n")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.index("Q1 of 2.") < text.index("Q2 of 2.") < text.index("1 of 2 right.") < text.index("== ")
    assert "> 3/7\n  right: the run's is 3/7 (0.429) of the step" in text
    assert "> 2\n  not quite (yours 2, 0.5x the run's); the run's: 4 micro-batches\n  how: stage 1 runs p" in text
    ended = cli("lesson", "pp-1f1b", "--plain", "--quiz", input="")  # stdin at its end: no answers
    assert ended.returncode == 0 and ended.stdout.count("no answer; the run's:") == 2
    long = cli("lesson", "pp-1f1b", "--plain", "--quiz", input="9" * 5000 + "\n4\n")
    assert "> " + "9" * 200 + "\n  not quite" in long.stdout  # its first 200 characters, the rest dropped
    assert "> 4\n  right" in long.stdout  # the next line answers the next question
    given = cli("lesson", "collectives", "--plain", "--quiz", "--answer", "7168", "--answer", "3.5 KiB")
    assert (
        "> 7168\n  right" in given.stdout and "> 3.5 KiB\n  right" in given.stdout and "2 of 2 right." in given.stdout
    )


def test_json_grades_the_answers_given_and_is_strict():
    data = json.loads(
        cli("lesson", "pp-gpipe", "--json", "--quiz", "--answer", "3/7").stdout,
        parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"),
    )
    assert [(q["answer"], q["given"], q["right"]) for q in data["quiz"]] == [(3 / 7, "3/7", True), (4, None, None)]
    assert "quiz" not in json.loads(cli("lesson", "pp-gpipe", "--json").stdout)


def test_the_quiz_is_refused_in_one_line_where_it_cannot_ask():
    for argv, words in (
        (("lesson", "tp-mlp", "--quiz"), "--quiz: tp-mlp asks no questions yet; lessons that do: why-split, collectives, zero"),
        (("lesson", "pp-1f1b", "--answer", "3"), "--answer answers a quiz: give --quiz too"),
        (("lesson", "pp-1f1b", "--quiz", "--answer", "1" * 201), "--answer: at most 200 characters, got 201"),
        # issue 53: answers past the last question were dropped without a word
        (("lesson", "pp-gpipe", "--quiz", "--plain", "--answer", "3/7", "--answer", "4", "--answer", "9"),
         "--answer given 3 times: pp-gpipe asks 2 questions"),
        (("lesson", "pp-gpipe", "--quiz", "--json", *["--answer", "1"] * 3), "--answer given 3 times"),
        (("serve", "--quiz", "--memory", "--model 27b"), "--quiz asks a lesson's questions: give a lesson NAME"),
        (("serve", "tp-mlp", "--quiz"), "--quiz: tp-mlp asks no questions yet"),
    ):
        out = cli(*argv)
        assert out.returncode == 2 and out.stdout == "", argv
        assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_list_says_which_lessons_ask_and_the_browser_s_app_opens_asking():
    from parasim.cli.serve import app_command

    listed = {row["name"]: row["quiz"] for row in json.loads(cli("lesson", "--list", "--json").stdout)}
    assert {n for n, asks in listed.items() if asks} == {"why-split", "collectives", "zero", "tp-attention", "cp-causal", "pp-gpipe", "pp-1f1b", "moe16"}
    assert {n for n, lesson in load_lessons().items() if lesson.quiz is not None} == {
        n for n, asks in listed.items() if asks
    }
    base = dict(name="pp-1f1b", view=None, trace=None, memory=None, world=None, quiz=True)
    command, _ = app_command(argparse.Namespace(**base))
    assert shlex.split(command) == ["exec", sys.executable, "-m", "parasim", "lesson", "pp-1f1b", "--quiz", "--tui"]
    with pytest.raises(UsageError, match="asks no questions"):
        get_lesson("sp").check_asks()


def test_a_figure_asked_in_gb_reads_sizes_and_bare_numbers_in_that_unit():
    """why-split asks for GB: "432", "432 GB", "0.432 TB" and "4.32e11 bytes" all say the same figure; a
    figure asked in bytes still reads "7 KiB" as 7,168."""
    from parasim.examples.quiz import Question, grade

    q = Question("how many GB?", 432.0, "GB", "")
    assert [g.right for g in grade([q] * 5, ["432", "432 GB", "0.432 TB", "4.32e11 bytes", "432 MB"])] == [
        True, True, True, True, False]
    b = Question("how many bytes?", 7168, "bytes", "")
    assert [g.right for g in grade([b] * 2, ["7 KiB", "7168"])] == [True, True]


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_cp_causal_asks_the_last_ranks_share_and_zigzags_blocks(cp):
    """Contiguous: piece i of cp does i - 1/2 pieces' worth of the cp^2/2 in all, so the last does
    (cp - 1/2)/(cp^2/2) (7/16 at CP 4, the post's 44%); zigzag: each rank 2cp blocks of the 2cp-way split."""
    from fractions import Fraction

    from parasim.examples.quiz import grade
    from parasim.lesson import get_lesson, run_lesson

    lr = run_lesson(get_lesson("cp-causal"), knobs={"cp": cp})
    share, blocks = lr.questions()
    assert share.answer == Fraction(2 * cp - 1, cp * cp) and blocks.answer == 2 * cp
    right = [g.right for g in grade([share, blocks], [f"{100 * (2 * cp - 1) / cp**2:.1f}%", str(2 * cp)])]
    assert right == [True, True]


@pytest.mark.parametrize("tp, copies", [(16, 2), (4, 2), (2, 2), (1, 1)])
def test_tp_attention_asks_how_many_gpus_hold_each_kv_head(tp, copies):
    """The post's GQA case: 16 query heads, 8 K/V heads at TP 16: a query head a GPU, two query heads a K/V
    head, so each K/V head on 2 GPUs; worked here as (query heads / K/V heads) / (query heads / TP)."""
    from parasim.lesson import get_lesson, run_lesson

    (q,) = run_lesson(get_lesson("tp-attention"), knobs={"tp": tp}).questions()
    heads, kv = max(4, tp), max(1, tp // 2)
    assert q.answer == copies == max(1, (heads // kv) // (heads // tp))
    assert f"{heads} query heads and {kv} key/value head" in q.ask


def test_a_decimal_size_is_also_read_in_binary():
    """The lessons write 4,096 B as 4 KB, as most people do: "3.5KB" for 3,584 bytes is right (3.5 x 1,024),
    as are "3.5 KiB" and "3584"; "3.3KB" is wrong either way (3,300 or 3,379)."""
    from parasim.examples.quiz import Question, grade

    q = Question("bytes?", 3584, "bytes", "")
    got = [g.right for g in grade([q] * 4, ["3.5KB", "3.5 KiB", "3584", "3.3KB"])]
    assert got == [True, True, True, False]
