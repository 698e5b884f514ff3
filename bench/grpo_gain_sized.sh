#!/usr/bin/env bash
# GRPO's own gain through Codex, sized so that the noise tests can pass (issue 39, item 1):
# 12 steps x 4 chores x 8 samples per seed, held-out evaluations of 72 sessions (36 chores x 2)
# before and after, 3 seeds side by side, one process each, from one fixed checkpoint.
#
# What it costs, from the 3-seed run of docs/benchmarks.md (6 steps x 4 x 4, 36-session
# evaluations: 26 to 33 min per seed on one core): about 4x the training sessions and 2x the
# evaluation sessions, so about 100 to 130 core-minutes per seed. It does not fit a 180-minute
# session on the 2 shared cores of a development machine; on a 16-core machine (THREADS=4,
# three seeds at once) expect about 45 to 60 minutes.
#
#   bash bench/grpo_gain_sized.sh [OUT]          # OUT: bench-results/grpo-gain
#   THREADS=4 SEEDS="0 1 2" bash bench/grpo_gain_sized.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/grpo-gain}
threads=${THREADS:-4}
read -r -a seeds <<<"${SEEDS:-0 1 2}"
sizes=(--steps 12 --per-step 4 --samples 8 --eval-tasks 36 --threads "$threads")

python bench/grpo_only.py --warm-only "${sizes[@]}" --out "$out"
pids=()
for seed in "${seeds[@]}"; do
    python bench/grpo_only.py --seeds "$seed" "${sizes[@]}" --out "$out" \
        >"$out/seed-$seed.log" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
python bench/grpo_only.py --seeds "${seeds[@]}" "${sizes[@]}" --out "$out" --report-only
exit "$status"
