#!/usr/bin/env bash
# Session 20's device calls (issue 40), one 4xH200 machine: `bash THIS CALL` from the checkout's root,
# with torchao 0.17.0 and the GPU wheels installed first (bench/README.md, "What the GPU machine needs").
# Each phase runs four 1-GPU bench invocations at once, one per GPU (bench/side_by_side.sh), and
# leaves everything under $OUT/cN, packed into $OUT/cN.tgz (the device tool returns few files).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
call=$1
shift # call 2: the four --only patterns, one per GPU, then the deadline in minutes
o=$OUT/c$call
mkdir -p "$o"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1
python3 -c 'import sys, torch, transformers, accelerate, torchao; print(sys.version.split()[0], torch.__version__,
  torch.version.cuda, transformers.__version__, accelerate.__version__, torchao.__version__)' >"$o/versions.txt" 2>&1
LLAMA=(--suite llama --gpus 1 --llama-steps 40 --llama-warmup 20 --llama-log-every 10 --eval-samples 500)
FP8=(--variant 'llama:fp8=--precision fp8' --variant 'llama:fp8fa=--precision fp8 --fp8-fast-accum'
  --variant 'llama:fp8fa16=--precision fp8 --fp8-fast-accum --batch-size 16' --variant 'llama:b16=--batch-size 16'
  --variant 'llama:fp8b16=--precision fp8 --batch-size 16'
  --variant 'llama:cdt=--compile-tuning' --variant 'llama:b16cdt=--batch-size 16 --compile-tuning' --variant 'llama:fp8cdt=--precision fp8 --compile-tuning'
  --variant 'llama:fp8facdt=--precision fp8 --fp8-fast-accum --compile-tuning'
  --variant 'llama:fp8fa16cdt=--precision fp8 --fp8-fast-accum --batch-size 16 --compile-tuning')
GPT2=(--suite single --gpus 1 --ours-compile --variant 'single:b32=--batch-size 32' --variant 'single:cdt=--compile-tuning'
  --variant 'single:b32cdt=--batch-size 32 --compile-tuning')
case $call in
1)  # llama-1b: bf16, fp8, fp8 with the backward's fast accumulation, and bf16 at micro-batch 16
    bash bench/side_by_side.sh "$o/llama" 'k1$' 'k1-fp8$' 'k1-fp8fa$' 'k1-b16$' -- "${LLAMA[@]}" "${FP8[@]}" \
      --deadline-min 4.6
    tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
    # GPT-2 small, 1 GPU: micro-batch 32 and Inductor's coordinate-descent tuning, alone and together
    bash bench/side_by_side.sh "$o/gpt2" 'compile-g1-b16-k1$' 'k1-b32$' 'k1-cdt$' 'k1-b32cdt$' -- "${GPT2[@]}" \
      --deadline-min 4.4
    ;;
2 | 4)  # llama-1b, four variants named on the command line (call 2: --compile-tuning; call 4: micro-batch 16)
    bash bench/side_by_side.sh "$o/llama" "$1" "$2" "$3" "$4" -- "${LLAMA[@]}" "${FP8[@]}" --deadline-min "$5"
    ;;
3)  # the loss: three 400-step fp8 runs with the backward's fast accumulation, one bf16 beside them
    bash bench/side_by_side.sh "$o/loss" 'k1-fp8fa$' 'k1-fp8fa$' 'k1-fp8fa$' 'k1$' -- --suite llama --gpus 1 \
      --llama-steps 380 --llama-warmup 20 --llama-log-every 20 --eval-samples 16000 --deadline-min 5.6 \
      --variant 'llama:fp8fa=--precision fp8 --fp8-fast-accum'
    tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
    # GPT-2 small alone on one GPU (the other three idle): micro-batch 16 and 32
    python3 bench/run.py "${GPT2[@]}" --only 'compile-g1-b16-k1$|k1-b32$' --deadline-min 2.6 --out "$o/gpt2" \
      >"$o/gpt2.log" 2>&1
    ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
