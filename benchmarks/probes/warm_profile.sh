#!/bin/bash
# A warm process's first call under cProfile: one cold child fills a cache, a second child runs
# warm under cProfile; the top of the profile goes to $OUT.
# usage: bash benchmarks/probes/warm_profile.sh WORKLOAD "MODE" (MODE: "ours precompile" or "ours")
set -u
workload=${1:-gpt2-12}; mode=${2:-ours precompile}
work=$(mktemp -d)
export TORCHINDUCTOR_CACHE_DIR=$work/inductor TRITON_CACHE_DIR=$work/triton
python benchmarks/compile_time.py --child "$workload" "$mode cold" "$work/cache" > "$OUT/warm-profile-cold.json"
python -m cProfile -o "$work/warm.prof" benchmarks/compile_time.py --child "$workload" "$mode warm process" "$work/cache" \
  > "$OUT/warm-profile-warm.json"
python - "$work/warm.prof" > "$OUT/warm-profile.txt" <<'PY'
import pstats, sys
stats = pstats.Stats(sys.argv[1])
stats.sort_stats("cumulative").print_stats(60)
stats.sort_stats("tottime").print_stats(30)
PY
