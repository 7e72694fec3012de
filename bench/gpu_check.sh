#!/usr/bin/env bash
# The one prepared check of the GPU path, to run once on a lent GPU machine (the device tool), in at most 8 minutes
# (TOTAL=470 s of sections by default). Each section has its own timeout, reports on its own and cannot stop the
# others; the last lines summarise every section (rc, TIMEOUT, SKIPPED). Sections, in order:
#   0  the sampling engine on CUDA: its log-probs against the model's own forward, fp32 and bf16
#   1  the demo experiment (`opct run`): bf16 OPCT/BCT training and every suite evaluated on CUDA
#   2  full fine-tuning, bf16, gradient checkpointing
#   3  the OPCT step's throughput at 32 pairs x 4 samples, bf16, LoRA
#   4  sharded launches: DeepSpeed ZeRO-2 (train, resume), ZeRO-3 and FSDP (both refused by opct for now: each should
#      stop with opct's 'shards the parameters' error, rc 1, and no traceback through opct's code: the only lines
#      shown are opct's error and any `File ".../opct/...` frame; the launcher's own ChildFailedError is not shown)
#   5  the vLLM sampler (opct/engine/vllm_sampler.py; UNTESTED until this runs: written 2026-12-01 without a GPU):
#      vllm imported (or `pip install vllm` tried, which fails without network), an OPCT run with --sampler hf and the
#      same with --sampler vllm (tokens/s of both), then bench/vllm_check.py: vLLM's processed log-probs against HF's
#      at step 0 and after pushing the vllm run's trained adapter (PASS/FAIL with the tolerance stated there)
#   6  bench/opct_step.py on CUDA: one OPCT step against TRL's SDFTTrainer at Qwen2.5-0.5B's shape (random weights built
#      on the spot), bf16, 32 pairs x 4 samples x 256 tokens (UNTESTED until this runs: written 2026-12-01 without a
#      GPU); TRL from the wheels bench/trl_wheels.sh puts in .whl (the image has no TRL), installed into
#      $TRL_SITE (default /tmp/trl-site), on PYTHONPATH for this section only; without them opct runs alone
# Time: sections 0-4 leave the sections after them RESERVE seconds: VLLM_RESERVE (210 s) when 5 is asked for,
# BENCH_RESERVE (240 s) when 6 is, the larger of the two when both are (they share it), and section 5 keeps
# BENCH_RESERVE for 6. On the lent machines vLLM cannot be had and section 5 says NOT RUN within seconds, so 6 gets the
# reserve; where vLLM is importable, 5 then has only what 0-4 left unused: run SECTIONS=5 on its own (all 470 s for it).
# A missing vllm is installed from wheels in $VLLM_WHEELS (default .whl) when there are any, else from the package
# index when one answers (the lent machines reach none, and vLLM's wheels are far over what a device call carries: there
# section 5 says NOT RUN at once), with `pip install --target $VLLM_SITE` (default /tmp/vllm-site), never into the
# environment itself: vllm pins its own torch, and a timeout in the middle of replacing torch would break the other
# sections; the vLLM section then runs with $VLLM_SITE first on PYTHONPATH (and so does a later run that finds it).
# Usage (repository root, a CUDA build of torch installed):
#     OUT=/tmp/gpu-check bash bench/gpu_check.sh            # or SECTIONS=05 ... for some sections only
# Results: $OUT/gpu_check.log, the experiment's results.md and report.html, and train metrics; the run directories
# themselves in a fresh /tmp/gpu-check-work.XXXXXX per invocation (so a rerun on a warm machine starts clean).
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OPCT_HOME=/tmp/opct-home TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
exec > >(tee "$OUT/gpu_check.log") 2>&1
quiet() { grep -av -e 'it/s' -e 's/it' -e '^\s*$' | tr '\r' '\n' | grep -av -e 'it/s' -e 's/it' -e '^\s*$'; }

T0=$(date +%s); TOTAL=${TOTAL:-470}; VLLM_RESERVE=${VLLM_RESERVE:-210}; BENCH_RESERVE=${BENCH_RESERVE:-240}
SECTIONS=${SECTIONS:-0123456}
SUMMARY=()
want() { [[ $SECTIONS == *$1* ]]; }
left() { echo $(( T0 + TOTAL - $(date +%s) )); }
# begin NAME CAP [KEEP]: a section's timeout T = CAP seconds at most, leaving KEEP seconds for the sections after it;
# returns 1 (and says so) when no time is left for it
begin() {
  NAME=$1; T=$2; local room=$(( $(left) - ${3:-0} ))
  (( room < T )) && T=$room
  S0=$(date +%s)
  echo "== $NAME [timeout ${T}s; $(left)s of ${TOTAL}s left]"
  if (( T < 5 )); then echo "SKIPPED: out of time"; SUMMARY+=("$NAME: SKIPPED (out of time)"); return 1; fi
}
# end RC: record how the section ended (124 = its timeout)
end() {
  local how="rc $1"; (( $1 == 124 )) && how="TIMEOUT after ${T}s"
  echo "-- $NAME: $how in $(( $(date +%s) - S0 )) s"; SUMMARY+=("$NAME: $how in $(( $(date +%s) - S0 )) s")
}
R=0; want 5 && R=$VLLM_RESERVE                                     # what sections 0-4 keep for 5 and 6
want 6 && (( BENCH_RESERVE > R )) && R=$BENCH_RESERVE
K6=0; want 6 && K6=$BENCH_RESERVE                                 # what section 5 keeps for 6

echo "== versions"
timeout 60 $PY -c "import torch, transformers, peft, accelerate; print('torch', torch.__version__, '| cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-', '| transformers', transformers.__version__, '| peft', peft.__version__, '| accelerate', accelerate.__version__)"
# every run directory of this invocation, fresh: a rerun on a warm machine must neither find the last run's directories
# ("already holds a run") nor print their metrics as its own
WORK=$(mktemp -d /tmp/gpu-check-work.XXXXXX)
echo "run directories: $WORK"
PAIRS=$OUT/pairs.jsonl  # sycophancy pairs for sections 2-5 (section 1 makes its own)
$PY -m opct.cli pairs make --axis sycophancy --out "$PAIRS" --per-family 16 | tail -1

if want 0 && begin "0. the sampling engine on CUDA: its log-probs against the model's own forward, fp32 and bf16" 40 $R; then
timeout $T $PY - <<'PYEOF'
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
end $?
fi

if want 1 && begin "1. the demo experiment on CUDA (train bf16, eval on cuda)" 100 $R; then
cat > $WORK/gpu.yaml <<YAML
name: gpu
out: $WORK/runs
train: {max_steps: 200, batch_size: 8, n_samples: 2, lr: 0.001, max_new_tokens: 48, save_every: 50, bf16: true}
eval: {n: 100, device: cuda}
YAML
timeout $T $PY -m opct.cli run $WORK/gpu.yaml 2>&1 | quiet | tail -40
end "${PIPESTATUS[0]}"
cp $WORK/runs/gpu/results.md $WORK/runs/gpu/report.html "$OUT/" 2>/dev/null
for a in opct bct; do cp $WORK/runs/gpu/$a/0/train/metrics.jsonl "$OUT/train_$a.jsonl" 2>/dev/null; done
fi

if want 2 && begin "2. full fine-tuning, bf16, gradient checkpointing (10 OPCT steps)" 40 $R; then
timeout $T $PY -m opct.cli train --method opct --model opct/organisms/default --pairs "$PAIRS" --out $WORK/ft --no-lora \
  --bf16 --gradient-checkpointing --max-steps 10 --batch-size 8 --n-samples 2 --lr 1e-5 --max-new-tokens 48 \
  --save-every 5 2>&1 | quiet | tail -5
end "${PIPESTATUS[0]}"
$PY -c "import json; rows = [json.loads(x) for x in open('$WORK/ft/metrics.jsonl')]; print('full FT losses:', [round(r['loss'], 4) for r in rows], 'tokens/s:', round(sum(r['tokens_per_s'] for r in rows[2:]) / max(1, len(rows[2:]))))" 2>&1 | tail -1
fi

if want 3 && begin "3. OPCT step throughput on CUDA, 32 pairs x 4 samples, bf16, LoRA (20 steps)" 35 $R; then
timeout $T $PY -m opct.cli train --method opct --model opct/organisms/default --pairs "$PAIRS" --out $WORK/tp --bf16 \
  --max-steps 20 --batch-size 32 --n-samples 4 --lr 1e-3 --max-new-tokens 48 --save-every 20 2>&1 | quiet | tail -3
end "${PIPESTATUS[0]}"
$PY -c "import json; rows = [json.loads(x) for x in open('$WORK/tp/metrics.jsonl')][3:]; print('OPCT bf16 LoRA 32x4: s/step %.3f, tokens/s %.0f' % (sum(r['step_time_s'] for r in rows) / len(rows), sum(r['tokens_per_s'] for r in rows) / len(rows)))" 2>&1 | tail -1
fi

# ZeRO-2 should train 4 steps, resume to 6 and say 'resume: ok'; ZeRO-3 and FSDP should each stop with opct's
# 'shards the parameters' error (rc 1, no traceback through opct's code), as neither is supported yet
# (opct/train/sharded.py refuses both from the launch environment, before accelerate sets them up).
NP=$(nvidia-smi -L 2>/dev/null | wc -l); NP=$(( NP < 1 ? 1 : NP ))
LAUNCH="$PY -m accelerate.commands.launch --num_processes $NP --num_machines 1 --mixed_precision no --dynamo_backend no"
SHARD_ARGS="--method opct --model opct/organisms/default --pairs $PAIRS --bf16 --batch-size 8 --n-samples 2 --lr 1e-3 \
  --max-new-tokens 48 --save-every 2"
if ! want 4; then
  :
elif $PY -c "import deepspeed" 2>/dev/null; then
  if begin "4a. DeepSpeed ZeRO-2 on $NP GPU(s): 4 steps" 50 $R; then
    timeout $T $LAUNCH --use_deepspeed --zero_stage 2 -m opct.cli train $SHARD_ARGS --out $WORK/z2 --max-steps 4 2>&1 \
      | quiet | tail -4
    end "${PIPESTATUS[0]}"
  fi
  if begin "4b. DeepSpeed ZeRO-2: resume to 6 steps" 45 $R; then
    timeout $T $LAUNCH --use_deepspeed --zero_stage 2 -m opct.cli train $SHARD_ARGS --out $WORK/z2 --max-steps 6 \
      --resume 2>&1 | quiet | tail -4
    end "${PIPESTATUS[0]}"
    $PY -c "import json; r=[json.loads(x) for x in open('$WORK/z2/metrics.jsonl')]; print('ZeRO-2: steps', [x['step'] for x in r], 'losses', [round(x['loss'], 4) for x in r], '| resume: ok' if [x['step'] for x in r] == list(range(1, 7)) else '| resume: FAILED')" 2>&1 | tail -1
    ls $WORK/z2/checkpoints/*/ 2>/dev/null | head -12
  fi
  if begin "4c. DeepSpeed ZeRO-3 (expected: opct's 'shards the parameters' error)" 35 $R; then
    timeout $T $LAUNCH --use_deepspeed --zero_stage 3 -m opct.cli train $SHARD_ARGS --out $WORK/z3 --max-steps 2 2>&1 \
      | quiet | grep -a -e "opct: error" -e 'File ".*/opct/' | head -3
    end "${PIPESTATUS[0]}"
  fi
else
  echo "== 4a-4c. ZeRO-2 / ZeRO-3: SKIPPED, deepspeed is not installed (pip install 'opct[deepspeed]')"
  SUMMARY+=("4a-4c. DeepSpeed: SKIPPED (not installed)")
fi
if want 4 && begin "4d. FSDP (expected: opct's 'shards the parameters' error)" 35 $R; then
  timeout $T $LAUNCH --use_fsdp -m opct.cli train $SHARD_ARGS --out $WORK/fsdp --max-steps 2 2>&1 | quiet \
    | grep -a -e "opct: error" -e 'File ".*/opct/' | head -3
  end "${PIPESTATUS[0]}"
fi

# 5. vLLM. vLLM runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set by opct too); nothing may go online.
export VLLM_ENABLE_V1_MULTIPROCESSING=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
VLLM_SITE=${VLLM_SITE:-/tmp/vllm-site}
[ -d "$VLLM_SITE/vllm" ] && export PYTHONPATH=$VLLM_SITE:$PYTHONPATH
VLLM_VERSION=""
if want 5; then
  VLLM_VERSION=$(timeout 90 $PY -c "import vllm; print(vllm.__version__)" 2>/dev/null | tail -1)
  HAS_CUDA=$($PY -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null | tail -1)
  if [ -z "$VLLM_VERSION" ] && [ "$HAS_CUDA" != 1 ]; then
    echo "== 5a. vLLM: not installed, and no CUDA here: pip install vllm NOT tried (it would pull a CUDA torch)"
  elif [ -z "$VLLM_VERSION" ] && ls ${VLLM_WHEELS:-.whl}/vllm-*.whl >/dev/null 2>&1 \
       && begin "5a. vLLM: not installed; from the wheels in ${VLLM_WHEELS:-.whl} into $VLLM_SITE" 200 $(( 60 + K6 )); then
    timeout $T $PY -m pip install -q --no-index --no-deps --no-compile --target "$VLLM_SITE" ${VLLM_WHEELS:-.whl}/*.whl \
      2>&1 | tail -3
    end "${PIPESTATUS[0]}"
    export PYTHONPATH=$VLLM_SITE:$PYTHONPATH
    VLLM_VERSION=$(timeout 90 $PY -c "import vllm; print(vllm.__version__)" 2>/dev/null | tail -1)
  elif [ -z "$VLLM_VERSION" ] && ! timeout 8 $PY -c "import urllib.request as u; u.urlopen('https://pypi.org/simple/vllm/', timeout=5)" 2>/dev/null; then
    # the lent machines reach no package index, and vLLM's wheel (hundreds of MB, with its own torch) is far over the
    # 64 MiB a device call may carry: there vLLM cannot be had at all, and trying would only spend the budget
    echo "== 5a. vLLM: not installed, no wheels in ${VLLM_WHEELS:-.whl}, and no package index reachable: not installed"
  elif [ -z "$VLLM_VERSION" ] && begin "5a. vLLM: not installed; pip install --target $VLLM_SITE vllm" 200 $(( 60 + K6 )); then
    timeout $T $PY -m pip install --retries 1 --timeout 15 --target "$VLLM_SITE" vllm 2>&1 | tail -3
    end "${PIPESTATUS[0]}"
    export PYTHONPATH=$VLLM_SITE:$PYTHONPATH
    VLLM_VERSION=$(timeout 90 $PY -c "import vllm; print(vllm.__version__)" 2>/dev/null | tail -1)
    $PY -c "import torch, transformers; print('with $VLLM_SITE: torch', torch.__version__, torch.cuda.is_available(), '| transformers', transformers.__version__)"
  fi
fi
if ! want 5; then
  :
elif [ -z "$VLLM_VERSION" ]; then
  echo "== 5. vLLM: NOT RUN: vllm cannot be imported here (and pip could not install it)"
  SUMMARY+=("5. vLLM: NOT RUN (vllm not importable)")
else
  echo "== vllm $VLLM_VERSION"
  VL_ARGS="--method opct --model opct/organisms/default --pairs $PAIRS --bf16 --max-steps 12 --batch-size 16 \
    --n-samples 4 --lr 1e-3 --max-new-tokens 48 --save-every 12"
  if begin "5b. OPCT, 12 steps of 16 pairs x 4 samples, bf16 LoRA: --sampler hf, then --sampler vllm (eager)" 120 $(( 80 + K6 )); then
    timeout $(( T / 4 )) $PY -m opct.cli train $VL_ARGS --out $WORK/vl-hf 2>&1 | quiet | tail -2
    timeout $(( T - T / 4 )) $PY -m opct.cli train $VL_ARGS --out $WORK/vl-vllm --sampler vllm --vllm-enforce-eager \
      --vllm-gpu-memory 0.25 2>&1 | quiet | grep -av -e '^INFO' -e '^(EngineCore' | tail -12
    end "${PIPESTATUS[0]}"
    for s in hf vllm; do
      $PY -c "import json; rows = [json.loads(x) for x in open('$WORK/vl-$s/metrics.jsonl')]; t = rows[2:]; print('--sampler $s: losses', [round(r['loss'], 3) for r in rows], '| s/step %.3f, tokens/s %.0f (steps 3-%d)' % (sum(r['step_time_s'] for r in t) / len(t), sum(r['tokens_per_s'] for r in t) / len(t), len(rows)))" 2>&1 | tail -1
      cp $WORK/vl-$s/metrics.jsonl "$OUT/train_vl_$s.jsonl" 2>/dev/null
    done
  fi
  if begin "5c. vLLM log-probs against HF: step 0 and after pushing the trained adapter (bench/vllm_check.py)" 150 $K6; then
    ADAPTER=""; [ -f $WORK/vl-vllm/final/adapter_config.json ] && ADAPTER="--adapter $WORK/vl-vllm/final"
    timeout $T $PY bench/vllm_check.py --pairs "$PAIRS" $ADAPTER --dtype float32 2>&1 \
      | grep -av -e '^INFO' -e '^(EngineCore' -e '^WARNING' | tail -20
    RC=${PIPESTATUS[0]}
    if (( RC == 2 )) && (( $(left) - K6 > 40 )); then  # the float32 engine did not start: the bfloat16 one, looser tolerance
      timeout $(( $(left) - K6 - 5 )) $PY bench/vllm_check.py --pairs "$PAIRS" $ADAPTER --dtype bfloat16 2>&1 \
        | grep -av -e '^INFO' -e '^(EngineCore' -e '^WARNING' | tail -20
      RC=${PIPESTATUS[0]}
    fi
    end $RC
  fi
fi

# 6. bench/opct_step.py: opct against TRL at Qwen2.5-0.5B's shape, bf16, 32 pairs x 4 samples x 256 tokens.
# Memory: one float32 logits tensor of such a step is 128 x 256 x 151936 x 4 B = 20 GB, the unfused full-vocabulary
# loss keeps about 5 of them (opct) or 7 (TRL's SDFT loss; bench/kl_memory.py, measured on the CPU), and the student
# forward's activations for the backward add ~60 GB (an estimate: ~2 MB per token over 24 layers, ~34k tokens): ~160 GB
# for opct unfused, over 200 GB for TRL in one batch, against the H200's 139 GiB (149 GB). So opct runs with
# --kl-chunk 256 (its fused output layer + KL, as it is meant to run at a real vocabulary; ~70 GB) and TRL with its own
# remedy, gradient accumulation: 4 micro-batches of 32 rows (--trl-grad-accum 4, ~60 GB; generation stays one batch of
# all 128 rows, TRL's steps_per_generation).
# Time (an estimate, nothing of it measured: no GPU was lent while this was written): opct samples through
# model.generate here (opct's own engine is Llama-only), and so does TRL: 256 decode steps of 128 rows through 24 layers
# under LoRA cost ~1,500-2,000 small kernels each, bound by Python and launch overhead at ~20-40 ms, so ~5-10 s of
# sampling per step against ~1-2 s for both forwards and the backward (~150 TFLOP per step at a few hundred TFLOP/s).
# Each worker runs warmup + steps + 1 = 4 steps (~40 s) after ~15-20 s of imports and loading, and the model is built
# and the matmul peak measured first (~20 s): ~120-200 s in all. That is why --steps is 2 (the issue asked for 3;
# generation makes the step times steady) and the section has BENCH_RESERVE = 240 s: a TIMEOUT still leaves the lines
# of the worker(s) that finished, each printed with its tokens/s and peak memory as soon as it ends.
TRL_SITE=${TRL_SITE:-/tmp/trl-site}
if ! want 6; then
  :
elif [ "$($PY -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null | tail -1)" != 1 ]; then
  echo "== 6. opct against TRL at Qwen2.5-0.5B's shape: SKIPPED, torch sees no CUDA GPU here"
  SUMMARY+=("6. opct_step Qwen2.5-0.5B bf16: SKIPPED (no CUDA)")
elif begin "6. bench/opct_step.py: opct against TRL, Qwen2.5-0.5B's shape (random weights), bf16, 32 x 4 x 256" \
    $BENCH_RESERVE; then
  BENCH_PATH=$PWD  # not $PYTHONPATH: section 5 may have put $VLLM_SITE (with vLLM's own torch) on it
  if ls .whl/trl-*.whl >/dev/null 2>&1; then  # never from an index: the lent machines reach none
    timeout 60 $PY -m pip install -q --no-index --no-deps --no-compile --target "$TRL_SITE" .whl/*.whl 2>&1 | tail -3
    BENCH_PATH=$TRL_SITE:$PWD
  elif ! $PY -c "import trl" 2>/dev/null; then
    echo "no TRL here and no wheels in .whl: opct runs alone (bench/trl_wheels.sh, run where pip reaches PyPI, puts" \
      "them there)"
  fi
  PYTHONPATH=$BENCH_PATH $PY - <<'PYEOF' 2>&1 | tail -1
import importlib.metadata as m
names = ("trl", "datasets", "dill", "multiprocess", "pyarrow", "fsspec", "transformers", "accelerate", "peft")
def version(n):
    try:
        return m.version(n)
    except m.PackageNotFoundError:
        return "-"
print("; ".join(f"{n} {version(n)}" for n in names))
PYEOF
  T6=$(( T - ($(date +%s) - S0) )); (( T6 < 5 )) && T6=5  # what is left of the section (timeout 0 would mean none)
  PYTHONPATH=$BENCH_PATH timeout $T6 $PY bench/opct_step.py --device cuda --dtype bfloat16 \
    --shape qwen2.5-0.5b --pairs 32 --samples 4 --response-len 256 --rounds 1 --steps 2 --warmup 1 --kl-chunk 256 \
    --trl-grad-accum 4 --interleave rounds 2>&1 | grep -av -e 'Writing model shards' -e 'real_accelerator'
  end "${PIPESTATUS[0]}"
fi

nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>/dev/null
echo "== summary ($(( $(date +%s) - T0 )) s in all)"
printf '%s\n' "${SUMMARY[@]}"
