#!/bin/bash
# Same simulated times from two nsim builds: runs every examples/*.json and examples/library/*.json
# timing-only through both (stats JSON, per-instruction and per-DMA-packet tables, `nsim analyze --json`)
# and diffs the outputs byte for byte. None of them holds a wall-clock figure, so any difference is a
# change of the simulated schedule. Used for the speed work of issue 12 (docs/performance.md).
#   benchmarks/compare_timing.sh BEFORE/nsim AFTER/nsim [extra kernel.json ...]
set -u
if [ $# -lt 2 ]; then echo "usage: $0 NSIM_BEFORE NSIM_AFTER [kernel.json ...]" >&2; exit 2; fi
a=$1; b=$2; shift 2
cd "$(dirname "$0")/.."
out=$(mktemp -d)
run() {  # run NSIM DIR
  mkdir -p "$2"
  for k in examples/*.json examples/library/*.json "${extra[@]}"; do
    n=$(echo "$k" | tr / _)
    "$1" run "$k" --timing-only --quiet --stats "$2/$n.stats.json" --instructions "$2/$n.instr.csv" \
      --dma "$2/$n.dma.csv" > "$2/$n.stdout" 2>&1; echo "exit $?" >> "$2/$n.stdout"
    "$1" analyze "$k" --json "$2/$n.analyze.json" > "$2/$n.analyze.txt" 2>&1; echo "exit $?" >> "$2/$n.analyze.txt"
  done
}
extra=("$@")
run "$a" "$out/before"
run "$b" "$out/after"
if diff -r "$out/before" "$out/after" > "$out/diff.txt"; then
  echo "identical: $(ls "$out/after" | wc -l) files from $(ls "$out/after"/*.stdout | wc -l) kernels"
  rm -rf "$out"
else
  echo "DIFFERENT (see $out/diff.txt):"; head -20 "$out/diff.txt"; exit 1
fi
