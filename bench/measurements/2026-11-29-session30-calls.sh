#!/usr/bin/env bash
# Session 30's device calls (issue 40), on a 1xH200 machine: `bash THIS CALL [DEADLINE] [REGEX]` from
# the checkout's root, with the GPU wheels (torchao 0.17.0, datasets, deepspeed) installed first
# (bench/README.md, "What the GPU machine needs"). The runs go one after another, each alone on the
# GPU, in the order below (a deadline cuts the last). Everything lands under $OUT/cN, packed into
# $OUT/cN.tgz. Ratios are taken within one machine only. The calls, in order:
# `bash THIS 1` (the one-pass float8 casts of bench/fp8_onepass.py as committed, then llama-1b at
# micro-batch 32: bf16's default, with --compile-optimizer, and fp8's default);
# `bash THIS 2` (by default fp8 with --compile-optimizer at 32, then both at 16; this session ran
# `bash THIS 2 9.0 'k1-natco32$|k1-b32$|k1-co32$'`: the bf16 pair again beside fp8's).
# The JSONs: 2026-11-29-h200x1-session30-c1.json, -c2.json, -c3.json (call 3: a bf16 micro-batch-16 run,
# the command in 2026-11-29-session30.md).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
call=$1
o=$OUT/c$call
mkdir -p "$o"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1
python3 -c 'import sys, torch, transformers, accelerate, torchao, triton; print(sys.version.split()[0], torch.__version__,
  torch.version.cuda, transformers.__version__, accelerate.__version__, torchao.__version__, triton.__version__)' \
  >"$o/versions.txt" 2>&1
V=(--variant 'llama:b32=--batch-size 32'
  --variant 'llama:co32=--compile-optimizer --batch-size 32'
  --variant 'llama:nat32=--precision fp8 --batch-size 32'
  --variant 'llama:natco32=--precision fp8 --compile-optimizer --batch-size 32'
  --variant 'llama:co16=--compile-optimizer --batch-size 16'
  --variant 'llama:natco16=--precision fp8 --compile-optimizer --batch-size 16')
SPEED=(--suite llama --gpus 1 --llama-steps 40 --llama-warmup 20 --llama-log-every 10 --eval-samples 500)
case $call in
1)  # the one-pass casts (about a minute), then micro-batch 32 ($2: the deadline (min), $3: run ids)
    (cd bench && timeout 150 python3 fp8_onepass.py) >"$o/onepass.txt" 2>&1
    python3 bench/run.py "${SPEED[@]}" "${V[@]}" --only "${3:-k1-b32$|k1-co32$|k1-nat32$}" \
      --deadline-min "${2:-8.2}" --out "$o/speed" >"$o/speed.log" 2>&1
    ;;
2)  # fp8 with the compiled optimizer step at 32 and at 16, and bf16 with it at 16
    python3 bench/run.py "${SPEED[@]}" "${V[@]}" --only "${3:-k1-natco32$|k1-co16$|k1-natco16$}" \
      --deadline-min "${2:-9.3}" --out "$o/speed" >"$o/speed.log" 2>&1
    ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
