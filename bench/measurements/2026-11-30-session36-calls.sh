#!/usr/bin/env bash
# Session 36's device calls (issue 40: fp8's loss at micro-batch 16), on a 2xH200 machine
# (`nvidia-h200-x2`): `bash THIS CALL [DEADLINE]` from the checkout's root, with the GPU wheels
# installed first (bench/README.md, "What the GPU machine needs"). Everything lands under $OUT/cN,
# packed into $OUT/cN.tgz. llama-1b on one GPU, session 35's loss protocol (200 steps at
# micro-batch 16, eval on the held-out text); ratios within one GPU of one machine.
# `bash THIS 1 4.45`: the two flags session 35 built, one llama-1b run each on GPU 0 (qk:
# `--fp8-bf16-layers q_proj,k_proj`, then e4: `--fp8-grad-dtype e4m3`), while GPU 1 runs
# bench/fp8_plateau_study.py (small byte-level Llamas, 128 then 256 wide, batch 8 and 32, three
# seeds, bf16 against fp8 and both flags): does a model that trains in seconds show the gap?
# `bash THIS 2 4.45`: second runs of both flags (GPU 1: qk then e4), both flags together (GPU 0:
# qke4), then fp8's default recipe on GPU 0, its fifth run and the speed beside which to price them.
# `bash THIS 3 4.45`: both flags together (qke4) on both GPUs: call 2's qke4 run was the first fp8
# run within 1% of bf16's eval loss at micro-batch 16.
# `bash THIS 4 4.45`: bf16's default (GPU 0, the bench's own run, id ending -k1) beside a fourth qke4 run (GPU 1): bf16's speed and a third
# bf16 loss on this machine, against which to set qke4's.
# `bash THIS 5 3`: the session's last 263 s, after auto became qke4's recipe: `--precision fp8` alone
# (auto32, the new auto on a GPU) on GPU 0 beside the bf16 default on GPU 1, both at micro-batch 32,
# 30 timed steps after 10: speed only, one pair across the host's two GPUs.
# Prepared for the next session: `bash THIS 6 4.45` (micro-batch 32, speed, session 32's 40 timed
# steps after 20: GPU 0 the new auto then bf16, GPU 1 the recipe before it then the new auto; each
# run's deadline its own, two runs a GPU in about 340 s) and `bash THIS 7 9.3` (the issue's own loss
# protocol, 400 steps at micro-batch 8, the new auto twice on each GPU: four runs against the
# ledger's bf16 pool there, about 450 s).
# Session 37 ran 6 and 7, then `bash THIS 8 4.3`: k_proj alone kept in bf16 (konly; k_proj is a
# quarter of q_proj's size in llama-1b's grouped-query attention, so it costs about a fifth of the
# qk recipe's speed) three times at micro-batch 16, beside a fifth run of the new auto on GPU 0: its
# loss, and its speed against auto's on one GPU. Then `bash THIS 9 4.3` with the session's last
# 460 s: a fourth bf16 run (GPU 0) beside a sixth of the new auto (GPU 1) at micro-batch 16.
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
# 200 steps at micro-batch 16 (the standard library's source lasts 224 there), eval on the held-out text
LOSS=(--suite llama --gpus 1 --llama-batch-size 16 --llama-steps 180 --llama-warmup 20 --llama-log-every 20
  --eval-samples 16000
  --variant 'llama:fp8=--precision fp8'
  --variant 'llama:row=--precision fp8 --fp8-recipe rowwise'
  --variant 'llama:e4=--precision fp8 --fp8-grad-dtype e4m3'
  --variant 'llama:qk=--precision fp8 --fp8-bf16-layers q_proj,k_proj'
  --variant 'llama:qke4=--precision fp8 --fp8-bf16-layers q_proj,k_proj --fp8-grad-dtype e4m3'
  --variant 'llama:auto=--precision fp8'
  --variant 'llama:konly=--precision fp8 --fp8-bf16-layers k_proj')
one() {  # $1: GPU; $2: the run's variant; $3: its directory
  CUDA_VISIBLE_DEVICES=$1 python3 bench/run.py "${LOSS[@]}" --only="-$2\$" --deadline-min "$deadline" \
    --out "$o/$3" >"$o/$3.log" 2>&1
}
plateau() {  # $1: GPU; $2: seconds; $3: width; then the study's own flags
  local gpu=$1 secs=$2 width=$3
  shift 3
  CUDA_VISIBLE_DEVICES=$gpu timeout "$secs" python3 bench/fp8_plateau_study.py --batch 8,32 --steps 300 \
    --recipes bf16,fp8,fp8-e4m3,fp8-qk --seeds 0,1,2 --hidden "$width" "$@" --json "$o/plateau-$width.json" \
    >"$o/plateau-$width.log" 2>&1
}
case $call in
1) (one 0 qk gpu0a && one 0 e4 gpu0b) &
   (plateau 1 250 128; plateau 1 270 256 --seq 256) &
   wait ;;
2) (one 0 qke4 gpu0a && one 0 fp8 gpu0b) &
   (one 1 qk gpu1a && one 1 e4 gpu1b) &
   wait ;;
3) one 0 qke4 gpu0 & one 1 qke4 gpu1 & wait ;;
4) one 0 k1 gpu0 & one 1 qke4 gpu1 & wait ;;
5) SPEED=(--suite llama --gpus 1 --llama-batch-size 32 --llama-steps 30 --llama-warmup 10 --llama-log-every 10
     --eval-samples 500 --variant 'llama:auto32=--precision fp8')
   CUDA_VISIBLE_DEVICES=0 python3 bench/run.py "${SPEED[@]}" --only='-auto32$' --deadline-min "$deadline" \
     --out "$o/gpu0" >"$o/gpu0.log" 2>&1 &
   CUDA_VISIBLE_DEVICES=1 python3 bench/run.py "${SPEED[@]}" --only='-k1$' --deadline-min "$deadline" \
     --out "$o/gpu1" >"$o/gpu1.log" 2>&1 &
   wait ;;
6) SPEED=(--suite llama --gpus 1 --llama-batch-size 32 --llama-steps 40 --llama-warmup 20 --llama-log-every 10
     --eval-samples 500 --variant 'llama:auto32=--precision fp8'
     --variant 'llama:old32=--precision fp8 --fp8-grad-dtype e5m2 --fp8-bf16-layers none')
   speed() {  # $1: GPU; $2: the runs in order, as --only patterns; $3: the directory
     local run
     for run in $2; do
       CUDA_VISIBLE_DEVICES=$1 python3 bench/run.py "${SPEED[@]}" --only="$run" --deadline-min "$deadline" \
         --out "$o/$3-${run//[^a-z0-9]/}" >>"$o/$3.log" 2>&1
     done
   }
   speed 0 '-auto32$ -k1$' gpu0 & speed 1 '-old32$ -auto32$' gpu1 & wait ;;
7) LOSS8=(--suite llama --gpus 1 --llama-batch-size 8 --llama-steps 380 --llama-warmup 20 --llama-log-every 20
     --eval-samples 16000 --variant 'llama:auto8=--precision fp8')
   for g in 0 1; do
     CUDA_VISIBLE_DEVICES=$g python3 bench/run.py "${LOSS8[@]}" --only='-auto8$' --repeat 2 \
       --deadline-min "$deadline" --out "$o/gpu$g" >"$o/gpu$g.log" 2>&1 &
   done
   wait ;;
8) (one 0 konly gpu0a && one 0 auto gpu0b) &
   (one 1 konly gpu1a && one 1 konly gpu1b) &
   wait ;;
9) one 0 k1 gpu0 & one 1 auto gpu1 & wait ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
