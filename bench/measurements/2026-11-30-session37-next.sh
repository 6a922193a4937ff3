#!/usr/bin/env bash
# Prepared in session 37 for the next device time (issue 40), on a 2xH200 machine (`nvidia-h200-x2`):
# `bash THIS CALL [DEADLINE]` from the checkout's root, with the GPU wheels installed first
# (bench/README.md, "What the GPU machine needs"). Everything lands under $OUT/cN, packed into
# $OUT/cN.tgz. Memory only: session 37 derived fp8's activation saving from what a compiled step
# saves (bench/fp8_saved_bytes.py, CPU: 2 (2d + I) bytes a token and layer compiled, 4d + I eager)
# and held it to llama-1b's compiled peaks at I = 4d; these runs test the two parts no GPU has:
# `bash THIS 1 4.4`: GPU 0 runs llama-1b eager (--no-compile), fp8 then bf16, micro-batch 8 (the eager
# term); GPU 1 runs llama-1b with its MLP 6d wide (--config-overrides intermediate_size=12288),
# compiled, fp8 then bf16, micro-batch 8 (the compiled term's I part). 20 timed steps after 10: the
# peak is reached in the first steps.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
call=$1
deadline=${2:-4.4}
o=$OUT/c$call
mkdir -p "$o"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1
MEM=(--suite llama --gpus 1 --llama-batch-size 8 --llama-steps 20 --llama-warmup 10 --llama-log-every 10
  --eval-samples 500
  --variant 'llama:efp8=--precision fp8 --no-compile'
  --variant 'llama:ebf16=--no-compile'
  --variant 'llama:w6fp8=--precision fp8 --config-overrides intermediate_size=12288'
  --variant 'llama:w6bf16=--config-overrides intermediate_size=12288'
  --variant 'llama:ebf16b=--no-compile --batch-size 16'
  --variant 'llama:efp8b=--precision fp8 --no-compile --batch-size 16'
  --variant 'llama:w6bf16b=--config-overrides intermediate_size=12288 --batch-size 16')
runs() {  # $1: GPU; $2: the runs in order, as variant names; $3: the directory
  local run
  for run in $2; do
    CUDA_VISIBLE_DEVICES=$1 python3 bench/run.py "${MEM[@]}" --only="-$run\$" --deadline-min "$deadline" \
      --out "$o/$3-$run" >>"$o/$3.log" 2>&1
  done
}
SPEED=(--suite llama --gpus 1 --llama-batch-size 32 --llama-steps 40 --llama-warmup 20 --llama-log-every 10
  --eval-samples 500 --variant 'llama:auto32=--precision fp8' --variant 'llama:auto48=--precision fp8 --batch-size 48'
  --variant 'llama:autop32=--precision fp8 --profile-steps 30:35')
speed() {  # $1: GPU; $2: the runs in order, as --only patterns; $3: the directory
  local run
  for run in $2; do
    CUDA_VISIBLE_DEVICES=$1 python3 bench/run.py "${SPEED[@]}" --only="$run" --deadline-min "$deadline" \
      --out "$o/$3-${run//[^a-z0-9]/}" >>"$o/$3.log" 2>&1
  done
}
case $call in
1) runs 0 'efp8 ebf16' gpu0 & runs 1 'w6fp8 w6bf16' gpu1 & wait ;;
# session 38: what fp8's memory buys. auto at micro-batch 48 (about 120 GiB; bf16 needs about 150 there
# and stops at 32) beside bf16 at 32 on GPU 0 and auto at 32 on GPU 1, opposite orders.
2) speed 0 '-auto48$ -k1$' gpu0 & speed 1 '-auto32$ -auto48$' gpu1 & wait ;;
# the second pair of 2 on GPU 0 in the other order; GPU 1 profiles auto's step at 32 (never profiled)
3) speed 0 '-k1$ -auto48$' gpu0 & speed 1 '-autop32$' gpu1 & wait ;;
# the memory terms session 38 built on call 1, tested at micro-batch 16 (unseen by them): eager
# Llama's constant (bf16 and fp8) on GPU 0, the MLP-width term (bf16, 6 d wide) on GPU 1
4) runs 0 'ebf16b efp8b' gpu0 & runs 1 'w6bf16b' gpu1 & wait ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
