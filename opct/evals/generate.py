"""Batched sampling through the policy interface, shared by every suite.

Suites hand over a list of chat prompts and get one response text per prompt, in order. Prompts are rendered once,
checked against the model's context (when the policy can tell), sorted by length so each batch pads little, and
sampled in batches of `batch_size` at `temperature` (1.0 by default: DESIGN §5 — behaviour rates are measured by
sampling, not greedy decoding).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: importing the policy (and torch) here would slow `opct --help`
    from opct.policy import Policy

Messages = list[dict]


@dataclass
class Gen:
    """How responses are sampled."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    batch_size: int = 64
    progress: bool = False


def seed_everything(seed: int) -> None:
    """Seed torch's sampler if torch is in use (a scripted policy never imports it)."""
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)


def generate(policy: Policy, prompts: list[Messages], gen: Gen = Gen(), seed: int = 0, desc: str = "sampling",
             where: list[str] | None = None) -> list[str]:
    """One sampled response text per prompt, in the order given. `where[i]` names prompt i in an error (e.g. a
    prompt too long for the model's context): its item id, and the file and line it came from."""
    return [t for t, _ in generate_flagged(policy, prompts, gen, seed, desc, where)]


def generate_flagged(policy: Policy, prompts: list[Messages], gen: Gen = Gen(), seed: int = 0,
                     desc: str = "sampling", where: list[str] | None = None) -> list[tuple[str, bool]]:
    """`generate`, with each response's truncation flag: (text, True where max_new_tokens ran out before the end of
    the turn). The same samples as `generate` for the same seed."""
    if not prompts:
        return []
    ids = [policy.render(m) for m in prompts]
    if hasattr(policy, "check_fits"):
        for i, p in enumerate(ids):
            policy.check_fits(p, gen.max_new_tokens, f"{desc}: {where[i]}" if where else f"{desc} prompt {i}")
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[tuple[str, bool] | None] = [None] * len(ids)
    seed_everything(seed)
    bar = None
    if gen.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(ids), desc=desc, mininterval=2.0, leave=False)
    for start in range(0, len(order), gen.batch_size):
        chunk = order[start:start + gen.batch_size]
        got = policy.sample([ids[i] for i in chunk], max_new_tokens=gen.max_new_tokens, temperature=gen.temperature)
        flags = getattr(got, "truncated", None) or [False] * len(chunk)
        for i, t, cut in zip(chunk, got.texts, flags):
            out[i] = (t, bool(cut))
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return out  # type: ignore[return-value]
