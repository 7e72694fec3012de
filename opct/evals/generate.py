"""Batched sampling through the policy interface, shared by every suite.

Suites hand over a list of chat prompts and get one response text per prompt, in order. Prompts are rendered once,
checked against the model's context (when the policy can tell), sorted by length so each batch pads little, and
sampled in batches of `batch_size` at `temperature` (1.0 by default: DESIGN §5 — behaviour rates are measured by
sampling, not greedy decoding).

Seeds: by default one seed for the whole call (torch's global RNG, seeded once, then drawn batch by batch in length
order), so a prompt's response also depends on `batch_size` and on the other prompts of the call. With
`seed_per_prompt`, each prompt draws from its own generator, seeded by `prompt_seed` (seed, its token ids, how many
times the same prompt came before in the call; the seeds the inspect provider opct/local uses), so its response
depends on neither (up to float rounding at a draw that falls on a boundary between two tokens: a batch's matmuls may
round differently). That needs a policy whose `sample` takes `row_seeds` (`HFPolicy`).
"""

from __future__ import annotations

import hashlib
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
    seed_per_prompt: bool = False  # each prompt's own seed (`prompt_seed`), not one for the call: see the docstring


def prompt_seed(seed: int, ids: list[int], occurrence: int) -> int:
    """The sampling seed of one prompt: a hash of (seed, its token ids, how many times the same prompt came before)."""
    h = hashlib.sha256(f"{seed}|{occurrence}|{','.join(map(str, ids))}".encode())
    return int.from_bytes(h.digest()[:8], "little") & ((1 << 63) - 1)


class PromptSeeds:
    """`prompt_seed` of prompts in the order they come, counting each prompt's repeats (a call's prompts in list
    order; the inspect provider's requests as they arrive)."""

    def __init__(self, seed: int):
        self.seed = seed
        self._asked: dict[tuple, int] = {}  # prompt ids -> how many times they came before

    def __call__(self, ids: list[int]) -> int:
        key = tuple(ids)
        occurrence = self._asked.get(key, 0)
        self._asked[key] = occurrence + 1
        return prompt_seed(self.seed, list(ids), occurrence)


def prompt_seeds(seed: int, prompts_ids: list[list[int]]) -> list[int]:
    """`prompt_seed` of every prompt, counting repeats of a prompt in list order."""
    return list(map(PromptSeeds(seed), prompts_ids))


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
    seeds = prompt_seeds(seed, ids) if gen.seed_per_prompt else None
    bar = None
    if gen.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(ids), desc=desc, mininterval=2.0, leave=False)
    for start in range(0, len(order), gen.batch_size):
        chunk = order[start:start + gen.batch_size]
        kwargs = {} if seeds is None else {"row_seeds": [seeds[i] for i in chunk]}
        got = policy.sample([ids[i] for i in chunk], max_new_tokens=gen.max_new_tokens, temperature=gen.temperature,
                            **kwargs)
        flags = getattr(got, "truncated", None) or [False] * len(chunk)
        for i, t, cut in zip(chunk, got.texts, flags):
            out[i] = (t, bool(cut))
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return out  # type: ignore[return-value]
