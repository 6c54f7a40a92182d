#!/bin/bash
# One device call: the zoo in the time given, then kernel tables of a few models.
# usage: PIPELINE_COMMIT=<commit> bash benchmarks/probes/device_round.sh ZOO_BUDGET_S KERNEL_MODELS [zoo args...]
# (name the commit: the device's copy of the tree may carry a stale git history)
set -u
budget=${1:-280}; kernels=${2:-}; shift 2 || true
export PIPELINE_COMMIT=${PIPELINE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
nvidia-smi -L > "$OUT/machine.txt" 2>&1
t0=$(date +%s)
python benchmarks/zoo/runner.py --device cuda --out "$OUT/zoo" --work /tmp/zoo-work --budget "$budget" --grace 50 "$@" \
  > "$OUT/zoo-stdout.txt" 2> "$OUT/zoo-stderr.txt"; echo "zoo rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$OUT/machine.txt"
if [ -n "$kernels" ]; then
  timeout 120 python benchmarks/probes/zoo_kernels.py --device cuda --models "$kernels" --top 25 --out "$OUT" \
    > /dev/null 2> "$OUT/kernels-stderr.txt"; echo "kernels rc=$?" | tee -a "$OUT/machine.txt"
fi
