"""Making organisms: full-fine-tuning SFT through the shared training loop, cached by what went in.

  sft_on            SFT on (messages, response) examples (`--method sft --targets`, full fine-tuning)
  derive_organism   an organism = its base fine-tuned on its split's derivation data (per seed)
  protected_base    the alignment-SFT stage: the base organism fine-tuned on wrong suggestions answered honestly
                    (opct/audit/organisms/sycophantic.py `alignment_data`), the audit's stand-in for an instruction-
                    tuned model in the paper's RLHF-protection finding

Each result is cached under the audit's OUT/organisms/<name>-<hash>, the hash covering the base weights, the
training settings and the examples themselves, so a grid reuses it and a change to any of them makes a new one.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from opct.pairs.schema import Pair


@dataclass
class DeriveConfig:
    examples: int = 600
    steps: int = 100
    batch_size: int = 16
    lr: float = 3e-4


def probe_pairs(examples: list[dict], family: str) -> list[Pair]:
    """Examples as pairs whose teacher and student prompts are the same (what `sft --targets` trains on)."""
    return [Pair(id=f"x{i}", axis="custom", task="invariance", teacher=ex["messages"], student=ex["messages"],
                 meta={"family": family, "split": "train"}) for i, ex in enumerate(examples)]


def sft_on(model_dir, examples: list[dict], out: Path, family: str, steps: int, batch_size: int, lr: float,
           seed: int, max_new_tokens: int = 48) -> Path:
    """Full fine-tuning with the shared training loop (`--method sft --targets`); returns the run's final/ model."""
    from opct.pairs.schema import save_pairs, write_jsonl_atomic
    from opct.train.config import TrainConfig
    from opct.train.loop import train

    out.mkdir(parents=True, exist_ok=True)
    pairs = probe_pairs(examples, family)
    save_pairs(pairs, out / "data_pairs.jsonl")
    write_jsonl_atomic(out / "data_targets.jsonl",
                       ({"id": p.id, "response": ex["response"]} for p, ex in zip(pairs, examples)))
    cfg = TrainConfig(method="sft", model=str(model_dir), pairs=str(out / "data_pairs.jsonl"), out=str(out / "run"),
                      targets=str(out / "data_targets.jsonl"), lora=False, max_steps=steps, batch_size=batch_size,
                      lr=lr, seed=seed, save_every=steps, keep_checkpoints=1, tensorboard=False,
                      max_new_tokens=max_new_tokens)
    return train(cfg) / "final"


def _weights_key(model_dir: Path) -> str:
    weights = model_dir / "model.safetensors"
    return hashlib.sha256(weights.read_bytes()).hexdigest()[:12] if weights.exists() else str(model_dir)


def cached_sft(name: str, base_dir, examples: list[dict], cache_root: Path, cfg: DeriveConfig, seed: int,
               info: dict) -> Path:
    """`base_dir` fine-tuned on `examples`, cached under cache_root/<name>-<hash of base, settings, examples>."""
    base_dir = Path(base_dir).resolve()
    key = hashlib.sha256(json.dumps({"name": name, "base": _weights_key(base_dir), "cfg": asdict(cfg), "seed": seed,
                                     "examples": [[e["messages"], e["response"]] for e in examples], "v": 2},
                                    sort_keys=True).encode()).hexdigest()[:12]
    final = cache_root / f"{name}-{key}"
    if (final / "config.json").exists():
        return final
    work = cache_root / f".{name}-{key}.work"
    if work.exists():
        shutil.rmtree(work)
    model = sft_on(base_dir, examples, work, name, cfg.steps, cfg.batch_size, cfg.lr, seed)
    shutil.copytree(model, work / "model")
    (work / "model" / "derivation.json").write_text(json.dumps({"organism": name, "base": str(base_dir), "seed": seed,
                                                                 "config": asdict(cfg), **info}, indent=1))
    (work / "model").rename(final)
    shutil.rmtree(work)
    return final


def protected_base(base_dir, cache_root: Path, cfg: DeriveConfig, steps: int) -> Path:
    """The base organism after the alignment-SFT stage (built once, seed 0)."""
    from opct.audit.splits import alignment_examples

    return cached_sft("protected_base", base_dir, alignment_examples(cfg.examples), cache_root,
                      DeriveConfig(cfg.examples, steps, cfg.batch_size, cfg.lr), 0, {"stage": "alignment SFT"})


def derive_organism(name: str, base_dir, derive_examples: list[dict], cache_root: Path, cfg: DeriveConfig,
                    seed: int) -> Path:
    """The organism `name` of one seed: `base_dir` fine-tuned on its derive split (`derive_examples`, without the
    protected base's alignment data, which is already in `base_dir`)."""
    return cached_sft(name, base_dir, derive_examples, cache_root, cfg, seed, {"examples": len(derive_examples)})
