#!/usr/bin/env bash
# Session 25's device calls (issue 40), 1xH200 machines: `bash THIS CALL [ARGS]` from the checkout's
# root, with the GPU wheels (torchao 0.17.0 among them) installed first (bench/README.md, "What the
# GPU machine needs"). One GPU: the runs go one after another, each alone on it, in the order of the
# variants below (a deadline cuts the last). Everything lands under $OUT/cN, packed into $OUT/cN.tgz.
# Each call may land on another machine: ratios are taken within one call only. The calls, in order:
# `bash THIS 1 'k1-b16$|k1-rf16$|k1-natrf16$|k1-r16$|k1-natrhf16$' 9.3` (the fused projections'
# speed beside bf16; kept as c1); `bash THIS 2 'k1-r$' 9.5 3` (three --residual-dtype bf16 loss
# runs; kept as c2); `bash THIS 2 'k1-natrh$' 9.2 3` (three --fp8-head --residual-dtype bf16 loss runs,
# the third cut by the deadline; written under c2/ there, packed as c3.tgz, kept as c3). One machine,
# one lease: the three compare with each other. Each call ran main at fb2ddc3. Since 86c401a
# --residual-dtype auto casts Llama's stream to bf16 with no flag: these variants' plain rows (b16,
# nath, ...) now run with it; add --residual-dtype fp32 to repeat them as they ran.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
call=$1
o=$OUT/c$call
mkdir -p "$o"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1
python3 -c 'import sys, torch, transformers, accelerate, torchao; print(sys.version.split()[0], torch.__version__,
  torch.version.cuda, transformers.__version__, accelerate.__version__, torchao.__version__)' >"$o/versions.txt" 2>&1
# `--precision fp8` runs the native layers (training/fp8_linear.py) with dynamic scaling unless told.
# `--residual-dtype bf16` (session 23) keeps the residual stream in bf16 under autocast; `--sdpa-backend
# flash` is PyTorch's flash attention where the default picks cuDNN's on an H200. `--fuse-projections`
# (session 24) runs each attention's q/k/v and each MLP's gate/up as one matmul.
V=(--variant 'llama:b16=--batch-size 16'
  --variant 'llama:r16=--residual-dtype bf16 --batch-size 16'
  --variant 'llama:fl16=--sdpa-backend flash --batch-size 16'
  --variant 'llama:natrhb16=--precision fp8 --fp8-head --residual-dtype bf16 --batch-size 16'
  --variant 'llama:nathb16=--precision fp8 --fp8-head --batch-size 16'
  --variant 'llama:p16=--batch-size 16 --profile-steps 30:35'
  --variant 'llama:r=--residual-dtype bf16'
  --variant 'llama:nath=--precision fp8 --fp8-head'
  --variant 'llama:natrh=--precision fp8 --fp8-head --residual-dtype bf16'
  --variant 'llama:rf16=--residual-dtype bf16 --fuse-projections --batch-size 16'
  --variant 'llama:natrf16=--precision fp8 --residual-dtype bf16 --fuse-projections --batch-size 16'
  --variant 'llama:natrhf16=--precision fp8 --fp8-head --residual-dtype bf16 --fuse-projections --batch-size 16'
  --variant 'llama:rf=--residual-dtype bf16 --fuse-projections'
  --variant 'llama:natrf=--precision fp8 --residual-dtype bf16 --fuse-projections')
SPEED=(--suite llama --gpus 1 --llama-steps 40 --llama-warmup 20 --llama-log-every 10 --eval-samples 500)
LOSS=(--suite llama --gpus 1 --llama-steps 380 --llama-warmup 20 --llama-log-every 20 --eval-samples 16000)
case $call in
1)  # micro-batch 16: the fused projections against bf16 and the bf16 stream, and under fp8.
    # $2: a regex of run ids, $3: the deadline (min).
    python3 bench/run.py "${SPEED[@]}" "${V[@]}" --only "${2:-k1-b16$|k1-rf16$|k1-natrf16$|k1-r16$}" \
      --deadline-min "${3:-9.3}" --out "$o/speed" >"$o/speed.log" 2>&1
    ;;
2)  # the loss after 400 steps on the non-repeated text, micro-batch 8 (sessions 19-22's protocol), of
    # the variant(s) named by the regex $2, $4 runs of each, deadline $3 minutes
    python3 bench/run.py "${LOSS[@]}" "${V[@]}" --only "$2" --repeat "${4:-1}" --deadline-min "${3:-9.2}" \
      --out "$o/loss" >"$o/loss.log" 2>&1
    ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
