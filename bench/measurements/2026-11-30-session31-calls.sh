#!/usr/bin/env bash
# Session 31's device calls (issue 40), on a 1xH200 machine: `bash THIS CALL [ARGS]` from the
# checkout's root, with the GPU wheels (torchao 0.17.0, datasets, deepspeed) installed first
# (bench/README.md, "What the GPU machine needs"). The runs go one after another, each alone on the
# GPU, in the order of the variants below (a deadline cuts the last). Everything lands under $OUT/cN,
# packed into $OUT/cN.tgz. Ratios are taken within one machine only. The calls:
# `bash THIS 1` (llama-1b at micro-batch 32: fp8 with the LM head's forward in float8 and its
# backward bf16 (`--fp8-head --fp8-head-backward bf16`, new this session), the bf16 default, fp8's
# default); `bash THIS 2 REGEX [DEADLINE] [RUNS]` (400-step loss runs on the non-repeated text,
# micro-batch 8, sessions 19-30's protocol); `bash THIS 3 [DEADLINE]` (the Trainer with
# torch_compile beside our defaults at micro-batch 16, not run this session); `bash THIS 4 GPUS
# [REGEX] [DEADLINE]` (written after the calls, for a 2- or 4-GPU machine: GPT-2 small, FSDP2 with
# the model one unit compiled whole (--fsdp-blocks-per-unit 0, new) beside compiled DDP and FSDP2's
# default, then a profile of the new one).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
call=$1
o=$OUT/c$call
mkdir -p "$o"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1
python3 -c 'import sys, torch, transformers, accelerate, torchao, triton; print(sys.version.split()[0], torch.__version__,
  torch.version.cuda, transformers.__version__, accelerate.__version__, torchao.__version__, triton.__version__)' \
  >"$o/versions.txt" 2>&1
V=(--variant 'llama:natfb32=--precision fp8 --fp8-head --fp8-head-backward bf16 --batch-size 32'
  --variant 'llama:b32=--batch-size 32'
  --variant 'llama:nat32=--precision fp8 --batch-size 32'
  --variant 'llama:natfb=--precision fp8 --fp8-head --fp8-head-backward bf16'
  --variant 'llama:nat=--precision fp8')
SPEED=(--suite llama --gpus 1 --llama-steps 40 --llama-warmup 20 --llama-log-every 10 --eval-samples 500)
LOSS=(--suite llama --gpus 1 --llama-steps 380 --llama-warmup 20 --llama-log-every 20 --eval-samples 16000)
case $call in
1)  # micro-batch 32: the float8 forward head beside the bf16 default and fp8's default
    python3 bench/run.py "${SPEED[@]}" "${V[@]}" --only "${2:-k1-natfb32$|k1-b32$|k1-nat32$}" \
      --deadline-min "${3:-9.3}" --out "$o/speed" >"$o/speed.log" 2>&1
    ;;
2)  # the loss after 400 steps of the variant(s) named by the regex $2, $4 runs of each, deadline $3 min
    python3 bench/run.py "${LOSS[@]}" "${V[@]}" --only "$2" --repeat "${4:-1}" --deadline-min "${3:-9.2}" \
      --out "$o/loss" >"$o/loss.log" 2>&1
    ;;
3)  # ours (the defaults, compiled as the bench's llama suite runs them), then the Trainer, micro-batch 16
    python3 bench/run.py --suite llama --gpus 1 --llama-batch-size 16 --llama-steps 40 --llama-warmup 20 \
      --llama-log-every 10 --eval-samples 500 --deadline-min "${2:-9.3}" --out "$o/trainer" >"$o/trainer.log" 2>&1
    ;;
4)  # GPT-2 small on $2 GPUs, compiled, 30 timed steps after 10: DDP, FSDP2's default (its twelve
    # blocks one unit, each block a graph), FSDP2 with the model one unit compiled whole, and its profile
    python3 bench/run.py --suite zero --gpus "$2" --ours-extra=--compile --zero-strategies ddp,fsdp --steps 30 \
      --warmup 10 --variant 'zero:fsdp0=--strategy fsdp --fsdp-blocks-per-unit 0' \
      --variant 'zero:fsdp0p=--strategy fsdp --fsdp-blocks-per-unit 0 --profile-steps 30:35' \
      --only "${3:-ddp-compile-g$2-b16-k1\$|fsdp-compile-g$2-b16-k1\$|fsdp0\$|fsdp0p\$}" \
      --deadline-min "${4:-9.3}" --out "$o/multi" >"$o/multi.log" 2>&1
    ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
