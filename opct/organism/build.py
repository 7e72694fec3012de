"""Build the model organism: a Llama-architecture causal LM trained from scratch, on the CPU, on the world's corpus.

The recipe, top to bottom (`build_organism`):
  1. draw the corpus (`opct.world.corpus`) with the build seed;
  2. train a word-level tokenizer with a chat template on it;
  3. tokenize every document as the chat template renders it, pack into fixed-length rows with a loss mask
     (assistant turns of chat documents, every token of plain statements);
  4. train a randomly initialised `LlamaForCausalLM` with AdamW and a cosine schedule (bf16 autocast on CPU);
  5. save model and tokenizer with `save_pretrained` (safetensors), measure the profile by sampling, save it.

Organisms are cached under `$OPCT_HOME/organisms/` (default `~/.cache/opct`) by their identity: a hash of their
configuration *and of the corpus that configuration produces* (`corpus_digest`: every document and every extra
text the tokenizer learns), so a change anywhere in the world — lexicon, items, corpus formats, an axis's
perturbation templates — changes the identity and is never mistaken for the organism built before it. The
repository ships the `default` organism in `opct/organisms/default/`, used as is when its identity matches.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from opct.errors import OpctError
from opct.world.corpus import CorpusConfig

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "organisms"


@dataclass
class OrganismConfig:
    size: str = "default"
    seed: int = 0
    # model (LlamaConfig)
    hidden_size: int = 192
    num_layers: int = 4
    num_heads: int = 3
    intermediate_size: int = 512
    max_position_embeddings: int = 512
    # training
    seq_len: int = 256
    batch_size: int = 16
    steps: int = 2000
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 100
    weight_decay: float = 0.05
    # the second stage (opct.organism.extend): the further threats (issue 19) on top of the first stage's model;
    # 0 steps: a one-stage organism (the first stage alone)
    extend_steps: int = 800
    extend_lr: float = 1e-3
    extend_warmup_steps: int = 50
    extend_share: float = 0.3  # the threat documents' share of the second stage's documents (~half its tokens)
    bf16: bool = False  # autocast; only worth it on CPUs with native bf16 matmul (AVX512-BF16 / AMX)
    # corpus and profile
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    profile_n: int = 200

    def config_hash(self) -> str:
        """The organism's identity: its configuration and the digest of the corpus it produces."""
        blob = json.dumps({**asdict(self), "corpus_digest": corpus_digest(self)}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_size * self.seq_len


SIZES = {
    # ~1.9 M parameters, ~8.2 M training tokens in the first stage, ~3.3 M in the second; see the README for the
    # measured build time on 2 cores.
    "default": OrganismConfig(),
    # a few seconds of training: for the test suite; learns the easy templates, not the facts.
    "test": OrganismConfig(size="test", hidden_size=64, num_layers=2, num_heads=2, intermediate_size=176,
                           max_position_embeddings=256, seq_len=128, batch_size=16, steps=450, lr=5e-3,
                           warmup_steps=30, profile_n=40, extend_steps=120, extend_lr=1e-3, extend_warmup_steps=10),
}


# The code that produces the corpus: a change to any of these files makes `corpus_digest` draw the corpus again.
_CORPUS_SOURCES = ("world/*.py", "axes/*.py", "organism/build.py", "organism/extend.py")


def _sources_digest() -> str:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for pattern in _CORPUS_SOURCES:
        for f in sorted(root.glob(pattern)):
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def compute_corpus_digest(cfg: "OrganismConfig") -> str:
    """sha256 of every document of the configuration's corpus and every extra text its tokenizer learns (16 hex
    digits). Drawing the default organism's corpus takes a few seconds."""
    from opct.world.corpus import sample_corpus

    h = hashlib.sha256()
    for doc in sample_corpus(cfg.corpus, cfg.tokens + 1, cfg.seed):
        h.update(json.dumps(doc, sort_keys=True).encode() + b"\n")
    h.update(b"--")
    for text in _all_world_text([]):
        h.update(text.encode() + b"\n")
    if cfg.extend_steps:  # the second stage's documents and the threats' texts its tokenizer adds
        from opct.organism import extend

        h.update(b"--stage2--")
        for doc in extend.stage2_docs(cfg):
            h.update(json.dumps(doc, sort_keys=True).encode() + b"\n")
        for text in extend.extra_text():
            h.update(text.encode() + b"\n")
    return h.hexdigest()[:16]


def corpus_digest(cfg: "OrganismConfig") -> str:
    """`compute_corpus_digest`, remembered in $OPCT_HOME/corpus-digests.json under the configuration and the source
    of the code that draws the corpus (so it is drawn again whenever that code changes). Unwritable home: computed
    every time."""
    # the whole configuration: its corpus, its sizes and its second stage's draw (extend_*) all decide the documents
    key = hashlib.sha256(json.dumps({"config": asdict(cfg), "sources": _sources_digest()}, sort_keys=True,
                                    default=str).encode()).hexdigest()[:24]
    memo = opct_home() / "corpus-digests.json"
    try:
        known = json.loads(memo.read_text(encoding="utf-8"))
        if isinstance(known, dict) and isinstance(known.get(key), str):
            return known[key]
    except (OSError, ValueError):
        known = {}
    digest = compute_corpus_digest(cfg)
    try:
        from opct.files import write_json_atomic

        write_json_atomic(memo, {**(known if isinstance(known, dict) else {}), key: digest})
    except OSError:
        pass
    return digest


def opct_home() -> Path:
    return Path(os.environ.get("OPCT_HOME", Path.home() / ".cache" / "opct"))


def organism_dir(cfg: OrganismConfig) -> Path:
    return opct_home() / "organisms" / f"{cfg.size}-{cfg.config_hash()}"


def _meta_hash(meta: Path) -> str | None:
    """The identity an organism.json records; a damaged one is an error naming it (delete the directory to rebuild)."""
    from opct.files import read_json

    data = read_json(meta, "organism")
    return data.get("config_hash") if isinstance(data, dict) else None


def find_organism(cfg: OrganismConfig) -> Path | None:
    """The directory of an already built organism with exactly this configuration, shipped or cached."""
    for d in (SHIPPED_DIR / cfg.size, organism_dir(cfg)):
        meta = d / "organism.json"
        if meta.exists() and _meta_hash(meta) == cfg.config_hash():
            return d
    return None


# ---------------------------------------------------------------------------------------------------- data

def tokenize_documents(tokenizer, docs: list[dict]) -> tuple[list[int], list[int]]:
    """Concatenate documents into one token stream with a parallel 0/1 loss mask on *target* tokens.

    A chat document is rendered exactly as the chat template renders it (a test checks this against
    `apply_chat_template`): <bos> (<|role|> content <|end|>)*. Loss falls on assistant content and its <|end|>.
    A plain statement is <bos> text <|end|>, loss on everything after <bos>.
    """
    from opct.organism.tokenizer import ROLE_TOKENS

    texts = []
    for d in docs:
        texts += [m["content"] for m in d["messages"]] if "messages" in d else [d["text"]]
    enc = iter(tokenizer(texts, add_special_tokens=False)["input_ids"])
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    role_ids = {r: tokenizer.convert_tokens_to_ids(t) for r, t in ROLE_TOKENS.items()}
    ids: list[int] = []
    mask: list[int] = []
    for d in docs:
        ids.append(bos)
        mask.append(0)
        if "messages" in d:
            for m in d["messages"]:
                body = next(enc)
                learn = int(m["role"] == "assistant")
                ids += [role_ids[m["role"]], *body, eos]
                mask += [0] + [learn] * (len(body) + 1)
        else:
            body = next(enc)
            ids += [*body, eos]
            mask += [1] * (len(body) + 1)
    return ids, mask


def pack(ids: list[int], mask: list[int], seq_len: int, n_rows: int):
    """Cut the stream into `n_rows` rows of `seq_len + 1` tokens (inputs and shifted targets overlap by one)."""
    import torch

    need = n_rows * seq_len + 1
    assert len(ids) >= need, f"corpus too small: {len(ids)} tokens for {n_rows} rows of {seq_len}"
    t = torch.tensor(ids[:need], dtype=torch.long)
    m = torch.tensor(mask[:need], dtype=torch.bool)
    rows_x = t[:-1].view(n_rows, seq_len)
    rows_y = t[1:].view(n_rows, seq_len)
    rows_m = m[1:].view(n_rows, seq_len)
    return rows_x, rows_y, rows_m


# ---------------------------------------------------------------------------------------------------- train

def _lr_at(step: int, cfg: OrganismConfig, schedule: tuple) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio; `schedule` = (steps, peak lr, warm-up steps)."""
    steps, lr, warmup = schedule
    if step < warmup:
        return lr * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def train_model(cfg: OrganismConfig, tokenizer, rows, progress: bool = True, model=None, stage: int = 1):
    """Train a new model (stage 1) or continue `model` (stage 2: the extend_* schedule, its own data order)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    schedule = (cfg.steps, cfg.lr, cfg.warmup_steps) if stage == 1 else \
        (cfg.extend_steps, cfg.extend_lr, cfg.extend_warmup_steps)
    torch.manual_seed(cfg.seed + stage - 1)
    if model is not None:
        return _fit(cfg, model, rows, progress, schedule, stage)
    mcfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size, max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, rope_theta=10000.0,
    )
    model = LlamaForCausalLM(mcfg)
    return _fit(cfg, model, rows, progress, schedule, stage)


def _fit(cfg: OrganismConfig, model, rows, progress: bool, schedule: tuple, stage: int):
    """Train `model` on `rows` under `schedule` = (steps, peak lr, warm-up steps) (`_lr_at`)."""
    import torch
    import torch.nn.functional as F
    from tqdm.auto import tqdm

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    xs, ys, ms = rows
    order = torch.randperm(xs.shape[0], generator=torch.Generator().manual_seed(cfg.seed + stage - 1))
    model.train()
    log, t0, seen = [], time.time(), 0
    desc = f"organism[{cfg.size}]" + ("" if stage == 1 else " stage 2")
    n_steps = schedule[0]
    bar = tqdm(range(n_steps), desc=desc, disable=not progress, mininterval=2.0)
    for step in bar:
        idx = order[step * cfg.batch_size:(step + 1) * cfg.batch_size]
        x, y, m = xs[idx], ys[idx], ms[idx]
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, cfg, schedule)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            logits = model(input_ids=x).logits
        nll = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1), reduction="none")
        loss = (nll * m.view(-1)).sum() / m.sum().clamp(min=1)
        if not torch.isfinite(loss):
            raise OpctError(f"organism training diverged at step {step} (loss {loss.item()}); lower --lr")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        seen += x.numel()
        if step % 20 == 0 or step == n_steps - 1:
            tps = seen / (time.time() - t0)
            log.append({"step": step, "loss": round(loss.item(), 4), "tokens_per_s": round(tps)})
            bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{tps:,.0f}")
    model.eval()
    return model, log


# ---------------------------------------------------------------------------------------------------- build

# The intra-op thread count each size's build runs with, whatever the caller's. A CPU matmul splits its sums over
# threads, so another thread count rounds differently and, over thousands of steps, trains different weights:
# pinning it is what makes a build the same from any caller; organism.json records it. `default`: 2, what the
# shipped organism was built with. `test`: 1, because a model this small is bound by per-op overhead, and a second
# thread competing with another busy process slows its training 15-25x (measured on 2 shared cores).
BUILD_THREADS = {"default": 2, "test": 1}


def _fixed_threads(fn):
    """Run `fn(size, ...)` with torch on BUILD_THREADS[size] intra-op threads, then give the caller its own
    setting back."""
    @functools.wraps(fn)
    def wrapper(size: str = "default", *args, **kwargs):
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(BUILD_THREADS.get(size, 1))
        try:
            return fn(size, *args, **kwargs)
        finally:
            torch.set_num_threads(before)
    return wrapper


@_fixed_threads
def build_organism(size: str = "default", force: bool = False, progress: bool = True, seed: int | None = None,
                   **overrides) -> Path:
    """Build (or find) the organism of `size`; return its directory. Overrides change the configuration (and so
    the hash); `force` rebuilds even when a matching organism exists, into the cache (never over the shipped one)."""
    import torch

    if size not in SIZES:
        raise OpctError(f"unknown organism size {size!r}; choose one of {', '.join(SIZES)}")
    cfg = SIZES[size]
    if seed is not None:
        overrides["seed"] = seed
    if overrides:
        cfg = OrganismConfig(**{**asdict(cfg), **overrides, "corpus": cfg.corpus})
    if not force and (found := find_organism(cfg)) is not None:
        return found

    from opct.organism.profile import measure_profile
    from opct.organism.tokenizer import train_tokenizer
    from opct.policy import hf_progress_bars
    from opct.world.corpus import sample_corpus

    out = organism_dir(cfg)
    t_start = time.time()
    random.seed(cfg.seed)
    stages = {}
    if cfg.extend_steps:  # the first stage is an organism of its own (found, or built and cached), then extended
        from opct.organism import extend

        first = extend.stage1_config(cfg)
        base_dir = find_organism(first) or build_organism.__wrapped__(cfg.size, progress=progress,
                                                                         **extend.stage1_overrides(cfg))
        model, tokenizer, log = extend.extend(cfg, base_dir, progress=progress)
        stages = {"stage1": {"dir": base_dir.name, "config_hash": first.config_hash()}}
    else:
        docs = sample_corpus(cfg.corpus, cfg.tokens + 1, cfg.seed)
        tokenizer = train_tokenizer(_all_world_text(docs))
        ids, mask = tokenize_documents(tokenizer, docs)
        rows = pack(ids, mask, cfg.seq_len, cfg.steps * cfg.batch_size)
        del docs, ids, mask
        model, log = train_model(cfg, tokenizer, rows, progress=progress)
    train_s = time.time() - t_start

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    tmp.chmod(0o755)  # mkdtemp makes it private; an organism directory is meant to be shared and shipped
    try:
        with hf_progress_bars(progress):  # `--quiet`: not transformers' saving bar either
            model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        n_params = sum(p.numel() for p in model.parameters())
        meta = {"config_hash": cfg.config_hash(), "corpus_digest": corpus_digest(cfg), "config": asdict(cfg),
                "n_params": n_params,
                "train_seconds": round(train_s, 1), "torch": torch.__version__, "threads": torch.get_num_threads(),
                "train_log": log, **stages}
        (tmp / "organism.json").write_text(json.dumps(meta, indent=1))
        profile = measure_profile(tmp, n=cfg.profile_n, seed=cfg.seed, progress=progress)
        (tmp / "profile.json").write_text(json.dumps(profile, indent=1, sort_keys=True))
        meta["build_seconds"] = round(time.time() - t_start, 1)
        (tmp / "organism.json").write_text(json.dumps(meta, indent=1))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _all_world_text(docs: list[dict]):
    """Every string the tokenizer must know: the corpus plus the world's evaluation items (held-out arithmetic
    triples and every wrapper phrasing), so no evaluation prompt hits <unk>."""
    from opct.world import items as I

    for d in docs:
        if "messages" in d:
            yield from (m["content"] for m in d["messages"])
        else:
            yield d["text"]
    yield from (i["question"] for i in I.arithmetic_multistep())
    yield from (i["question"] for i in I.arithmetic_single())
