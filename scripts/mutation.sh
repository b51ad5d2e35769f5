#!/usr/bin/env bash
# Mutation testing of the core (comm/, layout, nn/, pipeline/, estimate/) with mutmut; see docs/testing.md.
#   bash scripts/mutation.sh                      every core mutant (hours on 2 cores)
#   bash scripts/mutation.sh "parasim.layout*"    one module (mutmut's name patterns)
#   bash scripts/mutation.sh --survivors          run the surviving mutants again (after new tests: mutmut
#                                                 keeps a result until its function changes)
# Results stay in mutants/ (resumable); the per-module score table is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
[ -x "$py" ] || py=python3
"$py" -c "import mutmut" 2>/dev/null || "$py" -m pip install --quiet -e ".[test,mutation]"
# forked test processes must not inherit busy BLAS/OpenMP thread pools
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
# a property a mutant breaks is reported at once, without shrinking its example (tests/conftest.py)
export PARASIM_HYPOTHESIS=mutation
if [ "${1:-}" = "--survivors" ]; then
  mapfile -t names < <("$py" scripts/mutation_report.py --survivors)
  [ ${#names[@]} -eq 0 ] || "$(dirname "$py")/mutmut" run "${names[@]}" || true
else
  "$(dirname "$py")/mutmut" run "$@" || true
fi
"$py" scripts/mutation_report.py
