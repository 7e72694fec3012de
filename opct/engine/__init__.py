"""A lean batched sampler for Llama-architecture models (the fast path behind `HFPolicy.sample`).

Why it exists: on a small model, `model.generate` costs far more in Python than in arithmetic. Every decode step goes
through generate's bookkeeping and the transformers forward (mask building, cache objects, output capture), and under
LoRA every linear layer is three matmuls behind peft's dispatch. This module samples with the same model's weights
through a short explicit loop instead:

  weights   read from the model at each call; under peft, each active LoRA adapter is folded into its base weight
            (W + scaling * B @ A, a temporary copy: the model itself is not touched). q/k/v and gate/up are fused
            into one matmul each; a float32 RMSNorm's weight is folded into the matmul after it (W * w).
  cache     preallocated keys and values for prompt + max_new_tokens positions; one matmul pass per layer per step.
  step      few, large ops, since per-op overhead bounds a small model's decode step: a folded RMSNorm is the layer
            norm of [x, -x] (mean 0, variance mean(x^2): exactly x / sqrt(mean(x^2) + eps), one fused kernel where
            the RMSNorm takes ~7 on a CPU); rotary embedding is one complex multiply, with the rows of q and k
            reordered in the folded weights so that each rotated pair is adjacent (attention only takes dot products
            between q and k, which one shared reordering leaves unchanged; the KV cache holds the reordered keys);
            residual additions are accumulated into the matmul (addmm).
  sampling  temperature sampling from softmax(logits / T) (optionally nucleus: restricted to the smallest set of
            tokens whose probability reaches `top_p`, renormalised), by inverse CDF: one uniform draw per row from the
            global torch RNG (so `torch.manual_seed` makes it reproducible, and checkpointed RNG state covers it),
            the first token whose cumulative probability exceeds it (an order of magnitude cheaper on a CPU than
            `torch.multinomial`, which draws an exponential per vocabulary entry); rows stop at their first EOS;
            EOS is masked out before `min_new_tokens`.

It computes what the model computes, up to float rounding: the layers' own rotary-embedding module (its cos and sin
tables) and activation are called; a norm that is not a float32 LlamaRMSNorm is the module itself; the attention is
softmax(q k^T * scale) v over the unpadded keys. Models it does not recognise exactly (another architecture, a rope
type whose frequencies depend on the sequence length or whose tables are not rotate_half's, DoRA or other LoRA
variants, a quantised base layer, registered forward hooks, linear weights past `MAX_COPY_BYTES`) give None from
`llama_engine`, and the caller falls back to `generate`.

Memory: on the CPU, torch hands every large tensor back to the OS when it is freed, so a fresh one costs a page
fault per 4 KiB on first touch (about 10x the cost of writing it again: ~4 ms for the default organism's folded
weights, on every call). An `EnginePool` keeps the folded weights and the KV cache between calls; `HFPolicy` keeps
one per policy on the CPU, for models with up to `POOL_MAX_BYTES` of linear weights and for KV caches up to that
size. The weights are still re-read and re-folded on every call (training changes them between calls, and some
in-place edits are invisible to version counters); only their memory is reused. On a GPU the caching allocator
already reuses memory, and a persistent copy would only add to peak memory, so no pool is used there.

Batch layout: prompts are left-padded to width P; position ids count each row's real tokens from 0 (as `pack` and
generate do); token t of the response sits at cache column P + t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from opct import cpu_matmul
from opct.activations import unwrap
from opct.batching import left_pad
from opct.engine.weights import MAX_COPY_BYTES, POOL_MAX_BYTES, EnginePool, Unsupported, empty, fused, interleave  # noqa: F401

# rope types whose cos/sin depend only on the position (not on the current sequence length)
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")
# what the engine reads of a Llama model: anything missing means a model it does not know
_MODEL_PARTS = ("model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb", "lm_head")
_LAYER_PARTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.head_dim",
                "self_attn.scaling", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "mlp.act_fn",
                "input_layernorm", "post_attention_layernorm")


def _bookkeeping(hook) -> bool:
    """DeepSpeed's engine hooks the root module for its timers and profiler (ZeRO-3 partitioning is refused by
    opct.train.sharded, fp16 input casting is never enabled by opct): they leave the forward's values alone."""
    return getattr(hook, "__qualname__", "").startswith("DeepSpeedEngine._create_module_forward_")


class NonFinite(Exception):
    """The model's probabilities are not finite (diverged weights): nothing can be sampled from them."""


def _has(obj, dotted: str) -> bool:
    for name in dotted.split("."):
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


def _check_structure(lm, cfg) -> None:
    """Unsupported unless `lm` has every part the engine reads (a llama model_type with another layout is refused
    here, by name, rather than failing half way through the weight snapshot)."""
    missing = [p for p in _MODEL_PARTS if not _has(lm, p)]
    missing += [f"config.{a}" for a in ("num_attention_heads", "num_key_value_heads") if not hasattr(cfg, a)]
    if not missing:
        missing = [f"model.layers[{i}].{p}" for i, layer in enumerate(lm.model.layers) for p in _LAYER_PARTS
                   if not _has(layer, p)]
    if missing:
        raise Unsupported(f"no {missing[0]}")


@dataclass
class _Layer:
    norm1: torch.nn.Module | float  # a float: the epsilon of an RMSNorm whose weight is folded into qkv_w
    qkv_w: torch.Tensor
    qkv_b: torch.Tensor | None
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    norm2: torch.nn.Module | float  # likewise, folded into gate_up_w
    gate_up_w: torch.Tensor
    gate_up_b: torch.Tensor | None
    down_w: torch.Tensor
    down_b: torch.Tensor | None
    act: object
    dnn: tuple[bool, bool, bool, bool]  # qkv, o, gate_up, down through oneDNN (`opct.cpu_matmul.for_engine`)


def _foldable(norm: torch.nn.Module, dtype) -> bool:
    """A float32 LlamaRMSNorm: weight * x / sqrt(mean(x^2) + eps), whose weight can move into the next matmul."""
    return type(norm).__name__ == "LlamaRMSNorm" and dtype == torch.float32 and norm.weight.dtype == torch.float32


class LlamaEngine:
    """Sampling over a snapshot of a Llama model's effective weights (take a new one after the weights change).

    `pool`: memory to reuse for the folded weights and the KV cache (see `EnginePool`); the snapshot then lives in
    the pool's memory, so take the next snapshot from the same pool only once this one is no longer used."""

    @torch.no_grad()  # a snapshot: no graph back to the adapter weights
    def __init__(self, model, pool: EnginePool | None = None):
        lm = unwrap(model)
        cfg = lm.config
        if getattr(cfg, "model_type", None) != "llama" or getattr(cfg, "pretraining_tp", 1) != 1:
            raise Unsupported(f"model_type {getattr(cfg, 'model_type', None)!r}")
        rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
        if rope not in _STATIC_ROPE:
            raise Unsupported(f"rope type {rope!r}")
        _check_structure(lm, cfg)
        # one walk over the modules (this runs before every sampling call)
        devices, linear_bytes = set(), 0
        for m in getattr(model, "module", model).modules():
            # forward hooks (activation recording, steering) would be bypassed: leave hooked models to generate()
            if any(not _bookkeeping(h) for h in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())):
                raise Unsupported("forward hooks")
            devices.update(p.device for p in m._parameters.values() if p is not None)
            if isinstance(m, torch.nn.Linear):
                linear_bytes += m.weight.numel() * m.weight.element_size()
        if torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks:
            raise Unsupported("forward hooks")
        if len(devices) != 1 or devices.pop().type == "meta":
            raise Unsupported("weights spread over devices or offloaded")  # device_map="auto" and the like
        if linear_bytes > MAX_COPY_BYTES:
            raise Unsupported(f"{linear_bytes} bytes of linear weights")
        if linear_bytes > POOL_MAX_BYTES:
            pool = None
        inner = lm.model
        if type(inner.embed_tokens) is not torch.nn.Embedding:
            raise Unsupported("embedding layer")
        self.embed_w = inner.embed_tokens.weight
        self.dtype, self.device = self.embed_w.dtype, self.embed_w.device
        self.rotary = inner.rotary_emb
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.scale = inner.layers[0].self_attn.head_dim, inner.layers[0].self_attn.scaling
        if self.head_dim % 2:
            raise Unsupported("odd head_dim")
        # rotate_half pairs dimension j with j + D/2 at one angle: cos and sin repeat after D/2
        cos, sin = self.rotary(self.embed_w, torch.arange(4, device=self.device)[None])
        half = self.head_dim // 2
        if not (torch.equal(cos[..., :half], cos[..., half:]) and torch.equal(sin[..., :half], sin[..., half:])):
            raise Unsupported("rotary embedding layout")
        q_perm = interleave(self.n_heads, self.head_dim, self.device)
        k_perm = interleave(self.n_kv, self.head_dim, self.device)
        self.pool = pool
        self.final_norm = self._norm_or_eps(inner.norm)
        self.lm_head_w, self.lm_head_b = fused([lm.lm_head], pool, "lm_head",
                                                col_scale=self._folded_scale(inner.norm))
        self.lm_head_dnn = cpu_matmul.for_engine(self.lm_head_w)
        self.layers = []
        for i, layer in enumerate(inner.layers):
            att, mlp = layer.self_attn, layer.mlp
            n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
            qkv_w, qkv_b = fused([att.q_proj, att.k_proj, att.v_proj], pool, f"{i}.qkv",
                                  row_perms=[q_perm, k_perm, None], col_scale=self._folded_scale(n1))
            o_w, o_b = fused([att.o_proj], pool, f"{i}.o")
            gu_w, gu_b = fused([mlp.gate_proj, mlp.up_proj], pool, f"{i}.gate_up", col_scale=self._folded_scale(n2))
            down_w, down_b = fused([mlp.down_proj], pool, f"{i}.down")
            dnn = tuple(cpu_matmul.for_engine(w) for w in (qkv_w, o_w, gu_w, down_w))
            self.layers.append(_Layer(self._norm_or_eps(n1), qkv_w, qkv_b, o_w, o_b, self._norm_or_eps(n2),
                                      gu_w, gu_b, down_w, down_b, mlp.act_fn, dnn))

    def _folded_scale(self, norm) -> torch.Tensor | None:
        return norm.weight if _foldable(norm, self.dtype) else None

    def _norm_or_eps(self, norm) -> torch.nn.Module | float:
        return float(norm.variance_epsilon) if _foldable(norm, self.dtype) else norm

    # -------------------------------------------------------------------------------------------- forward

    def _forward(self, ids_B_T, rot_B_T_R, cache, start: int, mask_B_1_T_S) -> torch.Tensor:
        """Run tokens at cache columns [start, start + T) through the model; return the last column's hidden state,
        normalised by the final norm. `rot_B_T_R` holds each position's rotary angles as unit complex numbers."""
        B, T = ids_B_T.shape
        H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
        x = F.embedding(ids_B_T.reshape(-1), self.embed_w)  # (B*T, d): tokens as rows throughout
        rot = rot_B_T_R[:, :, None]
        end = start + T
        for layer, (k_cache, v_cache) in zip(self.layers, cache):
            qkv = _linear(_norm(layer.norm1, x), layer.qkv_w, layer.qkv_b, layer.dnn[0])
            # q and k rows are in interleaved order (see `interleave`), so the rotation is one complex multiply;
            # attention only takes dot products between q and k, which one shared reordering leaves unchanged
            qk = torch.view_as_complex(qkv[:, :(H + Hkv) * D].view(B, T, H + Hkv, D // 2, 2).float())
            qk = torch.view_as_real(qk * rot).view(B, T, H + Hkv, D).to(self.dtype).transpose(1, 2)
            v = qkv[:, (H + Hkv) * D:].view(B, T, Hkv, D).transpose(1, 2)
            k_cache[:, :, start:end] = qk[:, H:]
            v_cache[:, :, start:end] = v
            att = F.scaled_dot_product_attention(qk[:, :H], k_cache[:, :, :end], v_cache[:, :, :end],
                                                 attn_mask=mask_B_1_T_S, scale=self.scale, enable_gqa=H != Hkv)
            x = _residual(x, att.transpose(1, 2).reshape(B * T, H * D), layer.o_w, layer.o_b, layer.dnn[1])
            gate, up = _linear(_norm(layer.norm2, x), layer.gate_up_w, layer.gate_up_b, layer.dnn[2]).chunk(2, -1)
            x = _residual(x, layer.act(gate) * up, layer.down_w, layer.down_b, layer.dnn[3])
        return _norm(self.final_norm, x.view(B, T, -1)[:, -1])

    def _logits(self, normed_B_d) -> torch.Tensor:
        return _linear(normed_B_d, self.lm_head_w, self.lm_head_b, self.lm_head_dnn).float()

    # -------------------------------------------------------------------------------------------- sampling

    @torch.inference_mode()
    def sample(self, prompts_ids: Sequence[list[int]], max_new_tokens: int, temperature: float, eos_ids: list[int],
               pad_id: int, min_new_tokens: int = 0, top_p: float = 1.0,
               uniforms_B_T: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample up to `max_new_tokens` per prompt (greedy decoding at `temperature` 0; nucleus sampling when
        `top_p` < 1). Returns (tokens_B_T, logp_B_T) on the CPU: T <= max_new_tokens (the loop stops once every row
        has an EOS); after a row's first EOS its tokens are `pad_id`. logp is the sampling distribution's (at
        temperature 0: the model's own). `uniforms_B_T` (B x max_new_tokens, in [0, 1)): the draws of each row and
        step, instead of the global RNG's (so a row's sample does not depend on its batch-mates). Torch-function
        modes are off inside (`opct.cpu_matmul.no_interception`: a mode's Python cost per op would land on each of a
        decode step's ~90 small ops); large weights go through oneDNN where the training step chose it
        (`opct.cpu_matmul.for_engine`)."""
        if uniforms_B_T is not None and tuple(uniforms_B_T.shape) != (len(prompts_ids), max_new_tokens):
            raise ValueError(f"uniforms_B_T: shape {tuple(uniforms_B_T.shape)}, expected "
                             f"{(len(prompts_ids), max_new_tokens)}")
        with cpu_matmul.no_interception():
            return self._sample(prompts_ids, max_new_tokens, temperature, eos_ids, pad_id, min_new_tokens, top_p,
                                uniforms_B_T)

    def _sample(self, prompts_ids, max_new_tokens, temperature, eos_ids, pad_id, min_new_tokens, top_p, uniforms_B_T):
        B, dev = len(prompts_ids), self.device
        P = max(len(p) for p in prompts_ids)
        S = P + max_new_tokens
        # Identical prompts (n samples per pair) share one prefill; their caches are copied into each row.
        unique: dict[tuple, int] = {}
        row_of = [unique.setdefault(tuple(p), len(unique)) for p in prompts_ids]
        U = len(unique)
        prompt_ids, _ = left_pad([list(p) for p in unique], pad_id, P)
        lengths = torch.tensor([len(p) for p in unique], dtype=torch.long)
        cols = torch.arange(S)
        valid_U_S = (cols[None, :] >= P - lengths[:, None])
        pos_U_S = (cols[None, :] - (P - lengths[:, None])).clamp(min=0)
        prompt_ids, valid_U_S, pos_U_S = prompt_ids.to(dev), valid_U_S.to(dev), pos_U_S.to(dev)
        cos_U_S_D, sin_U_S_D = self.rotary(self.embed_w, pos_U_S)
        half = self.head_dim // 2
        rot_U_S_R = torch.complex(cos_U_S_D[..., :half].float(), sin_U_S_D[..., :half].float())

        def new_cache(n, name):
            shape = (n, self.n_kv, S, self.head_dim)
            # a large batch's cache is not kept: the pool would hold it for as long as the policy lives
            nbytes = 2 * len(self.layers) * math.prod(shape) * self.embed_w.element_size()
            pool = self.pool if nbytes <= POOL_MAX_BYTES else None
            return [(empty(pool, f"{name}.{i}.k", shape, self.dtype, dev),
                     empty(pool, f"{name}.{i}.v", shape, self.dtype, dev)) for i in range(len(self.layers))]

        # prefill: causal over real keys; a padding query attends to itself only (keeps its row finite)
        causal_P_P = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        eye_P_P = torch.eye(P, dtype=torch.bool, device=dev)
        mask = _additive(((causal_P_P[None] & valid_U_S[:, None, :P]) | eye_P_P[None])[:, None], self.dtype)
        prefill_cache = new_cache(U, "prefill")
        hidden = self._forward(prompt_ids, rot_U_S_R[:, :P], prefill_cache, 0, mask)
        index = torch.tensor(row_of, device=dev)
        if U == B and row_of == list(range(B)):
            cache = prefill_cache
        else:
            cache = new_cache(B, "cache")
            for (k, v), (k_u, v_u) in zip(cache, prefill_cache):
                k[:, :, :P] = k_u[index, :, :P]
                v[:, :, :P] = v_u[index, :, :P]
            del prefill_cache
        hidden = hidden[index]
        bias_B_1_1_S = _additive(valid_U_S[index][:, None, None], self.dtype)
        rot_B_S_R = rot_U_S_R[index]

        eos = torch.tensor(eos_ids, device=dev)
        pad_B = torch.full((B,), pad_id, dtype=torch.long, device=dev)
        done_B = torch.zeros(B, dtype=torch.bool, device=dev)
        tokens, logps = [], []
        for t in range(max_new_tokens):
            logits_B_V = self._logits(hidden)
            if temperature not in (0.0, 1.0):
                logits_B_V = logits_B_V / temperature
            if t < min_new_tokens:
                logits_B_V.index_fill_(1, eos, -float("inf"))
            logp_B_V = torch.log_softmax(logits_B_V, -1)
            if top_p < 1.0 and temperature > 0:
                logp_B_V = nucleus(logp_B_V, top_p)
            tok_B = logp_B_V.argmax(-1) if temperature == 0 else \
                _draw(logp_B_V, None if uniforms_B_T is None else uniforms_B_T[:, t:t + 1].to(dev, logp_B_V.dtype))
            logps.append(logp_B_V.gather(-1, tok_B[:, None])[:, 0])
            tok_B = torch.where(done_B, pad_B, tok_B)
            tokens.append(tok_B)
            done_B |= torch.isin(tok_B, eos)
            if t == max_new_tokens - 1 or bool(done_B.all()):
                break
            col = P + t
            hidden = self._forward(tok_B[:, None], rot_B_S_R[:, col:col + 1], cache, col, bias_B_1_1_S[..., :col + 1])
        logp_B_T = torch.stack(logps, 1).cpu()
        if not bool(torch.isfinite(logp_B_T).all()):  # checked once here rather than at every step
            raise NonFinite("the model's probabilities are not finite")
        return torch.stack(tokens, 1).cpu(), logp_B_T


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, dnn: bool) -> torch.Tensor:
    """F.linear, or through oneDNN (`dnn`: a weight `opct.cpu_matmul.for_engine` picked)."""
    return cpu_matmul.dense(x, w, b) if dnn else F.linear(x, w, b)


def _residual(x_N_d: torch.Tensor, h_N_k: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
              dnn: bool) -> torch.Tensor:
    """x + linear(h): one matmul that accumulates onto x when there is no bias (`dnn`: oneDNN's product, then the
    sum)."""
    if dnn:
        return x_N_d + cpu_matmul.dense(h_N_k, w, b)
    if b is None:
        return torch.addmm(x_N_d, h_N_k, w.t())
    return x_N_d + F.linear(h_N_k, w, b)


def _norm(norm: torch.nn.Module | float, x: torch.Tensor) -> torch.Tensor:
    """An RMSNorm. A float is the epsilon of one whose weight is folded into the next matmul: x / sqrt(mean(x^2) +
    eps) is then computed as the layer norm of [x, -x] (mean 0, variance mean(x^2)), one fused kernel on the CPU
    instead of the ~7 that an RMSNorm takes there."""
    if isinstance(norm, float):
        d = x.shape[-1]
        return F.layer_norm(torch.cat((x, -x), -1), (2 * d,), eps=norm)[..., :d]
    return norm(x)


def _additive(allowed: torch.Tensor, dtype) -> torch.Tensor:
    """A boolean attention mask as the additive one SDPA would build from it (0 where allowed, -inf elsewhere)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, -float("inf"))


def nucleus(logp_B_V: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus (top-p) restriction of log-probs: keep, per row, the most probable tokens until their mass reaches
    `top_p` (the token that crosses it included, so at least one is kept), renormalised; the rest get -inf."""
    sorted_B_V, order_B_V = logp_B_V.sort(-1, descending=True)
    mass_before_B_V = sorted_B_V.exp().cumsum(-1) - sorted_B_V.exp()
    drop_B_V = torch.zeros_like(sorted_B_V, dtype=torch.bool).scatter(-1, order_B_V, mass_before_B_V >= top_p)
    return torch.log_softmax(logp_B_V.masked_fill(drop_B_V, -float("inf")), -1)


def _draw(logp_B_V: torch.Tensor, u01_B_1: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row from exp(logp_B_V), by inverse CDF on one uniform draw per row (`u01_B_1`, in [0, 1), or
    the global RNG's).

    The draw is kept strictly below the total mass, so the chosen token always has a positive probability. Rows that
    are not finite (diverged weights) are caught by the caller through their log-probs.
    """
    cdf_B_V = logp_B_V.exp().cumsum(-1)
    total_B_1 = cdf_B_V[:, -1:]
    if u01_B_1 is None:
        u01_B_1 = torch.rand(total_B_1.shape, device=total_B_1.device, dtype=total_B_1.dtype)
    u_B_1 = u01_B_1 * total_B_1
    u_B_1 = torch.minimum(u_B_1, torch.nextafter(total_B_1, torch.zeros_like(total_B_1)))
    return torch.searchsorted(cdf_B_V, u_B_1, right=True)[:, 0].clamp(max=logp_B_V.shape[-1] - 1)


def try_engine(model, pool: EnginePool | None = None) -> tuple[LlamaEngine | None, str | None]:
    """(a `LlamaEngine` over the model's current weights, None), or (None, why) when the model is outside what the
    engine reproduces — the one signal on which sampling falls back to `generate`."""
    try:
        return LlamaEngine(model, pool), None
    except Unsupported as e:
        return None, str(e)


def llama_engine(model, pool: EnginePool | None = None) -> LlamaEngine | None:
    """A `LlamaEngine` over the model's current weights (in `pool` memory when given), or None when the model is
    outside what it reproduces."""
    return try_engine(model, pool)[0]
