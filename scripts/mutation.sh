#!/usr/bin/env bash
# Mutation testing of the core (comm/, layout, nn/, pipeline/, estimate/) with mutmut; see docs/testing.md.
#   bash scripts/mutation.sh                      every core mutant (hours on 2 cores)
#   bash scripts/mutation.sh "parasim.layout*"    one module (mutmut's name patterns)
# Results stay in mutants/ (resumable); the per-module score table is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
[ -x "$py" ] || py=python3
"$py" -c "import mutmut" 2>/dev/null || "$py" -m pip install --quiet -e ".[test,mutation]"
# forked test processes must not inherit busy BLAS/OpenMP thread pools
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
"$(dirname "$py")/mutmut" run "$@" || true
"$py" scripts/mutation_report.py
