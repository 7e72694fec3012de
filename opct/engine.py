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
  sampling  pure temperature sampling from softmax(logits / T), by inverse CDF: one uniform draw per row from the
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

from opct.activations import unwrap

# rope types whose cos/sin depend only on the position (not on the current sequence length)
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")
# The engine saves per-token Python overhead, which is what bounds small models; its fused (and LoRA-merged) weights
# are copies of up to all linear weights. Past this many bytes of them a model is compute-bound anyway, and sampling
# stays with generate(), which makes no copy.
MAX_COPY_BYTES = 1 << 30
# An `EnginePool` keeps those copies (and, separately, a KV cache) between calls only up to this size: past it the
# arithmetic dwarfs the page faults the pool saves, and the memory would stay taken for as long as the policy lives.
POOL_MAX_BYTES = 64 << 20


class Unsupported(Exception):
    """The model (or one of its adapters) is outside what the engine reproduces exactly."""


def _parts(module: torch.nn.Module):
    """(base weight, base bias, [(B, A, scaling), ...]) that `module(x)` applies in eval mode: a plain Linear, or a
    peft LoRA Linear with its active adapters, mirroring `peft.tuners.lora.Linear.forward` (merged -> base only;
    disabled -> base only)."""
    if type(module) is torch.nn.Linear:
        return module.weight, module.bias, []
    try:
        from peft.tuners.lora import Linear as LoraLinear
    except ImportError:  # peft is optional for inference
        raise Unsupported(type(module).__name__) from None
    if type(module) is not LoraLinear or type(module.get_base_layer()) is not torch.nn.Linear:
        raise Unsupported(type(module).__name__)
    base = module.get_base_layer()
    if module.disable_adapters:
        if module.merged:  # peft would unmerge in place here; leave that to the slow path
            raise Unsupported("disabled but merged adapter")
        return base.weight, base.bias, []
    if module.merged:
        return base.weight, base.bias, []
    deltas = []
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        if name in getattr(module, "lora_variant", {}) or getattr(module, "lora_bias", {}).get(name):
            raise Unsupported(f"LoRA variant on adapter {name!r}")
        A, B = module.lora_A[name].weight, module.lora_B[name].weight
        if module.fan_in_fan_out or A.dtype != base.weight.dtype or B.dtype != base.weight.dtype:
            raise Unsupported("LoRA layout or dtype")
        deltas.append((B, A, module.scaling[name]))
    return base.weight, base.bias, deltas


class EnginePool:
    """Tensors kept between engine calls, by name: a request for a name gets the same memory back while it is big
    enough (see the module docstring). Not thread-safe, like the policy that owns it."""

    def __init__(self):
        self._store: dict[str, torch.Tensor] = {}

    def take(self, name: str, shape: Sequence[int], dtype, device) -> torch.Tensor:
        """An uninitialised tensor of `shape`, a view of the memory last given under `name` when that fits."""
        n = math.prod(shape)
        flat = self._store.get(name)
        if flat is None or flat.numel() < n or flat.dtype != dtype or flat.device != torch.device(device):
            flat = self._store[name] = torch.empty(n, dtype=dtype, device=device)
        return flat[:n].view(shape)


def _empty(pool: EnginePool | None, name: str, shape, dtype, device) -> torch.Tensor:
    if pool is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return pool.take(name, shape, dtype, device)


def _fused(modules: Sequence[torch.nn.Module], pool: EnginePool | None = None, name: str = "",
           row_perms: Sequence[torch.Tensor | None] | None = None,
           col_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The effective (weight, bias) of linear layers that read the same input, stacked into one (out_1 + out_2 + ...,
    in) weight: base weight + scaling * B @ A for every active LoRA adapter, written straight into the stacked copy
    (in `pool` memory under `name` when a pool is given). `row_perms[i]`, when given, reorders module i's output rows
    (new row j = old row perm[j]); `col_scale` multiplies every input column (a preceding RMSNorm's weight folded in).
    A single plain layer with neither is returned as is (no copy)."""
    parts = [_parts(m) for m in modules]
    row_perms = list(row_perms) if row_perms is not None else [None] * len(parts)
    if len(parts) == 1 and not parts[0][2] and row_perms[0] is None and col_scale is None:
        return parts[0][0], parts[0][1]
    w0 = parts[0][0]
    weight = _empty(pool, name, (sum(w.shape[0] for w, _, _ in parts), w0.shape[1]), w0.dtype, w0.device)
    row = 0
    for (w, _, deltas), perm in zip(parts, row_perms):
        dst = weight[row:row + w.shape[0]]
        if perm is not None:
            torch.index_select(w, 0, perm, out=dst)
            for B, A, scaling in deltas:
                dst.addmm_(B[perm], A, alpha=scaling)
        else:
            if not deltas:
                dst.copy_(w)
            for i, (B, A, scaling) in enumerate(deltas):
                torch.addmm(w if i == 0 else dst, B, A, alpha=scaling, out=dst)
        row += w.shape[0]
    if col_scale is not None:
        weight.mul_(col_scale)
    biases = [b if b is None or perm is None else b[perm] for (_, b, _), perm in zip(parts, row_perms)]
    if all(b is None for b in biases):
        return weight, None
    return weight, torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for (w, _, _), b in zip(parts, biases)])


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


def _foldable(norm: torch.nn.Module, dtype) -> bool:
    """A float32 LlamaRMSNorm: weight * x / sqrt(mean(x^2) + eps), whose weight can move into the next matmul."""
    return type(norm).__name__ == "LlamaRMSNorm" and dtype == torch.float32 and norm.weight.dtype == torch.float32


def _interleave(n_heads: int, head_dim: int, device) -> torch.Tensor:
    """Row order that turns each head's rotate_half layout (pairs j, j + D/2) into interleaved pairs (2j, 2j + 1),
    the layout `torch.view_as_complex` reads."""
    j = torch.arange(head_dim, device=device)
    one_head = j // 2 + (j % 2) * (head_dim // 2)
    return (torch.arange(n_heads, device=device)[:, None] * head_dim + one_head).flatten()


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
        # one walk over the modules (this runs before every sampling call)
        devices, linear_bytes = set(), 0
        for m in getattr(model, "module", model).modules():
            # forward hooks (activation recording, steering) would be bypassed: leave hooked models to generate()
            if m._forward_hooks or m._forward_pre_hooks:
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
        q_perm = _interleave(self.n_heads, self.head_dim, self.device)
        k_perm = _interleave(self.n_kv, self.head_dim, self.device)
        self.pool = pool
        self.final_norm = self._norm_or_eps(inner.norm)
        self.lm_head_w, self.lm_head_b = _fused([lm.lm_head], pool, "lm_head",
                                                col_scale=self._folded_scale(inner.norm))
        self.layers = []
        for i, layer in enumerate(inner.layers):
            att, mlp = layer.self_attn, layer.mlp
            n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
            qkv_w, qkv_b = _fused([att.q_proj, att.k_proj, att.v_proj], pool, f"{i}.qkv",
                                  row_perms=[q_perm, k_perm, None], col_scale=self._folded_scale(n1))
            o_w, o_b = _fused([att.o_proj], pool, f"{i}.o")
            gu_w, gu_b = _fused([mlp.gate_proj, mlp.up_proj], pool, f"{i}.gate_up", col_scale=self._folded_scale(n2))
            down_w, down_b = _fused([mlp.down_proj], pool, f"{i}.down")
            self.layers.append(_Layer(self._norm_or_eps(n1), qkv_w, qkv_b, o_w, o_b, self._norm_or_eps(n2),
                                      gu_w, gu_b, down_w, down_b, mlp.act_fn))

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
            qkv = F.linear(_norm(layer.norm1, x), layer.qkv_w, layer.qkv_b)
            # q and k rows are in interleaved order (see `_interleave`), so the rotation is one complex multiply;
            # attention only takes dot products between q and k, which one shared reordering leaves unchanged
            qk = torch.view_as_complex(qkv[:, :(H + Hkv) * D].view(B, T, H + Hkv, D // 2, 2).float())
            qk = torch.view_as_real(qk * rot).view(B, T, H + Hkv, D).to(self.dtype).transpose(1, 2)
            v = qkv[:, (H + Hkv) * D:].view(B, T, Hkv, D).transpose(1, 2)
            k_cache[:, :, start:end] = qk[:, H:]
            v_cache[:, :, start:end] = v
            att = F.scaled_dot_product_attention(qk[:, :H], k_cache[:, :, :end], v_cache[:, :, :end],
                                                 attn_mask=mask_B_1_T_S, scale=self.scale, enable_gqa=H != Hkv)
            x = _residual(x, att.transpose(1, 2).reshape(B * T, H * D), layer.o_w, layer.o_b)
            gate, up = F.linear(_norm(layer.norm2, x), layer.gate_up_w, layer.gate_up_b).chunk(2, -1)
            x = _residual(x, layer.act(gate) * up, layer.down_w, layer.down_b)
        return _norm(self.final_norm, x.view(B, T, -1)[:, -1])

    def _logits(self, normed_B_d) -> torch.Tensor:
        return F.linear(normed_B_d, self.lm_head_w, self.lm_head_b).float()

    # -------------------------------------------------------------------------------------------- sampling

    @torch.inference_mode()
    def sample(self, prompts_ids: Sequence[list[int]], max_new_tokens: int, temperature: float, eos_ids: list[int],
               pad_id: int, min_new_tokens: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample up to `max_new_tokens` per prompt. Returns (tokens_B_T, logp_B_T) on the CPU: T <= max_new_tokens
        (the loop stops once every row has an EOS); after a row's first EOS its tokens are `pad_id`."""
        B, dev = len(prompts_ids), self.device
        P = max(len(p) for p in prompts_ids)
        S = P + max_new_tokens
        # Identical prompts (n samples per pair) share one prefill; their caches are copied into each row.
        unique: dict[tuple, int] = {}
        row_of = [unique.setdefault(tuple(p), len(unique)) for p in prompts_ids]
        U = len(unique)
        prompt_ids = torch.full((U, P), pad_id, dtype=torch.long)
        lengths = torch.zeros(U, dtype=torch.long)
        for p, u in unique.items():
            prompt_ids[u, P - len(p):] = torch.tensor(p, dtype=torch.long)
            lengths[u] = len(p)
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
            return [(_empty(pool, f"{name}.{i}.k", shape, self.dtype, dev),
                     _empty(pool, f"{name}.{i}.v", shape, self.dtype, dev)) for i in range(len(self.layers))]

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
            if temperature != 1.0:
                logits_B_V = logits_B_V / temperature
            if t < min_new_tokens:
                logits_B_V.index_fill_(1, eos, -float("inf"))
            logp_B_V = torch.log_softmax(logits_B_V, -1)
            tok_B = _draw(logp_B_V)
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
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        return torch.stack(tokens, 1).cpu(), logp_B_T


def _residual(x_N_d: torch.Tensor, h_N_k: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x + linear(h): one matmul that accumulates onto x when there is no bias."""
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


def _draw(logp_B_V: torch.Tensor) -> torch.Tensor:
    """One token per row from exp(logp_B_V), by inverse CDF on one uniform draw per row (global RNG).

    The draw is kept strictly below the total mass, so the chosen token always has a positive probability. Rows that
    are not finite (diverged weights) are caught by the caller through their log-probs.
    """
    cdf_B_V = logp_B_V.exp().cumsum(-1)
    total_B_1 = cdf_B_V[:, -1:]
    u_B_1 = torch.rand(total_B_1.shape, device=total_B_1.device, dtype=total_B_1.dtype) * total_B_1
    u_B_1 = torch.minimum(u_B_1, torch.nextafter(total_B_1, torch.zeros_like(total_B_1)))
    return torch.searchsorted(cdf_B_V, u_B_1, right=True)[:, 0].clamp(max=logp_B_V.shape[-1] - 1)


def llama_engine(model, pool: EnginePool | None = None) -> LlamaEngine | None:
    """A `LlamaEngine` over the model's current weights (in `pool` memory when given), or None when the model is
    outside what it reproduces."""
    try:
        return LlamaEngine(model, pool)
    except (Unsupported, AttributeError, TypeError):
        return None
