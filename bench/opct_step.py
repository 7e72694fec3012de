"""Benchmark one OPCT optimizer step against TRL's experimental SDFT trainer (a script, not a test).

Same work for both: compression pairs (teacher prompt = student prompt + a safety fact), the same batch (pairs x
samples), the same response length (EOS is forbidden until the last token, so every response has exactly
--response-len tokens), the same LoRA adapter, full-vocabulary reverse KL KL(student || teacher) with the frozen
starting model as teacher (opct: estimator `full`, LoRA teacher = adapters disabled; TRL: distillation_mode
`full_logits`, distillation_alpha 1.0, teacher_model_kind `base`; TRL's gradient checkpointing, on by default in
TRL, is turned off: opct does not checkpoint either, and at this size it only costs TRL time). Each trainer runs in
its own subprocess so peak RSS is measured fairly; the two alternate for --rounds rounds (opct, TRL, opct, TRL, ...)
so that load from other processes on a shared machine falls on both alike. In every subprocess the first --warmup
steps are not timed. A step is timed from the start of one optimizer step to the start of the next (everything the
trainer does per step), in wall-clock seconds and in CPU seconds of the process (`time.process_time`, which other
processes' load inflates far less); medians over all timed steps of all rounds are reported.

Reported: response tokens trained per second for both and their ratio, peak RSS for both (and RSS after imports,
before the model is loaded), where opct's step goes (sampling, student forward, teacher forward, backward: medians
of each part), and opct's achieved FLOP/s against a matmul peak measured in the same run. FLOPs are
model FLOPs, 2 x (linear-layer parameters) per token per forward pass, backward 2x forward for activations
(+2x for weights when they are trained); attention score FLOPs are left out, so this is an estimate.

    python bench/opct_step.py [--threads N] [--model DIR] [--rounds 3] [--steps 4] [--pairs 4] [--samples 2]
                              [--response-len 32] [--cpu-matmul onednn|blas]

--threads: intra-op threads for both trainers (torch.set_num_threads in each worker); by default torch's own choice
(one per core), which is how either trainer runs when a user starts it. Both trainers always get the same number.

--cpu-matmul: opct's `TrainConfig.cpu_matmul` (default onednn: linear layers through oneDNN, see opct/cpu_matmul.py;
blas: torch's default, which TRL always runs on). The matmul peak printed is that of the same backend.

--model defaults to the shipped default organism (opct/organisms/default) when it exists, otherwise to a tiny
Llama built on the spot.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


# ------------------------------------------------------------------------------------------------ set-up

def default_model(tmp: Path) -> Path:
    shipped = ROOT / "opct" / "organisms" / "default"
    if (shipped / "config.json").exists():
        return shipped
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from opct.organism.tokenizer import train_tokenizer

    tok = train_tokenizer([" ".join(f"w{i}" for i in range(500))])
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=352,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                         max_position_embeddings=256, pad_token_id=tok.pad_token_id,
                                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    out = tmp / "tiny-model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def make_pairs(model_dir: Path, n: int, prompt_words: int, fact_words: int, path: Path) -> None:
    """Compression pairs from in-vocabulary words (no <unk>), one per line, every pair the same lengths."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    words = sorted(w for w in tok.get_vocab() if w.isalnum() and w not in tok.all_special_tokens)
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            prompt = " ".join(rng.choice(words) for _ in range(prompt_words))
            fact = " ".join(rng.choice(words) for _ in range(fact_words))
            f.write(json.dumps({"id": f"bench-{i}", "axis": "awareness", "task": "compression",
                                "teacher": [{"role": "user", "content": f"{prompt} {fact}"}],
                                "student": [{"role": "user", "content": prompt}],
                                "meta": {"family": "bench", "split": "train", "prompt": prompt, "fact": fact}}) + "\n")


def matmul_peak(n: int = 1024, seconds: float = 1.0, backend: str = "blas") -> float:
    """FLOP/s of an n x n float32 matmul through torch's BLAS (MKL) or oneDNN (what --cpu-matmul onednn uses)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    if backend == "onednn":
        from opct import cpu_matmul

        def mm():
            return cpu_matmul.dense(a, b)  # a b^T: the same FLOPs
    else:
        def mm():
            return a @ b
    mm()
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        mm()
        reps += 1
    return 2 * n ** 3 * reps / (time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------------ workers

class StepClock:
    """Wall and CPU time at the start of every step; step i lasts from start i to start i + 1."""

    def __init__(self):
        self.starts: list[tuple[float, float]] = []

    def tick(self):
        self.starts.append((time.perf_counter(), time.process_time()))

    def steps(self, first: int) -> tuple[list[float], list[float]]:
        spans = list(zip(self.starts[first:], self.starts[first + 1:]))
        return [b[0] - a[0] for a, b in spans], [b[1] - a[1] for a, b in spans]


def set_threads(a) -> None:
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)


def worker_opct(a) -> dict:
    set_threads(a)
    import torch
    from accelerate import Accelerator

    import opct.methods.opct as opct_method
    from opct.methods import METHODS
    from opct.train.config import TrainConfig
    from opct.train.loop import train

    base_rss = rss_mb()
    clock, step_fn = StepClock(), METHODS["opct"]
    parts: dict[str, list[float]] = {"sampling": [], "student forward": [], "teacher forward": [], "backward": []}

    def timed(fn, name=None):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            # response_logits runs twice per micro-batch: the student's forward (with grad), then the teacher's
            key = name or ("student forward" if torch.is_grad_enabled() else "teacher forward")
            parts[key].append(time.perf_counter() - t0)
            return out
        return wrapper

    opct_method.rollout = timed(opct_method.rollout, "sampling")
    opct_method.response_logits = timed(opct_method.response_logits)
    Accelerator.backward = timed(Accelerator.backward, "backward")  # this worker process only

    def timed_step(run, micro_batches):
        clock.tick()
        return step_fn(run, micro_batches)

    METHODS["opct"] = timed_step
    out = Path(a.tmp) / f"opct-run-{a.round}"
    # one step more than timed: the last step only closes the span of the one before it
    train(TrainConfig(model=a.model, pairs=a.pairs_file, out=str(out), split="all", estimator="full",
                      batch_size=a.pairs, n_samples=a.samples, max_new_tokens=a.response_len,
                      min_new_tokens=a.response_len, max_steps=a.warmup + a.steps + 1, save_every=10 ** 9,
                      lora_r=a.lora_r, lora_alpha=2.0 * a.lora_r, lr=1e-4, tensorboard=False,
                      cpu_matmul=a.cpu_matmul))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][a.warmup:-1]
    wall, cpu = clock.steps(a.warmup)
    # one micro-batch per step: entry i of each part belongs to step i
    parts = {k: v[a.warmup:a.warmup + a.steps] for k, v in parts.items()}
    return {"step_s": wall, "step_cpu_s": cpu, "tokens": [r["tokens"] for r in rows],
            "base_rss_mb": base_rss, "peak_rss_mb": rss_mb(), "parts": parts}


def worker_trl(a) -> dict:
    set_threads(a)
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.experimental.sdft import SDFTConfig, SDFTTrainer

    base_rss = rss_mb()
    rows = [json.loads(line) for line in Path(a.pairs_file).read_text().splitlines()]
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": r["meta"]["prompt"]}],
                             "privileged_context": r["meta"]["fact"]} for r in rows])
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    clock = StepClock()

    class Timer(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            clock.tick()

    args = SDFTConfig(
        output_dir=str(Path(a.tmp) / f"trl-run-{a.round}"), per_device_train_batch_size=a.pairs * a.samples,
        num_generations=a.samples, max_completion_length=a.response_len, max_prompt_length=None,
        distillation_mode="full_logits", distillation_alpha=1.0, distillation_is_clip=None, teacher_model_kind="base",
        teacher_prompt_template="{prompt} {privileged_context}", temperature=1.0, top_k=0, top_p=1.0,
        generation_kwargs={"min_new_tokens": a.response_len}, max_steps=a.warmup + a.steps + 1, learning_rate=1e-4,
        lr_scheduler_type="constant", logging_steps=1, report_to="none", use_cpu=True, save_strategy="no",
        seed=0, bf16=False, dataloader_num_workers=0, max_grad_norm=1.0, gradient_checkpointing=False)
    trainer = SDFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok,
                          peft_config=LoraConfig(r=a.lora_r, lora_alpha=2.0 * a.lora_r, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"),
                          callbacks=[Timer()])
    trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    rows = a.pairs * a.samples
    wall, cpu = clock.steps(a.warmup)
    return {"step_s": wall, "step_cpu_s": cpu, "tokens": [rows * n for n in lengths[a.warmup:-1]],
            "base_rss_mb": base_rss, "peak_rss_mb": rss_mb()}


def run_worker(name: str, a, extra_env=None) -> tuple[dict | None, str]:
    cmd = [sys.executable, __file__, "--worker", name, "--model", str(a.model), "--pairs-file", str(a.pairs_file),
           "--tmp", str(a.tmp), "--steps", str(a.steps), "--warmup", str(a.warmup), "--pairs", str(a.pairs),
           "--samples", str(a.samples), "--response-len", str(a.response_len), "--lora-r", str(a.lora_r),
           "--round", str(a.round), "--threads", str(a.threads or 0), "--cpu-matmul", a.cpu_matmul]
    out = Path(a.tmp) / f"{name}-{a.round}.json"
    done = subprocess.run(cmd + ["--result", str(out)], capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return None, " | ".join(tail)
    return json.loads(out.read_text()), ""


# ------------------------------------------------------------------------------------------------ report

def model_flops_per_step(n_linear: int, a, student_len: int, teacher_len: int) -> float:
    """Model FLOPs of one opct step as opct executes it, 2 x linear-layer params per token per forward pass: sampling
    (prefill + cached decode), student forward, student backward (activation gradients only: LoRA leaves the base
    weights frozen, and the adapter's own FLOPs are negligible), teacher forward. opct runs each distinct prompt once
    per step (the n samples of a pair share it), so prompts count once per pair, responses once per row."""
    rows, L = a.pairs * a.samples, a.response_len
    student = a.pairs * student_len + rows * L  # sampling, student forward, student backward: each this many tokens
    return 2 * n_linear * (3 * student + a.pairs * teacher_len + rows * L)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (one subprocess per trainer per round)")
    p.add_argument("--steps", type=int, default=4, help="timed optimizer steps per round")
    p.add_argument("--warmup", type=int, default=1, help="untimed first steps per round")
    p.add_argument("--pairs", type=int, default=4, help="pairs per step")
    p.add_argument("--samples", type=int, default=2, help="responses per pair")
    p.add_argument("--response-len", type=int, default=32)
    p.add_argument("--prompt-words", type=int, default=24)
    p.add_argument("--fact-words", type=int, default=24)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads for both trainers (default: torch's)")
    p.add_argument("--cpu-matmul", default="onednn", choices=["onednn", "blas"],
                   help="opct's TrainConfig.cpu_matmul (TRL always runs on torch's default, the BLAS)")
    p.add_argument("--worker", choices=["opct", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--pairs-file", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.worker:
        result = (worker_opct if a.worker == "opct" else worker_trl)(a)
        Path(a.result).write_text(json.dumps(result))
        return 0

    import torch

    set_threads(a)  # the matmul peak below is measured with the same threads
    with tempfile.TemporaryDirectory(prefix="opct-bench-") as tmp:
        a.tmp = tmp
        a.model = str(Path(a.model) if a.model else default_model(Path(tmp)))
        a.pairs_file = str(Path(tmp) / "pairs.jsonl")
        make_pairs(Path(a.model), a.pairs * (a.warmup + a.steps + 1), a.prompt_words, a.fact_words, Path(a.pairs_file))
        from opct.policy import load_policy

        pol = load_policy(a.model)
        first = json.loads(Path(a.pairs_file).read_text().splitlines()[0])
        s_len, t_len = len(pol.render(first["student"])), len(pol.render(first["teacher"]))
        n_linear = sum(m.weight.numel() for m in pol.model.modules() if isinstance(m, torch.nn.Linear))
        del pol
        print(f"model {a.model} ({n_linear / 1e6:.2f}M linear params); {torch.get_num_threads()} threads; "
              f"{a.pairs} pairs x {a.samples} samples x {a.response_len} response tokens per step; "
              f"prompt {s_len} tokens (teacher {t_len}); LoRA r={a.lora_r}; opct cpu_matmul {a.cpu_matmul}")
        peak = matmul_peak(backend=a.cpu_matmul)
        results: dict[str, dict] = {}
        round_ratios: list[float] = []
        for a.round in range(a.rounds):
            this_round: dict[str, dict] = {}
            for name in ("opct", "trl"):
                if name in results and results[name] is None:
                    continue
                r, why = run_worker(name, a)
                if r is None:
                    hint = " (TRL is not an opct dependency: `pip install trl` to compare)" if name == "trl" else ""
                    print(f"{name}: could not run here{hint}: {why}")
                    results[name] = None
                    continue
                acc = results.setdefault(name, {"step_s": [], "step_cpu_s": [], "tokens": [], "peak_rss_mb": [],
                                                "base_rss_mb": [], "parts": {}})
                for k, v in r.get("parts", {}).items():
                    acc["parts"].setdefault(k, []).extend(v)
                for k in ("step_s", "step_cpu_s", "tokens"):
                    acc[k] += r[k]
                acc["peak_rss_mb"].append(r["peak_rss_mb"])
                acc["base_rss_mb"].append(r["base_rss_mb"])
                this_round[name] = r
                line = (f"  round {a.round + 1} {name:<5} s/step " + " ".join(f"{x:.3f}" for x in r["step_s"])
                        + "  cpu s/step " + " ".join(f"{x:.3f}" for x in r["step_cpu_s"]))
                if name == "trl" and "opct" in this_round:  # this round's own ratio, on its median wall steps
                    ratio = (statistics.median(this_round["opct"]["tokens"]) / statistics.median(r["tokens"])
                             * statistics.median(r["step_s"]) / statistics.median(this_round["opct"]["step_s"]))
                    round_ratios.append(ratio)
                    line += f"  | round ratio {ratio:.2f}x"
                print(line, flush=True)

    def summary(r):
        """(tokens/s on the median wall step, median wall s/step, tokens/s on the median CPU step, median CPU s)"""
        tokens = statistics.median(r["tokens"])
        wall, cpu = statistics.median(r["step_s"]), statistics.median(r["step_cpu_s"])
        return tokens / wall, wall, tokens / cpu, cpu

    print(f"medians over {a.rounds} rounds x {a.steps} steps; peak RSS: the largest of the rounds")
    print(f"{'trainer':<18}{'s/step':>8}{'tokens/s':>10}{'cpu s/step':>12}{'tokens/cpu-s':>14}{'resp len':>10}"
          f"{'RSS after imports':>19}{'peak RSS':>11}")
    for name, label in (("opct", "opct (full)"), ("trl", "TRL SDFTTrainer")):
        r = results.get(name)
        if r:
            tps, sps, tpc, cps = summary(r)
            resp = statistics.median(r["tokens"]) / (a.pairs * a.samples)
            print(f"{label:<18}{sps:>8.3f}{tps:>10.1f}{cps:>12.3f}{tpc:>14.1f}{resp:>10.1f}"
                  f"{max(r['base_rss_mb']):>16.0f} MB{max(r['peak_rss_mb']):>8.0f} MB")
    if results.get("opct") and results.get("trl"):
        o, t = summary(results["opct"]), summary(results["trl"])
        print(f"opct / TRL tokens/s: {o[0] / t[0]:.2f}x wall-clock, {o[2] / t[2]:.2f}x CPU time")
        if round_ratios:
            print(f"per round (wall-clock, each round's medians): lowest {min(round_ratios):.2f}x, "
                  f"highest {max(round_ratios):.2f}x over {len(round_ratios)} rounds")
    if results.get("opct") and results["opct"]["parts"]:
        step = statistics.median(results["opct"]["step_s"])
        print("opct step, median s: " + ", ".join(
            f"{k} {statistics.median(v):.3f} ({100 * statistics.median(v) / step:.0f}%)"
            for k, v in results["opct"]["parts"].items() if v))
    if results.get("opct"):
        flops = model_flops_per_step(n_linear, a, s_len, t_len)
        achieved = flops / summary(results["opct"])[1]
        print(f"opct: ~{flops / 1e9:.2f} GFLOP/step (model FLOPs), {achieved / 1e9:.2f} GFLOP/s achieved; "
              f"fp32 matmul peak here ({a.cpu_matmul}, 1024^3) {peak / 1e9:.1f} GFLOP/s -> "
              f"{100 * achieved / peak:.1f}% of peak")
    return 0


if __name__ == "__main__":
    sys.exit(main())
