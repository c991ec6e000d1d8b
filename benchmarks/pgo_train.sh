#!/bin/bash
# The training run of `make pgo`: kernels through an instrumented nsim (NSIM_PGO=generate), which writes the
# profiles the optimised build then uses. What users run: timing-only runs, full runs with numerics, and
# `nsim analyze`, of the examples and library kernels, and timing-only runs of a long softmax loop (~100k
# instructions: the per-instruction path) under each preset. Not the benchmarks: they measure the result.
#   benchmarks/pgo_train.sh BUILD/nsim
set -eu
if [ $# -ne 1 ]; then echo "usage: $0 NSIM" >&2; exit 2; fi
nsim=$(realpath "$1")
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_fast_forward as b; print(b.softmax_kernel(14285))" \
  > "$tmp/softmax_100k.json"
for k in examples/*.json examples/library/*.json; do
  "$nsim" run "$k" --timing-only --quiet > /dev/null
  "$nsim" run "$k" --quiet > /dev/null
  "$nsim" analyze "$k" > /dev/null
done
for c in trn1 trn2 trn3; do
  "$nsim" run "$tmp/softmax_100k.json" --timing-only --no-fast-forward --quiet --config $c > /dev/null
  "$nsim" run "$tmp/softmax_100k.json" --timing-only --quiet --config $c > /dev/null  # fast-forward, the default
done
"$nsim" analyze "$tmp/softmax_100k.json" > /dev/null
echo "pgo_train: profiles written"
