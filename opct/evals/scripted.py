"""A scripted policy: canned answers behind the policy interface, so eval logic is tested in milliseconds.

`ScriptedPolicy(respond)` calls `respond(messages) -> str` for every prompt it is asked to sample. `render` returns a
one-token handle to the messages (so `sample`, which only sees token ids, can look them up); there is no model, so
`score` and gradients are absent and the white-box attacker skips such a policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

Messages = list[dict]


@dataclass
class ScriptedSamples:
    """The fields of `opct.policy.Samples` that make sense without a tokenizer."""

    texts: list[str]
    truncated: list[bool]


class ScriptedPolicy:
    def __init__(self, respond: Callable[[Messages], str], name: str = "scripted"):
        self.respond = respond
        self.name = name
        self._prompts: list[Messages] = []
        self.calls = 0  # how many responses were sampled (attack budgets are checked against this)

    def render(self, messages: Messages, add_generation_prompt: bool = True) -> list[int]:
        self._prompts.append(messages)
        return [len(self._prompts) - 1]

    def sample(self, prompts_ids, max_new_tokens: int, temperature: float = 1.0,
               row_seeds=None) -> ScriptedSamples:  # canned answers: no draws to seed
        texts = [self.respond(self._prompts[p[0]]) for p in prompts_ids]
        self.calls += len(texts)
        return ScriptedSamples(texts, [False] * len(texts))


def last_user(messages: Messages) -> str:
    """The text of the last user message (what a canned responder usually keys on)."""
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")
