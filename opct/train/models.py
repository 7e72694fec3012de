"""The models a training run holds: the student (a LoRA adapter over the loaded model, or the model itself under full
fine-tuning) and the frozen teacher it is compared with (the starting model, or `--teacher-model`)."""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch

from opct.errors import OpctError, first_line
from opct.modeldir import check_finite_weights
from opct.policy import HFPolicy, load_policy
from opct.train.config import TrainConfig
from opct.train.guards import _is_target, check_lora_rank, lora_targets


def _disable_dropout(model) -> None:
    # The loss is defined on the distribution the student samples from (eval mode); dropout in the training forward
    # would train a different one. Zeroing it also lets the model stay in train mode for gradient checkpointing.
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0


def config_model(model) -> str:
    return str(getattr(getattr(model, "config", None), "_name_or_path", "") or "the model")


def _continue_adapter(model, path):
    """The model under the trainable LoRA adapter saved in `path` (safetensors only, checked like any model file)."""
    from peft import PeftModel

    from opct.modeldir import adapter_load_problem, check_adapter, check_adapter_loaded

    check_adapter(path)
    try:
        student = PeftModel.from_pretrained(model, path, is_trainable=True)
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as e:
        raise OpctError(f"{path}: cannot continue this adapter on {config_model(model)} "
                        f"({adapter_load_problem(e)})") from None
    check_adapter_loaded(student, path)  # peft leaves a missing tensor at its initial value with a warning
    check_finite_weights(student, config_model(model), adapter=path)  # not load_policy's: it was loaded here
    _disable_dropout(student)
    return student


def _check_same_lora(student, config: TrainConfig) -> None:
    """The continued adapter's rank, alpha and targets are the run's, and it trains without dropout: --lora-r /
    --lora-alpha (found 2026-12-07), --lora-targets and --lora-dropout (that evening) other than the adapter's were
    ignored while the run's config.json recorded them."""
    from opct.activations import unwrap

    saved = student.peft_config["default"]
    for flag, field, theirs in (("--lora-r", "lora_r", saved.r), ("--lora-alpha", "lora_alpha", saved.lora_alpha)):
        if float(getattr(config, field)) != float(theirs):
            raise OpctError(f"{flag} {getattr(config, field):g}: the adapter of --init-adapter {config.init_adapter} "
                            f"has {field} {theirs:g}, which continuing it keeps; give {flag} {theirs:g} (the run "
                            f"records it)")
    lm = unwrap(student)
    adapted = {n for n, m in lm.named_modules() if "default" in getattr(m, "lora_A", {})}
    others = {n for n, m in lm.named_modules() if type(m) is torch.nn.Linear and m is not lm.get_output_embeddings()
              and not any(n.startswith(a + ".") for a in adapted)}  # linear layers the adapter leaves alone
    names = sorted({n.rsplit(".", 1)[-1] for n in adapted})
    asked = [t.strip() for t in config.lora_targets.split(",") if t.strip()]
    if {n for n in adapted | others if asked == ["all-linear"] or any(_is_target(n, t) for t in asked)} != adapted:
        raise OpctError(f"--lora-targets {config.lora_targets}: the adapter of --init-adapter {config.init_adapter} "
                        f"adapts {', '.join(names)}, which continuing it keeps; give --lora-targets {','.join(names)} "
                        "(the run records it)")
    if config.lora_dropout:
        raise OpctError(f"--lora-dropout {config.lora_dropout:g}: an adapter continued from --init-adapter trains "
                        "without dropout; leave --lora-dropout out (the run records it)")


def student_and_teacher(model, config: TrainConfig):
    """Return (student, teacher) where `teacher()` is a context manager yielding the frozen starting model.

    LoRA: the teacher is the same model with adapters disabled (no second copy). Full fine-tuning: a frozen deep
    copy of the starting weights, taken in memory (never reloaded from a path).
    """
    _disable_dropout(model)
    if config.lora:
        from peft import LoraConfig, get_peft_model

        if config.init_adapter:  # e.g. SFT+OPCT: continue an SFT adapter; the teacher is still the starting model
            student = _continue_adapter(model, config.init_adapter)
            _check_same_lora(student, config)
        else:
            targets = lora_targets(model, config.lora_targets)
            check_lora_rank(model, targets, config.lora_r)
            student = get_peft_model(model, LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha,
                                                       lora_dropout=config.lora_dropout, target_modules=targets,
                                                       task_type="CAUSAL_LM"))

        from peft.tuners.tuners_utils import BaseTunerLayer

        # What `student.disable_adapter()` does for LoRA (every tuner layer's `enable_adapters(False)`, then True),
        # over a list of those layers taken once: peft's context manager walks the whole model and checks its adapter
        # status on every call, which costs as much as the teacher's forward pass on a small model.
        tuner_layers = [m for m in student.modules() if isinstance(m, BaseTunerLayer)]

        @contextmanager
        def teacher():
            with torch.no_grad():
                for m in tuner_layers:
                    m.enable_adapters(False)
                try:
                    yield student
                finally:
                    for m in tuner_layers:
                        m.enable_adapters(True)
        return student, teacher

    frozen = copy.deepcopy(model).requires_grad_(False).eval()

    @contextmanager
    def teacher():
        with torch.no_grad():
            yield frozen
    return model, teacher


def separate_teacher(policy: HFPolicy, config: TrainConfig, device):
    """`teacher()` over another frozen model (`--teacher-model`, e.g. a backdoored teacher), loaded from its
    save_pretrained directory; its tokenizer must be the student's (the same vocabulary, token for token), since
    both score the same token ids."""
    from opct.subjects import resolve

    teacher_dir = config.teacher_model
    other = load_policy(resolve(teacher_dir, "--teacher-model")[0], device=device,
                        trust_remote_code=config.trust_remote_code, progress=config.progress)
    if other.tokenizer.get_vocab() != policy.tokenizer.get_vocab():
        raise OpctError(f"{teacher_dir}: --teacher-model has another tokenizer than the student ({policy.name}); "
                        f"both must score the same token ids")
    frozen = other.model.requires_grad_(False).eval()
    _disable_dropout(frozen)

    @contextmanager
    def teacher():
        with torch.no_grad():
            yield frozen
    return teacher
