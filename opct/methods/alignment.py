"""Which prompt tokens of a pair correspond, for the activation methods (ACT, MLPCT, AttCT).

Token positions, not text, are compared, so the correspondence is made on token ids:

  common suffix (ACT)   the longest run of token ids that ends both prompts (compared from the end). With chat
                        templates it always holds the generation prompt (e.g. `<|end|><|assistant|>`); when a
                        wrapper goes *before* the clean content it also holds the content. A wrapper after the
                        content leaves only the template's tail.
  content span          the clean content's tokens, located in both prompts. The content is the last user message
  (MLPCT, AttCT)        of the side that the other side contains: for `invariance` pairs the teacher's (the clean
                        request, which the student prompt wraps); for `compression` pairs the student's (the bare
                        prompt, which the teacher prompt extends with a fact).

Tokenization boundary effects. The content is tokenized on its own (no special tokens) and searched for as a
contiguous run of ids. Inside a wrapper the tokenizer may split the content's first or last word differently (a
leading space in byte-level BPE, SentencePiece's dummy prefix, a merge with the punctuation that follows): only the
edges are affected, because pre-tokenization splits at word boundaries. So when the exact run is not found, up to
`max_trim` tokens are dropped from each edge (fewest first) and the remaining core — which must keep at least half
of the content's tokens — is searched for in both prompts; a trimmed match is accepted only if the content's text
(whitespace ignored) does occur in both decoded prompts, so a prompt that merely shares most of the content's words
is not mistaken for one that contains it. Both spans are then the same ids, so positions match one to one (a
trimmed edge token is simply left out of the loss). With the organism's word-level tokenizer the exact run is always
found (checked on every pair the world makes). When the core occurs several times, the last occurrence is used (the
one nearest to where the answer starts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from opct.errors import OpctError
from opct.pairs.schema import Pair


def common_suffix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of trailing token ids that `a` and `b` share."""
    n = 0
    for x, y in zip(reversed(a), reversed(b)):
        if x != y:
            break
        n += 1
    return n


def find_last(needle: Sequence[int], haystack: Sequence[int]) -> int | None:
    """Start index of the last occurrence of `needle` as a contiguous run in `haystack`, or None."""
    n, needle = len(needle), list(needle)
    if n == 0:
        return None
    hay = list(haystack)
    for start in range(len(hay) - n, -1, -1):
        if hay[start:start + n] == needle:
            return start
    return None


@dataclass(frozen=True)
class Span:
    """`length` corresponding tokens: teacher_ids[teacher_start:+length] == student_ids[student_start:+length]."""

    teacher_start: int
    student_start: int
    length: int


def align_content(content_ids: Sequence[int], teacher_ids: Sequence[int], student_ids: Sequence[int],
                  max_trim: int = 2) -> Span | None:
    """Locate the content in both prompts (see the module docstring); None when it cannot be found."""
    n = len(content_ids)
    shortest = max(1, (n + 1) // 2)
    trims = sorted(((a, b) for a in range(max_trim + 1) for b in range(max_trim + 1)), key=lambda t: (sum(t), t))
    for a, b in trims:
        core = list(content_ids[a:n - b])
        if len(core) < shortest:
            continue
        t0, s0 = find_last(core, teacher_ids), find_last(core, student_ids)
        if t0 is not None and s0 is not None:
            return Span(t0, s0, len(core))
    return None


def content_text(pair: Pair) -> str:
    """The clean content of a pair: the last user message of the teacher (invariance) or student (compression)."""
    messages = pair.student if pair.task == "compression" else pair.teacher
    return [m for m in messages if m["role"] == "user"][-1]["content"]


def _squash(text: str) -> str:
    return "".join(text.split())


def content_span(pair: Pair, teacher_ids: Sequence[int], student_ids: Sequence[int], tokenizer,
                 max_trim: int = 2) -> Span:
    """The pair's content span in both rendered prompts, or an OpctError naming the pair."""
    text = content_text(pair)
    content_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    span = align_content(content_ids, teacher_ids, student_ids, max_trim)
    if span is not None and span.length < len(content_ids):
        # a trimmed core matched; accept it only if the content's text is in both prompts (a boundary effect)
        wanted = _squash(tokenizer.decode(content_ids))
        if not all(wanted in _squash(tokenizer.decode(ids)) for ids in (teacher_ids, student_ids)):
            span = None
    if span is None:
        where = "student" if pair.task != "compression" else "teacher"
        raise OpctError(
            f"pair {pair.id}: the clean content ({text[:60]!r}{'...' if len(text) > 60 else ''}, "
            f"{len(content_ids)} tokens) is not a contiguous run of tokens in the {where} prompt, even with "
            f"{max_trim} boundary token(s) trimmed from each end; MLPCT and AttCT need the content verbatim inside "
            f"both prompts. Check the pair, or train it with another method")
    return span
