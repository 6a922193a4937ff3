#!/usr/bin/env bash
# Session 28's device calls (issue 40), on a 2xH200 machine (the first multi-GPU kind lent since
# session 19): `bash THIS CALL [ARGS]` from the checkout's root, with the GPU wheels (torchao 0.17.0,
# datasets, deepspeed) installed first (bench/README.md, "What the GPU machine needs"). The runs go one
# after another, each alone on the GPUs it names, in the order of the variants below (a deadline cuts
# the last). Everything lands under $OUT/cN, packed into $OUT/cN.tgz. Each call may land on another
# machine: ratios are taken within one call only. The calls, in order:
# `bash THIS 3 'g1-|g2-' 9` (GPT-2 small on 1 and 2 GPUs: compiled DDP, FSDP2 compiled (what `--strategy
# fsdp --compile` runs for 40 steps), in-graph fsdp, FSDP2 with two units of six blocks, and a profile of
# FSDP2's step); `bash THIS 1 'k1-b16$|k1-nat16$|k1-nathf16$|k1-nath16$' 9.3` (llama-1b on one GPU: fp8's
# default, the float8 head with its forward in bf16 (new in session 27) and the float8 head, beside bf16,
# all with the rope tables, the compiled default since session 27).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
call=$1
o=$OUT/c$call
mkdir -p "$o"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1
python3 -c 'import sys, torch, transformers, accelerate, torchao; print(sys.version.split()[0], torch.__version__,
  torch.version.cuda, transformers.__version__, accelerate.__version__, torchao.__version__)' >"$o/versions.txt" 2>&1
# `--precision fp8` runs the native layers (training/fp8_linear.py) with dynamic scaling unless told.
# `--fp8-head` puts the LM head's three matmuls in float8, `--fp8-head-forward bf16` keeps its forward
# (the logits, the loss) in bf16; `--profile-steps A:B` writes the kernel table of those steps.
V=(--variant 'llama:b16=--batch-size 16'
  --variant 'llama:nat16=--precision fp8 --batch-size 16'
  --variant 'llama:nathf16=--precision fp8 --fp8-head --fp8-head-forward bf16 --batch-size 16'
  --variant 'llama:nath16=--precision fp8 --fp8-head --batch-size 16'
  --variant 'llama:natp16=--precision fp8 --batch-size 16 --profile-steps 30:35'
  --variant 'llama:nathf=--precision fp8 --fp8-head --fp8-head-forward bf16'
  --variant 'llama:nat=--precision fp8')
# GPT-2 small (124M) on 1 and 2 GPUs, compiled: in-graph fsdp (--compile-unit model); FSDP2 with its
# default units (all twelve blocks in one) profiled, and with two units of six blocks.
M=(--variant 'scaling:ingraph=--strategy fsdp --compile-unit model'
  --variant 'zero:fsdpp=--strategy fsdp --profile-steps 30:35'
  --variant 'zero:fsdp6=--strategy fsdp --fsdp-blocks-per-unit 6')
SPEED=(--suite llama --gpus 1 --llama-steps 40 --llama-warmup 20 --llama-log-every 10 --eval-samples 500)
LOSS=(--suite llama --gpus 1 --llama-steps 380 --llama-warmup 20 --llama-log-every 20 --eval-samples 16000)
case $call in
1)  # micro-batch 16: fp8's recipes beside bf16, with the rope tables (the compiled default).
    # $2: a regex of run ids, $3: the deadline (min).
    python3 bench/run.py "${SPEED[@]}" "${V[@]}" --only "${2:-k1-b16$|k1-rt16$|k1-nat16$|k1-natrt16$}" \
      --deadline-min "${3:-9.3}" --out "$o/speed" >"$o/speed.log" 2>&1
    ;;
2)  # the loss after 400 steps on the non-repeated text, micro-batch 8 (sessions 19-22's protocol), of
    # the variant(s) named by the regex $2, $4 runs of each, deadline $3 minutes
    python3 bench/run.py "${LOSS[@]}" "${V[@]}" --only "$2" --repeat "${4:-1}" --deadline-min "${3:-9.2}" \
      --out "$o/loss" >"$o/loss.log" 2>&1
    ;;
3)  # the multi-GPU pair on 1 and 2 GPUs: weak scaling (scaling suite) and FSDP2 against compiled DDP
    # (zero suite), GPT-2 small, 30 timed steps after 10. $2: a regex of run ids, $3: the deadline
    # (min), $4: runs of each
    python3 bench/run.py --suite scaling,zero --gpus 2 --ours-extra=--compile --zero-strategies ddp,fsdp \
      --steps 30 --warmup 10 "${M[@]}" --only "${2:-g1-|g2-}" --repeat "${4:-1}" --deadline-min "${3:-9}" \
      --out "$o/multi" >"$o/multi.log" 2>&1
    ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
