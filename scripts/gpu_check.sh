#!/usr/bin/env bash
# On a machine with CUDA GPUs (one is enough): what it can check of parasim's real ranks, as one markdown
# table ready for docs/gpu.md. NCCL at world 1 for every lesson that runs there (and wider worlds when there
# are more GPUs), every kind of call, a bf16 all-reduce, tests/e2e/test_nccl.py, and every lesson as gloo ranks
# with their tensors on the GPU; what cannot run here is a row too, with the reason. scripts/gpu_check.py
# does the work; docs/gpu.md says how to run it on a lent machine.
#
#   bash scripts/gpu_check.sh [--dry-run [--gpus N]] [--out FILE.md] [--budget SECONDS] [--each SECONDS]
#
# PYTHON names the interpreter whose torch sees the GPUs (default python3). Exit status: 0 every row that
# ran passed, 1 one did not, 2 nothing could run (no GPU, a package missing).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # run from the checkout, installed or not
exec "$PY" scripts/gpu_check.py "$@"
