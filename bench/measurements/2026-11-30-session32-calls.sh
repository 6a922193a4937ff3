#!/usr/bin/env bash
# Session 32's device calls (issue 40), on a 2xH200 machine (`nvidia-h200-x2`), one lease:
# `bash THIS CALL [ARGS]` from the checkout's root, with the GPU wheels (torchao 0.17.0, datasets,
# deepspeed) installed first (bench/README.md, "What the GPU machine needs"). Everything lands under
# $OUT/cN, packed into $OUT/cN.tgz. Ratios are taken within one machine, and for one-GPU runs within
# one GPU. The calls:
# `bash THIS 1 [REGEX] [DEADLINE]` (GPT-2 small on both GPUs, compiled: DDP, FSDP2's default (each
# block a unit and a graph), FSDP2 with the model one unit compiled whole (--fsdp-blocks-per-unit 0),
# then a profile of the last; session 31's call 4);
# `bash THIS 2 [DEADLINE]` (llama-1b at micro-batch 32, one run per GPU at a time: the fp8 forward
# head with fast accumulation of the input gradients beside the bf16 default, in opposite orders on
# the two GPUs, so each GPU gives one pair and each pair shares its GPU and its neighbour's load);
# `bash THIS 3 REGEX [DEADLINE] [RUNS]` (400-step loss runs on the non-repeated text at micro-batch
# 8, sessions 19-31's protocol, RUNS of each on each GPU at once: 2x RUNS runs).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
call=$1
o=$OUT/c$call
mkdir -p "$o"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1
python3 -c 'import sys, torch, transformers, accelerate, torchao, triton; print(sys.version.split()[0], torch.__version__,
  torch.version.cuda, transformers.__version__, accelerate.__version__, torchao.__version__, triton.__version__)' \
  >"$o/versions.txt" 2>&1
HEAD='--precision fp8 --fp8-head --fp8-head-backward bf16 --fp8-fast-accum grad-input'
FB="llama:natfbg32=$HEAD --batch-size 32"
B="llama:b32=--batch-size 32"
SPEED=(--suite llama --gpus 1 --llama-steps 40 --llama-warmup 20 --llama-log-every 10 --eval-samples 500)
LOSS=(--suite llama --gpus 1 --llama-steps 380 --llama-warmup 20 --llama-log-every 20 --eval-samples 16000)
case $call in
1)  python3 bench/run.py --suite zero --gpus 2 --ours-extra=--compile --zero-strategies ddp,fsdp --steps 30 \
      --warmup 10 --variant 'zero:fsdp0=--strategy fsdp --fsdp-blocks-per-unit 0' \
      --variant 'zero:fsdp0p=--strategy fsdp --fsdp-blocks-per-unit 0 --profile-steps 30:35' \
      --only "${2:-ddp-compile-g2-b16-k1\$|fsdp-compile-g2-b16-k1\$|fsdp0\$|fsdp0p\$}" \
      --deadline-min "${3:-9.3}" --out "$o/multi" >"$o/multi.log" 2>&1
    ;;
2)  CUDA_VISIBLE_DEVICES=0 python3 bench/run.py "${SPEED[@]}" --variant "$FB" --variant "$B" \
      --only 'k1-natfbg32$|k1-b32$' --deadline-min "${2:-9.3}" --out "$o/gpu0" >"$o/gpu0.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=1 python3 bench/run.py "${SPEED[@]}" --variant "$B" --variant "$FB" \
      --only 'k1-natfbg32$|k1-b32$' --deadline-min "${2:-9.3}" --out "$o/gpu1" >"$o/gpu1.log" 2>&1 &
    wait
    ;;
3)  for g in 0 1; do
      CUDA_VISIBLE_DEVICES=$g python3 bench/run.py "${LOSS[@]}" --variant "llama:natfbg=$HEAD" \
        --variant "llama:natfb=--precision fp8 --fp8-head --fp8-head-backward bf16" --only "$2" \
        --repeat "${4:-1}" --deadline-min "${3:-9.2}" --out "$o/gpu$g" >"$o/gpu$g.log" 2>&1 &
    done
    wait
    ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
