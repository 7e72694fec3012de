"""The policy interface (DESIGN §3): the one way training and evaluation code talks to a model.

A policy does three things:
  render  chat messages -> prompt token ids, through the tokenizer's chat template;
  sample  batched responses to prompts (temperature sampling, optionally nucleus; greedy at temperature 0; stop at
          EOS), with the sampler's own per-token log-probs (`opct.engine` for Llama models, `model.generate`
          otherwise); `HFPolicy.beam_search` decodes by beam search (the audit's diverse-decoding candidates);
  score   per-token log-probs of given responses under given prompts (batched, padded).

`HFPolicy` wraps any Hugging Face causal LM + tokenizer (the organism is one); `load_policy` loads one from a
directory written by `save_pretrained`.

Batch layouts (left-padded prompts; prompt + response for scoring, with shared prompts laid out once) live in
`opct.batching`; `pack` and `response_logits` are re-exported here.

Reading activations at named sites (DESIGN §3: residual stream per layer, MLP hidden state, attention probabilities)
is `HFPolicy.read_activations`, over the forward hooks of `opct.activations` (which the training methods ACT, MLPCT
and AttCT use directly, with gradients).
"""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import torch

from opct.batching import PackedBatch, left_pad, pack, response_logits  # noqa: F401  (re-exported)
from opct.engine import EnginePool, NonFinite, try_engine
from opct.errors import OpctError, first_line

Messages = list[dict]


@dataclass
class Samples:
    """Responses sampled for a batch of prompts (one row per prompt, in order)."""

    response_ids: list[list[int]]  # cut after the first EOS, which is kept; no padding
    texts: list[str]  # decoded responses, special tokens (EOS) removed
    logprobs: list[list[float]]  # the sampler's log-prob of each response token (temperature applied)
    truncated: list[bool]  # True where max_new_tokens ran out before an EOS


class Policy(Protocol):
    """What training and evaluation code may ask of a model (`HFPolicy` wraps a Hugging Face model; the scripted
    policy of `opct.evals.scripted` implements render and sample for eval-logic tests)."""

    eos_ids: list[int]
    pad_id: int

    def render(self, messages: Messages, add_generation_prompt: bool = True) -> list[int]: ...

    def check_fits(self, ids: Sequence[int], max_new_tokens: int, where: str) -> None: ...

    def sample(self, prompts_ids: Sequence[list[int]], max_new_tokens: int, temperature: float = 1.0,
               min_new_tokens: int = 0, top_p: float = 1.0,
               row_seeds: Sequence[int] | None = None) -> Samples: ...  # row_seeds: see HFPolicy.sample

    def score(self, prompts_ids: Sequence[list[int]],
              responses_ids: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]: ...

    def read_activations(self, prompts_ids: Sequence[list[int]], sites: Sequence[str] = ("residual",),
                         layers: Sequence[int] | None = None): ...


# ------------------------------------------------------------------------------------------------ HF policy

def row_uniforms(seeds: Sequence[int], steps: int) -> torch.Tensor:
    """(len(seeds), steps) float32 draws in [0, 1): row i from its own CPU generator seeded with seeds[i] (the same on
    every device the draws are then moved to)."""
    return torch.stack([torch.rand(steps, generator=torch.Generator().manual_seed(int(s))) for s in seeds]) \
        if len(seeds) else torch.zeros(0, steps)


class HFPolicy:
    """A Hugging Face causal LM + tokenizer behind the policy interface."""

    def __init__(self, model, tokenizer, name: str = "model", fast_sampling: bool = True, meant_special=()):
        """`meant_special`: special tokens whose text a message holds on purpose (the attacker's slot token, in the
        frame its prompt quotes); any other inside a message is warned of once (`warn_special_text`)."""
        if not getattr(tokenizer, "chat_template", None):
            raise OpctError(
                f"{name}: the tokenizer has no chat template, so chat messages cannot be rendered; set "
                f"`tokenizer.chat_template` to a Jinja template and save it with `tokenizer.save_pretrained({name!r})` "
                f"(or add a \"chat_template\" entry to its tokenizer_config.json)")
        from opct.pairs.schema import said_specials, special_texts

        self.model, self.tokenizer, self.name = model, tokenizer, name
        self._special_texts = tuple(t for t in special_texts(tokenizer) if t not in meant_special)
        self._special_seen = said_specials(name)  # special tokens' texts said inside a message (per command)
        self.render([{"role": "user", "content": "?"}])  # a template that does not compile: said here, once
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos += gen_eos if isinstance(gen_eos, list) else ([gen_eos] if gen_eos is not None else [])
        if not eos:
            raise OpctError(f"{name}: neither the tokenizer nor the generation config names an EOS token")
        self.eos_ids = sorted(set(eos))
        # Padding only fills space; masks come from lengths, so pad may equal EOS without harm.
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        # Sample through `opct.engine` (Llama models, LoRA folded in) when it applies; False forces generate().
        self.fast_sampling = fast_sampling
        self._engine_pool = EnginePool()  # the engine's memory between calls, on the CPU only (see opct.engine)
        self._fallbacks: set[str] = set()  # reasons already reported for sampling through generate()

    def sibling(self, model) -> "HFPolicy":
        """The same tokenizer and settings over another model (e.g. a frozen copy of the starting weights)."""
        other = HFPolicy.__new__(HFPolicy)
        other.__dict__.update(self.__dict__, model=model, _engine_pool=EnginePool(), _fallbacks=self._fallbacks)
        return other

    @property
    def device(self):
        return next(self.model.parameters()).device

    def render(self, messages: Messages, add_generation_prompt: bool = True) -> list[int]:
        """Prompt ids through the chat template; a prompt ending in a prefill (`opct.pairs.schema.prefill_of`) ends
        with the prefill's tokens after the generation prompt."""
        from jinja2 import TemplateError, TemplateSyntaxError

        from opct.pairs.schema import render_ids, warn_special_text

        warn_special_text(self.name, messages, self._special_texts, self._special_seen)
        try:
            return render_ids(self.tokenizer, messages, add_generation_prompt)
        except TemplateSyntaxError as e:
            raise OpctError(f"{self.name}: its chat template (chat_template.jinja or tokenizer_config.json's "
                            f"chat_template) does not compile: line {e.lineno}: {e.message}") from None
        except TemplateError as e:  # the template's own raise_exception, or an undefined it cannot render
            raise OpctError(f"{self.name}: its chat template cannot render this prompt "
                            f"({first_line(e, type(e).__name__)})") from None

    def check_fits(self, ids: Sequence[int], max_new_tokens: int, where: str) -> None:
        """Raise if a prompt plus `max_new_tokens` does not fit the model's context. `where` names the item."""
        if self.max_positions is not None and len(ids) + max_new_tokens > self.max_positions:
            raise OpctError(
                f"{where}: prompt is {len(ids)} tokens; with max_new_tokens={max_new_tokens} it exceeds the context "
                f"of {self.name} ({self.max_positions} positions). Shorten the prompt or lower max_new_tokens.")

    def _engine(self):
        """The fast engine over the current weights, or None (reported once per reason) when it does not apply."""
        if not self.fast_sampling:
            return None
        engine, reason = try_engine(self.model, self._engine_pool if self.device.type == "cpu" else None)
        if engine is None and reason not in self._fallbacks:
            self._fallbacks.add(reason)
            print(f"opct: note: {self.name}: sampling through model.generate, not the fast engine ({reason})",
                  file=sys.stderr)
        return engine

    @torch.no_grad()
    def sample(self, prompts_ids: Sequence[list[int]], max_new_tokens: int, temperature: float = 1.0,
               min_new_tokens: int = 0, top_p: float = 1.0, row_seeds: Sequence[int] | None = None) -> Samples:
        """One response per prompt: temperature sampling (no top-k; nucleus sampling when `top_p` < 1) — or greedy
        decoding at `temperature` 0 — with a KV cache, stopping at EOS.

        Llama-architecture models (also under peft LoRA) run through the lean loop of `opct.engine`; any other
        model, or `fast_sampling=False`, through `model.generate`. Both draw from the global torch RNG — unless
        `row_seeds` gives each prompt its own seed: then each row's draws come from its own generator (the engine:
        one batch; generate: one row at a time under `torch.manual_seed(seed)`, the RNG restored after), so a row's
        sample depends on its prompt and seed, not on its batch-mates (up to float rounding at a draw that falls on
        a boundary between two tokens, since a batch's matmuls may round differently), and the global RNG is left
        alone.

        `min_new_tokens` > 0 forbids EOS before that many tokens (benchmarks that need a fixed length); the
        returned log-probs are then those of the constrained sampler. Greedy decoding returns the model's own
        (temperature 1) log-probs of the chosen tokens.
        """
        if not temperature >= 0:
            raise OpctError(f"temperature must be >= 0 (got {temperature}; 0 decodes greedily)")
        if not 0 < top_p <= 1:
            raise OpctError(f"top_p must be in (0, 1] (got {top_p})")
        if row_seeds is not None and len(row_seeds) != len(prompts_ids):
            raise OpctError(f"row_seeds: {len(row_seeds)} seeds for {len(prompts_ids)} prompts")
        engine = self._engine()
        try:
            if engine is not None:
                uniforms = None if row_seeds is None else row_uniforms(row_seeds, max_new_tokens)
                new_B_T, logp_B_T = engine.sample(prompts_ids, max_new_tokens, temperature, self.eos_ids, self.pad_id,
                                                  min_new_tokens, top_p, uniforms_B_T=uniforms)
            elif row_seeds is not None:
                rows = [self._seeded_generate(p, seed, max_new_tokens, temperature, min_new_tokens, top_p)
                        for p, seed in zip(prompts_ids, row_seeds)]
                return Samples(*(sum((getattr(r, f) for r in rows), []) for f in
                                 ("response_ids", "texts", "logprobs", "truncated")))
            else:
                new_B_T, logp_B_T = self._generate(prompts_ids, max_new_tokens, temperature, min_new_tokens, top_p)
        except NonFinite as e:  # the logits / temperature overflow at a tiny temperature, as at diverged weights
            why = "diverged weights?" if not 0 < temperature < 1e-3 else \
                f"a temperature of {temperature:g} overflows the logits divided by it: use 0.001 or more"
            raise OpctError(f"{self.name}: sampling failed, {e} ({why})") from None
        return self._samples(new_B_T, logp_B_T)

    def _seeded_generate(self, prompt_ids, seed, max_new_tokens, temperature, min_new_tokens, top_p) -> Samples:
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            return self._samples(*self._generate([prompt_ids], max_new_tokens, temperature, min_new_tokens, top_p))

    def _samples(self, new_B_T, logp_B_T) -> Samples:
        responses, logprobs, truncated = [], [], []
        eos = torch.tensor(self.eos_ids)
        for row, lp in zip(new_B_T, logp_B_T):
            hits = torch.isin(row, eos).nonzero()
            n = int(hits[0]) + 1 if len(hits) else len(row)  # up to and including the first EOS
            responses.append(row[:n].tolist())
            logprobs.append(lp[:n].tolist())
            truncated.append(not len(hits))
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        return Samples(responses, texts, logprobs, truncated)

    def _generate(self, prompts_ids, max_new_tokens, temperature, min_new_tokens, top_p=1.0):
        """The general path: `model.generate` (any architecture). Returns (new tokens_B_T, sampler logp_B_T) on CPU."""
        from opct.hf_generate import generate

        return generate(self.model, prompts_ids, self.pad_id, self.eos_ids, max_new_tokens, temperature,
                        min_new_tokens, top_p)

    @torch.no_grad()
    def beam_search(self, prompts_ids: Sequence[list[int]], max_new_tokens: int, num_beams: int = 4) -> Samples:
        """One response per prompt by beam search (`model.generate`, `num_beams` beams, length penalty 1, stop at
        EOS): the best-scoring finished beam. Deterministic; `logprobs` are the model's own log-probs of the chosen
        tokens. (The fast engine samples one token per row and keeps no beams, so this goes through generate.)"""
        from opct.hf_generate import beam_search

        new_B_T = beam_search(self.model, prompts_ids, self.pad_id, self.eos_ids, max_new_tokens, num_beams)
        eos = torch.tensor(self.eos_ids)
        rows = []
        for row in new_B_T:
            hits = torch.isin(row, eos).nonzero()
            rows.append(row[:int(hits[0]) + 1].tolist() if len(hits) else row.tolist())
        rows = [r or [self.eos_ids[0]] for r in rows]
        logp_B_R, _ = self.score(list(prompts_ids), rows)
        logp_B_T = torch.zeros(new_B_T.shape)
        for i, r in enumerate(rows):
            logp_B_T[i, :len(r)] = logp_B_R[i, :len(r)].cpu()
        return self._samples(new_B_T, logp_B_T)

    @torch.no_grad()
    def read_activations(self, prompts_ids: Sequence[list[int]], sites: Sequence[str] = ("residual",),
                         layers: Sequence[int] | None = None):
        """Activations on prompts at named sites (`opct.activations.SITES`) and decoder layers (default: all).

        Returns `(recording, batch)`: `recording.<site>[layer]` is a (B, W, ...) tensor over the left-padded prompt
        batch, where token j of prompt i sits in column `batch.column(i, j)`. Attention probabilities need eager
        attention: call `opct.activations.use_eager_attention(policy.model)` first.
        """
        from opct.activations import forward_prompts, record
        from opct.batching import pad_left

        batch = pad_left(prompts_ids, self.pad_id, self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            with record(self.model, sites, layers) as rec:
                forward_prompts(self.model, batch)
        finally:
            self.model.train(was_training)
        return rec, batch

    @torch.no_grad()
    def score(self, prompts_ids: Sequence[list[int]], responses_ids: Sequence[list[int]]):
        """Per-token log-probs of each response under its prompt.

        Returns `(logp_B_R, mask_B_R)`: row i holds response i's log-probs in its first len(response_i) columns and
        `mask_B_R` marks them.
        """
        batch = pack(prompts_ids, responses_ids, self.pad_id, self.device)
        logits_B_R_V = response_logits(self.model, batch)
        logp_B_R = torch.log_softmax(logits_B_R_V.float(), -1).gather(-1, batch.response_ids_B_R[..., None])[..., 0]
        R = batch.response_ids_B_R.shape[1]
        mask_B_R = torch.arange(R, device=logp_B_R.device)[None, :] < batch.response_lengths_B[:, None]
        return logp_B_R * mask_B_R, mask_B_R


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# Below this many parameters a model on the CPU runs on one thread (see `cpu_threads`).
SMALL_MODEL_PARAMS = 100_000_000


@contextmanager
def cpu_threads(n_params: int, device: str = "cpu", threads: int | None = None):
    """Within the `with` block, torch runs on `threads` intra-op threads when given; else on one thread for a small
    model on the CPU. Sampling and stepping a small model is bound by per-op overhead, not arithmetic: a second
    OpenMP thread buys little, and when another process is busy on a 2-core machine it slows generation about 7x
    (measured on the default organism: all four eval suites 33 s on one thread, 236 s on two). Large models, and
    models on a GPU, keep torch's default. The count before is restored when the block ends, error or not, so a
    caller that evaluates in-process does not keep running on one thread after it."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    elif device == "cpu" and 0 < n_params < SMALL_MODEL_PARAMS:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def count_parameters(model_dir) -> int:
    """Parameters stored in a save_pretrained directory, read from the safetensors headers (nothing is loaded)."""
    from safetensors import safe_open

    n = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        try:
            with safe_open(str(f), "pt") as g:
                n += sum(math.prod(g.get_slice(k).get_shape()) for k in g.keys())
        except Exception as e:  # noqa: BLE001 - SafetensorError: a damaged file
            raise OpctError(f"{f}: damaged or truncated safetensors file ({first_line(e)})") from None
    return n


def check_dtype(dtype, name: str = "dtype") -> None:
    """An OpctError naming `name` (how the caller's user spells the setting) unless `dtype` is one `load_policy`
    takes."""
    if dtype not in _DTYPES:
        raise OpctError(f"{name}: must be one of {', '.join(_DTYPES)} (got {dtype!r})")


@contextmanager
def hf_progress_bars(shown: bool):
    """transformers' own progress bars ("Loading weights", "Writing model shards") off inside the block unless
    `shown` (its process-wide switch put back): what a command's --no-progress / --quiet also hides."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not shown and was:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not shown and was:
            hf_logging.enable_progress_bar()


def load_policy(model_dir, adapter=None, dtype: str = "float32", device="cpu",
                trust_remote_code: bool = False, progress: bool = True) -> HFPolicy:
    """Load a `save_pretrained` directory (safetensors only) as an `HFPolicy`, optionally with a peft adapter.
    `progress` False: without transformers' loading bar (a command's --no-progress).

    Remote code is off unless asked for: a model directory is data, and loading it must not run its Python. Asked
    for (only ever by an explicit command-line flag), a warning names the directory whose code will run.
    """
    from transformers import AutoModelForCausalLM

    path = Path(model_dir)
    if trust_remote_code:
        print(f"opct: warning: --trust-remote-code: the Python code in {path} will run (only use it for a model "
              f"directory you trust)", file=sys.stderr)
    from opct.modeldir import (adapter_load_problem, check_adapter, check_adapter_loaded, check_device,
                               check_finite_weights, check_loading_info, check_model_dir, load_tokenizer,
                               unbuildable)

    check_model_dir(path)  # no config.json; damaged, truncated or pickle-only weights: an error naming the file
    check_dtype(dtype)
    device = check_device(device)
    if adapter is not None:
        check_adapter(adapter)
    tokenizer = load_tokenizer(path, trust_remote_code)
    try:
        with hf_progress_bars(progress):
            model, info = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True, dtype=_DTYPES[dtype],
                                                               trust_remote_code=trust_remote_code,
                                                               output_loading_info=True)
    except (OSError, ValueError, RuntimeError) as e:
        first = first_line(e)
        if "mismatched" in first:
            raise OpctError(f"{path / 'config.json'}: does not match the weights (tensor shapes differ)") from None
        raise OpctError(f"{path}: cannot load the model ({first})") from None
    except Exception as e:  # noqa: BLE001 - a config.json value the model cannot be built from
        raise unbuildable(path, e) from None
    check_loading_info(path, info)
    if adapter is not None:
        from peft import PeftModel

        try:
            model = PeftModel.from_pretrained(model, adapter)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as e:
            raise OpctError(f"{adapter}: cannot load the adapter onto {path} ({adapter_load_problem(e)}); was it "
                            f"trained on another model?") from None
        check_adapter_loaded(model, adapter)
    check_finite_weights(model, path, adapter, dtype)
    model.to(device).eval()
    return HFPolicy(model, tokenizer, name=str(path))
