"""Benchmark one OPCT optimizer step against TRL's experimental SDFT trainer (a script, not a test).

Same work for both: compression pairs (teacher prompt = student prompt + a safety fact), the same batch (pairs x
samples), the same response length (EOS is forbidden until the last token, so every response has exactly
--response-len tokens), the same LoRA adapter, full-vocabulary reverse KL KL(student || teacher) with the frozen
starting model as teacher (opct: estimator `full`, LoRA teacher = adapters disabled; TRL: distillation_mode
`full_logits`, distillation_alpha 1.0, teacher_model_kind `base`; TRL's gradient checkpointing, on by default in
TRL, is turned off: opct does not checkpoint either, and at this size it only costs TRL time). Each trainer runs in
its own subprocess so peak RSS is measured fairly. --interleave steps (the default): in each of --rounds rounds both
subprocesses start together and take turns step by step (opct's step, then TRL's, then opct's, ...; the one whose
turn it is not waits, blocked on a pipe, at the start of its next step), so that load from other processes on a
shared machine falls on both alike, within seconds; --interleave rounds: one subprocess after the other, opct then
TRL, in each round (load that changes from one minute to the next then falls on one more than the other). In every
subprocess the first --warmup steps are not timed. A step is timed from the start of one optimizer step to the
start of the next (everything the trainer does per step; with --interleave steps, less the wait for the turn), in
wall-clock seconds and in CPU seconds of the process (`time.process_time`, which other processes' load inflates far
less); medians over all timed steps of all rounds are reported, and each round's own ratio. On a GPU both workers
of a step-interleaved round hold their memory at once, and a round prints nothing until both have finished:
bench/gpu_check.sh, which has a time limit and one GPU, runs --interleave rounds.

Reported: response tokens trained per second for both and their ratio, peak RSS for both (and RSS after imports,
before the model is loaded), where opct's step goes (sampling, student forward, teacher forward, backward: medians
of each part), and opct's achieved FLOP/s against a matmul peak measured in the same run. FLOPs are
model FLOPs, 2 x (linear-layer parameters) per token per forward pass, backward 2x forward for activations
(+2x for weights when they are trained); attention score FLOPs are left out, so this is an estimate.

    python bench/opct_step.py [--threads N] [--model DIR | --shape qwen2.5-0.5b] [--rounds 3] [--steps 4] [--pairs 4]
                              [--samples 2] [--response-len 32] [--cpu-matmul onednn|blas] [--device cpu|cuda]
                              [--dtype float32|bfloat16] [--kl-chunk N] [--trl-grad-accum N] [--sampler hf|vllm]
                              [--interleave steps|rounds]

--threads: intra-op threads for both trainers (torch.set_num_threads in each worker); by default torch's own choice
(one per core), which is how either trainer runs when a user starts it. Both trainers always get the same number.

--cpu-matmul: opct's `TrainConfig.cpu_matmul` (default auto: oneDNN on an AMD CPU with AVX-512, the BLAS elsewhere;
onednn: linear layers through oneDNN, see opct/cpu_matmul.py; blas: torch's default, which TRL always
runs on). The matmul peak printed is that of the same backend.

--model defaults to the shipped default organism (opct/organisms/default) when it exists, otherwise to a tiny
Llama built on the spot. --shape NAME (a key of SHAPES: qwen2.5-0.5b) builds a model of that architecture and size on
the spot instead, with random weights (seeded: both trainers load the same saved model; nothing is downloaded) and a
tokenizer of exactly the model's vocabulary size, with opct's special tokens and chat template (`word_tokenizer`: a
byte-level BPE whose other tokens are the words " a", " ab", ... in Qwen2's own format), so every id that can be
sampled decodes; the prompts are random words of it.

--device cpu|cuda: where both trainers run (cpu hides any GPU from the workers; cuda: opct's accelerate picks the GPU,
TRL gets use_cpu=False). --dtype float32|bfloat16: the precision both compute in. Both keep float32 weights and, for
bfloat16, run under bf16 autocast: opct's `TrainConfig.bf16`, TRL's `bf16=True` (transformers' Trainer: accelerate's
bf16 mixed precision); this is the mixed precision both are built for, and LoRA's adapter stays float32 in both. On
CUDA each step boundary (and each of opct's parts) is timed after `torch.cuda.synchronize()`, the peak GPU memory of
each worker (`torch.cuda.max_memory_allocated`) is reported beside its peak RSS, and the matmul peak is an 8192^3
matmul in the dtype through torch.

--kl-chunk N: opct's `TrainConfig.kl_chunk` (the fused output layer + KL, N positions at a time; 0 = the full-vocabulary
log-probs at once, as before). --trl-grad-accum N: TRL trains each step's rows in N micro-batches (gradient
accumulation; generation stays one batch of all rows, TRL's steps_per_generation). At a real vocabulary and a large
batch both are what fits in memory: at 32 pairs x 4 samples x 256 tokens and V = 151936 one float32 logits tensor of the
step is 20 GB, and the unfused loss keeps about 5 of them (opct) or 7 (TRL's SDFT loss; bench/kl_memory.py).

--sampler hf|vllm: opct's `TrainConfig.sampler` (hf: opct's own engine; vllm: a vLLM engine in opct's worker, sent
the weights after every step, which the step's time includes; needs vllm on a CUDA GPU or vLLM's CPU build, see
`make test-vllm-cpu`). TRL always samples with `model.generate` here.

When TRL (or its `datasets`) cannot be imported, opct runs alone and the bench says how to get TRL.
"""

from __future__ import annotations

import argparse
import json
import os
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
    """Peak resident memory of this process, MB: VmHWM, which starts afresh at exec (ru_maxrss would carry over the
    resident memory of the parent at fork, e.g. the model --shape built there)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024  # KiB
    except (OSError, StopIteration):
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


# Shapes --shape builds with random weights: the released model's Qwen2Config (head_dim = hidden / heads = 64; q, k
# and v carry biases, as Qwen2's attention always does; max_position_embeddings as released, far above the bench's).
SHAPES = {
    "qwen2.5-0.5b": {"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "hidden_act": "silu",
                     "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
                     "use_sliding_window": False},
}


def word_tokenizer(vocab_size: int):
    """A tokenizer of exactly `vocab_size` ids in Qwen2's own format, with opct's special tokens and chat template
    (opct.organism.tokenizer): a byte-level BPE over the 256 byte symbols and the words " a", " ab", " abc", " abcd",
    ... (letters only, each one token, each built by one merge from the word one letter shorter), as many as fill the
    vocabulary. Not the organism's word-level tokenizer: for a model_type qwen2 directory, AutoTokenizer (so opct's
    load_policy and TRL) builds a Qwen2Tokenizer from tokenizer.json's vocabulary and merges whatever the file's own
    model is, and a word-level vocabulary without merges then encodes every word to nothing."""
    import itertools
    import string

    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    from opct.organism.tokenizer import BOS, CHAT_TEMPLATE, EOS, PAD, ROLE_TOKENS, SPECIAL_TOKENS, UNK

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    merges, space = [], "\u0120"  # byte-level's symbol for the space
    for n in itertools.count(1):
        for letters in itertools.product(string.ascii_lowercase, repeat=n):
            if len(vocab) == vocab_size:
                break
            word = space + "".join(letters)
            merges.append((word[:-1], word[-1]))
            vocab[word] = len(vocab)
        if len(vocab) == vocab_size:
            break
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=UNK, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                         padding_side="left", model_max_length=1_000_000)
    tok.add_tokens(list(ROLE_TOKENS.values()), special_tokens=True)  # already in the vocabulary: no new ids
    tok.chat_template = CHAT_TEMPLATE
    return tok


def shape_model(tmp: Path, shape: str, device: str, dtype: str) -> Path:
    """A random-weight model of `shape` (seeded), saved in `dtype`, with `word_tokenizer` of exactly its vocabulary
    size (so every id that can be sampled decodes). Checks that AutoTokenizer loads back that very tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    spec = SHAPES[shape]
    tok = word_tokenizer(spec["vocab_size"])
    cfg = Qwen2Config(**spec, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id)
    assert cfg.hidden_size // cfg.num_attention_heads == 64 and cfg.rope_parameters["rope_theta"] == 1e6, cfg
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it will run: seconds on a GPU, not a minute on a small CPU
        model = Qwen2ForCausalLM(cfg)
    out = tmp / f"{shape}-random"
    model.to(getattr(torch, dtype)).save_pretrained(out)
    tok.save_pretrained(out)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    back = AutoTokenizer.from_pretrained(out)
    probe = [{"role": "user", "content": "abc zzz hello q"}]
    ids = [t.apply_chat_template(probe, tokenize=True, add_generation_prompt=True, return_dict=False)
           for t in (tok, back)]
    if len(back) != spec["vocab_size"] or ids[0] != ids[1] or back.eos_token_id != tok.eos_token_id:
        raise SystemExit(f"opct_step: AutoTokenizer loads {type(back).__name__} ({len(back)} ids) from {out}, not the "
                         f"tokenizer saved there ({len(tok)} ids): {ids[1]} instead of {ids[0]}")
    return out


def make_pairs(model_dir: Path, n: int, prompt_words: int, fact_words: int, path: Path) -> None:
    """Compression pairs from in-vocabulary words (no <unk>), one per line, every pair the same lengths: words that
    are one token each after a space (a word-level vocabulary's words, a byte-level BPE's whole-word tokens)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    special = set(tok.all_special_ids)
    texts = tok.batch_decode([[i] for i in range(len(tok)) if i not in special])
    texts = sorted({t.strip() for t in texts if t.strip().isalnum()})
    lengths = tok([" " + t for t in texts], add_special_tokens=False)["input_ids"]
    words = [t for t, ids in zip(texts, lengths, strict=True) if len(ids) == 1]
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            prompt = " ".join(rng.choice(words) for _ in range(prompt_words))
            fact = " ".join(rng.choice(words) for _ in range(fact_words))
            f.write(json.dumps({"id": f"bench-{i}", "axis": "awareness", "task": "compression",
                                "teacher": [{"role": "user", "content": f"{prompt} {fact}"}],
                                "student": [{"role": "user", "content": prompt}],
                                "meta": {"family": "bench", "split": "train", "prompt": prompt, "fact": fact}}) + "\n")


def matmul_peak(n: int = 1024, seconds: float = 1.0, backend: str = "blas", device: str = "cpu",
                dtype: str = "float32") -> float:
    """FLOP/s of an n x n matmul in `dtype` through torch: on the CPU through its BLAS (MKL) or, for float32, oneDNN
    (what --cpu-matmul onednn uses); on CUDA through cuBLAS, timed between synchronisations."""
    import torch

    a = torch.randn(n, n, device=device, dtype=getattr(torch, dtype))
    b = torch.randn(n, n, device=device, dtype=getattr(torch, dtype))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    from opct import cpu_matmul

    if device == "cpu" and dtype == "float32" and cpu_matmul.resolve(backend) == "onednn":
        def mm():
            return cpu_matmul.dense(a, b)  # a b^T: the same FLOPs
    else:
        def mm():
            return a @ b
    for _ in range(3 if device == "cuda" else 1):
        mm()
    sync()
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        mm()
        reps += 1
        if device == "cuda" and reps % 10 == 0:  # the loop queues kernels faster than they run: wait every 10
            sync()
    sync()
    return 2 * n ** 3 * reps / (time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------------ workers

class StepClock:
    """Wall and CPU time at the start of every step; step i lasts from start i to start i + 1. `sync` runs first (on
    CUDA `torch.cuda.synchronize`: the kernels a step queued belong to that step). With a `baton` (--interleave
    steps: the ends of two pipes, see `lockstep`), each start first hands the turn back (a byte on `baton[1]`) and
    waits for the next one (a byte on `baton[0]`); the wait is not part of either step."""

    def __init__(self, sync=lambda: None, baton: tuple[int, int] | None = None):
        self.ends: list[tuple[float, float]] = []  # when the step before each start ended (before the wait)
        self.starts: list[tuple[float, float]] = []
        self.sync, self.baton = sync, baton

    def tick(self):
        self.sync()
        self.ends.append((time.perf_counter(), time.process_time()))
        if self.baton is not None:
            os.write(self.baton[1], b".")
            if not os.read(self.baton[0], 1):
                raise SystemExit("opct_step worker: the bench stopped handing out turns")
        self.starts.append((time.perf_counter(), time.process_time()))

    def steps(self, first: int) -> tuple[list[float], list[float]]:
        spans = list(zip(self.starts[first:], self.ends[first + 1:]))
        return [b[0] - a[0] for a, b in spans], [b[1] - a[1] for a, b in spans]

    def spans(self) -> list[tuple[float, float]]:
        """Every step's (start, end) on the wall clock, warm-up included (perf_counter: CLOCK_MONOTONIC on Linux, one
        clock for all processes), for the check that interleaved steps never overlap."""
        return [(a[0], b[0]) for a, b in zip(self.starts, self.ends[1:])]


def baton_of(a) -> tuple[int, int] | None:
    """The worker's ends of its turn pipes (--baton R,W), or None (--interleave rounds)."""
    if not a.baton:
        return None
    r, w = (int(x) for x in a.baton.split(","))
    return r, w


def set_threads(a) -> None:
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)


def device_sync(a):
    """What a clock runs before it reads the time: on CUDA a synchronisation (kernels run asynchronously)."""
    import torch

    if a.device != "cuda":
        return lambda: None
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA GPU in this worker")
    return torch.cuda.synchronize


def memory(a, base_rss: float) -> dict:
    """A worker's peaks: RSS, and on CUDA the GPU memory its tensors took (`max_memory_allocated`)."""
    import torch

    cuda = torch.cuda.max_memory_allocated() / 2 ** 20 if a.device == "cuda" else None
    return {"base_rss_mb": base_rss, "peak_rss_mb": rss_mb(), "cuda_peak_mb": cuda}


def worker_opct(a) -> dict:
    set_threads(a)
    import torch
    from accelerate import Accelerator

    import opct.fused_kl
    import opct.methods.opct as opct_method
    from opct.methods import METHODS
    from opct.train.config import TrainConfig
    from opct.train.loop import train

    base_rss = rss_mb()
    sync = device_sync(a)
    clock, step_fn = StepClock(sync, baton_of(a)), METHODS["opct"]
    parts: dict[str, list[float]] = {"sampling": [], "student forward": [], "teacher forward": [], "fused KL": [],
                                     "backward": []}

    def timed(fn, name=None):
        def wrapper(*args, **kwargs):
            sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            sync()
            # response_logits runs twice per micro-batch: the student's forward (with grad), then the teacher's
            key = name or ("student forward" if torch.is_grad_enabled() else "teacher forward")
            parts[key].append(time.perf_counter() - t0)
            return out
        return wrapper

    opct_method.rollout = timed(opct_method.rollout, "sampling")
    opct_method.response_logits = timed(opct_method.response_logits)
    # --kl-chunk: the output layer and the KL, after the forwards (its backward is inside "backward")
    opct.fused_kl.fused_reverse_kl = timed(opct.fused_kl.fused_reverse_kl, "fused KL")
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
                      cpu_matmul=a.cpu_matmul, bf16=a.dtype == "bfloat16", kl_chunk=a.kl_chunk,
                      sampler=a.sampler))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][a.warmup:-1]
    wall, cpu = clock.steps(a.warmup)
    # one micro-batch per step: entry i of each part belongs to step i
    parts = {k: v[a.warmup:a.warmup + a.steps] for k, v in parts.items()}
    return {"step_s": wall, "step_cpu_s": cpu, "tokens": [r["tokens"] for r in rows], **memory(a, base_rss),
            "parts": parts, "spans": clock.spans()}


def worker_trl(a) -> dict:
    set_threads(a)
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.experimental.sdft import SDFTConfig, SDFTTrainer

    base_rss = rss_mb()
    sync = device_sync(a)
    rows = [json.loads(line) for line in Path(a.pairs_file).read_text().splitlines()]
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": r["meta"]["prompt"]}],
                             "privileged_context": r["meta"]["fact"]} for r in rows])
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)  # bf16: autocast, as opct's
    clock = StepClock(sync, baton_of(a))

    class Timer(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            clock.tick()

    # --trl-grad-accum N: each step's rows in N micro-batches; generation stays one batch of all rows (TRL's
    # steps_per_generation defaults to gradient_accumulation_steps)
    args = SDFTConfig(
        output_dir=str(Path(a.tmp) / f"trl-run-{a.round}"),
        per_device_train_batch_size=a.pairs * a.samples // a.trl_grad_accum,
        gradient_accumulation_steps=a.trl_grad_accum, num_generations=a.samples,
        max_completion_length=a.response_len, max_prompt_length=None,
        distillation_mode="full_logits", distillation_alpha=1.0, distillation_is_clip=None, teacher_model_kind="base",
        teacher_prompt_template="{prompt} {privileged_context}", temperature=1.0, top_k=0, top_p=1.0,
        generation_kwargs={"min_new_tokens": a.response_len}, max_steps=a.warmup + a.steps + 1, learning_rate=1e-4,
        lr_scheduler_type="constant", logging_steps=1, report_to="none", use_cpu=a.device == "cpu",
        save_strategy="no", seed=0, bf16=a.dtype == "bfloat16", dataloader_num_workers=0, max_grad_norm=1.0,
        gradient_checkpointing=False)
    trainer = SDFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok,
                          peft_config=LoraConfig(r=a.lora_r, lora_alpha=2.0 * a.lora_r, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"),
                          callbacks=[Timer()])
    trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    rows = a.pairs * a.samples
    wall, cpu = clock.steps(a.warmup)
    return {"step_s": wall, "step_cpu_s": cpu, "tokens": [rows * n for n in lengths[a.warmup:-1]],
            **memory(a, base_rss), "spans": clock.spans()}


def _worker_cmd(name: str, a) -> tuple[list[str], dict, Path]:
    cmd = [sys.executable, __file__, "--worker", name, "--model", str(a.model), "--pairs-file", str(a.pairs_file),
           "--tmp", str(a.tmp), "--steps", str(a.steps), "--warmup", str(a.warmup), "--pairs", str(a.pairs),
           "--samples", str(a.samples), "--response-len", str(a.response_len), "--lora-r", str(a.lora_r),
           "--round", str(a.round), "--threads", str(a.threads or 0), "--cpu-matmul", a.cpu_matmul,
           "--device", a.device, "--dtype", a.dtype, "--kl-chunk", str(a.kl_chunk),
           "--trl-grad-accum", str(a.trl_grad_accum), "--sampler", a.sampler]
    out = Path(a.tmp) / f"{name}-{a.round}.json"
    env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if a.device == "cpu" else {}))  # cpu: no GPU to pick
    return cmd + ["--result", str(out)], env, out


def _result(returncode: int, out: Path, log: str) -> tuple[dict | None, str]:
    if returncode != 0 or not out.exists():
        return None, " | ".join(log.strip().splitlines()[-3:])
    return json.loads(out.read_text()), ""


def run_worker(name: str, a) -> tuple[dict | None, str]:
    """One worker on its own (--interleave rounds)."""
    cmd, env, out = _worker_cmd(name, a)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return _result(done.returncode, out, done.stderr or done.stdout)


def lockstep(names: list[str], a) -> dict[str, tuple[dict | None, str]]:
    """The workers `names` at once, taking turns step by step (--interleave steps): each worker stops at the start of
    every step (`StepClock.tick`), says so with a byte on its pipe to the bench, and goes on when the bench sends
    it a byte; the bench lets one worker run one step at a time, in turn, once every worker has reached its first
    step (the model loads overlap; steps never do). A worker that exits (done or failed) drops out of the turns."""
    procs, go, at_tick, logs = {}, {}, {}, {}
    for name in names:
        to_worker, from_worker = os.pipe(), os.pipe()
        cmd, env, out = _worker_cmd(name, a)
        logs[name] = open(Path(a.tmp) / f"{name}-{a.round}.log", "w+")
        procs[name] = (subprocess.Popen(cmd + ["--baton", f"{to_worker[0]},{from_worker[1]}"], env=env,
                                        pass_fds=(to_worker[0], from_worker[1]), stdout=logs[name],
                                        stderr=subprocess.STDOUT), out)
        os.close(to_worker[0])
        os.close(from_worker[1])
        go[name], at_tick[name] = to_worker[1], from_worker[0]
    alive = [n for n in names if os.read(at_tick[n], 1)]  # every worker at its first step (or gone)
    while alive:
        for name in list(alive):
            os.write(go[name], b".")
            if not os.read(at_tick[name], 1):  # it exited during that step (its last, or a failure)
                alive.remove(name)
    results = {}
    for name in names:
        proc, out = procs[name]
        proc.wait()
        os.close(go[name])
        os.close(at_tick[name])
        logs[name].seek(0)
        results[name] = _result(proc.returncode, out, logs[name].read())
        logs[name].close()
    spans = sorted((t0, t1, name) for name, (r, _) in results.items() if r for t0, t1 in r["spans"])
    overlaps = [(x, y) for x, y in zip(spans, spans[1:]) if y[0] < x[1]]
    if overlaps:  # the turns failed: the two trainers' steps ran at the same time, and their times mean nothing
        raise SystemExit(f"opct_step: round {a.round + 1}: {len(overlaps)} steps of the two trainers overlapped "
                         f"(first: {overlaps[0][0][2]} and {overlaps[0][1][2]})")
    return results


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
    from opct.config import nonneg_arg, positive_arg  # (not at the top: the TRL worker imports nothing of opct)

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a save_pretrained model directory or an opct subject (e.g. "
                   "smollm2); default: the shipped default organism")
    p.add_argument("--rounds", type=positive_arg, default=3,
                   help="alternating rounds (one subprocess per trainer per round)")
    p.add_argument("--steps", type=positive_arg, default=4, help="timed optimizer steps per round")
    p.add_argument("--warmup", type=nonneg_arg, default=1, help="untimed first steps per round")
    p.add_argument("--pairs", type=positive_arg, default=4, help="pairs per step")
    p.add_argument("--samples", type=positive_arg, default=2, help="responses per pair")
    p.add_argument("--response-len", type=positive_arg, default=32)
    p.add_argument("--prompt-words", type=positive_arg, default=24)
    p.add_argument("--fact-words", type=positive_arg, default=24)
    p.add_argument("--lora-r", type=positive_arg, default=16)
    p.add_argument("--threads", type=nonneg_arg, default=0,
                   help="intra-op threads for both trainers (default: torch's)")
    p.add_argument("--cpu-matmul", default="auto", choices=["auto", "onednn", "blas"],
                   help="opct's TrainConfig.cpu_matmul (TRL always runs on torch's default, the BLAS)")
    p.add_argument("--shape", choices=list(SHAPES), default=None,
                   help="build a random-weight model of this architecture and size instead of --model (no download)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where both trainers run")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="compute precision of both (bfloat16: autocast over float32 weights in both)")
    p.add_argument("--kl-chunk", type=nonneg_arg, default=0,
                   help="opct's TrainConfig.kl_chunk (0: the full-vocabulary log-probs at once)")
    p.add_argument("--sampler", default="hf", choices=["hf", "vllm"],
                   help="opct's TrainConfig.sampler (vllm: a vLLM engine in opct's worker; TRL uses generate)")
    p.add_argument("--trl-grad-accum", type=positive_arg, default=1,
                   help="TRL: micro-batches per step (gradient accumulation; generation stays one batch)")
    p.add_argument("--interleave", default="steps", choices=["steps", "rounds"],
                   help="steps: both trainers at once, taking turns step by step (default); rounds: one after the "
                        "other in each round")
    p.add_argument("--worker", choices=["opct", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--baton", default=None, help=argparse.SUPPRESS)
    p.add_argument("--pairs-file", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.worker:
        result = (worker_opct if a.worker == "opct" else worker_trl)(a)
        Path(a.result).write_text(json.dumps(result))
        return 0

    if a.model and a.shape:
        p.error("--model and --shape are alternatives: give one")
    if a.model:
        from opct.errors import OpctError
        from opct.subjects import resolve

        try:
            a.model = resolve(a.model)[0]
        except OpctError as e:
            p.error(f"--model: {e}")
    if (a.pairs * a.samples) % a.trl_grad_accum:  # (>= 1: positive_arg)
        p.error(f"--trl-grad-accum must divide pairs x samples ({a.pairs * a.samples})")
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("opct_step: --device cuda, but torch sees no CUDA GPU here (torch "
              f"{torch.__version__}); run with --device cpu", file=sys.stderr)
        return 2
    set_threads(a)  # the matmul peak below is measured with the same threads
    with tempfile.TemporaryDirectory(prefix="opct-bench-") as tmp:
        a.tmp = tmp
        if a.shape:
            t0 = time.perf_counter()
            a.model = str(shape_model(Path(tmp), a.shape, a.device, a.dtype))
            print(f"built {a.shape} with random weights in {time.perf_counter() - t0:.1f} s", flush=True)
        a.model = str(Path(a.model) if a.model else default_model(Path(tmp)))
        a.pairs_file = str(Path(tmp) / "pairs.jsonl")
        make_pairs(Path(a.model), a.pairs * (a.warmup + a.steps + 1), a.prompt_words, a.fact_words, Path(a.pairs_file))
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        from opct import cpu_matmul
        from opct.pairs.schema import render_ids

        # prompt lengths from the tokenizer, linear parameters from a weightless copy (no 2 GB load for a count)
        tok = AutoTokenizer.from_pretrained(a.model)
        first = json.loads(Path(a.pairs_file).read_text().splitlines()[0])
        s_len, t_len = len(render_ids(tok, first["student"])), len(render_ids(tok, first["teacher"]))
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(a.model))
        n_linear = sum(m.weight.numel() for m in skeleton.modules() if isinstance(m, torch.nn.Linear))
        del skeleton
        where = "" if (a.device, a.dtype) == ("cpu", "float32") else f"; {a.device} {a.dtype}"
        where += f"; opct kl_chunk {a.kl_chunk}" if a.kl_chunk else ""
        where += f"; TRL in {a.trl_grad_accum} micro-batches" if a.trl_grad_accum > 1 else ""
        where += "; opct samples through vLLM" if a.sampler == "vllm" else ""
        print(f"model {a.model} ({n_linear / 1e6:.2f}M linear params); {torch.get_num_threads()} threads; "
              f"{a.pairs} pairs x {a.samples} samples x {a.response_len} response tokens per step; "
              f"prompt {s_len} tokens (teacher {t_len}); LoRA r={a.lora_r}; opct cpu_matmul {a.cpu_matmul}"
              f"{f' ({cpu_matmul.resolve(a.cpu_matmul)} on this CPU)' if a.cpu_matmul == 'auto' else ''}{where}",
              flush=True)
        peak_n = 8192 if a.device == "cuda" else 1024
        peak = matmul_peak(n=peak_n, backend=a.cpu_matmul, device=a.device, dtype=a.dtype)
        if a.device == "cuda":
            torch.cuda.empty_cache()  # the workers are other processes: leave them the GPU's memory
        results: dict[str, dict] = {}
        round_ratios: list[float] = []
        for a.round in range(a.rounds):
            this_round: dict[str, dict] = {}
            names = [n for n in ("opct", "trl") if not (n in results and results[n] is None)]
            together = lockstep(names, a) if a.interleave == "steps" else {}
            for name in names:
                r, why = together[name] if together else run_worker(name, a)
                if r is None:
                    hint = ""
                    if name == "trl" and "No module named" in why:
                        hint = (" (TRL is not an opct dependency: `pip install trl` to compare; on a machine without "
                                "a package index, carry the wheels bench/trl_wheels.sh downloads, as section 6 of "
                                "bench/gpu_check.sh does)")
                    print(f"{name}: could not run here{hint}: {why}", flush=True)
                    results[name] = None
                    continue
                acc = results.setdefault(name, {"step_s": [], "step_cpu_s": [], "tokens": [], "peak_rss_mb": [],
                                                "base_rss_mb": [], "cuda_peak_mb": [], "parts": {}})
                for k, v in r.get("parts", {}).items():
                    acc["parts"].setdefault(k, []).extend(v)
                for k in ("step_s", "step_cpu_s", "tokens"):
                    acc[k] += r[k]
                acc["peak_rss_mb"].append(r["peak_rss_mb"])
                acc["base_rss_mb"].append(r["base_rss_mb"])
                if r["cuda_peak_mb"] is not None:
                    acc["cuda_peak_mb"].append(r["cuda_peak_mb"])
                this_round[name] = r
                line = (f"  round {a.round + 1} {name:<5} s/step " + " ".join(f"{x:.3f}" for x in r["step_s"])
                        + "  cpu s/step " + " ".join(f"{x:.3f}" for x in r["step_cpu_s"]))
                if a.device == "cuda":  # printed now, in case a later worker does not finish in the caller's time
                    line += (f"  tokens/s {statistics.median(r['tokens']) / statistics.median(r['step_s']):.0f}"
                             f"  peak CUDA {r['cuda_peak_mb']:.0f} MB, RSS {r['peak_rss_mb']:.0f} MB")
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

    cuda = a.device == "cuda"
    print(f"medians over {a.rounds} rounds x {a.steps} steps; peak RSS"
          f"{' and peak CUDA memory (max_memory_allocated)' if cuda else ''}: the largest of the rounds")
    print(f"{'trainer':<18}{'s/step':>8}{'tokens/s':>10}{'cpu s/step':>12}{'tokens/cpu-s':>14}{'resp len':>10}"
          f"{'RSS after imports':>19}{'peak RSS':>11}" + (f"{'peak CUDA':>13}" if cuda else ""))
    for name, label in (("opct", "opct (full)"), ("trl", "TRL SDFTTrainer")):
        r = results.get(name)
        if r:
            tps, sps, tpc, cps = summary(r)
            resp = statistics.median(r["tokens"]) / (a.pairs * a.samples)
            print(f"{label:<18}{sps:>8.3f}{tps:>10.1f}{cps:>12.3f}{tpc:>14.1f}{resp:>10.1f}"
                  f"{max(r['base_rss_mb']):>16.0f} MB{max(r['peak_rss_mb']):>8.0f} MB"
                  + (f"{max(r['cuda_peak_mb']):>10.0f} MB" if cuda else ""))
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
              f"{'bf16' if a.dtype == 'bfloat16' else 'fp32'} matmul peak here "
              f"({'cuda' if cuda else a.cpu_matmul if a.dtype == 'float32' else 'torch'}, {peak_n}^3) "
              f"{peak / 1e9:.1f} GFLOP/s -> "
              f"{100 * achieved / peak:.1f}% of peak")
    return 0


if __name__ == "__main__":
    sys.exit(main())
