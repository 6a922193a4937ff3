#!/usr/bin/env bash
# Session 33's device calls (issue 40), on a 2xH200 machine (`nvidia-h200-x2`), one lease:
# `bash THIS CALL [DEADLINE]` from the checkout's root, with the GPU wheels (torchao 0.17.0, datasets,
# deepspeed) installed first (bench/README.md, "What the GPU machine needs"). llama-1b on one GPU at
# the trainer's default micro-batch 16, one run per GPU at a time, each pair in opposite orders on the
# two GPUs, so each GPU gives one pair sharing its GPU and its neighbour's load. Everything lands
# under $OUT/cN, packed into $OUT/cN.tgz. Ratios are taken within one GPU of one machine. The calls:
# `bash THIS 1` (session 32's fp8 recipe, `--fp8-head --fp8-head-backward bf16 --fp8-fast-accum
# grad-input`, beside the bf16 default); `bash THIS 2` (the bf16 default beside the Trainer with
# torch_compile, session 31's call 3 on two GPUs); `bash THIS 3` (the recipe beside fp8's default).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
call=$1
deadline=${2:-9.2}
o=$OUT/c$call
mkdir -p "$o"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1
python3 -c 'import sys, torch, transformers, accelerate, torchao, triton; print(sys.version.split()[0], torch.__version__,
  torch.version.cuda, transformers.__version__, accelerate.__version__, torchao.__version__, triton.__version__)' \
  >"$o/versions.txt" 2>&1
HEAD='--precision fp8 --fp8-head --fp8-head-backward bf16 --fp8-fast-accum grad-input'
FB="llama:natfbg16=$HEAD --batch-size 16"
B="llama:b16=--batch-size 16"
N="llama:nat16=--precision fp8 --batch-size 16"
SPEED=(--suite llama --gpus 1 --llama-batch-size 16 --llama-steps 40 --llama-warmup 20 --llama-log-every 10
  --eval-samples 500)
pair() {  # $1, $2: the two variants; $3: the --only regex. GPU 0 runs them in that order, GPU 1 reversed
  CUDA_VISIBLE_DEVICES=0 python3 bench/run.py "${SPEED[@]}" --variant "$1" --variant "$2" --only "$3" \
    --deadline-min "$deadline" --out "$o/gpu0" >"$o/gpu0.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 python3 bench/run.py "${SPEED[@]}" --variant "$2" --variant "$1" --only "$3" \
    --deadline-min "$deadline" --out "$o/gpu1" >"$o/gpu1.log" 2>&1 &
  wait
}
case $call in
1)  pair "$FB" "$B" 'k1-natfbg16$|k1-b16$' ;;
2)  # the suite runs ours first, then the Trainer; GPU 1 runs the Trainer first, then ours, in what is left
    CUDA_VISIBLE_DEVICES=0 python3 bench/run.py "${SPEED[@]}" --deadline-min "$deadline" --out "$o/gpu0" \
      >"$o/gpu0.log" 2>&1 &
    (
      start=$(date +%s)
      CUDA_VISIBLE_DEVICES=1 python3 bench/run.py "${SPEED[@]}" --only '^hf-' --deadline-min "$deadline" \
        --out "$o/gpu1-hf" >"$o/gpu1-hf.log" 2>&1
      left=$(python3 -c "import time; print(round($deadline - (time.time() - $start) / 60, 2))")
      CUDA_VISIBLE_DEVICES=1 python3 bench/run.py "${SPEED[@]}" --only '^ours-' --deadline-min "$left" \
        --out "$o/gpu1-ours" >"$o/gpu1-ours.log" 2>&1
    ) &
    wait
    ;;
3)  pair "$N" "$FB" 'k1-nat16$|k1-natfbg16$' ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
