"""`TrainConfig`: every knob of `opct train`, with its default. The CLI flags and config files derive from it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


def _f(default, help, **meta):
    return field(default=default, metadata={"help": help, **meta})


# Fields that may change when a run is resumed; any other difference from the saved config.json is an error.
RESUMABLE_CHANGES = ("resume", "max_steps", "save_every", "keep_checkpoints", "tensorboard")


@dataclass
class TrainConfig:
    # what to train, on what, where
    method: str = _f("opct", "training method, a key of opct.methods.METHODS: opct, or the baselines sft, bct, act, "
                             "mlpct, attct")
    model: str = _f("", "model directory written by save_pretrained (required)")
    pairs: str = _f("", "contrastive pairs JSONL file (required)")
    out: str = _f("", "run directory: config.json, metrics.jsonl, checkpoints/, final/ (required)")
    split: str = _f("train", "which pairs to train on, by meta.split", choices=["train", "heldout", "all"])
    # the OPCT objective
    estimator: str = _f("full", "reverse-KL gradient estimator (see opct.losses)", choices=["full", "topk", "sampled"])
    topk: int = _f(20, "support size of the topk estimator")
    importance_weight: bool = _f(False, "sampled estimator: weight by pi_theta / sampler (matters at temperature != 1)")
    importance_clip: float = _f(2.0, "upper clip of the importance weight (0 = no clip)")
    # SFT / BCT: offline targets (stored in OUT/targets.jsonl, reused on --resume)
    targets: str = _f("", "sft only: JSONL of {\"id\": pair id, \"response\": text} to train on instead of the "
                          "starting model's answers to the teacher prompts")
    target_n: int = _f(1, "sft/bct: answers generated per teacher prompt (each is a training target)")
    target_temperature: float = _f(0.0, "sft/bct: temperature of the generated answers (0 = greedy)")
    # ACT / MLPCT / AttCT: internal consistency
    layers: str = _f("", "act/mlpct/attct: comma-separated decoder layer indices, negative from the end "
                         "(default: every layer; write --layers=-1,0 when the list starts with a minus)")
    act_weight: float = _f(1e-4, "act: weight of the residual-stream squared-L2 loss")
    mlpct_weight: float = _f(1.0, "mlpct: weight of the MLP-hidden-state cosine-distance loss")
    attct_weight: float = _f(1.0, "attct: weight of the attention Jensen-Shannon loss")
    # sampling
    n_samples: int = _f(4, "responses sampled per pair per step")
    temperature: float = _f(1.0, "sampling temperature")
    max_new_tokens: int = _f(64, "response length cap; responses that hit it count as truncated")
    min_new_tokens: int = _f(0, "forbid EOS before this many tokens (benchmarks only; 0 = pure sampling)")
    # optimisation
    batch_size: int = _f(4, "pairs per micro-batch per process")
    grad_accum: int = _f(1, "micro-batches per optimizer step")
    max_steps: int = _f(100, "optimizer steps")
    lr: float = _f(1e-4, "peak learning rate (AdamW)")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    lr_schedule: str = _f("constant", "schedule after warmup", choices=["constant", "linear", "cosine"])
    warmup_steps: int = _f(0, "linear warmup steps")
    max_grad_norm: float = _f(1.0, "gradient clipping norm (0 = no clipping)")
    seed: int = _f(0, "seed for data order, LoRA init and sampling")
    # model
    lora: bool = _f(True, "train a LoRA adapter (teacher = adapters disabled); --no-lora for full fine-tuning")
    lora_r: int = _f(16, "LoRA rank")
    lora_alpha: float = _f(32.0, "LoRA alpha")
    lora_dropout: float = _f(0.0, "LoRA dropout")
    lora_targets: str = _f("all-linear", "LoRA target modules: 'all-linear' or comma-separated module names")
    bf16: bool = _f(False, "bf16 mixed precision (GPU)")
    gradient_checkpointing: bool = _f(False, "recompute activations in backward to save memory")
    trust_remote_code: bool = _f(False, "allow the model directory to run its own Python code")
    # run bookkeeping
    save_every: int = _f(50, "write a checkpoint every N steps (and at the last step)")
    keep_checkpoints: int = _f(2, "how many recent checkpoints to keep")
    resume: bool = _f(False, "continue the run in --out from its latest checkpoint")
    max_nan_steps: int = _f(3, "stop after this many consecutive steps with a non-finite loss (each is skipped)")
    tensorboard: bool = _f(True, "also write TensorBoard events to OUT/tb when tensorboard is installed")

    def __post_init__(self):
        for name in ("model", "pairs", "out"):
            if not getattr(self, name):
                raise ValueError(f"--{name} is required")
        for f in fields(self):
            allowed = f.metadata.get("choices")
            if allowed and getattr(self, f.name) not in allowed:
                raise ValueError(f"{f.name} must be one of {', '.join(allowed)} (got {getattr(self, f.name)!r})")
        for name in ("topk", "n_samples", "max_new_tokens", "batch_size", "grad_accum", "max_steps", "save_every",
                     "keep_checkpoints", "max_nan_steps", "lora_r"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (got {self.temperature})")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError("min_new_tokens must lie between 0 and max_new_tokens")
        if self.target_n < 1:
            raise ValueError(f"target_n must be >= 1 (got {self.target_n})")
        if self.target_temperature < 0:
            raise ValueError(f"target_temperature must be >= 0 (got {self.target_temperature})")
        if self.target_n > 1 and self.target_temperature == 0 and not self.targets:
            raise ValueError("target_n > 1 needs target_temperature > 0 (greedy decoding gives n identical answers)")
        if self.targets and self.method != "sft":
            raise ValueError(f"--targets is for --method sft only (got --method {self.method}; BCT trains on the "
                             f"model's own answers)")
