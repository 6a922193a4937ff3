#!/usr/bin/env bash
# Session 21's device calls (issue 40), one 1xH200 machine: `bash THIS CALL` from the checkout's root,
# with torchao 0.17.0 and the GPU wheels installed first (bench/README.md, "What the GPU machine needs").
# One GPU: the runs go one after another, each alone on it. Everything lands under $OUT/cN, packed
# into $OUT/cN.tgz (the device tool returns few files).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
call=$1
o=$OUT/c$call
mkdir -p "$o"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1
python3 -c 'import sys, torch, transformers, accelerate, torchao; print(sys.version.split()[0], torch.__version__,
  torch.version.cuda, transformers.__version__, accelerate.__version__, torchao.__version__)' >"$o/versions.txt" 2>&1
# fp8: torchao's defaults (fp8), the LM head in float8 too (h), the input gradients' matmuls in fast
# accumulation (gi); b16/b32: the micro-batch. fp8h2 and fp8h3 repeat fp8h with a flag that changes no
# number of the training (bench/run.py runs one command once: the same flags would not run again).
V=(--variant 'llama:b16=--batch-size 16' --variant 'llama:b32=--batch-size 32'
  --variant 'llama:fp8b16=--precision fp8 --batch-size 16'
  --variant 'llama:fp8h16=--precision fp8 --fp8-head --batch-size 16'
  --variant 'llama:fp8gi16=--precision fp8 --fp8-fast-accum grad-input --batch-size 16'
  --variant 'llama:fp8hgi16=--precision fp8 --fp8-head --fp8-fast-accum grad-input --batch-size 16'
  --variant 'llama:fp8h=--precision fp8 --fp8-head'
  --variant 'llama:fp8h2=--precision fp8 --fp8-head --eval-batch-size 8'
  --variant 'llama:fp8h3=--precision fp8 --fp8-head --generate-tokens 2'
  --variant 'llama:fp8hgi=--precision fp8 --fp8-head --fp8-fast-accum grad-input'
  --variant 'llama:fp8gi=--precision fp8 --fp8-fast-accum grad-input')
SPEED=(--suite llama --gpus 1 --llama-steps 40 --llama-warmup 20 --llama-log-every 10 --eval-samples 500)
LOSS=(--suite llama --gpus 1 --llama-steps 380 --llama-warmup 20 --llama-log-every 20 --eval-samples 16000)
case $call in
1)  # speed, micro-batch 16 (the trainer's default): bf16, fp8, and fp8's two new levers alone and together
    python3 bench/run.py "${SPEED[@]}" "${V[@]}" --only 'k1-b16$|k1-fp8b16$|k1-fp8h16$|k1-fp8hgi16$|k1-fp8gi16$' \
      --deadline-min 9.2 --out "$o/speed" >"$o/speed.log" 2>&1
    ;;
2 | 3)  # the loss after 400 steps on the non-repeated text, micro-batch 8 (sessions 19-20's protocol)
    # of the variant(s) named on the command line (a regex of run ids)
    python3 bench/run.py "${LOSS[@]}" "${V[@]}" --only "$2" --deadline-min "$3" --out "$o/loss" \
      >"$o/loss.log" 2>&1
    ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
