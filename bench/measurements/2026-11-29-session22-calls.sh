#!/usr/bin/env bash
# Session 22's device calls (issue 40), 1xH200 machines: `bash THIS CALL` from the checkout's root,
# with torchao 0.17.0 and the GPU wheels installed first (bench/README.md, "What the GPU machine needs").
# One GPU: the runs go one after another, each alone on it. Everything lands under $OUT/cN, packed
# into $OUT/cN.tgz (the device tool returns few files). Each call may land on another machine: ratios
# are taken within one call only. Calls 2, 3 and 4 found call 2's machine warm: one machine, one lease.
# The calls: `bash THIS 1`; `bash THIS 2`; `bash THIS 3 'k1-fp8h$' 9.2 2`; `bash THIS 2 - 3.5` (call 4:
# its output folder c2 renamed c4).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
call=$1
o=$OUT/c$call
mkdir -p "$o"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1
python3 -c 'import sys, torch, transformers, accelerate, torchao; print(sys.version.split()[0], torch.__version__,
  torch.version.cuda, transformers.__version__, accelerate.__version__, torchao.__version__)' >"$o/versions.txt" 2>&1
# fp8b16, fp8b32 and fp8h ran without `--fp8-linear torchao`, which was then the default (and call 1's
# code had no such flag): it is spelled out here so that they run torchao's layers again.
V=(--variant 'llama:b16=--batch-size 16' --variant 'llama:b32=--batch-size 32'
  --variant 'llama:fp8b16=--precision fp8 --fp8-linear torchao --batch-size 16'
  --variant 'llama:fp8b32=--precision fp8 --fp8-linear torchao --batch-size 32'
  --variant 'llama:natb16=--precision fp8 --fp8-linear native --batch-size 16'
  --variant 'llama:nathb16=--precision fp8 --fp8-linear native --fp8-head --batch-size 16'
  --variant 'llama:nat=--precision fp8 --fp8-linear native'
  --variant 'llama:fp8h=--precision fp8 --fp8-linear torchao --fp8-head'
  --variant 'llama:natdb16=--precision fp8 --fp8-scaling delayed --batch-size 16'
  --variant 'llama:natd=--precision fp8 --fp8-scaling delayed')
SPEED=(--suite llama --gpus 1 --llama-steps 40 --llama-warmup 20 --llama-log-every 10 --eval-samples 500)
LOSS=(--suite llama --gpus 1 --llama-steps 380 --llama-warmup 20 --llama-log-every 20 --eval-samples 16000)
case $call in
1)  # micro-batch 32: bf16 for the 60% MFU target, torchao's fp8 beside it
    python3 bench/run.py "${SPEED[@]}" "${V[@]}" --only 'k1-b32$|k1-fp8b32$' \
      --deadline-min 8.5 --out "$o/speed" >"$o/speed.log" 2>&1
    ;;
2)  # micro-batch 16: --fp8-linear native (new) against torchao's layers and bf16, and with --fp8-head.
    # Call 4 was `bash THIS 2 - 3.5` on the same machine, with 300 s of device time left: meant to run
    # nathb16 alone, it ran this list again (a quoting slip lost the regex) and stopped at its deadline
    # after bf16's row. $3: the deadline in minutes.
    python3 bench/run.py "${SPEED[@]}" "${V[@]}" --only 'k1-b16$|k1-fp8b16$|k1-natb16$|k1-nathb16$' \
      --deadline-min "${3:-8.6}" --out "$o/speed" >"$o/speed.log" 2>&1
    ;;
5)  # not run this session (no device time left): the next session's first call. Delayed scaling
    # (new, committed after the calls above) against the native layers' dynamic scaling and bf16, at
    # micro-batch 16; the three of them alone take about 400 s.
    python3 bench/run.py "${SPEED[@]}" "${V[@]}" --only 'k1-b16$|k1-natb16$|k1-natdb16$' \
      --deadline-min "${3:-9}" --out "$o/speed" >"$o/speed.log" 2>&1
    ;;
3)  # the loss after 400 steps on the non-repeated text, micro-batch 8 (sessions 19-21's protocol)
    # of the variant(s) named on the command line (a regex of run ids), $4 runs of each
    python3 bench/run.py "${LOSS[@]}" "${V[@]}" --only "$2" --repeat "$4" --deadline-min "$3" --out "$o/loss" \
      >"$o/loss.log" 2>&1
    ;;
esac
tar czf "$OUT/c$call.tgz" -C "$OUT" "c$call"
