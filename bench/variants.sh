export PYTHONPATH=/tmp/bw/pkgshim:/tmp/site
v() { name=$1; shift; rm -rf /tmp/v; DISTRAIN_MODEL_DIR=/tmp/v/m DISTRAIN_OUTPUT_DIR=/tmp/v/o DISTRAIN_CHECKPOINT_DIR=/tmp/v/c timeout 150 python3 -m distrain_cloud.training --task causal-lm --preset gpt2-small --train-file /tmp/bw/data/lm_corpus.txt --block-size 1024 --precision bf16 --batch-size 16 --max-steps 50 --log-every 10 --compile --report-to none --no-save-model --max-eval-samples 64 --generate-tokens 1 "$@" > $OUT/variant-$name.log 2>&1; echo "== $name: $(grep -o 'step=[0-9]* train_loss=[0-9.]* lr=[^ ]* tokens_per_sec=[0-9.]*' $OUT/variant-$name.log | tail -3 | sed 's/lr=[^ ]* //' | tr '\n' ' ')"; }
v base
v flash --sdpa-backend flash
v fusedce --fused-ce
v flash-fusedce --sdpa-backend flash --fused-ce
v efficient --sdpa-backend efficient
