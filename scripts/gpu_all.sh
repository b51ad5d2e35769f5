#!/usr/bin/env bash
# Everything a lent GPU machine runs for parasim, in one call: the two wheels it lacks installed from .whl,
# scripts/gpu_check.sh (its table) and scripts/gpu_kernels.py (its JSON), each under a budget of its own and
# a hard limit, the outputs left under $OUT. docs/gpu.md gives the exact `run` command.
#
#   bash scripts/gpu_all.sh [--dry-run] [--budget SECONDS]
#
# --budget is the whole call's (default 540, at most 570: a call may last 600 s), split as it prints:
#   install      30 s at most
#   gpu_check    55% of the rest: its --budget, --each min(180, that), hard limit its budget + 30 s
#   gpu_kernels  what is left less 20 s: its --budget, hard limit its budget + 20 s
# so the hard limits add up to --budget. Outputs: $OUT/gpu-table.md, $OUT/gpu-kernels.json, $OUT/gpu-check.log,
# $OUT/gpu-kernels.log, $OUT/nvidia-smi.txt. PYTHON names the interpreter (default python3); PARASIM_COMMIT,
# when set, is the commit the kernels' file records (a copy without .git cannot say). Exit status: 0 both parts
# ran clean, else the first non-zero status of a part; 2 for a bad flag or wheels that are not there.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DRY=0
TOTAL=540
say() { printf '%s\n' "$*"; }
die() { printf 'gpu_all: %s\n' "$*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --budget)
            [ $# -ge 2 ] || die "--budget needs a number of seconds"
            case "$2" in ''|*[!0-9]*) die "--budget takes whole seconds from 240 to 570, got '$2'" ;; esac
            [ "$2" -ge 240 ] && [ "$2" -le 570 ] || die "--budget takes whole seconds from 240 to 570, got '$2'"
            TOTAL=$2; shift ;;
        *) die "unknown argument '$1' (use --dry-run, --budget SECONDS)" ;;
    esac
    shift
done

INSTALL=30
REST=$((TOTAL - INSTALL))
CHECK=$((REST * 55 / 100))
EACH=$((CHECK < 180 ? CHECK : 180))
CHECK_HARD=$((CHECK + 30))
KERNELS=$((REST - CHECK_HARD - 20))
KERNELS_HARD=$((KERNELS + 20))
OUTDIR=${OUT:-gpu-out}

INSTALL_CMD=(timeout -k 5 "$INSTALL" "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site)
CHECK_CMD=(timeout -k 5 "$CHECK_HARD" bash scripts/gpu_check.sh --budget "$CHECK" --each "$EACH"
           --out "$OUTDIR/gpu-table.md")
KERNELS_CMD=(timeout -k 5 "$KERNELS_HARD" "$PY" scripts/gpu_kernels.py --budget "$KERNELS"
             --out "$OUTDIR/gpu-kernels.json")
shown() { printf '%q ' "$@" | sed 's/ $//'; }

say "gpu_all: --budget $TOTAL s: install $INSTALL s, gpu_check $CHECK s (+30 s to stop), gpu_kernels $KERNELS s (+20 s to stop)"
if [ "$DRY" = 1 ]; then
    say "1. $(shown "${INSTALL_CMD[@]}") .whl/*.whl   (only when greenlet or array_api_compat does not import)"
    say "2. PYTHONPATH=/tmp/site:. $(shown "${CHECK_CMD[@]}")"
    say "3. PYTHONPATH=/tmp/site:. $(shown "${KERNELS_CMD[@]}")"
    say "outputs under $OUTDIR: gpu-table.md, gpu-kernels.json, gpu-check.log, gpu-kernels.log, nvidia-smi.txt"
    exit 0
fi

mkdir -p "$OUTDIR" || die "cannot make the output folder $OUTDIR"
[ -n "${OUT:-}" ] || say "gpu_all: \$OUT is not set: outputs go to $OUTDIR"
command -v nvidia-smi >/dev/null && nvidia-smi > "$OUTDIR/nvidia-smi.txt" 2>&1

# 1. the wheels, unless this Python has the modules already
if ! "$PY" -c "import greenlet, array_api_compat" 2>/dev/null; then
    wheels=(.whl/*.whl)
    [ -e "${wheels[0]}" ] || die "no .whl/*.whl here and $PY cannot import greenlet and array_api_compat: bring the wheels (docs/gpu.md)"
    "${INSTALL_CMD[@]}" "${wheels[@]}" || die "installing ${wheels[*]} failed"
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

# 2. the check: its table on stdout too, so the call's output shows it
"${CHECK_CMD[@]}" 2>&1 | tee "$OUTDIR/gpu-check.log"
CHECK_RC=${PIPESTATUS[0]}
say "gpu_all: gpu_check exited $CHECK_RC"

# 3. the kernels
"${KERNELS_CMD[@]}" 2>&1 | tee "$OUTDIR/gpu-kernels.log"
KERNELS_RC=${PIPESTATUS[0]}
say "gpu_all: gpu_kernels exited $KERNELS_RC"

[ "$CHECK_RC" = 0 ] || exit "$CHECK_RC"
exit "$KERNELS_RC"
