"""A word-level tokenizer trained on the synthetic world's text, with a chat template.

Word-level, because the organism is small: one token per word or punctuation mark makes every behaviour a
keyword-and-template behaviour, which a few-million-parameter model learns in minutes. The vocabulary is closed
(the world's text), so `<unk>` only appears on text a user brings.

Chat format (the Jinja template saved in tokenizer_config.json renders exactly this):

    <bos><|user|> question <|end|><|assistant|> answer <|end|>

`<|end|>` closes every turn and is the EOS token, so generation stops at the end of the assistant's turn.
`<pad>` is a separate token; masks never rely on it.
"""

from __future__ import annotations

from typing import Iterable

BOS, EOS, PAD, UNK = "<bos>", "<|end|>", "<pad>", "<unk>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS = [PAD, UNK, BOS, EOS, *ROLE_TOKENS.values()]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }} {{ message['content'] }} {{ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], min_frequency: int = 1):
    """Train a word-level tokenizer on `texts` and wrap it as a `PreTrainedTokenizerFast` with a chat template.

    Deterministic: the vocabulary is ordered by frequency, ties broken by the word itself.
    """
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Whitespace()
    norm = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    counts: Counter = Counter()
    for t in texts:
        counts.update(w for w, _ in pre.pre_tokenize_str(norm.normalize_str(t)))
    words = sorted((w for w, c in counts.items() if c >= min_frequency), key=lambda w: (-counts[w], w))
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for w in words:
        vocab.setdefault(w, len(vocab))

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.normalizer = norm
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)  # joins words with spaces, tidies punctuation
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        chat_template=CHAT_TEMPLATE, padding_side="left", model_max_length=1_000_000,
        clean_up_tokenization_spaces=True,
    )


def encode_chat(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    """Token ids of `messages` as the chat template renders them (no extra BOS)."""
    return tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                         return_dict=False)
