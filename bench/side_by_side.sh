#!/usr/bin/env bash
# Several bench/run.py invocations at once, one GPU each: 1-GPU runs long enough for a loss
# comparison (500 steps of llama-1b: about 4 minutes each) that one after another would not fit
# one 10-minute device call. Invocation i runs on GPU i with --only REGEX_i, into OUT/gpuI, its
# output in OUT/gpuI.log. Each row says it was timed beside the others (--allow-busy-gpus): the
# runs share the host's CPUs and PCIe, so compare rows of one such call with each other.
#
#   bench/side_by_side.sh OUT 'k1$' 'k1-fp8$' -- --suite llama --gpus 1 --variant 'llama:fp8=--precision fp8'
set -u
out=$1
shift
onlys=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  onlys+=("$1")
  shift
done
[ $# -gt 0 ] && shift # the --
mkdir -p "$out"
pids=()
for i in "${!onlys[@]}"; do
  CUDA_VISIBLE_DEVICES=$i python3 "$(dirname "$0")/run.py" "$@" --allow-busy-gpus --only "${onlys[$i]}" \
    --out "$out/gpu$i" >"$out/gpu$i.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do
  wait "$p" || rc=1
done
exit $rc
