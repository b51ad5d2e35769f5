"""The pipeline lessons: the slot tables noted by each stage are the post's, and the checks hold."""
import pytest

from parasim.lesson import get_lesson, run_lesson
from test_pipeline_schedules import POST_1F1B, POST_GPIPE


@pytest.mark.parametrize("name, table", [("pp-gpipe", POST_GPIPE), ("pp-1f1b", POST_1F1B)])
def test_pipeline_lesson(name, table):
    lr = run_lesson(get_lesson(name))
    assert all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]
    notes = sorted((m.rank, m.text) for m in lr.result.trace.marks if m.kind == "note")
    assert [text.split(": ", 1)[1] for _, text in notes] == table
    assert run_lesson(get_lesson(name), 2).ok
