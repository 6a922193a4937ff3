#!/usr/bin/env bash
# Session 26's device calls (issue 40), 1xH200 machines: `bash THIS CALL [ARGS]` from the checkout's
# root, with the GPU wheels (torchao 0.17.0 among them) installed first (bench/README.md, "What the
# GPU machine needs"). One GPU: the runs go one after another, each alone on it, in the order of the
# variants below (a deadline cuts the last). Everything lands under $OUT/cN, packed into $OUT/cN.tgz.
# Each call may land on another machine: ratios are taken within one call only. Since 86c401a
# --residual-dtype auto casts Llama's residual stream to bf16 with no flag: every variant below runs
# with it unless it says --residual-dtype fp32. The calls, in order: `bash THIS 1
# 'k1-b16$|k1-nat16$|k1-natg16$|k1-p16$|k1-pf16$' 9.3` (fp8's default with the stream, the head with a
# bf16 input gradient, profiles; the last cut by the deadline; kept as c1); `bash THIS 2 'k1-nat$' 9.4 3`
# (three loss runs of fp8's default with the stream, the third cut at step 398; kept as c2);
# `bash THIS 1 'k1-b32$|k1-nat32$|k1-nath32$' 8.2` (micro-batch 32, the last cut at step 30; its c1/
# renamed c3 there, kept as c3). One machine, one lease: the three compare with each other.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
call=$1
o=$OUT/c$call
mkdir -p "$o"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1
python3 -c 'import sys, torch, transformers, accelerate, torchao; print(sys.version.split()[0], torch.__version__,
  torch.version.cuda, transformers.__version__, accelerate.__version__, torchao.__version__)' >"$o/versions.txt" 2>&1
# `--precision fp8` runs the native layers (training/fp8_linear.py) with dynamic scaling unless told.
# `--fp8-head-grad-input bf16` (session 25) keeps the float8 head's input gradient in bf16;
# `--fuse-projections` (session 24) runs each attention's q/k/v and each MLP's gate/up as one matmul;
# `--profile-steps A:B` writes the kernel table of those steps.
V=(--variant 'llama:b16=--batch-size 16'
  --variant 'llama:nat16=--precision fp8 --batch-size 16'
  --variant 'llama:natg16=--precision fp8 --fp8-head --fp8-head-grad-input bf16 --batch-size 16'
  --variant 'llama:nath16=--precision fp8 --fp8-head --batch-size 16'
  --variant 'llama:p16=--batch-size 16 --profile-steps 30:35'
  --variant 'llama:pf16=--batch-size 16 --fuse-projections --profile-steps 30:35'
  --variant 'llama:b32=--batch-size 32'
  --variant 'llama:nat32=--precision fp8 --batch-size 32'
  --variant 'llama:nath32=--precision fp8 --fp8-head --batch-size 32'
  --variant 'llama:nat=--precision fp8'
  --variant 'llama:natg=--precision fp8 --fp8-head --fp8-head-grad-input bf16')
SPEED=(--suite llama --gpus 1 --llama-steps 40 --llama-warmup 20 --llama-log-every 10 --eval-samples 500)
LOSS=(--suite llama --gpus 1 --llama-steps 380 --llama-warmup 20 --llama-log-every 20 --eval-samples 16000)
case $call in
1)  # micro-batch 16: fp8's recipes beside bf16, and profiles of bf16 and the fused projections.
    # $2: a regex of run ids, $3: the deadline (min).
    python3 bench/run.py "${SPEED[@]}" "${V[@]}" --only "${2:-k1-b16$|k1-nat16$|k1-natg16$}" \
      --deadline-min "${3:-9.3}" --out "$o/speed" >"$o/speed.log" 2>&1
    ;;
2)  # the loss after 400 steps on the non-repeated text, micro-batch 8 (sessions 19-22's protocol), of
    # the variant(s) named by the regex $2, $4 runs of each, deadline $3 minutes
    python3 bench/run.py "${LOSS[@]}" "${V[@]}" --only "$2" --repeat "${4:-1}" --deadline-min "${3:-9.2}" \
      --out "$o/loss" >"$o/loss.log" 2>&1
    ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
