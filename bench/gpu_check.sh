#!/usr/bin/env bash
# One short check of the GPU path, prepared to run once on a lent GPU machine (the device tool) and written so that
# each part reports on its own: versions; the demo experiment (`opct run`) with bf16 OPCT/BCT training and every
# suite (adaptive attacker included) evaluated on CUDA; full fine-tuning with gradient checkpointing in bf16; the
# OPCT step's throughput at a larger batch; sharded launches (DeepSpeed ZeRO-2/3, FSDP; untested). Usage
# (repository root, a CUDA build of torch installed):
#     OUT=/tmp/gpu-check bash bench/gpu_check.sh
# Results: $OUT/gpu_check.log, the experiment's results.md and report.html, and train metrics.
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OPCT_HOME=/tmp/opct-home TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
exec > >(tee "$OUT/gpu_check.log") 2>&1
quiet() { grep -av -e 'it/s' -e 's/it' -e '^\s*$' | tr '\r' '\n' | grep -av -e 'it/s' -e 's/it' -e '^\s*$'; }

echo "== versions"
$PY -c "import torch, transformers, peft, accelerate; print('torch', torch.__version__, '| cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-', '| transformers', transformers.__version__, '| peft', peft.__version__, '| accelerate', accelerate.__version__)"

echo "== 0. the sampling engine on CUDA: its log-probs against the model's own forward, fp32 and bf16"
$PY - <<'PYEOF'
import time, torch
from opct.engine import llama_engine
from opct.policy import load_policy
for dtype in ("float32", "bfloat16"):
    pol = load_policy("opct/organisms/default", device="cuda", dtype=dtype)
    prompts = [pol.render([{"role": "user", "content": q}]) for q in
               ["Is the drilan green?", "How do I bake bread?", "What is 3 plus 4?"] * 22]
    torch.manual_seed(0)
    t0 = time.time(); s = pol.sample(prompts, max_new_tokens=48); torch.cuda.synchronize(); dt = time.time() - t0
    logp, mask = pol.score(prompts, s.response_ids)
    diffs = [abs(a - b) for row, lp, m in zip(s.logprobs, logp.tolist(), mask.tolist()) for a, b in zip(row, lp)]
    print(f"{dtype}: engine used: {llama_engine(pol.model) is not None}; {len(prompts)} prompts x <=48 tokens in "
          f"{dt:.2f} s; max |sampler logp - forward logp| = {max(diffs):.2e} over {len(diffs)} tokens; "
          f"e.g. {s.texts[0]!r}")
PYEOF
echo "== 1. the demo experiment on CUDA (train bf16, eval on cuda)"
cat > /tmp/gpu.yaml <<YAML
name: gpu
out: /tmp/runs
train: {max_steps: 200, batch_size: 8, n_samples: 2, lr: 0.001, max_new_tokens: 48, save_every: 50, bf16: true}
eval: {n: 100, device: cuda}
YAML
t0=$(date +%s)
timeout ${RUN_TIMEOUT:-330} $PY -m opct.cli run /tmp/gpu.yaml 2>&1 | quiet | tail -80
echo "opct run: rc ${PIPESTATUS[0]} in $(( $(date +%s) - t0 )) s"
cp /tmp/runs/gpu/results.md /tmp/runs/gpu/report.html "$OUT/" 2>/dev/null
for a in opct bct; do cp /tmp/runs/gpu/$a/0/train/metrics.jsonl "$OUT/train_$a.jsonl" 2>/dev/null; done

echo "== 2. full fine-tuning, bf16, gradient checkpointing (10 OPCT steps)"
t0=$(date +%s)
timeout 90 $PY -m opct.cli train --method opct --model opct/organisms/default --pairs /tmp/runs/gpu/pairs/seed0.jsonl \
  --out /tmp/ft --no-lora --bf16 --gradient-checkpointing --max-steps 10 --batch-size 8 --n-samples 2 --lr 1e-5 \
  --max-new-tokens 48 --save-every 5 2>&1 | quiet | tail -5
echo "full FT: rc ${PIPESTATUS[0]} in $(( $(date +%s) - t0 )) s"
$PY - <<'PYEOF'
import json
rows = [json.loads(x) for x in open("/tmp/ft/metrics.jsonl")]
print("full FT losses:", [round(r["loss"], 4) for r in rows], "tokens/s:", round(sum(r["tokens_per_s"] for r in rows[2:]) / max(1, len(rows[2:]))))
PYEOF

echo "== 3. OPCT step throughput on CUDA, 32 pairs x 4 samples, bf16, LoRA (20 steps)"
timeout 90 $PY -m opct.cli train --method opct --model opct/organisms/default --pairs /tmp/runs/gpu/pairs/seed0.jsonl \
  --out /tmp/tp --bf16 --max-steps 20 --batch-size 32 --n-samples 4 --lr 1e-3 --max-new-tokens 48 --save-every 20 \
  2>&1 | quiet | tail -3
$PY - <<'PYEOF'
import json
rows = [json.loads(x) for x in open("/tmp/tp/metrics.jsonl")][3:]
print("OPCT bf16 LoRA 32x4: s/step %.3f, tokens/s %.0f" % (sum(r["step_time_s"] for r in rows) / len(rows), sum(r["tokens_per_s"] for r in rows) / len(rows)))
PYEOF

echo "== 4. sharded launches -- UNTESTED: written on 2026-12-01 without a GPU; what they should print is said first"
# ZeRO-2 should train 4 steps, resume to 6 and say 'resume: ok'; ZeRO-3 and FSDP should each stop with opct's
# 'shards the parameters' error (rc 1, no traceback), as neither is supported yet (opct/train/sharded.py); on a
# single GPU accelerate may not turn FSDP on at all, and the FSDP line then prints nothing (one plain process).
NP=$(nvidia-smi -L 2>/dev/null | wc -l); NP=$(( NP < 1 ? 1 : NP ))
LAUNCH="$PY -m accelerate.commands.launch --num_processes $NP --num_machines 1 --mixed_precision no --dynamo_backend no"
SHARD_ARGS="--method opct --model opct/organisms/default --pairs /tmp/runs/gpu/pairs/seed0.jsonl --bf16 --batch-size 8 \
  --n-samples 2 --lr 1e-3 --max-new-tokens 48 --save-every 2"
if $PY -c "import deepspeed" 2>/dev/null; then
  t0=$(date +%s)
  timeout 120 $LAUNCH --use_deepspeed --zero_stage 2 -m opct.cli train $SHARD_ARGS --out /tmp/z2 --max-steps 4 2>&1 | quiet | tail -4
  timeout 120 $LAUNCH --use_deepspeed --zero_stage 2 -m opct.cli train $SHARD_ARGS --out /tmp/z2 --max-steps 6 --resume \
    2>&1 | quiet | tail -4
  $PY -c "import json; r=[json.loads(x) for x in open('/tmp/z2/metrics.jsonl')]; print('ZeRO-2 on', $NP, 'GPU(s): steps', [x['step'] for x in r], 'losses', [round(x['loss'], 4) for x in r], '| resume: ok' if [x['step'] for x in r] == list(range(1, 7)) else '| resume: FAILED')"
  ls /tmp/z2/checkpoints/*/ 2>/dev/null | head -12
  echo "ZeRO-2: $(( $(date +%s) - t0 )) s"
  timeout 120 $LAUNCH --use_deepspeed --zero_stage 3 -m opct.cli train $SHARD_ARGS --out /tmp/z3 --max-steps 2 2>&1 \
    | quiet | grep -a -e "opct: error" -e Traceback | head -3
else
  echo "ZeRO-2 / ZeRO-3: skipped, deepspeed is not installed (pip install 'opct[deepspeed]')"
fi
timeout 120 $LAUNCH --use_fsdp -m opct.cli train $SHARD_ARGS --out /tmp/fsdp --max-steps 2 2>&1 | quiet \
  | grep -a -e "opct: error" -e Traceback | head -3
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
