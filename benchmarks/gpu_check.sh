#!/usr/bin/env bash
# The shipped commands on a machine with one CUDA GPU: what CI and a laptop cannot check (bf16 on CUDA,
# NCCL, a ByT5-small-sized encoder). Each step runs alone with its own time limit, so one failure still
# leaves the others' results; SUMMARY lists each step's exit code and wall time.
#   bash benchmarks/gpu_check.sh OUTDIR
# Steps: the main job's 4 devices on one GPU (expected: one error line, exit 2); the main job and its test
# on that GPU (--trainer.devices=1); the Fisher job on its last.ckpt; ReProver's recipe with a randomly
# initialised google/byt5-small-shaped model saved locally (no network), a few batches; the fast test suite
# with the GPU visible. nvidia-smi samples memory and load once a second into smi.csv.
set -u
out=${1:?usage: bash benchmarks/gpu_check.sh OUTDIR}
mkdir -p "$out"
summary="$out/SUMMARY.txt"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s%N)
    timeout --signal=INT --kill-after=20 "$limit" "$@" >"$out/$name.log" 2>&1
    rc=$?
    printf '%-10s rc=%-3s %5d s  %s\n' "$name" "$rc" $((($(date +%s%N) - start) / 1000000000)) "$*" >>"$summary"
}

{
    nvidia-smi -L
    "$py" -c 'import torch, pytorch_lightning as pl, transformers as t
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(),
      "| lightning", pl.__version__, "| transformers", t.__version__)
print("device", torch.cuda.get_device_name(0), "bf16", torch.cuda.is_bf16_supported())'
} >"$summary" 2>&1
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 1 >"$out/smi.csv" 2>&1 &
smi=$!

step devices4 60 "$py" main.py fit --config configs/retrieval.yaml
step fit 200 "$py" main.py fit --config configs/retrieval.yaml --trainer.devices=1
step test 80 "$py" main.py test --config configs/retrieval.yaml --trainer.devices=1 \
    --ckpt_path checkpoints/retrieval/last.ckpt
step fisher 80 "$py" main.py fit --config configs/fisher.yaml --trainer.devices=1

small=$(mktemp -d)/byt5-small-shape
"$py" - "$small" <<'EOF' >>"$summary" 2>&1
import sys
from transformers import ByT5Tokenizer, T5Config, T5EncoderModel
config = T5Config(vocab_size=384, d_model=1472, d_kv=64, num_heads=6, d_ff=3584, num_layers=12,
                  feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False,
                  tie_word_embeddings=False)
model = T5EncoderModel(config)
model.save_pretrained(sys.argv[1])
ByT5Tokenizer().save_pretrained(sys.argv[1])
print(f"byt5-small shape: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters in {sys.argv[1]}")
EOF
step byt5small 150 "$py" main.py fit --config configs/retrieval.yaml --config configs/recipes/byt5_small.yaml \
    --model.init_args.model_name="$small" --data.data_path=data/batteries/random \
    --data.corpus_path=data/batteries/corpus.jsonl --trainer.devices=1 --trainer.max_epochs=1 \
    --trainer.limit_train_batches=64 --model.init_args.warmup_steps=4
step pytest 100 "$py" -m pytest -m "not slow" -n 8 -q -p no:cacheprovider --timeout 120

kill "$smi" 2>/dev/null
awk -F', ' 'NR > 1 && $2 + 0 > peak { peak = $2 + 0 } END { print "peak GPU memory used:", peak, "MiB" }' \
    "$out/smi.csv" >>"$summary"
grep -h -E "distributed_backend|Using bf16|bf16" "$out/fit.log" | head -3 >>"$summary"
cat "$summary"
