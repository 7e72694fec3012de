"""A stand-in for the `vllm` package, for tests of opct's vLLM glue on a machine without a GPU (not a test module).

It has only what opct.engine.vllm_sampler calls, with the same names and shapes: `LLM(model=..., dtype=...,
logprobs_mode=..., skip_tokenizer_init=...)`, `LLM.generate(prompts, params, use_tqdm=...)` returning
RequestOutput-like objects, `LLM.apply_model(fn)`, `LLM.reset_prefix_cache()`, `LLM.llm_engine.model_executor`, and
`SamplingParams(**fields)`. Underneath it is the Hugging Face model itself, decoding one request at a time without a
cache: temperature sampling from a torch.Generator seeded with the request's seed, EOS masked before min_tokens,
the processed log-prob of each sampled token, stop at stop_token_ids. It says nothing about how vLLM behaves; the
tests that use it check that opct's side (requests, pushes, the loop's hooks, resume) fits together.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from types import SimpleNamespace
from typing import ClassVar

import torch

__version__ = "0.0+fake"


class SamplingParams:
    def __init__(self, **fields):
        self.__dict__.update(fields)


class _Model:
    """vLLM's model as `apply_model` hands it over: `load_weights` takes (checkpoint name, tensor) pairs and returns
    the names it loaded."""

    def __init__(self, hf):
        self.hf = hf

    def named_parameters(self):
        return self.hf.named_parameters()

    def load_weights(self, weights):
        params, loaded = dict(self.hf.named_parameters()), set()
        with torch.no_grad():
            for name, w in weights:
                params[name].copy_(w)
                loaded.add(name)
        return loaded


class LLM:
    made: ClassVar[list] = []  # every engine made, for the tests to inspect

    def __init__(self, model, dtype="auto", seed=0, gpu_memory_utilization=0.9, enforce_eager=False,
                 skip_tokenizer_init=False, logprobs_mode="raw_logprobs", **kwargs):
        from transformers import AutoModelForCausalLM

        assert logprobs_mode == "processed_logprobs" and skip_tokenizer_init
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).eval()
        self.llm_engine = SimpleNamespace(model_executor=object())
        self.resets, self.requests = 0, []
        torch.manual_seed(seed)  # as vLLM does: the caller's global RNG is clobbered
        LLM.made.append(self)

    def generate(self, prompts, params, use_tqdm=True):
        return [self._one(p["prompt_token_ids"], sp) for p, sp in zip(prompts, params)]

    @torch.no_grad()
    def _one(self, prompt, sp):
        self.requests.append(sp)
        gen = torch.Generator().manual_seed(sp.seed)
        tokens, steps, finish = [], [], "length"
        for t in range(sp.max_tokens):
            logits = self.model(input_ids=torch.tensor([list(prompt) + tokens])).logits[0, -1].float()
            if t < sp.min_tokens:
                logits[sp.stop_token_ids] = -float("inf")
            if sp.temperature == 0:
                logp = torch.log_softmax(logits, -1)
                tok = int(logp.argmax())
            else:
                logp = torch.log_softmax(logits / sp.temperature, -1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
            tokens.append(tok)
            steps.append({tok: SimpleNamespace(logprob=float(logp[tok]), rank=1)})
            if tok in sp.stop_token_ids:
                finish = "stop"
                break
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=tuple(tokens), logprobs=steps,
                                                        finish_reason=finish)])

    def apply_model(self, fn):
        return [fn(_Model(self.model))]

    def reset_prefix_cache(self):
        self.resets += 1
        return True


def install(monkeypatch) -> types.ModuleType:
    """Make `import vllm` give this module for the test (and skip opct's GPU/package check)."""
    module = sys.modules[__name__]
    module.__spec__ = module.__spec__ or importlib.machinery.ModuleSpec("vllm", None)
    monkeypatch.setitem(sys.modules, "vllm", module)
    LLM.made = []
    from opct.engine import vllm_sampler

    monkeypatch.setattr(vllm_sampler, "check_available", lambda *a: None)
    return module
