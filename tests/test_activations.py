"""Reading activations at named sites (opct/activations.py), on four Hugging Face architectures built tiny."""

import pytest
import torch

import tiny_lm
from tiny_lm import one_thread  # noqa: F401  (autouse fixture: one intra-op thread)
from opct.activations import layout, num_layers, parse_layers, record, use_eager_attention
from opct.batching import pad_left
from opct.errors import OpctError
from opct.policy import load_policy


def _build(arch: str):
    import transformers as T

    torch.manual_seed(0)
    small = dict(vocab_size=50, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=32)
    if arch == "llama":
        model = T.LlamaForCausalLM(T.LlamaConfig(hidden_size=16, intermediate_size=24, num_key_value_heads=2,
                                                 **small))
        final_norm = model.model.norm
    elif arch == "qwen2":
        model = T.Qwen2ForCausalLM(T.Qwen2Config(hidden_size=16, intermediate_size=24, num_key_value_heads=2, **small))
        final_norm = model.model.norm
    elif arch == "gpt2":
        model = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=4, n_positions=32,
                                               bos_token_id=0, eos_token_id=0))
        final_norm = model.transformer.ln_f
    else:
        model = T.GPTNeoXForCausalLM(T.GPTNeoXConfig(hidden_size=16, intermediate_size=24, **small))
        final_norm = model.gpt_neox.final_layer_norm
    return model.eval(), final_norm


ARCHS = ["llama", "qwen2", "gpt2", "gpt_neox"]


@pytest.mark.parametrize("arch", ARCHS)
def test_sites_match_what_the_model_reports_itself(arch):
    model, final_norm = _build(arch)
    use_eager_attention(model)
    ids = torch.randint(0, 50, (2, 7))
    mlp_out = {}
    lay = layout(model)
    blocks = [b for b in model.get_submodule(lay.layers)]
    hooks = [b.get_submodule(lay.down_proj).register_forward_hook(
        lambda m, a, o, i=i: mlp_out.__setitem__(i, o)) for i, b in enumerate(blocks)]
    with torch.no_grad(), record(model, ("residual", "mlp", "attention")) as rec:
        out = model(input_ids=ids, output_hidden_states=True, output_attentions=True)
    for h in hooks:
        h.remove()
    L = num_layers(model)
    assert L == 2 and sorted(rec.residual) == sorted(rec.mlp) == sorted(rec.attention) == [0, 1]
    # residual = each layer's raw output; transformers reports the last one after the final norm
    for layer in range(L - 1):
        assert torch.equal(rec.residual[layer], out.hidden_states[layer + 1])
    assert torch.allclose(final_norm(rec.residual[L - 1]), out.hidden_states[L], atol=1e-6)
    for layer in range(L):
        # the MLP hidden state is what the down projection reads: projecting it gives the projection's output
        down = blocks[layer].get_submodule(lay.down_proj)
        assert rec.mlp[layer].shape[-1] == (down.weight.shape[1] if arch != "gpt2" else down.weight.shape[0]) > 16
        assert torch.equal(down(rec.mlp[layer]), mlp_out[layer])
        assert torch.equal(rec.attention[layer], out.attentions[layer])
        assert rec.attention[layer].shape == (2, 4, 7, 7)
    # no hook of ours outlives its block (transformers adds hooks of its own on the first forward, hence the count)
    count_hooks = lambda: [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()]  # noqa: E731
    before = count_hooks()
    with torch.no_grad(), record(model, ("residual", "mlp", "attention")):
        assert count_hooks() != before
        model(input_ids=ids)
    assert count_hooks() == before


def test_layer_subset_and_gradients_flow_through_captured_tensors():
    model, _ = _build("llama")
    with record(model, ("residual", "mlp"), layers=[1]) as rec:
        model(input_ids=torch.randint(0, 50, (1, 5)))
    assert list(rec.residual) == [1] and list(rec.mlp) == [1]
    rec.mlp[1].pow(2).sum().backward()
    assert model.model.layers[0].mlp.up_proj.weight.grad is not None  # upstream of layer 1's MLP
    assert model.model.layers[1].mlp.down_proj.weight.grad is None  # downstream of the site


def test_attention_needs_eager_attention_and_says_so():
    model, _ = _build("llama")
    model.set_attn_implementation("sdpa")
    with pytest.raises(OpctError, match="no probabilities.*sdpa.*eager"):
        with record(model, ("attention",)):
            model(input_ids=torch.randint(0, 50, (1, 5)))


def test_unsupported_architecture_is_a_clear_error():
    import transformers as T

    bert = T.BertLMHeadModel(T.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=24, is_decoder=True))
    with pytest.raises(OpctError, match=r"not supported for architecture 'bert'.*gpt2.*llama"):
        with record(bert, ("residual",)):
            pass
    with pytest.raises(OpctError, match="not supported"):
        num_layers(torch.nn.Linear(2, 2))


def test_parse_layers():
    assert parse_layers("", 4) == [0, 1, 2, 3]
    assert parse_layers("0, -1,3", 4) == [0, 3]
    with pytest.raises(OpctError, match="index 4 is out of range; the model has 4"):
        parse_layers("4", 4)
    with pytest.raises(OpctError, match="'x' is not a layer index"):
        parse_layers("1,x", 4)


def test_policy_reads_activations_through_peft_and_left_padding():
    from peft import LoraConfig, get_peft_model

    policy = load_policy(tiny_lm.model_dir())
    short, long = policy.render(tiny_lm.clean_q("sky")), policy.render(tiny_lm.biased_q("sky", "red"))
    rec, batch = policy.read_activations([short, long], ("residual", "mlp"))
    alone, alone_batch = policy.read_activations([short], ("residual", "mlp"))
    assert batch.column(0, 0) == len(long) - len(short) and alone_batch.column(0, 0) == 0
    for site in ("residual", "mlp"):
        for layer in (0, 1):
            padded = getattr(rec, site)[layer][0, batch.column(0, 0):]
            assert torch.allclose(padded, getattr(alone, site)[layer][0], atol=1e-5)
    # a LoRA-wrapped model: the hooks land on the same decoder layers, adapters on or off
    policy.model = get_peft_model(policy.model, LoraConfig(r=2, target_modules="all-linear"))
    again, _ = policy.read_activations([short], ("mlp",))
    assert torch.equal(again.mlp[1], alone.mlp[1])  # B = 0: the adapter changes nothing yet


def test_pad_left_puts_every_prompt_end_in_the_last_column():
    b = pad_left([[5, 6, 7], [8]], pad_id=0, device="cpu")
    assert b.input_ids_B_W.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert b.position_ids_B_W[1].tolist()[-1] == 0 and b.column(1, 0) == 2 and b.column(0, 2) == 2
