#!/usr/bin/env bash
# Session 27's device calls (issue 40), 1xH200 machines: `bash THIS CALL [ARGS]` from the checkout's
# root, with the GPU wheels (torchao 0.17.0 among them) installed first (bench/README.md, "What the
# GPU machine needs"). One GPU: the runs go one after another, each alone on it, in the order of the
# variants below (a deadline cuts the last). Everything lands under $OUT/cN, packed into $OUT/cN.tgz.
# Each call may land on another machine: ratios are taken within one call only. Every variant runs
# with the bf16 residual stream (--residual-dtype auto's pick for Llama since 86c401a). The calls, in
# order: `bash THIS 1 'k1-b16$|k1-rt16$|k1-nat16$|k1-natrt16$|k1-rt32$' 9.3` (--rope-tables, session
# 26's lever, against the default in bf16 and fp8; the last two cut by the deadline; kept as c1);
# `bash THIS 1 'k1-natrt16$|k1-prt16$|k1-rt32$' 9.3` (the rest, and a profile with the tables; its c1/
# renamed c2 there, kept as c2); `bash THIS 2 'k1$|k1-rt$|k1-nat$' 9.5 1` (400-step loss runs, the
# last cut at step 31; its c2/ renamed c3 there, kept as c3). One machine, one lease: the three
# compare with each other. At these calls' commit --rope-tables was opt-in (off unless given).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
call=$1
o=$OUT/c$call
mkdir -p "$o"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1
python3 -c 'import sys, torch, transformers, accelerate, torchao; print(sys.version.split()[0], torch.__version__,
  torch.version.cuda, transformers.__version__, accelerate.__version__, torchao.__version__)' >"$o/versions.txt" 2>&1
# `--precision fp8` runs the native layers (training/fp8_linear.py) with dynamic scaling unless told.
# `--rope-tables` (session 26) computes the rotary cos and sin once a forward, outside the compiler;
# `--profile-steps A:B` writes the kernel table of those steps.
V=(--variant 'llama:b16=--batch-size 16'
  --variant 'llama:rt16=--rope-tables --batch-size 16'
  --variant 'llama:nat16=--precision fp8 --batch-size 16'
  --variant 'llama:natrt16=--precision fp8 --rope-tables --batch-size 16'
  --variant 'llama:rt32=--rope-tables --batch-size 32'
  --variant 'llama:prt16=--rope-tables --batch-size 16 --profile-steps 30:35'
  --variant 'llama:natp16=--precision fp8 --batch-size 16 --profile-steps 30:35'
  --variant 'llama:rt=--rope-tables'
  --variant 'llama:nat=--precision fp8'
  --variant 'llama:natrt=--precision fp8 --rope-tables')
SPEED=(--suite llama --gpus 1 --llama-steps 40 --llama-warmup 20 --llama-log-every 10 --eval-samples 500)
LOSS=(--suite llama --gpus 1 --llama-steps 380 --llama-warmup 20 --llama-log-every 20 --eval-samples 16000)
case $call in
1)  # micro-batch 16 (and 32): the rope tables beside the default in bf16 and fp8, profiles.
    # $2: a regex of run ids, $3: the deadline (min).
    python3 bench/run.py "${SPEED[@]}" "${V[@]}" --only "${2:-k1-b16$|k1-rt16$|k1-nat16$|k1-natrt16$}" \
      --deadline-min "${3:-9.3}" --out "$o/speed" >"$o/speed.log" 2>&1
    ;;
2)  # the loss after 400 steps on the non-repeated text, micro-batch 8 (sessions 19-22's protocol), of
    # the variant(s) named by the regex $2, $4 runs of each, deadline $3 minutes
    python3 bench/run.py "${LOSS[@]}" "${V[@]}" --only "$2" --repeat "${4:-1}" --deadline-min "${3:-9.2}" \
      --out "$o/loss" >"$o/loss.log" 2>&1
    ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
