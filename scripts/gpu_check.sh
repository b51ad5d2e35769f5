#!/usr/bin/env bash
# On a machine with CUDA GPUs: run the NCCL-backed tests, then every lesson that fits on the visible
# GPUs with `parasim run --backend nccl` (1 rank, and each of 2, 4, 8 and the lesson's own world that
# the GPU count allows), and print one table: lesson, world, match, time. Same script for 1 or 8 GPUs.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # run from the checkout, installed or not
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: no CUDA GPU visible to $PY (or no torch): nothing to check" >&2
    exit 2
fi
"$PY" -m pytest -q -m nccl tests/test_nccl.py -p no:cacheprovider 2>&1 | tail -n 3
"$PY" - <<'PYEOF'
import json, subprocess, sys, time
import torch
from parasim.lesson import load_lessons

gpus = torch.cuda.device_count()
print(f"{gpus} CUDA GPU(s) visible: {', '.join(torch.cuda.get_device_name(i) for i in range(gpus)) or 'none'}")
rows = []
for lesson in load_lessons().values():
    worlds = sorted({w for w in (1, 2, 4, 8, lesson.world) if w <= gpus and lesson.fits(w)})
    for w in worlds:
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "parasim", "run", lesson.name, "--backend", "nccl",
                              "--nproc", str(w), "--json"], capture_output=True, text=True, timeout=900)
        took = time.perf_counter() - t
        try:
            data = json.loads(out.stdout)
            match = "yes" if data["match"] and all(c["ok"] for c in data["checks"]) else "NO"
            calls = sum(v["total_ms"] for v in data["timings"].values())
        except (ValueError, KeyError):
            match, calls = f"error (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}", float("nan")
        rows.append((lesson.name, w, match, took, calls))
print(f"{'lesson':<16}{'world':>6}  {'match':<8}{'wall (s)':>10}{'in calls (ms)':>15}")
for name, w, match, took, calls in rows:
    print(f"{name:<16}{w:>6}  {match:<8}{took:>10.1f}{calls:>15.2f}")
sys.exit(0 if rows and all(r[2] == "yes" for r in rows) else 1)
PYEOF
