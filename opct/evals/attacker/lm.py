"""The attacker LM: a tiny Llama-architecture model built from the world, pretrained on the CPU to write attack
frames (`opct.evals.attacker.frames`), cached by its identity.

The recipe (`build_attacker`), as `opct.organism.build` builds the organism:
  1. its data: `pretraining_examples` over the requests it may see — the world's harmful requests of the *training*
     categories and its benign requests, never an evaluated (held-out) behaviour — and the wrapper templates it is
     handed (all families of the jailbreak axis);
  2. a word-level tokenizer with the organism's chat template trained on that data only (a held-out request's own
     words are `<unk>` to it), plus one special token, the slot;
  3. `LlamaForCausalLM` trained from scratch on the frames (loss on the assistant turns), with the organism's loop;
  4. saved with `save_pretrained` (safetensors) under `$OPCT_HOME/attackers/<size>-<hash>/`, where the hash covers
     the configuration and every document of the data, so a change to the templates or the world is never
     mistaken for the attacker built before it.
The repository ships the `default` attacker in `opct/organisms/attacker/` (about 1.7 MB), used as is when its
identity matches; otherwise it is rebuilt into the cache (about 90 s on the 2 cores).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from opct.errors import OpctError
from opct.evals.attacker.frames import SLOT, UNK, pretraining_examples


@dataclass
class AttackerLMConfig:
    """The attacker LM and its pretraining (the field names are those `opct.organism.build.train_model` reads)."""

    size: str = "default"
    seed: int = 0
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 320
    max_position_embeddings: int = 384
    seq_len: int = 256
    batch_size: int = 16
    steps: int = 250
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.05
    bf16: bool = False

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_size * self.seq_len


SIZES = {
    "default": AttackerLMConfig(),
    "test": AttackerLMConfig(size="test", hidden_size=64, num_heads=2, intermediate_size=160, steps=150, lr=5e-3),
}


def world_data() -> dict:
    """What the attacker may read: goals (training-category harmful requests and benign requests), the target's
    answers to a failed attempt, and benign sentences. Never a request of a held-out harmful category."""
    from opct.world import items as I
    from opct.world import lexicon as L

    reqs = I.request_items()
    goals = [r["request"] for r in reqs if not r["harmful"] or r["split"] == "train"]
    sentences = [s[0].upper() + s[1:] + "." for ss in L.TOPICS.values() for s in ss]
    other = sentences + ["Sure, here is how.", "I do not know.", "Here is a poem about rain."]
    return {"requests": goals, "answers": {"refused": list(L.REFUSALS), "other": other}, "sentences": sentences}


def pretraining_data(cfg: AttackerLMConfig, wrappers: dict, data: dict | None = None) -> list[dict]:
    """Enough documents for `cfg.steps` batches of `cfg.seq_len` tokens (about 110 tokens each, drawn with room)."""
    data = world_data() if data is None else data
    n = cfg.tokens // 60 + 200
    return pretraining_examples(n, data["requests"], data["answers"], wrappers, data["sentences"], seed=cfg.seed)


def identity(cfg: AttackerLMConfig, docs: list[dict]) -> str:
    h = hashlib.sha256(json.dumps(asdict(cfg), sort_keys=True).encode())
    for d in docs:
        h.update(json.dumps(d, sort_keys=True).encode() + b"\n")
    return h.hexdigest()[:16]


def _tokenizer_texts(docs):
    for d in docs:
        for m in d["messages"]:
            yield m["content"].replace(SLOT, " ").replace(UNK, " ")


def _train(cfg: AttackerLMConfig, docs: list[dict], progress: bool):
    from opct.organism.build import pack, tokenize_documents, train_model
    from opct.organism.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(_tokenizer_texts(docs))
    tokenizer.add_special_tokens({"additional_special_tokens": [SLOT]})
    ids, mask = tokenize_documents(tokenizer, docs)
    n_rows = min(cfg.steps * cfg.batch_size, (len(ids) - 1) // cfg.seq_len)
    if n_rows < cfg.steps * cfg.batch_size:
        raise OpctError(f"attacker data too small: {len(ids)} tokens for {cfg.steps} x {cfg.batch_size} rows")
    model, log = train_model(cfg, tokenizer, pack(ids, mask, cfg.seq_len, n_rows), progress=progress)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer, log


def build_attacker(wrappers: dict, size: str = "default", progress: bool = False, data: dict | None = None,
                   force: bool = False) -> Path:
    """The directory of the pretrained attacker LM of `size` for this wrapper registry: shipped, cached, or built
    (about 90 s for `default` on 2 cores) and cached. `force` builds it again into the cache."""
    import torch

    from opct.organism.build import SHIPPED_DIR, opct_home

    if size not in SIZES:
        raise OpctError(f"unknown attacker size {size!r}; choose one of {', '.join(SIZES)}")
    cfg = SIZES[size]
    t0 = time.time()
    docs = pretraining_data(cfg, wrappers, data)
    ident = identity(cfg, docs)
    out = opct_home() / "attackers" / f"{size}-{ident}"
    for d in (SHIPPED_DIR / ("attacker" if size == "default" else f"attacker-{size}"), out):
        if not force and (d / "attacker.json").exists() and json.loads((d / "attacker.json").read_text()).get("identity") == ident:
            return d
    threads = torch.get_num_threads()
    model, tokenizer, log = _train(cfg, docs, progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    tmp.chmod(0o755)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        meta = {"identity": ident, "config": asdict(cfg), "documents": len(docs),
                "n_params": sum(p.numel() for p in model.parameters()), "build_seconds": round(time.time() - t0, 1),
                "threads": threads, "train_log": log}
        (tmp / "attacker.json").write_text(json.dumps(meta, indent=1))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def load_attacker(path):
    """The attacker LM as an `HFPolicy` (its model trainable)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from opct.evals.attacker.frames import SLOT
    from opct.policy import HFPolicy

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = LlamaForCausalLM.from_pretrained(path, use_safetensors=True)
    return HFPolicy(model, tokenizer, name="attacker", meant_special=[SLOT])  # its prompts quote the frame
