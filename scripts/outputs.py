"""Behaviour kept: save what parasim prints now, and compare a later checkout's outputs with it.

    python scripts/outputs.py save DIR       every lesson's --json, the moe16 contract trace, the symbolic benchmark
    python scripts/outputs.py compare DIR    the same now, against DIR: names every output that differs

A redesign that keeps behaviour keeps these equal. Call sites (file:line of a collective) are dropped from
events, since moving a line moves them; the benchmark's seconds and megabytes are compared as ratios (a time
may grow by at most 10%), every other figure exactly.
"""
from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMED = ("_s", "_mb", "seconds", "over_target", "over_virtual")  # benchmark fields measured, not computed


def lessons() -> list[str]:
    out = subprocess.run([sys.executable, "-m", "parasim", "lesson"], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    return [line.split()[0] for line in out.splitlines()[1:] if line.startswith("  ")]


def commands() -> dict[str, list[str]]:
    cmds = {f"lesson-{n}": ["lesson", n, "--json"] for n in lessons()}
    cmds["trace-moe16-contract"] = ["trace", "--layout", "moe16", "--token", "contract", "--json"]
    return cmds


def unsited(v):
    """The output without call sites: a member's "site", any "sites"/"site" field a record carries."""
    if isinstance(v, dict):
        return {k: unsited(x) for k, x in v.items() if k not in ("site", "sites", "call_site")}
    if isinstance(v, list):
        return [unsited(x) for x in v]
    return v


def run(args: list[str]) -> object:
    p = subprocess.run([sys.executable, "-m", "parasim", *args], capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        return {"exit": p.returncode, "stderr": p.stderr[-2000:]}
    return unsited(json.loads(p.stdout))


def benchmark() -> object:
    p = subprocess.run([sys.executable, "benchmarks/symbolic.py", "--json"], capture_output=True, text=True,
                       cwd=ROOT)
    return json.loads(p.stdout) if p.returncode == 0 else {"exit": p.returncode, "stderr": p.stderr[-2000:]}


def collect(with_benchmark: bool) -> dict[str, object]:
    cmds = commands()
    with ThreadPoolExecutor(2) as pool:
        got = dict(zip(cmds, pool.map(run, cmds.values())))
    if with_benchmark:
        got["benchmark-symbolic"] = benchmark()
    return got


def differences(old, new, where: str = "", out: list | None = None) -> list[str]:
    out = [] if out is None else out
    if len(out) > 20:
        return out
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            if k not in old or k not in new:
                out.append(f"{where}.{k}: only in {'before' if k in old else 'after'}")
            elif any(k.endswith(s) for s in TIMED) and isinstance(old[k], (int, float)):
                if k.endswith(("_s", "seconds")) and new[k] > 1.10 * old[k] + 0.05:
                    out.append(f"{where}.{k}: {old[k]:.3g} s before, {new[k]:.3g} s now (more than 10% slower)")
            else:
                differences(old[k], new[k], f"{where}.{k}", out)
    elif isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            out.append(f"{where}: {len(old)} items before, {len(new)} now")
        for i, (a, b) in enumerate(zip(old, new)):
            differences(a, b, f"{where}[{i}]", out)
    elif old != new and not (old != old and new != new):
        out.append(f"{where}: {str(old)[:80]} before, {str(new)[:80]} now")
    return out


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[1] not in ("save", "compare"):
        print(__doc__.strip().splitlines()[2:4], file=sys.stderr)
        return 2
    mode, folder = sys.argv[1], Path(sys.argv[2])
    bench = "--no-benchmark" not in sys.argv
    got = collect(bench)
    if mode == "save":
        folder.mkdir(parents=True, exist_ok=True)
        for name, v in got.items():
            (folder / f"{name}.json").write_text(json.dumps(v, indent=0, sort_keys=True))
        print(f"saved {len(got)} outputs in {folder}")
        return 0
    bad = 0
    for name, v in got.items():
        path = folder / f"{name}.json"
        if not path.exists():
            print(f"{name}: new (nothing saved before)")
            continue
        diffs = differences(json.loads(path.read_text()), json.loads(json.dumps(v)), name)
        for d in diffs[:20]:
            print(d)
        bad += bool(diffs)
    print(f"{len(got)} outputs compared, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
