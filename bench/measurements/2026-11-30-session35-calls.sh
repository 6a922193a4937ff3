#!/usr/bin/env bash
# Session 35's device calls (issue 40: fp8's loss at micro-batch 16), on a 2xH200 machine
# (`nvidia-h200-x2`): `bash THIS CALL [DEADLINE]` from the checkout's root, with the GPU wheels
# installed first (bench/README.md, "What the GPU machine needs"). Everything lands under $OUT/cN,
# packed into $OUT/cN.tgz. llama-1b on one GPU; ratios within one GPU of one machine.
# `bash THIS 1`: probes, no training (about a minute): GPU 0 measures each float8 matmul's summation
# at llama-1b's shapes and 8,192 to 65,536 rows (bench/fp8_gemm_accuracy.py); GPU 1 runs the
# gradient study of a tiny Llama, fused and unfused, eager and compiled, at 8,192 to 32,768 rows
# (bench/fp8_grad_study.py --device cuda).
# `bash THIS 2 [DEADLINE]`: the loss protocol at micro-batch 16, 200 steps (session 34's call 3),
# fp8's default recipe with `--fuse-projections` (fu) and without (fp8), in opposite orders: GPU 0
# fu then fp8, GPU 1 fp8 then fu. `bash THIS 3 [DEADLINE]`: the same protocol, one part of the
# recipe changed per run: GPU 0 `--fp8-fast-accum none` (fa0) then micro-batch 8 with two
# accumulation steps (acc: the same 16 sequences an optimizer step); GPU 1 `--no-fp8-head` (nohead)
# then torchao's rowwise scales (row).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
call=$1
deadline=${2:-4.4}
o=$OUT/c$call
mkdir -p "$o"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1
python3 -c 'import sys, torch, transformers, torchao, triton
print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, torchao.__version__,
  triton.__version__)' >"$o/versions.txt" 2>&1
# 200 steps at micro-batch 16 (the standard library's source lasts 224 there), eval on 16,000 samples
LOSS=(--suite llama --gpus 1 --llama-batch-size 16 --llama-steps 180 --llama-warmup 20 --llama-log-every 20
  --eval-samples 16000
  --variant 'llama:fp8=--precision fp8'
  --variant 'llama:fu=--precision fp8 --fuse-projections'
  --variant 'llama:fa0=--precision fp8 --fp8-fast-accum none'
  --variant 'llama:nohead=--precision fp8 --no-fp8-head'
  --variant 'llama:row=--precision fp8 --fp8-recipe rowwise'
  --variant 'llama:acc=--precision fp8 --batch-size 8 --grad-accum 2')
one() {  # $1: GPU; $2: the run's variant; $3: its directory
  CUDA_VISIBLE_DEVICES=$1 python3 bench/run.py "${LOSS[@]}" --only="-$2\$" --deadline-min "$deadline" \
    --out "$o/$3" >"$o/$3.log" 2>&1
}
case $call in
1) CUDA_VISIBLE_DEVICES=0 timeout 240 python3 bench/fp8_gemm_accuracy.py --json "$o/gemm.json" >"$o/gemm.log" 2>&1 &
   (for mb in 64 128 256; do
      CUDA_VISIBLE_DEVICES=1 timeout 150 python3 bench/fp8_grad_study.py --device cuda --micro-batch $mb --compiled
    done) >"$o/grad-study.log" 2>&1 &
   wait ;;
2) (one 0 fu gpu0a && one 0 fp8 gpu0b) &
   (one 1 fp8 gpu1a && one 1 fu gpu1b) &
   wait ;;
3) (one 0 fa0 gpu0a && one 0 acc gpu0b) &
   (one 1 nohead gpu1a && one 1 row gpu1b) &
   wait ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
