"""The mutation score per core module, from mutmut's results in mutants/ and the equivalent mutants
listed (with the reason each changes nothing observable) in docs/mutation-equivalent.txt.

score = killed / (checked - equivalent); a timeout counts as killed (the mutant hangs where the code
does not). Prints a Markdown table for docs/testing.md, then every surviving mutant not listed as
equivalent, which is work left to do. With --survivors: only their names, one per line. With --names FILE:
only the mutants FILE lists, one a line (`scripts/mutation_changed.py REV --names > FILE`: a change's own).

mutants/ is not kept between checkouts, and a run over a big module takes hours, so results can be
carried: `--save FILE` writes every result with a hash of its function's code, `--load FILE` puts back
those whose function is unchanged (a changed function renumbers its mutants and must run again).
`--load FILE --since REV [--renamed OLD=NEW ...]` also puts back the results saved for a function's code at
REV where only its type hints, or names renamed everywhere since (mutation_changed.py), changed: mutmut
mutates neither, so its mutants are the same ones, numbered alike."""
from __future__ import annotations

import fcntl
import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path

from mutation_changed import _old_source, changed_functions, functions, moved_since  # scripts/ is on the path

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


def _metas() -> dict[str, Path]:
    """module -> its results file in mutants/."""
    return {str(meta.relative_to(ROOT / "mutants")).removesuffix(".py.meta").replace("/", "."): meta
            for meta in sorted((ROOT / "mutants" / "parasim").rglob("*.py.meta"))}


def _hashes(module: str) -> dict[str, str]:
    """mutmut's function key (x_f, xǁClassǁm) -> a short hash of its code, docstring aside."""
    source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
    return {name: hashlib.sha1(code.encode()).hexdigest()[:12] for name, code in functions(source).items()}


def save(path: Path) -> int:
    """One line per function with results: `module function hash n:code ...` (n the mutant's number). A line
    already in the file for a function with no results now stays (its hash says which code it was for), so a
    later `--load --since` can still carry it."""
    lines = []
    for module, meta in _metas().items():
        hashes, by_function = _hashes(module), defaultdict(list)
        for name, code in json.loads(meta.read_text()).get("exit_code_by_key", {}).items():
            function, _, number = name[len(module) + 1:].partition("__mutmut_")
            if code is not None and function in hashes:
                by_function[function].append(f"{number}:{code}")
        lines += [f"{module} {f} {hashes[f]} {' '.join(codes)}" for f, codes in sorted(by_function.items())]
    written = {tuple(line.split()[:2]) for line in lines}
    kept = [line for line in (path.read_text().splitlines() if path.exists() else [])
            if line.strip() and tuple(line.split()[:2]) not in written]
    lines = sorted(lines + kept)
    path.write_text("\n".join(lines) + "\n")
    print(f"saved the results of {len(lines)} functions to {path}")
    return 0


def _hashes_at(rev: str, module: str, moved: dict[str, str]) -> dict[str, str]:
    """`_hashes` of the module's code at rev (where it sat then)."""
    rel = module.replace(".", "/") + ".py"
    source = _old_source(rev, moved.get(rel, rel))
    return {name: hashlib.sha1(code.encode()).hexdigest()[:12] for name, code in functions(source).items()}


def load(path: Path, since: str | None = None, renames: dict[str, str] | None = None) -> int:
    """Put back the saved results of every function whose code is the same now (or, with `since`, the same as
    at that revision but for type hints and `renames`)."""
    metas, kept, stale, carried = _metas(), 0, 0, 0
    moved = moved_since(since) if since else {}
    saved: dict[str, list[tuple[str, str, list[str]]]] = defaultdict(list)
    now = {old[: -len(".py")].replace("/", "."): new[: -len(".py")].replace("/", ".") for new, old in moved.items()}
    for line in path.read_text().splitlines():
        module, function, digest, *codes = line.split()
        saved[now.get(module, module)].append((function, digest, codes))  # a file moved since: where it is now
    for module, rows in saved.items():
        if module not in metas:
            stale += len(rows)
            continue
        hashes = _hashes(module)
        if since:
            then = _hashes_at(since, module, moved)
            same = set(hashes) - changed_functions(since, module.replace(".", "/") + ".py", renames, moved)
        lock = open(ROOT / "mutants" / ".focus.lock", "w")  # mutation_focus.py may be writing results beside us
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(metas[module].read_text())
        results = data["exit_code_by_key"]
        for function, digest, codes in rows:
            if hashes.get(function) != digest:
                if not (since and function in same and then.get(function) == digest):
                    stale += 1
                    continue
                carried += 1
            for item in codes:
                number, _, code = item.partition(":")
                name = f"{module}.{function}__mutmut_{number}"
                if name in results:
                    results[name] = int(code)
                    kept += 1
        metas[module].write_text(json.dumps(data, indent=4))
        lock.close()  # the lock goes with it
    print(f"put back {kept} results ({carried} functions changed only in hints or renames since {since}); "
          f"{stale} functions changed since (or gone): run their mutants again" if since else
          f"put back {kept} results; {stale} functions changed since (or gone): run their mutants again")
    return 0


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] in ("--save", "--load"):
        return (save if sys.argv[1] == "--save" else load)(Path(sys.argv[2]))
    if len(sys.argv) >= 5 and sys.argv[1] == "--load" and sys.argv[3] == "--since":
        pairs = sys.argv[5:]
        if len(pairs) % 2 or any(flag != "--renamed" or value.count("=") != 1
                                 for flag, value in zip(pairs[::2], pairs[1::2])):
            print("usage: --load FILE --since REV [--renamed OLD=NEW ...]", file=sys.stderr)
            return 2
        return load(Path(sys.argv[2]), sys.argv[4], dict(value.split("=") for value in pairs[1::2]))
    eq = equivalents()
    only = None
    if "--names" in sys.argv:
        at = sys.argv.index("--names") + 1
        if at >= len(sys.argv) or not Path(sys.argv[at]).is_file():
            print("--names needs a file of mutant names, one a line", file=sys.stderr)
            return 2
        only = set(Path(sys.argv[at]).read_text().split())
    rows: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    left = []
    for meta in sorted((ROOT / "mutants" / "parasim").rglob("*.py.meta")):
        module = str(meta.relative_to(ROOT / "mutants")).removesuffix(".py.meta").replace("/", ".")
        for name, code in json.loads(meta.read_text()).get("exit_code_by_key", {}).items():
            if only is not None and name not in only:
                continue
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
