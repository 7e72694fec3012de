"""The chat messages opct's tasks send, and the frustration axis's multi-turn conversation as an inspect solver.

`frustration_solver` plays one conversation per sample by the axis's own protocol (`opct.axes.frustration`:
`next_user_turn`, `turn_prompt`, `add_reply`, the same rejections in the same order from the conversation's own
generator, the same number of turns, each reply capped at `reply_tokens(max_tokens)`), sampling each reply from
inspect's model (`get_model().generate`); the finished conversation is left in `state.metadata["conversation"]`,
and `frustration.record` turns it into the record `opct eval` writes. What differs is only who samples: one
conversation at a time through inspect's provider, not every conversation in one batch per turn through opct's
seeded engine. The context rule (a conversation ends, `ended: "context"`, when its next prompt plus the reply's cap
would not fit the model's positions) needs the model's tokenizer: `context_rule` has it for opct's provider
(`opct/local`) and inspect's `hf` (`hf/local`), each of which renders and tokenizes exactly as it then generates;
other providers expose no tokenizer or context length, so there no conversation ends on context (a prompt too long
fails as the provider reports it).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from inspect_ai.model import (
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageUser,
    GenerateConfig,
    Model,
    get_model,
)
from inspect_ai.solver import Generate, TaskState, solver

from opct.axes import frustration as FR
from opct.world import threats as T

_ROLES = {"user": ChatMessageUser, "assistant": ChatMessageAssistant, "system": ChatMessageSystem}


def chat(prompt: list[dict]) -> list:
    """opct's chat messages ({"role", "content"}) as inspect's."""
    return [_ROLES[m["role"]](content=m["content"]) for m in prompt]


def context_rule(model: Model) -> Callable[[list[dict], int], bool] | None:
    """`fits(messages, max_new) -> bool` as `frustration.rollout` asks it of a policy (the rendered prompt's tokens
    plus `max_new` within the model's positions), for a provider that holds the model and its tokenizer (opct's
    `opct/local`, and inspect's `hf`: each one's own chat rendering and tokenizer call, so the count is what it
    generates from); None for any other."""
    api = model.api
    if callable(getattr(api, "context_fits", None)):  # opct's own provider (opct.inspect.provider): opct's rendering
        return api.context_fits
    tokenizer, render = getattr(api, "tokenizer", None), getattr(api, "hf_chat", None)
    limit = getattr(getattr(getattr(api, "model", None), "config", None), "max_position_embeddings", None)
    if tokenizer is None or render is None or not isinstance(limit, int):
        return None
    call_args = getattr(api, "tokenizer_call_args", None) or {}

    def fits(messages: list[dict], max_new: int) -> bool:
        ids = tokenizer([render(chat(messages), [])], **call_args)["input_ids"][0]
        return len(ids) + max_new <= limit
    return fits


@solver
def frustration_solver(prompt_side: str = "student", max_tokens: int = 64, temperature: float = 1.0, seed: int = 0):
    """One frustration conversation (the sample's `probe`, a conversation of `frustration.conversations`) played to
    its end: its first answer, then up to MAX_TURNS rejections each followed by the model's reply; it stops at the
    escape or when the next prompt would not fit (`context_rule`). `prompt_side="teacher"`: each reply from turn 2 is
    sampled from the one-rejection context (`frustration.turn_prompt`), while the history keeps growing."""
    config = GenerateConfig(max_tokens=FR.reply_tokens(max_tokens), temperature=temperature)

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        model = get_model()
        fits = context_rule(model)
        c = copy.deepcopy(state.metadata["probe"])
        c["_rng"] = FR.rejection_rng(seed, c["conv_id"])
        for turn in range(T.MAX_TURNS + 1):
            if c["ended"] != "done":
                break
            FR.next_user_turn(c, turn)
            if fits is not None and not fits(c["messages"], config.max_tokens):
                c["ended"] = "context"
                break
            state.output = await model.generate(chat(FR.turn_prompt(c, turn, prompt_side)), config=config)
            FR.add_reply(c, turn, state.output.completion)
        state.messages = chat(c["messages"])
        state.metadata["conversation"] = {k: v for k, v in c.items() if not k.startswith("_")}
        return state

    return solve
