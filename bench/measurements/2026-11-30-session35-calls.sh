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
# recipe changed per run: GPU 0 micro-batch 8 with two accumulation steps (acc: the same 16
# sequences an optimizer step), then the first and last blocks in bf16 (edge, the head with them);
# GPU 1 `--no-fp8-head` (nohead) then torchao's rowwise scales (row). (Planned with
# `--fp8-fast-accum none` first on GPU 0; call 1 measured the fast sums' error at 1e-3, against
# float8's roundings near 1e-1, and it gave way to edge.) `bash THIS 4 [DEADLINE]`: the same
# protocol with the gradient clip off (--max-grad-norm 0), fp8's default recipe on GPU 0 (noclip8)
# and the bf16 default on GPU 1 (noclip): does clipping at 1.0 shorten fp8's steps more than bf16's?
# `bash THIS 5 4.1`: torchao's rowwise scales (row) on both GPUs, with the session's last 338 s of
# device time: call 3's row run trained ahead of every other run but reached no eval in its time.
# For the next session: `bash THIS 6 4.45` (--fp8-grad-dtype e4m3, e4, beside the default recipe:
# GPU 0 e4 then fp8, GPU 1 the other way round) and `bash THIS 7 5.6` (call 5 with time for its
# eval: about 300 s a rowwise run from a cold compile), then `bash THIS 8 4.45` (attention's query
# and key projections kept bf16, --fp8-bf16-layers q_proj,k_proj, qk, on both GPUs). First of all,
# `bash THIS 9` (a few minutes): bench/fp8_plateau_study.py, small byte-level Llamas (128 and 256
# wide) trained 300 steps at batch 8 and 32, three seeds, bf16 against fp8 and the two new flags:
# whether a model that trains in seconds shows the gap at the larger batch, to screen recipes on.
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
  --variant 'llama:acc=--precision fp8 --batch-size 8 --grad-accum 2'
  --variant 'llama:edge=--precision fp8 --fp8-bf16-edge-blocks 1'
  --variant 'llama:noclip8=--precision fp8 --max-grad-norm 0'
  --variant 'llama:noclip=--max-grad-norm 0'
  --variant 'llama:e4=--precision fp8 --fp8-grad-dtype e4m3'
  --variant 'llama:qk=--precision fp8 --fp8-bf16-layers q_proj,k_proj')
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
3) (one 0 acc gpu0a && one 0 edge gpu0b) &
   (one 1 nohead gpu1a && one 1 row gpu1b) &
   wait ;;
4) one 0 noclip8 gpu0 & one 1 noclip gpu1 & wait ;;
5) one 0 row gpu0 & one 1 row gpu1 & wait ;;
6) (one 0 e4 gpu0a && one 0 fp8 gpu0b) &
   (one 1 fp8 gpu1a && one 1 e4 gpu1b) &
   wait ;;
7) one 0 row gpu0 & one 1 row gpu1 & wait ;;
8) one 0 qk gpu0 & one 1 qk gpu1 & wait ;;
9) P=(--batch 8,32 --steps 300 --recipes bf16,fp8,fp8-e4m3,fp8-qk --seeds 0,1,2)
   CUDA_VISIBLE_DEVICES=0 timeout 420 python3 bench/fp8_plateau_study.py "${P[@]}" --json "$o/plateau-128.json" \
     >"$o/plateau-128.log" 2>&1 &
   CUDA_VISIBLE_DEVICES=1 timeout 420 python3 bench/fp8_plateau_study.py "${P[@]}" --hidden 256 --seq 256 \
     --json "$o/plateau-256.json" >"$o/plateau-256.log" 2>&1 &
   wait ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
