#!/usr/bin/env bash
# Session 29's device calls (issue 40), on a 2xH200 machine: `bash THIS CALL [ARGS]` from the
# checkout's root, with the GPU wheels (torchao 0.17.0, datasets, deepspeed) installed first
# (bench/README.md, "What the GPU machine needs"). The runs go one after another, each alone on the
# GPUs it names (llama-1b on the first), in the order below (a deadline cuts the last). Everything
# lands under $OUT/cN, packed into $OUT/cN.tgz. Each call may land on another machine: ratios are
# taken within one call only. The calls, in order:
# `bash THIS 1` (llama-1b at micro-batch 16: bf16 and fp8's default, each without and with
# --compile-optimizer); `bash THIS 2` (a profile of fp8's default step; GPT-2 small on 2 GPUs, FSDP2
# against compiled DDP with fsdp's once-decided clip; the 400-step loss of the bf16 default); then
# `bash THIS 1 8.4` again with the budget's last minutes (its c1/ packed as c3.tgz there). The JSONs:
# 2026-11-29-h200x2-session29-c1.json, -c2-{profile,multi,loss}.json (call 2's three invocations),
# -c3.json.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
call=$1
o=$OUT/c$call
mkdir -p "$o"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1
python3 -c 'import sys, torch, transformers, accelerate, torchao; print(sys.version.split()[0], torch.__version__,
  torch.version.cuda, transformers.__version__, accelerate.__version__, torchao.__version__)' >"$o/versions.txt" 2>&1
# `--precision fp8` runs the native layers (training/fp8_linear.py) with dynamic scaling unless told;
# `--compile-optimizer` compiles the clip and AdamW's update as one step (training/optim.py);
# `--profile-steps A:B` writes the kernel table of those steps.
V=(--variant 'llama:b16=--batch-size 16'
  --variant 'llama:co16=--compile-optimizer --batch-size 16'
  --variant 'llama:nat16=--precision fp8 --batch-size 16'
  --variant 'llama:natco16=--precision fp8 --compile-optimizer --batch-size 16'
  --variant 'llama:natp16=--precision fp8 --batch-size 16 --profile-steps 30:35'
  --variant 'llama:nat=--precision fp8')
SPEED=(--suite llama --gpus 1 --llama-steps 40 --llama-warmup 20 --llama-log-every 10 --eval-samples 500)
LOSS=(--suite llama --gpus 1 --llama-steps 380 --llama-warmup 20 --llama-log-every 20 --eval-samples 16000)
case $call in
1)  # micro-batch 16: the compiled optimizer step beside the defaults, bf16 and fp8 ($2: the deadline
    # (min), $3: a regex of run ids)
    python3 bench/run.py "${SPEED[@]}" "${V[@]}" --only "${3:-k1-b16$|k1-co16$|k1-nat16$|k1-natco16$}" \
      --deadline-min "${2:-9.3}" --out "$o/speed" >"$o/speed.log" 2>&1
    ;;
2)  # fp8's default profiled (steps 30-35); FSDP2 against compiled DDP on 2 GPUs (GPT-2 small, 30 timed
    # steps after 10; what `--strategy fsdp --compile` runs for 40 steps); the bf16 default's loss
    python3 bench/run.py "${SPEED[@]}" "${V[@]}" --only 'k1-natp16$' --deadline-min 3.4 --out "$o/profile" \
      >"$o/profile.log" 2>&1
    python3 bench/run.py --suite zero --gpus 2 --ours-extra=--compile --zero-strategies ddp,fsdp --steps 30 \
      --warmup 10 --only 'ddp-compile-g2-b16-k1$|fsdp-compile-g2-b16-k1$' --deadline-min 2.4 --out "$o/multi" \
      >"$o/multi.log" 2>&1
    python3 bench/run.py "${LOSS[@]}" "${V[@]}" --only 'k1$' --deadline-min 3.6 --out "$o/loss" >"$o/loss.log" 2>&1
    ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
