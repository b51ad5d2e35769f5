"""The sp lesson: the post's t = 8 figures (13 sbh with TP alone, 34/8 = 4.25 sbh with SP, about 3x less),
measured from what the layers kept; and AG + RS move the bytes of the all-reduce."""
import json
import subprocess
import sys

from parasim.lesson import get_lesson, run_lesson


def test_the_posts_t8_figures():
    lr = run_lesson(get_lesson("sp"), 8)
    assert all(c.ok for c in lr.checks), [c for c in lr.checks if not c.ok]
    sbh = 16 * 1 * 16
    v = lr.result.values[0]
    assert v["TP alone"]["saved"] / sbh == 13
    assert v["TP + SP"]["saved"] / sbh == 4.25
    assert round(v["TP alone"]["saved"] / v["TP + SP"]["saved"]) == 3


def test_json_checks_hold_for_every_world():
    for world in ("2", "4"):
        out = subprocess.run([sys.executable, "-m", "parasim", "lesson", "sp", "--json", "--world", world],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and all(c["ok"] for c in json.loads(out.stdout)["checks"])


def test_plot_draws_the_sp_flow(tmp_path):
    """`parasim lesson sp --plot FILE.png` writes the flow picture; --list says what it shows."""
    png = tmp_path / "sp.png"
    out = subprocess.run([sys.executable, "-m", "parasim", "lesson", "sp", "--tp", "4", "--plot", str(png), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads(subprocess.run([sys.executable, "-m", "parasim", "lesson", "--list", "--json"],
                                     capture_output=True, text=True, timeout=120).stdout)
    (row,) = [r for r in rows if r["name"] == "sp"]
    assert "all-gather and reduce-scatter" in row["picture"] and row["no_picture"] is None
