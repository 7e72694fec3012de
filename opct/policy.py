"""The policy interface (DESIGN §3): the one way training and evaluation code talks to a model.

A policy does three things:
  render  chat messages -> prompt token ids, through the tokenizer's chat template;
  sample  batched responses to prompts (pure temperature sampling, stop at EOS), with the sampler's own per-token
          log-probs (`opct.engine` for Llama models, `model.generate` otherwise);
  score   per-token log-probs of given responses under given prompts (batched, padded).

`HFPolicy` wraps any Hugging Face causal LM + tokenizer (the organism is one); `load_policy` loads one from a
directory written by `save_pretrained`.

Batch layout used for scoring (and for the training forward passes, see `pack` / `response_logits`):

    row i:  [pad ... pad | prompt_i | response_i | pad ... pad]
             <--- prompt block, width P ---><---- response block, width R ---->

Prompts are left-padded to a common width P and responses right-padded to R, so response token j of every row
sits in column P + j and is predicted by the logits in column P + j - 1, whatever each prompt's length. Position ids
are counted from each row's first real token, so a padded row computes what it would compute alone (up to float
rounding).

When several rows share one prompt (OPCT samples n responses per prompt), `pack(..., share_prompts=True)` notes which,
and `response_logits` lays each distinct prompt out once, followed by all of its responses, with an attention mask
that keeps the responses apart (`_shared_prompt_logits`): the same logits (up to float rounding) in one forward pass
with fewer tokens, in forward and backward.

Reading activations at named sites (DESIGN §3: residual stream per layer, MLP hidden state, attention probabilities)
is `HFPolicy.read_activations`, over the forward hooks of `opct.activations` (which the training methods ACT, MLPCT
and AttCT use directly, with gradients).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import torch

from opct.activations import unwrap
from opct.engine import EnginePool, llama_engine
from opct.errors import OpctError

Messages = list[dict]


@dataclass
class Samples:
    """Responses sampled for a batch of prompts (one row per prompt, in order)."""

    response_ids: list[list[int]]  # cut after the first EOS, which is kept; no padding
    texts: list[str]  # decoded responses, special tokens (EOS) removed
    logprobs: list[list[float]]  # the sampler's log-prob of each response token (temperature applied)
    truncated: list[bool]  # True where max_new_tokens ran out before an EOS


class Policy(Protocol):
    """What training and evaluation code may ask of a model."""

    def render(self, messages: Messages, add_generation_prompt: bool = True) -> list[int]: ...

    def sample(self, prompts_ids: Sequence[list[int]], max_new_tokens: int, temperature: float = 1.0) -> Samples: ...

    def score(self, prompts_ids: Sequence[list[int]],
              responses_ids: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]: ...


# ------------------------------------------------------------------------------------------------ batch layout

@dataclass
class PackedBatch:
    input_ids_B_L: torch.Tensor
    attention_mask_B_L: torch.Tensor
    position_ids_B_L: torch.Tensor
    response_ids_B_R: torch.Tensor  # right-padded with pad_id (never read as a mask)
    response_lengths_B: torch.Tensor
    prompt_width: int  # P
    # share_prompts: row b's prompt is distinct prompt prompt_index_B[b] (whose first row is first_rows_U[u]), and row b
    # is the slot_B[b]-th row with that prompt
    prompt_index_B: torch.Tensor | None = None
    slot_B: torch.Tensor | None = None
    first_rows_U: torch.Tensor | None = None


def pack(prompts_ids: Sequence[list[int]], responses_ids: Sequence[list[int]], pad_id: int, device,
         share_prompts: bool = False) -> PackedBatch:
    """Lay out prompts (left-padded) and responses (right-padded) as described in the module docstring.

    `share_prompts`: when some rows have identical prompts, record them so that `response_logits` computes each
    distinct prompt once (the layout itself is the same).
    """
    if len(prompts_ids) != len(responses_ids):
        raise ValueError(f"{len(prompts_ids)} prompts but {len(responses_ids)} responses")
    B = len(prompts_ids)
    P = max(len(p) for p in prompts_ids)
    R = max(len(r) for r in responses_ids)
    if R == 0:
        raise ValueError("every response is empty")
    ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + R), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts_ids, responses_ids)):
        ids[i, P - len(p):P] = torch.tensor(p, dtype=torch.long)
        ids[i, P:P + len(r)] = torch.tensor(r, dtype=torch.long)
        attn[i, P - len(p):P + len(r)] = 1
    # Positions count real tokens only, so left padding does not shift them (generate() does the same).
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    lengths = torch.tensor([len(r) for r in responses_ids], dtype=torch.long)
    batch = PackedBatch(ids.to(device), attn.to(device), pos.to(device), ids[:, P:].to(device), lengths.to(device), P)
    if share_prompts:
        distinct: dict[tuple, int] = {}
        index = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts_ids]
        if len(distinct) < B:
            first = [index.index(u) for u in range(len(distinct))]
            slot = [index[:i].count(u) for i, u in enumerate(index)]
            batch.prompt_index_B = torch.tensor(index, dtype=torch.long, device=device)
            batch.slot_B = torch.tensor(slot, dtype=torch.long, device=device)
            batch.first_rows_U = torch.tensor(first, dtype=torch.long, device=device)
    return batch


def _last_logits(model, n: int, **kwargs):
    """The model's output, with logits for the last `n` columns only when the model can skip the others."""
    if "logits_to_keep" in inspect.signature(unwrap(model).forward).parameters:
        out = model(**kwargs, logits_to_keep=n)
        return out, out.logits
    out = model(**kwargs)
    return out, out.logits[:, -n:]


def _can_share_prompts(model) -> bool:
    """The shared-prompt layout needs a custom 4D attention mask: the attention implementations that take one."""
    impl = getattr(getattr(unwrap(model), "config", None), "_attn_implementation", None)
    return impl in ("sdpa", "eager")


def response_logits(model, batch: PackedBatch) -> torch.Tensor:
    """Logits that predict each response token: `logits_B_R_V[:, j]` predicts `batch.response_ids_B_R[:, j]`.

    `model` may be wrapped (DDP, peft); gradients flow if the caller has them enabled. A batch packed with
    `share_prompts` runs each distinct prompt once (see the module docstring).
    """
    R = batch.response_ids_B_R.shape[1]
    if batch.prompt_index_B is not None and _can_share_prompts(model):
        return _shared_prompt_logits(model, batch)
    # Only the last R + 1 columns are needed; asking for fewer saves a (B, P, V) tensor on long prompts.
    _, logits = _last_logits(model, R + 1, input_ids=batch.input_ids_B_L, attention_mask=batch.attention_mask_B_L,
                             position_ids=batch.position_ids_B_L, use_cache=False)
    return logits[:, :-1]


def _shared_prompt_logits(model, batch: PackedBatch) -> torch.Tensor:
    """`response_logits` with each distinct prompt run once, in one forward pass over U rows (U distinct prompts):

        row u:  [pad ... pad | prompt_u | response of slot 0 | response of slot 1 | ... ]   width P + G * R

    where the G slots hold the responses of the rows that share prompt u (empty slots are padding). A custom 4D
    mask lets a response token see the real prompt tokens and the earlier tokens of its own slot only, and each slot's
    position ids continue from the prompt, so every response is computed exactly as in its own row (up to float
    rounding). A padding query sees only itself (a finite row, no NaN in the backward pass). The prompt's last
    column predicts token 0 of every slot.
    """
    P, R = batch.prompt_width, batch.response_ids_B_R.shape[1]
    dev = batch.input_ids_B_L.device
    prompt_B, slot_B, first_U = batch.prompt_index_B, batch.slot_B, batch.first_rows_U
    U, G = len(first_U), int(slot_B.max()) + 1
    L = P + G * R
    cols_B_R = P + slot_B[:, None] * R + torch.arange(R, device=dev)[None, :]
    rows_B_R = prompt_B[:, None].expand(-1, R)

    def lay_out(prompt_part_U_P, response_part_B_R, fill):
        out = torch.full((U, L), fill, dtype=prompt_part_U_P.dtype, device=dev)
        out[:, :P] = prompt_part_U_P
        out[rows_B_R, cols_B_R] = response_part_B_R
        return out

    ids_U_L = lay_out(batch.input_ids_B_L[first_U, :P], batch.response_ids_B_R, 0)
    real_U_L = lay_out(batch.attention_mask_B_L[first_U, :P], batch.attention_mask_B_L[:, P:], 0).bool()
    pos_U_L = lay_out(batch.position_ids_B_L[first_U, :P], batch.position_ids_B_L[:, P:], 0)
    segment_L = torch.cat([torch.zeros(P, dtype=torch.long, device=dev),
                           torch.arange(1, G + 1, device=dev).repeat_interleave(R)])
    causal_L_L = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
    visible_L_L = causal_L_L & ((segment_L[None, :] == 0) | (segment_L[None, :] == segment_L[:, None]))
    allowed_U_L_L = (visible_L_L[None] & real_U_L[:, None, :]) | torch.eye(L, dtype=torch.bool, device=dev)[None]
    if unwrap(model).config._attn_implementation == "sdpa":
        mask = allowed_U_L_L[:, None]
    else:  # eager attention adds the mask to the scores
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(allowed_U_L_L[:, None].shape, dtype=dtype, device=dev).masked_fill_(
            ~allowed_U_L_L[:, None], torch.finfo(dtype).min)
    _, logits_U_K_V = _last_logits(model, L - (P - 1), input_ids=ids_U_L, attention_mask=mask, position_ids=pos_U_L,
                                   use_cache=False)
    # column c of the layout is column c - (P - 1) of the kept logits; token j of a slot is predicted by column P - 1
    # (j = 0) or by the slot's column j - 1
    predictors_B_R = torch.cat([torch.zeros_like(cols_B_R[:, :1]), cols_B_R[:, :-1] - (P - 1)], 1)
    return logits_U_K_V[rows_B_R, predictors_B_R]


# ------------------------------------------------------------------------------------------------ HF policy

class _SamplerLogprobs:
    """Records the sampling distribution's log-prob of each chosen token, in O(B x V) memory.

    generate() calls logits processors with the scores for step t; the token chosen at step t only shows up in
    `input_ids` at step t + 1, so the log-probs of step t are kept until then (the last step is collected by
    `finish`). transformers applies custom processors before its temperature warper, hence the division here; the
    policy sets no other warper (top-k 0, top-p 1), so this is exactly the distribution tokens are drawn from.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.prev_logp_B_V = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        if self.prev_logp_B_V is not None:
            self.steps.append(self.prev_logp_B_V.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.prev_logp_B_V = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, last_tokens_B) -> torch.Tensor:
        self.steps.append(self.prev_logp_B_V.gather(-1, last_tokens_B[:, None]).squeeze(-1))
        return torch.stack(self.steps, dim=1)


class HFPolicy:
    """A Hugging Face causal LM + tokenizer behind the policy interface."""

    def __init__(self, model, tokenizer, name: str = "model", fast_sampling: bool = True):
        if not getattr(tokenizer, "chat_template", None):
            raise OpctError(
                f"{name}: the tokenizer has no chat template, so chat messages cannot be rendered; set "
                f"`tokenizer.chat_template` to a Jinja template and save it with `tokenizer.save_pretrained({name!r})` "
                f"(or add a \"chat_template\" entry to its tokenizer_config.json)")
        self.model, self.tokenizer, self.name = model, tokenizer, name
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

    @property
    def device(self):
        return next(self.model.parameters()).device

    def render(self, messages: Messages, add_generation_prompt: bool = True) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                                 return_dict=False)
        return list(ids)

    def check_fits(self, ids: Sequence[int], max_new_tokens: int, where: str) -> None:
        """Raise if a prompt plus `max_new_tokens` does not fit the model's context. `where` names the item."""
        if self.max_positions is not None and len(ids) + max_new_tokens > self.max_positions:
            raise OpctError(
                f"{where}: prompt is {len(ids)} tokens; with max_new_tokens={max_new_tokens} it exceeds the context "
                f"of {self.name} ({self.max_positions} positions). Shorten the prompt or lower max_new_tokens.")

    @torch.no_grad()
    def sample(self, prompts_ids: Sequence[list[int]], max_new_tokens: int, temperature: float = 1.0,
               min_new_tokens: int = 0) -> Samples:
        """Sample one response per prompt: pure temperature sampling (no top-k/top-p), KV cache, stop at EOS.

        Llama-architecture models (also under peft LoRA) sample through the lean loop of `opct.engine`; any other
        model, or `fast_sampling=False`, through `model.generate`. Both draw from the global torch RNG.

        `min_new_tokens` > 0 forbids EOS before that many tokens (benchmarks that need a fixed length); the
        returned log-probs are then those of the constrained sampler.
        """
        if temperature <= 0:
            raise OpctError(f"temperature must be > 0 (got {temperature}); opct samples, it does not decode greedily")
        engine = None
        if self.fast_sampling:
            engine = llama_engine(self.model, self._engine_pool if self.device.type == "cpu" else None)
        try:
            if engine is not None:
                new_B_T, logp_B_T = engine.sample(prompts_ids, max_new_tokens, temperature, self.eos_ids, self.pad_id,
                                                  min_new_tokens)
            else:
                new_B_T, logp_B_T = self._generate(prompts_ids, max_new_tokens, temperature, min_new_tokens)
        except RuntimeError as e:
            if "probability tensor" in str(e):  # multinomial on NaN/inf: the weights have diverged
                raise OpctError(f"{self.name}: sampling failed, the model's probabilities are not finite "
                                f"(diverged weights?): {e}") from None
            raise
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

    def _generate(self, prompts_ids, max_new_tokens, temperature, min_new_tokens):
        """The general path: `model.generate` (any architecture). Returns (new tokens_B_T, sampler logp_B_T) on CPU."""
        from transformers import GenerationConfig, LogitsProcessorList

        P = max(len(p) for p in prompts_ids)
        ids = torch.full((len(prompts_ids), P), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(prompts_ids):
            ids[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[i, P - len(p):] = 1
        gen = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                               max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens or None,
                               eos_token_id=self.eos_ids, pad_token_id=self.pad_id, use_cache=True)
        recorder = _SamplerLogprobs(temperature)
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                                      generation_config=gen, logits_processor=LogitsProcessorList([recorder]))
        finally:
            self.model.train(was_training)
        return out[:, P:].cpu(), recorder.finish(out[:, -1]).cpu()

    @torch.no_grad()
    def read_activations(self, prompts_ids: Sequence[list[int]], sites: Sequence[str] = ("residual",),
                         layers: Sequence[int] | None = None):
        """Activations on prompts at named sites (`opct.activations.SITES`) and decoder layers (default: all).

        Returns `(recording, batch)`: `recording.<site>[layer]` is a (B, W, ...) tensor over the left-padded prompt
        batch, where token j of prompt i sits in column `batch.column(i, j)`. Attention probabilities need eager
        attention: call `opct.activations.use_eager_attention(policy.model)` first.
        """
        from opct.activations import forward_prompts, pad_left, record

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


# Below this many parameters a model on the CPU runs on one thread (see `set_cpu_threads`).
SMALL_MODEL_PARAMS = 100_000_000


def set_cpu_threads(n_params: int, device: str = "cpu", threads: int | None = None) -> None:
    """`threads` when given; else one thread for a small model on the CPU. Sampling and stepping a small model is
    bound by per-op overhead, not arithmetic: a second OpenMP thread buys little, and when another process is busy
    on a 2-core machine it slows generation about 7x (measured on the default organism: all four eval suites 33 s
    on one thread, 236 s on two). Large models, and models on a GPU, keep torch's default."""
    if threads:
        torch.set_num_threads(threads)
    elif device == "cpu" and 0 < n_params < SMALL_MODEL_PARAMS:
        torch.set_num_threads(1)


def count_parameters(model_dir) -> int:
    """Parameters stored in a save_pretrained directory, read from the safetensors headers (nothing is loaded)."""
    from safetensors import safe_open

    n = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        try:
            with safe_open(str(f), "pt") as g:
                n += sum(math.prod(g.get_slice(k).get_shape()) for k in g.keys())
        except Exception as e:  # noqa: BLE001 - SafetensorError: a damaged file
            raise OpctError(f"{f}: damaged or truncated safetensors file ({str(e).splitlines()[0]})") from None
    return n


def load_policy(model_dir, adapter=None, dtype: str = "float32", device="cpu",
                trust_remote_code: bool = False) -> HFPolicy:
    """Load a `save_pretrained` directory (safetensors only) as an `HFPolicy`, optionally with a peft adapter.

    Remote code is off unless asked for: a model directory is data, and loading it must not run its Python.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model_dir)
    if not (path / "config.json").exists():
        raise OpctError(f"{path}: not a model directory (no config.json); pass a directory written by "
                        f"save_pretrained")
    if dtype not in _DTYPES:
        raise OpctError(f"dtype must be one of {', '.join(_DTYPES)} (got {dtype!r})")
    from opct.modeldir import check_adapter, check_device, check_loading_info, check_weights

    device = check_device(device)
    check_weights(path)  # damaged, truncated or pickle-only weights: an error naming the file
    if adapter is not None:
        check_adapter(adapter)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        model, info = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True, dtype=_DTYPES[dtype],
                                                           trust_remote_code=trust_remote_code,
                                                           output_loading_info=True)
    except (OSError, ValueError, RuntimeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "mismatched" in first:
            raise OpctError(f"{path / 'config.json'}: does not match the weights (tensor shapes differ)") from None
        raise OpctError(f"{path}: cannot load model or tokenizer ({first})") from None
    check_loading_info(path, info)
    if adapter is not None:
        from peft import PeftModel

        try:
            model = PeftModel.from_pretrained(model, adapter)
        except (OSError, ValueError, RuntimeError, KeyError) as e:
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
            detail = next((ln for ln in lines if "size mismatch" in ln), lines[0])
            raise OpctError(f"{adapter}: cannot load the adapter onto {path} ({detail}); was it trained on another "
                            f"model?") from None
    model.to(device).eval()
    return HFPolicy(model, tokenizer, name=str(path))
