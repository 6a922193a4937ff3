#!/usr/bin/env bash
# Session 34's device calls (issue 40), on a 2xH200 machine (`nvidia-h200-x2`), one lease:
# `bash THIS CALL [DEADLINE]` from the checkout's root, with the GPU wheels (torchao 0.17.0, datasets,
# deepspeed, liger-kernel 0.8.5) installed first (bench/README.md, "What the GPU machine needs").
# llama-1b on one GPU, one run per GPU at a time, each pair in opposite orders on the two GPUs.
# Everything lands under $OUT/cN, packed into $OUT/cN.tgz. Ratios within one GPU of one machine.
# `bash THIS 1` (micro-batch 16: the bf16 default beside the Trainer with torch_compile, and the
# Trainer with torch_compile and use_liger_kernel); `bash THIS 2` (the same at 32, where Liger's
# fused loss may let the Trainer fit; the plain Trainer does not); `bash THIS 3` (the loss protocol
# at micro-batch 16, 200 steps: the bf16 default on GPU 0 and `--precision fp8`, its default recipe,
# on GPU 1; then the other way round). Listed for the next session, not run in this one:
# `bash THIS 5` (the same 200 steps at 16 of `--precision fp8 --fuse-projections`, call 4's lead, one
# run per GPU, against call 3's bf16 pool); `bash THIS 6` (the same for the recipe before session 33,
# `--no-fp8-head --fp8-fast-accum none`, on GPU 0 and torchao's rowwise scales on GPU 1).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
call=$1
deadline=${2:-9.2}
o=$OUT/c$call
mkdir -p "$o"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1
python3 -c 'import sys, torch, transformers, accelerate, torchao, triton, liger_kernel, importlib.metadata as m
print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, accelerate.__version__,
  torchao.__version__, triton.__version__, m.version("liger-kernel"))' >"$o/versions.txt" 2>&1
speed() {  # $1: micro-batch
  echo --suite llama --gpus 1 --llama-batch-size "$1" --llama-steps 40 --llama-warmup 20 --llama-log-every 10 \
    --eval-samples 500 --hf-liger
}
# 200 steps, not 400: at micro-batch 16 the standard library's source (8.18M tokens, 90% of it counted
# as certain) lasts 224
LOSS=(--suite llama --gpus 1 --llama-batch-size 16 --llama-steps 180 --llama-warmup 20 --llama-log-every 20
  --eval-samples 16000 --variant 'llama:fp8=--precision fp8')
orders() {  # $1: micro-batch; $2: the Trainers' --only. GPU 0: ours first, then the Trainers; GPU 1: the Trainers first
  # shellcheck disable=SC2046
  CUDA_VISIBLE_DEVICES=0 python3 bench/run.py $(speed "$1") --only "k1\$|$2" --deadline-min "$deadline" \
    --out "$o/gpu0" >"$o/gpu0.log" 2>&1 &
  (
    start=$(date +%s)
    # shellcheck disable=SC2046
    CUDA_VISIBLE_DEVICES=1 python3 bench/run.py $(speed "$1") --only "$2" --deadline-min "$deadline" \
      --out "$o/gpu1-hf" >"$o/gpu1-hf.log" 2>&1
    left=$(python3 -c "import time; print(round($deadline - (time.time() - $start) / 60, 2))")
    # shellcheck disable=SC2046
    CUDA_VISIBLE_DEVICES=1 python3 bench/run.py $(speed "$1") --only 'k1$' --deadline-min "$left" \
      --out "$o/gpu1-ours" >"$o/gpu1-ours.log" 2>&1
  ) &
  wait
}
loss() {  # $1, $2: the --only of GPU 0's run and GPU 1's; $3: the runs' directory suffix
  CUDA_VISIBLE_DEVICES=0 python3 bench/run.py "${LOSS[@]}" --only "$1" --deadline-min "$deadline" \
    --out "$o/gpu0$3" >"$o/gpu0$3.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 python3 bench/run.py "${LOSS[@]}" --only "$2" --deadline-min "$deadline" \
    --out "$o/gpu1$3" >"$o/gpu1$3.log" 2>&1 &
  wait
}
case $call in
1) orders 16 'defaults-liger' ;;  # (1a, the first try: '^hf-llama-1b-compile-g1|liger')
2) orders 32 'defaults-liger' ;;
3) loss 'k1$' 'k1-fp8$' a && loss 'k1-fp8$' 'k1$' b ;;  # (the first try, 400 steps, stopped at the corpus)
5) V=(--variant 'llama:fu=--precision fp8 --fuse-projections')
   for g in 0 1; do
     CUDA_VISIBLE_DEVICES=$g python3 bench/run.py "${LOSS[@]}" "${V[@]}" --only 'k1-fu$' --deadline-min "$deadline" \
       --out "$o/gpu$g" >"$o/gpu$g.log" 2>&1 &
   done
   wait ;;
6) V=(--variant 'llama:old=--precision fp8 --no-fp8-head --fp8-fast-accum none'
     --variant 'llama:row=--precision fp8 --fp8-recipe rowwise')
   CUDA_VISIBLE_DEVICES=0 python3 bench/run.py "${LOSS[@]}" "${V[@]}" --only 'k1-old$' --deadline-min "$deadline" \
     --out "$o/gpu0" >"$o/gpu0.log" 2>&1 &
   CUDA_VISIBLE_DEVICES=1 python3 bench/run.py "${LOSS[@]}" "${V[@]}" --only 'k1-row$' --deadline-min "$deadline" \
     --out "$o/gpu1" >"$o/gpu1.log" 2>&1 &
   wait ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
