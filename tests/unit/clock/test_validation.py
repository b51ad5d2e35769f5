"""docs/validation.md's table stays true: every parasim figure there is recomputed here from the setup the
page writes beside it, and the gap is parasim's figure minus the published one. The published figures are
the sources' (copied into the page, checked here only for being what the page says)."""
import re
from pathlib import Path

import pytest

from parasim.estimate import Plan, breakdown
from parasim.layout import ModelSpec

DOC = Path(__file__).resolve().parents[3] / "docs" / "validation.md"
GiB = 2 ** 30
LLAMA_8B = ModelSpec(name="llama-3.1-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                     gated=True, norm="rmsnorm", bias=False)
QWEN3_8B = ModelSpec(name="qwen3-8b", layers=36, hidden=4096, heads=32, kv_heads=8, ffn=12288, vocab=151936,
                     gated=True, norm="rmsnorm", bias=False)
ZERO_7_5B = ModelSpec(name="zero-7.5b", layers=32, hidden=4096, heads=32, vocab=32000, params=7.5e9)


def _zero(stage):
    return breakdown(ZERO_7_5B, Plan(dp=64, zero=stage), 1).model_state / 1e9


def _fsdp(dp):
    return breakdown(LLAMA_8B, Plan(dp=dp, zero=3, recompute="selective", dropout=False, micro_batch=2),
                     8192).total / GiB


def _cp(cp):
    return breakdown(LLAMA_8B, Plan(dp=8 // cp, cp=cp, zero=3, recompute="full", dropout=False), 32768 * cp).total / GiB


def _trl(offload):
    b = breakdown(QWEN3_8B, Plan(cp=8, zero=3, recompute="full", dropout=False, chunked_loss=True), 1048576)
    return (b.total - (b.items["activations"] if offload else 0)) / 1e9


POINTS = {  # id -> (parasim's figure, its unit)
    "zero-os": (lambda: _zero(1), "GB"), "zero-os-g": (lambda: _zero(2), "GB"), "zero-os-g-p": (lambda: _zero(3), "GB"),
    "zero-base": (lambda: _zero(0), "GB"),
    "titan-fsdp8": (lambda: _fsdp(8), "GiB"), "titan-fsdp128": (lambda: _fsdp(128), "GiB"),
    "titan-fsdp-delta": (lambda: _fsdp(8) - _fsdp(128), "GiB"),
    "titan-cp1": (lambda: _cp(1), "GiB"), "titan-cp2": (lambda: _cp(2), "GiB"), "titan-cp4": (lambda: _cp(4), "GiB"),
    "titan-cp8": (lambda: _cp(8), "GiB"),
    "trl-qwen3-8b-1m": (lambda: _trl(False), "GB"), "trl-qwen3-8b-1m-offload": (lambda: _trl(True), "GB"),
}


def _rows():
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] in POINTS:
            rows[cells[0]] = cells
    return rows


def test_the_page_lists_every_point_once():
    assert set(_rows()) == set(POINTS)


@pytest.mark.parametrize("point", list(POINTS), ids=[f"p{k}" for k in range(len(POINTS))])
def test_parasims_figure_and_the_gap_are_what_the_estimator_says(point):
    _, kind, _, _, published, ours, gap = _rows()[point]
    figure, unit = POINTS[point]
    want = figure()
    number = re.fullmatch(r"(-?[\d.]+) (GB|GiB)", published)
    assert number and number.group(2) == unit and kind in ("analytic", "measured")
    assert ours == f"{want:.2f} {unit}", point
    assert gap == f"{want - float(number.group(1)):.2f} {unit}", point


def test_the_flat_cp_rows_are_flat_in_both():
    """Table 2's point: CP keeps per-GPU memory constant while the sequence grows with it."""
    rows = _rows()
    published = [float(rows[f"titan-cp{c}"][4].split()[0]) for c in (1, 2, 4, 8)]
    ours = [_cp(c) for c in (1, 2, 4, 8)]
    assert max(ours) - min(ours) < 1e-9 * max(ours) and max(published) - min(published) < 0.01 * max(published)


def test_analytic_points_agree_to_the_papers_rounding():
    rows = _rows()
    for point in ("zero-os", "zero-os-g", "zero-os-g-p", "zero-base"):
        published = rows[point][4].split()[0]
        decimals = len(published.split(".")[1]) if "." in published else 0
        assert round(POINTS[point][0](), decimals) == float(published), point


def test_the_gathered_layers_the_page_quotes_are_the_estimators():
    """The prose quotes ZeRO-3's gathered layers (equal at 8 and 128 GPUs, so they cancel in the delta)."""
    from parasim.estimate.memory import GATHERED, items

    text = DOC.read_text()
    fsdp = [float(items(LLAMA_8B, Plan(dp=dp, zero=3), 0)[GATHERED][0]) / GiB for dp in (8, 128)]
    assert fsdp[0] == fsdp[1] and f"`ZeRO-3 gathered layers`, {fsdp[0]:.2f} GiB at both sizes" in text
    trl = float(items(QWEN3_8B, Plan(cp=8, zero=3), 0)[GATHERED][0]) / 1e9
    assert f"FSDP's\n  gathered layers are, {trl:.2f} GB" in text
