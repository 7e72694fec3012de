"""Reading activations at named sites (DESIGN §3), with forward hooks on a Hugging Face causal LM.

Sites, per decoder layer `l` (0-based; a layer subset may be asked for):
  residual   the layer's raw output, the residual stream after block `l`: (B, L, D). Not the final norm.
  mlp        the MLP hidden state, i.e. the input of the MLP's down projection (after the activation and, in gated
             MLPs, the gate): (B, L, F). Read by a forward *pre*-hook on the down projection.
  attention  the attention probabilities of every head: (B, H, L, L), rows = queries, columns = keys. Only the
             eager attention implementation materialises them (sdpa/flash return None); see `use_eager_attention`.

Usage, for any forward the caller runs (with or without gradients — captured tensors keep their graph):

    with record(model, ("residual", "mlp"), layers=[0, 3]) as rec:
        model(input_ids=..., attention_mask=...)
    rec.residual[3]  # (B, L, D)

`model` may be wrapped by DDP or peft (LoRA): the hooks go on the modules of the transformers model inside, so the
same hooks see the student (adapters on) and the LoRA teacher (adapters disabled). Hooks are removed when the
`with` block ends, so recomputation in backward (gradient checkpointing) does not capture again.

Architectures: where the sites live is a table (`ARCHITECTURES`) keyed by `config.model_type`. The Llama family
(Llama, Mistral, Qwen2/3, Gemma, OLMo, Phi-3, ...: `model.layers[i].mlp.down_proj`, `.self_attn`), GPT-2 and
GPT-NeoX are listed; an unlisted model type with the Llama layout is accepted; anything else is an OpctError.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence

import torch

from opct.errors import OpctError

if TYPE_CHECKING:
    from opct.batching import PromptBatch

SITES = ("residual", "mlp", "attention")


@dataclass(frozen=True)
class Layout:
    """Where the sites are: dotted attribute paths, from the transformers model and from each decoder layer."""

    layers: str  # the decoder layer list, from the *ForCausalLM model
    down_proj: str  # in a layer: the MLP's down projection (its input is the MLP hidden state)
    attention: str  # in a layer: the self-attention module; its forward returns (output, probabilities, ...)


_LLAMA = Layout("model.layers", "mlp.down_proj", "self_attn")
ARCHITECTURES = {
    **{t: _LLAMA for t in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "olmo", "olmo2", "phi3",
                           "granite", "smollm3")},
    "gpt2": Layout("transformer.h", "mlp.c_proj", "attn"),
    "gpt_neox": Layout("gpt_neox.layers", "mlp.dense_4h_to_h", "attention"),
}


def unwrap(model) -> torch.nn.Module:
    """The transformers model under DDP (`.module`) and peft (`get_base_model()`) wrappers."""
    model = getattr(model, "module", model)
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def _get(obj, path: str):
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def _has(obj, path: str) -> bool:
    try:
        _get(obj, path)
        return True
    except AttributeError:
        return False


def layout(model) -> Layout:
    """The site layout of `model`'s architecture, or an OpctError naming what is unsupported."""
    inner = unwrap(model)
    model_type = getattr(getattr(inner, "config", None), "model_type", None)
    found = ARCHITECTURES.get(model_type)
    if found is None and _has(inner, _LLAMA.layers):  # an unlisted architecture with the Llama layout
        layers = _get(inner, _LLAMA.layers)
        if len(layers) and _has(layers[0], _LLAMA.down_proj) and _has(layers[0], _LLAMA.attention):
            found = _LLAMA
    if found is None or not _has(inner, found.layers):
        raise OpctError(
            f"reading activations is not supported for architecture {model_type or type(inner).__name__!r}: "
            f"supported are {', '.join(sorted(ARCHITECTURES))} and other models laid out like Llama "
            f"(model.layers[i].mlp.down_proj, .self_attn); add its layout to opct.activations.ARCHITECTURES")
    return found


def decoder_layers(model) -> list[torch.nn.Module]:
    return list(_get(unwrap(model), layout(model).layers))


def num_layers(model) -> int:
    return len(decoder_layers(model))


def parse_layers(spec: str, n_layers: int) -> list[int]:
    """'' -> every layer; '0,2,-1' -> [0, 2, n-1] (negative counts from the end). Sorted, without repeats."""
    if not spec.strip():
        return list(range(n_layers))
    chosen = set()
    for part in spec.split(","):
        part = part.strip()
        try:
            i = int(part)
        except ValueError:
            raise OpctError(f"layers: {part!r} is not a layer index (give comma-separated integers, e.g. 0,2,-1)") \
                from None
        if not -n_layers <= i < n_layers:
            raise OpctError(f"layers: index {i} is out of range; the model has {n_layers} decoder layers")
        chosen.add(i % n_layers)
    return sorted(chosen)


def use_eager_attention(model) -> None:
    """Switch the attention implementation to eager, the one that returns attention probabilities."""
    inner = unwrap(model)
    if getattr(inner.config, "_attn_implementation", None) == "eager":
        return
    if not hasattr(inner, "set_attn_implementation"):
        raise OpctError(f"{type(inner).__name__}: cannot switch to eager attention (transformers too old?)")
    inner.set_attn_implementation("eager")
    if inner.config._attn_implementation != "eager":
        raise OpctError(f"{type(inner).__name__}: could not switch to eager attention, which is needed to read "
                        f"attention probabilities")


@dataclass
class Recording:
    """What `record` captured: site -> {layer index: tensor}. Tensors keep their autograd graph."""

    residual: dict[int, torch.Tensor] = field(default_factory=dict)
    mlp: dict[int, torch.Tensor] = field(default_factory=dict)
    attention: dict[int, torch.Tensor] = field(default_factory=dict)


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


@contextmanager
def record(model, sites: Sequence[str], layers: Sequence[int] | None = None) -> Iterator[Recording]:
    """Capture `sites` at `layers` (default: all) during the forward passes run inside the block.

    A second forward inside the same block overwrites the first one's tensors.
    """
    unknown = [s for s in sites if s not in SITES]
    if unknown:
        raise ValueError(f"unknown activation site(s) {unknown}; known: {', '.join(SITES)}")
    lay = layout(model)
    blocks = decoder_layers(model)
    layers = list(range(len(blocks))) if layers is None else list(layers)
    rec = Recording()
    handles = []

    def on_residual(i):
        def hook(module, args, output):
            rec.residual[i] = _first(output)
        return hook

    def on_mlp(i):
        def hook(module, args, kwargs):
            rec.mlp[i] = args[0] if args else kwargs["input"]
        return hook

    def on_attention(i):
        def hook(module, args, output):
            probs = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
            if probs is None:
                raise OpctError(f"layer {i}: the attention module returned no probabilities; the "
                                f"{getattr(unwrap(model).config, '_attn_implementation', '?')!r} attention "
                                f"implementation does not compute them. Switch to eager attention "
                                f"(opct.activations.use_eager_attention) to read them")
            rec.attention[i] = probs
        return hook

    try:
        for i in layers:
            block = blocks[i]
            if "residual" in sites:
                handles.append(block.register_forward_hook(on_residual(i)))
            if "mlp" in sites:
                handles.append(_get(block, lay.down_proj).register_forward_pre_hook(on_mlp(i), with_kwargs=True))
            if "attention" in sites:
                handles.append(_get(block, lay.attention).register_forward_hook(on_attention(i)))
        yield rec
    finally:
        for h in handles:
            h.remove()


# ------------------------------------------------------------------------------------------------ prompt batches

def forward_prompts(model, batch: "PromptBatch"):
    """Run `model` on a prompt batch for its activations; logits are computed for the last column only (when the
    model supports `logits_to_keep`), since nothing reads them."""
    import inspect

    kwargs = dict(input_ids=batch.input_ids_B_W, attention_mask=batch.attention_mask_B_W,
                  position_ids=batch.position_ids_B_W, use_cache=False)
    if "logits_to_keep" in inspect.signature(unwrap(model).forward).parameters:
        kwargs["logits_to_keep"] = 1
    return model(**kwargs)
