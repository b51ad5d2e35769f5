"""Render PNG screenshots of the step-through app for the README (headless: Textual's Pilot, then cairosvg).

    python scripts/screenshot.py [--out DIR] [--size 120x40] [--scale 1.0]

Writes DIR/tui-tp-mlp.png (tp-mlp at its middle event), DIR/tui-collectives.png (collectives at its first
ring all-reduce), DIR/tui-pipeline.png (pp-zero-bubble's DualPipeV run, with its slot table) and
DIR/tui-moe16.png (the 16-GPU example at layer 1's dispatch, following 'contract'). DIR defaults to docs/. Rich's SVG asks for "Fira Code"; cairosvg would fall back to a
proportional font and the columns would drift, so the SVG is switched to DejaVu Sans Mono first.
"""
from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path

from parasim.lesson import get_lesson, run_lesson
from parasim.tui.app import ParasimApp
from parasim.tui.view import View

ROOT = Path(__file__).resolve().parent.parent
FONT = "DejaVu Sans Mono"


def make_view(lesson: str) -> View:
    lr = run_lesson(get_lesson(lesson))
    return View(lr.result.trace, lr.lesson.narrative, lr.lesson.title)


def middle(view: View) -> int:
    return view.visible[len(view.visible) // 2] if view.visible else 0


def first_ring_all_reduce(view: View) -> int:
    for i, e in enumerate(view.events):
        if e.op == "all_reduce" and e.params.get("algo") == "ring":
            return i
    raise SystemExit("collectives has no ring all-reduce to show")


async def screenshot_svg(view: View, index: int, size: tuple[int, int]) -> str:
    """The app's screen with event `index` selected, reached by pressing Right as a user would."""
    app = ParasimApp(view)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        for _ in range(view.visible.index(index)):
            await pilot.press("right")
        await pilot.pause()
        if app.index != index:
            raise SystemExit(f"stepping reached event {app.index}, not {index}")
        return app.export_screenshot(title="parasim")


def svg_to_png(svg: str, path: Path, scale: float) -> None:
    import cairosvg

    svg = re.sub(r"Fira Code", FONT, svg)
    path.parent.mkdir(parents=True, exist_ok=True)
    cairosvg.svg2png(bytestring=svg.encode(), write_to=str(path), scale=scale)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "docs"), metavar="DIR", help="output folder (default: docs/)")
    ap.add_argument("--size", default="120x40", metavar="WxH", help="terminal size (default 120x40)")
    ap.add_argument("--scale", type=float, default=1.0, help="PNG scale (default 1.0)")
    ap.add_argument("--svg", action="store_true", help="also keep the SVGs")
    args = ap.parse_args(argv)
    w, h = (int(x) for x in args.size.lower().split("x"))
    out = Path(args.out)

    shots = []
    tp = make_view("tp-mlp")
    shots.append(("tui-tp-mlp", tp, middle(tp)))
    co = make_view("collectives")
    shots.append(("tui-collectives", co, first_ring_all_reduce(co)))
    pp = make_view("pp-zero-bubble")
    dual = [i for i in pp.visible if pp.events[i].phase.startswith("DualPipeV")]
    shots.append(("tui-pipeline", pp, dual[len(dual) // 2]))
    moe = make_view("moe16")
    shots.append(("tui-moe16", moe, next(i for i, e in enumerate(moe.events) if e.op == "all_to_all")))
    for name, view, index in shots:
        svg = asyncio.run(screenshot_svg(view, index, (w, h)))
        if args.svg:
            (out / f"{name}.svg").parent.mkdir(parents=True, exist_ok=True)
            (out / f"{name}.svg").write_text(svg)
        png = out / f"{name}.png"
        svg_to_png(svg, png, args.scale)
        print(f"{png}  (event {index + 1} of {len(view.events)}, {w}x{h})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
