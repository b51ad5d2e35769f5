"""The mutation score per core module, from mutmut's results in mutants/ and the equivalent mutants
listed (with the reason each changes nothing observable) in docs/mutation-equivalent.txt.

score = killed / (checked - equivalent); a timeout counts as killed (the mutant hangs where the code
does not). Prints a Markdown table for docs/testing.md, then every surviving mutant not listed as
equivalent, which is work left to do. With --survivors: only their names, one per line."""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KILLED = {1, 3, 36, 24, -24, 152, 255, -9, -11, 37}  # mutmut's exit codes for killed, timeout, crash
SURVIVED = {0, 5, 33}  # survived, or no test reached it


def equivalents() -> dict[str, str]:
    path = ROOT / "docs" / "mutation-equivalent.txt"
    out = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.strip() and not line.startswith("#"):
            name, _, why = line.partition(" ")
            out[name] = why.strip()
    return out


def main() -> int:
    eq = equivalents()
    rows: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    left = []
    for meta in sorted((ROOT / "mutants" / "parasim").rglob("*.py.meta")):
        module = str(meta.relative_to(ROOT / "mutants")).removesuffix(".py.meta").replace("/", ".")
        for name, code in json.loads(meta.read_text()).get("exit_code_by_key", {}).items():
            r = rows[module]
            r["mutants"] += 1
            if code in KILLED:
                r["killed"] += 1
            elif name in eq:  # by its reason no test can kill it, run or not
                r["equivalent"] += 1
            elif code is None:
                r["not run"] += 1
            elif code in SURVIVED:
                r["survived"] += 1
                left.append(f"{name} ({'no test reaches it' if code in (5, 33) else 'survived'})")
            else:
                r["other"] += 1
                left.append(f"{name} (exit {code})")
    if "--survivors" in sys.argv:  # names only, for `mutmut run NAME...` after new tests
        print("\n".join(x.split()[0] for x in left))
        return 0
    cols = ["mutants", "not run", "killed", "equivalent", "survived"]
    print("| module | " + " | ".join(cols) + " | score |")
    print("|---" * (len(cols) + 2) + "|")
    total = defaultdict(int)
    for module, r in rows.items():
        done = r["killed"] + r["survived"] + r["other"]
        if not done:
            continue
        for c in cols + ["other"]:
            total[c] += r[c]
        print(f"| {module} | " + " | ".join(str(r[c]) for c in cols) + f" | {100 * r['killed'] / done:.1f}% |")
    done = total["killed"] + total["survived"] + total["other"]
    if done:
        print("| **all run** | " + " | ".join(str(total[c]) for c in cols) + f" | **{100 * total['killed'] / done:.1f}%** |")
    if left:
        print(f"\n{len(left)} surviving mutant(s) not listed as equivalent:")
        print("\n".join("  " + x for x in left))
    return 0


if __name__ == "__main__":
    sys.exit(main())
