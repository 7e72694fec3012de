"""The engine's weights: what `module(x)` applies for a plain or peft-LoRA linear layer, folded into one stacked copy
per group of layers that read the same input (q/k/v, gate/up), in memory an `EnginePool` keeps between calls. See
`opct.engine` for why and how these copies are used."""

from __future__ import annotations

import math
from typing import Sequence

import torch

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


def empty(pool: EnginePool | None, name: str, shape, dtype, device) -> torch.Tensor:
    if pool is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return pool.take(name, shape, dtype, device)


def fused(modules: Sequence[torch.nn.Module], pool: EnginePool | None = None, name: str = "",
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
    weight = empty(pool, name, (sum(w.shape[0] for w, _, _ in parts), w0.shape[1]), w0.dtype, w0.device)
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


def interleave(n_heads: int, head_dim: int, device) -> torch.Tensor:
    """Row order that turns each head's rotate_half layout (pairs j, j + D/2) into interleaved pairs (2j, 2j + 1),
    the layout `torch.view_as_complex` reads."""
    j = torch.arange(head_dim, device=device)
    one_head = j // 2 + (j % 2) * (head_dim // 2)
    return (torch.arange(n_heads, device=device)[:, None] * head_dim + one_head).flatten()


@torch.no_grad()
def merged_weights(model):
    """Every parameter of `model` under the name a Hugging Face checkpoint of it would use, with each active LoRA
    adapter merged in: yields (name, tensor) pairs, e.g. ("model.layers.0.self_attn.q_proj.weight", W + scaling * B
    @ A). For weight pushes into another engine (opct.engine.vllm_sampler).

    The model is not touched (no `merge_adapter`): a merged weight is a new tensor, made one layer at a time, so the
    extra memory is one layer's weight. Wrappers are looked through (DDP's `.module`, peft's base model); peft's
    `.base_layer` and the adapter tensors do not appear in the names. A parameter shared by two modules (tied input
    and output embeddings) is yielded once, under its first name. Adapters that `_parts` does not reproduce (DoRA and
    other LoRA variants, LoRA on an embedding, fan-in-fan-out layouts, peft's `modules_to_save`) raise `Unsupported`,
    as does a LoRA delta on an output layer tied to the input embedding (a checkpoint cannot hold the two apart).
    """
    from opct.activations import unwrap

    lm = unwrap(model)
    seen: set[int] = set()
    lora_roots: list[str] = []  # modules whose subtree is a LoRA layer, already yielded merged
    tied = bool(getattr(getattr(lm, "config", None), "tie_word_embeddings", False))
    for name, module in lm.named_modules():
        if any(name.startswith(root + ".") for root in lora_roots):
            continue
        prefix = f"{name}." if name else ""
        if type(module).__name__ == "ModulesToSaveWrapper":  # peft's trained copy of a whole module
            raise Unsupported(f"peft modules_to_save ({name})")
        if hasattr(module, "get_base_layer") and hasattr(module, "lora_A"):  # a peft LoRA layer
            weight, bias, deltas = _parts(module)
            if deltas and tied and name == "lm_head":
                raise Unsupported("LoRA on an output layer tied to the input embedding")
            lora_roots.append(name)
            merged = weight.clone()
            for B, A, scaling in deltas:
                merged.addmm_(B, A, alpha=scaling)
            seen.add(id(weight))
            yield prefix + "weight", merged
            if bias is not None and id(bias) not in seen:
                seen.add(id(bias))
                yield prefix + "bias", bias
            continue
        for pname, p in module.named_parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                yield prefix + pname, p
