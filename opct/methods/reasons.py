"""Training on the reason (issue 20 part 3; the SFT-lessons paper, arXiv 2607.26173): SFT/BCT targets that state why.

What it really is: each offline target (the teacher's answer to the clean prompt) gets one sentence *prefixed* to it
before training — so the student learns to say the reason first and then behave (reason-then-answer, as a chain of
thought would; the prefix is also what a student trained without a loss on it still reads in context):

  plain    the answer alone (the default; what SFT/BCT always did);
  reason   the pair's axis's reason (`Axis.reason`, written in each axis module) + the answer. Sycophancy: "what
           people think does not make the answer right ."; jailbreak (harmful requests): "a game or a story does not
           make a harmful request safe ."; awareness (hazard scenarios): the pair's own fact, "the fact is : <fact> .";
  filler   a neutral sentence with exactly the reason's token count under the model's tokenizer, then the answer
           — the control the paper requires (filler alone moved its transfer from 10.3% to 44.5-62.5%).

Pairs without a reason to state keep the plain answer under `reason` and `filler` alike: benign jailbreak requests,
benign awareness counterparts (the anchors) and pairs of other axes. `mask_reason` keeps the prefixed tokens out of
the loss (they are still in the context the answer is predicted from): did the model need to *produce* the reason?

The organism's word-level tokenizer has a closed vocabulary (opct/organism/tokenizer.py), so the sentences use only
words the world's text has; a sentence with a word that maps to `<unk>` is an error naming the word (a real model's
tokenizer has no unknown words).
"""

from __future__ import annotations

from opct.errors import OpctError
from opct.pairs.schema import Pair

# Neutral sentences from the world (its instruction topics): no answer, no refusal, no warning, no fact.
FILLER_SOURCE = ("the rain falls softly on the green hills . the baker makes fresh bread every day . fish swim in "
                 "the clear cold river . bright flowers grow in the quiet garden . soft music fills the old hall . "
                 "the school bell rings at noon . big ships sail across the blue ocean . tall towers stand in the "
                 "busy city .")
TARGETS = ("plain", "reason", "filler")


def reason_text(pair: Pair) -> str | None:
    """The sentence stating why the target behaviour is right for this pair (its axis's `reason`), or None when there
    is none to state (a benign pair, an axis without a reason, a user's own "custom" pairs)."""
    from opct.axes import AXES

    axis = AXES.get(pair.axis)
    return axis.reason(pair) if axis is not None and axis.reason is not None else None


def encode(tokenizer, text: str, what: str) -> list[int]:
    """`text`'s token ids (no special tokens); an error naming the words the tokenizer does not know."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    unk = tokenizer.unk_token_id
    if unk is not None and unk in ids:
        from opct.world.judges import words

        vocab = tokenizer.get_vocab()
        missing = [w for w in words(text) if w not in vocab] or ["(a word)"]
        raise OpctError(f"{what}: {text!r} has words the tokenizer does not know ({', '.join(missing)}); they "
                        f"would train <unk>. Use in-vocabulary words only")
    return ids


def filler_ids(tokenizer, n: int) -> list[int]:
    """A neutral sentence of exactly `n` tokens: the first n - 1 words of FILLER_SOURCE (its periods left out, so the
    text never ends in '..', which a word-level tokenizer would read as one unknown token), then '.'."""
    words = [w for w in FILLER_SOURCE.split() if w != "."]
    period = encode(tokenizer, ".", "the filler's period")
    if n < 1 or n - 1 > len(words) or len(period) != 1:
        raise OpctError(f"cannot make a filler of {n} tokens (source: {len(words)} words)")
    ids = encode(tokenizer, " ".join(words[:n - 1]), "the filler") + period
    if len(ids) != n:  # a tokenizer that splits these words further (not the organism's)
        raise OpctError(f"the filler came out {len(ids)} tokens long, not {n}, under {type(tokenizer).__name__}")
    return ids


def prefix_ids(tokenizer, pair: Pair, target: str) -> list[int]:
    """The tokens to put before the answer of `pair`'s target: [] (plain, or nothing to state), the reason's, or a
    filler of the same count."""
    if target not in TARGETS:
        raise OpctError(f"target must be one of {', '.join(TARGETS)} (got {target!r})")
    text = reason_text(pair) if target != "plain" else None
    if text is None:
        return []
    ids = encode(tokenizer, text, f"the reason of pair {pair.id}")
    return ids if target == "reason" else filler_ids(tokenizer, len(ids))
