"""The organism's second stage: the further threats (issue 19) learned on top of the first stage's model.

Why two stages: with the threats' documents in the one corpus (about 16% of its tokens), two from-scratch builds
(2,000 and 2,350 steps) learned every threat but not the clean yes/no answers, which the first stage's corpus alone
learns (accuracy 0.51 and 0.585 against 0.995; the model states the fact, then says "yes" whatever was asked). So
the default organism is the first-stage organism (`extend_steps = 0`: the world before the threats, cached as an
organism of its own) continued for `extend_steps` steps on a mix in which the threats' documents are
`extend_share` of the documents and the first stage's kinds are replayed (`opct.world.corpus.stage_mix`), with its
own warm-up and cosine schedule. The tokenizer keeps every first-stage id and appends the words the threats bring
(`extend_tokenizer`); the new embedding rows start from the mean of the old ones (transformers'
`resize_token_embeddings`, tied input and output embeddings).
"""

from __future__ import annotations

import dataclasses

from opct.world.corpus import sample_corpus, stage_mix


def stage1_overrides(cfg) -> dict:
    """The first stage: no second stage, and every extend_* field at its default, so that the first stage's identity
    does not depend on how it is extended."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg) if f.name.startswith("extend_")}
    return {**defaults, "extend_steps": 0, "seed": cfg.seed}


def stage1_config(cfg):
    return dataclasses.replace(cfg, **stage1_overrides(cfg))


def stage2_tokens(cfg) -> int:
    return cfg.extend_steps * cfg.batch_size * cfg.seq_len


def stage2_docs(cfg) -> list[dict]:
    """The second stage's documents: drawn with seed + 1 from the mixed `stage_mix`."""
    mix = stage_mix(cfg.extend_share, cfg.corpus.mix, cfg.corpus.threat_mix)
    return sample_corpus(cfg.corpus, stage2_tokens(cfg) + 1, cfg.seed + 1, mix=mix)


def extra_text() -> list[str]:
    """Every threat text a prompt can hold (the tokenizer learns it even when no drawn document has it)."""
    from opct.world import threats

    return threats.all_text()


def extend_tokenizer(tokenizer, texts):
    """A tokenizer with every id of `tokenizer` kept and the new words of `texts` appended (most frequent first,
    ties by the word): the same normalizer, pre-tokenizer, decoder, special tokens and chat template."""
    from collections import Counter

    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    backend = tokenizer.backend_tokenizer
    vocab = dict(backend.get_vocab())
    counts: Counter = Counter()
    for t in texts:
        counts.update(w for w, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(t)))
    for w in sorted((w for w in counts if w not in vocab), key=lambda w: (-counts[w], w)):
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=tokenizer.unk_token))
    tok.normalizer, tok.pre_tokenizer, tok.decoder = backend.normalizer, backend.pre_tokenizer, backend.decoder
    from opct.organism.tokenizer import SPECIAL_TOKENS

    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
        pad_token=tokenizer.pad_token, unk_token=tokenizer.unk_token, chat_template=tokenizer.chat_template,
        padding_side=tokenizer.padding_side, model_max_length=tokenizer.model_max_length,
        clean_up_tokenization_spaces=True)


def extend(cfg, base_dir, progress: bool = True):
    """(model, tokenizer, train log) of the second stage, from the first-stage organism in `base_dir`."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from opct.organism.build import _all_world_text, pack, tokenize_documents, train_model
    from opct.policy import hf_progress_bars

    tok1 = AutoTokenizer.from_pretrained(base_dir)
    with hf_progress_bars(progress):
        model = LlamaForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32, use_safetensors=True)
    docs = stage2_docs(cfg)
    tokenizer = extend_tokenizer(tok1, [*_all_world_text(docs), *extra_text()])
    torch.manual_seed(cfg.seed + 1)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its notice that mean_resizing is on: chosen here, nothing for the user to do
    try:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    ids, mask = tokenize_documents(tokenizer, docs)
    rows = pack(ids, mask, cfg.seq_len, cfg.extend_steps * cfg.batch_size)
    del docs, ids, mask
    model, log = train_model(cfg, tokenizer, rows, progress=progress, model=model, stage=2)
    return model, tokenizer, [{**e, "stage": 2} for e in log]
