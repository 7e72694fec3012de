"""The lean sampler behind HFPolicy.sample for Llama models (opct/engine.py), against the model's own forward."""

import math

import pytest
import torch

import tiny_lm
from tiny_lm import one_thread  # noqa: F401  (autouse fixture: one intra-op thread)
from opct.engine import llama_engine
from opct.policy import HFPolicy, load_policy, pack, response_logits


@pytest.fixture(scope="module")
def policy():
    return load_policy(tiny_lm.model_dir())


def _prompts(policy):
    """Prompts of three different lengths, one of them twice (rows that share a prefill)."""
    return [policy.render(tiny_lm.biased_q("sky", "red")), policy.render(tiny_lm.clean_q("coal")),
            policy.render(tiny_lm.biased_q("sky", "red")), policy.render([{"role": "user", "content": "sun ?"}])]


def _forward_logprobs(model, prompts, samples, temperature=1.0, forbid=()):
    """log softmax(logits / T) of the sampled tokens under a separate (padded, batched) forward of `model`, with the
    `forbid` tokens masked out (as `min_new_tokens` masks EOS)."""
    batch = pack(prompts, samples.response_ids, 0, "cpu")
    with torch.no_grad():
        logits = response_logits(model, batch)
    logits[..., list(forbid)] = -float("inf")
    return torch.log_softmax(logits.float() / temperature, -1).gather(-1, batch.response_ids_B_R[..., None])[..., 0]


def _lora(model, seed=0):
    """The model under a LoRA adapter on every linear layer, with non-zero B so the adapter changes the outputs."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                  task_type="CAUSAL_LM"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return peft_model.eval()


def test_llama_models_take_the_engine_and_other_architectures_do_not(policy):
    from transformers import GPT2Config, GPT2LMHeadModel

    assert llama_engine(policy.model) is not None
    tok = tiny_lm.make_tokenizer()
    assert llama_engine(GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=4))) is None


def test_models_past_the_copy_budget_fall_back_to_generate(policy, monkeypatch):
    import opct.engine

    monkeypatch.setattr(opct.engine, "MAX_COPY_BYTES", 1000)
    assert llama_engine(policy.model) is None
    torch.manual_seed(0)
    smp = policy.sample([policy.render(tiny_lm.clean_q("sky"))], max_new_tokens=12)
    assert smp.response_ids[0][-1] in policy.eos_ids


def test_a_model_with_forward_hooks_falls_back_to_generate(policy):
    """Hooks (activation recording, steering) only run inside the model's own forward, so the engine must not skip
    them."""
    seen = []
    handle = policy.model.model.layers[0].register_forward_hook(lambda *_: seen.append(1))
    try:
        assert llama_engine(policy.model) is None
        smp = policy.sample([policy.render(tiny_lm.clean_q("sky"))], max_new_tokens=3)
    finally:
        handle.remove()
    assert len(smp.response_ids[0]) == 3 and seen
    assert llama_engine(policy.model) is not None


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_match_the_models_forward_under_lora(temperature):
    """Merged-weight sampling reports the log-probs the adapter model (3 matmuls per linear) assigns; with the
    adapter disabled, those of the base model — and the two differ, so the adapter really was folded in."""
    tok = tiny_lm.make_tokenizer()
    model = _lora(tiny_lm.make_model(tok, seed=3))
    policy = HFPolicy(model, tok)
    assert llama_engine(model) is not None
    prompts = _prompts(policy)
    torch.manual_seed(0)
    smp = policy.sample(prompts, max_new_tokens=10, temperature=temperature)
    want = _forward_logprobs(model, prompts, smp, temperature)
    with model.disable_adapter():
        torch.manual_seed(0)
        base_smp = policy.sample(prompts, max_new_tokens=10, temperature=temperature)
        base_want = _forward_logprobs(model, prompts, base_smp, temperature)
    base_scored_with_adapter = _forward_logprobs(model, prompts, base_smp, temperature)
    for i in range(len(prompts)):
        n = len(smp.logprobs[i])
        assert torch.allclose(torch.tensor(smp.logprobs[i]), want[i, :n], atol=1e-4), i
        m = len(base_smp.logprobs[i])
        assert torch.allclose(torch.tensor(base_smp.logprobs[i]), base_want[i, :m], atol=1e-4), i
    assert (base_want - base_scored_with_adapter).abs().max() > 1e-2


def test_engine_and_generate_report_the_same_logprobs_for_the_same_tokens(policy):
    """Both sampler paths describe one distribution: the engine's log-probs of its own tokens equal what generate's
    recorder reports when generate is forced to emit those tokens (scored here by the forward pass both must match)."""
    prompts = _prompts(policy)
    torch.manual_seed(2)
    fast = policy.sample(prompts, max_new_tokens=8)
    slow_policy = HFPolicy(policy.model, policy.tokenizer, fast_sampling=False)
    torch.manual_seed(2)
    slow = slow_policy.sample(prompts, max_new_tokens=8)
    for smp in (fast, slow):
        want = _forward_logprobs(policy.model, prompts, smp)
        for i, lp in enumerate(smp.logprobs):
            assert torch.allclose(torch.tensor(lp), want[i, :len(lp)], atol=1e-4)


def test_first_token_frequencies_follow_the_model(policy):
    """Draws follow softmax(logits / T): empirical first-token frequencies over many rows match the model's
    probabilities (a wrong temperature or a shifted position would fail this)."""
    prompt = policy.render(tiny_lm.biased_q("snow", "red"))
    n, temperature = 4000, 2.0
    torch.manual_seed(0)
    smp = policy.sample([prompt] * n, max_new_tokens=1, temperature=temperature)
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([prompt])).logits[0, -1]
    probs = torch.softmax(logits / temperature, -1)
    counts = torch.bincount(torch.tensor([r[0] for r in smp.response_ids]), minlength=len(probs)).double()
    assert len(set(r[0] for r in smp.response_ids)) > 3  # temperature 2 spreads the draws
    for v in torch.nonzero(probs > 0.02)[:, 0].tolist():
        sd = math.sqrt(n * probs[v] * (1 - probs[v]))
        assert abs(counts[v] - n * probs[v]) < 5 * sd, (v, counts[v].item(), n * probs[v].item())


def test_same_seed_same_samples_other_seed_other_samples(policy):
    prompts = _prompts(policy)

    def draw(seed):
        torch.manual_seed(seed)
        return policy.sample(prompts, max_new_tokens=10, temperature=1.5)

    a, b, c = draw(5), draw(5), draw(6)
    assert a.response_ids == b.response_ids and a.logprobs == b.logprobs
    assert a.response_ids != c.response_ids


def test_eos_stops_each_row_and_min_new_tokens_forbids_it_before(policy):
    prompts = _prompts(policy)
    torch.manual_seed(0)
    smp = policy.sample(prompts, max_new_tokens=12)
    assert not any(smp.truncated)  # the trained model answers in 6 tokens
    for ids in smp.response_ids:
        assert ids[-1] in policy.eos_ids and not any(i in policy.eos_ids for i in ids[:-1])
    torch.manual_seed(0)
    smp = policy.sample(prompts, max_new_tokens=9, min_new_tokens=9)
    assert all(len(ids) == 9 for ids in smp.response_ids) and all(smp.truncated)
    assert not any(i in policy.eos_ids for ids in smp.response_ids for i in ids)
    # the log-probs are the constrained sampler's: EOS masked out, the rest renormalised
    batch = pack(prompts, smp.response_ids, policy.pad_id, "cpu")
    with torch.no_grad():
        logits = response_logits(policy.model, batch)
    logits[..., policy.eos_ids] = -float("inf")
    want = torch.log_softmax(logits, -1).gather(-1, batch.response_ids_B_R[..., None])[..., 0]
    for i, lp in enumerate(smp.logprobs):
        assert torch.allclose(torch.tensor(lp), want[i], atol=1e-4)


def test_sampling_leaves_the_weights_untouched():
    tok = tiny_lm.make_tokenizer()
    model = _lora(tiny_lm.make_model(tok, seed=4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    HFPolicy(model, tok).sample([[tok.bos_token_id]] * 2, max_new_tokens=5)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_diverged_weights_are_a_clear_error(policy):
    from opct.errors import OpctError

    tok = tiny_lm.make_tokenizer()
    model = tiny_lm.make_model(tok, seed=5)
    with torch.no_grad():
        model.lm_head.weight[3, 0] = float("nan")
    broken = HFPolicy(model, tok)
    assert llama_engine(model) is not None
    with pytest.raises(OpctError, match="not finite"):
        broken.sample([policy.render(tiny_lm.clean_q("sky"))] * 2, max_new_tokens=4)


def test_the_policys_kept_memory_is_reused_and_still_sees_every_weight_edit():
    """HFPolicy keeps the engine's folded weights and KV cache between calls (opct.engine.EnginePool). Their memory
    is reused, but the weights are re-read on every call: an edit through `.data`, which no version counter sees,
    must still change what is sampled."""
    tok = tiny_lm.make_tokenizer()
    model = _lora(tiny_lm.make_model(tok, seed=6))
    policy = HFPolicy(model, tok)
    prompts = _prompts(policy)
    torch.manual_seed(0)
    first = policy.sample(prompts, max_new_tokens=6)
    kept = {k: v.data_ptr() for k, v in policy._engine_pool._store.items()}
    assert any(k.endswith("qkv") for k in kept) and any(".k" in k for k in kept)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.mul_(-1.0)
    torch.manual_seed(0)
    second = policy.sample(prompts, max_new_tokens=6)
    assert {k: v.data_ptr() for k, v in policy._engine_pool._store.items()} == kept
    assert first.logprobs != second.logprobs
    want = _forward_logprobs(model, prompts, second)
    for i, lp in enumerate(second.logprobs):
        assert torch.allclose(torch.tensor(lp), want[i, :len(lp)], atol=1e-4), i


def test_the_pool_does_not_keep_a_large_batchs_kv_cache(monkeypatch):
    """What the pool keeps is bounded by POOL_MAX_BYTES: a batch whose KV cache is larger gets fresh memory, which is
    freed after the call, so one large evaluation batch does not stay in memory for the policy's lifetime."""
    import opct.engine

    tok = tiny_lm.make_tokenizer()
    model = _lora(tiny_lm.make_model(tok, seed=7))
    policy = HFPolicy(model, tok)
    prompt = policy.render(tiny_lm.clean_q("sky"))
    policy.sample([prompt] * 2, max_new_tokens=4)
    store = policy._engine_pool._store
    kv_sizes = {k: v.numel() for k, v in store.items() if k.endswith((".k", ".v"))}
    assert kv_sizes  # a small batch's cache is kept
    linear_bytes = sum(m.weight.numel() * m.weight.element_size() for m in model.modules()
                       if isinstance(m, torch.nn.Linear))
    monkeypatch.setattr(opct.engine, "POOL_MAX_BYTES", linear_bytes)  # the weights still fit, 256 rows' cache not
    smp = policy.sample([prompt] * 256, max_new_tokens=4)
    assert len(smp.response_ids) == 256
    assert {k: v.numel() for k, v in store.items() if k.endswith((".k", ".v"))} == kv_sizes


def _variant(seed, dtype=torch.float32, **overrides):
    """A tiny Llama with `overrides` on its config, under LoRA, with every norm weight and bias randomised (at
    initialisation they are ones and zeros, which would hide a norm weight folded in wrongly or a bias left out)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_lm.make_tokenizer()
    cfg = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64, pad_token_id=tok.pad_token_id,
               bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{**cfg, **overrides})).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    return _lora(model.to(dtype), seed), tok


@pytest.mark.parametrize("variant", ["gqa", "heads=kv_heads", "biases", "llama3 rope", "float64", "bfloat16"])
def test_engine_logprobs_match_the_forward_across_llama_variants(variant):
    """The engine folds norm weights into the next matmul and reorders q/k rows for its rotary multiply; the
    log-probs it reports must stay the model's own on every layout that reaches it."""
    overrides, dtype = {}, torch.float32
    if variant == "heads=kv_heads":
        overrides = {"num_key_value_heads": 4}
    elif variant == "biases":
        overrides = {"attention_bias": True, "mlp_bias": True}
    elif variant == "llama3 rope":
        overrides = {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
                                         "rope_theta": 10000.0}}
    elif variant == "float64":
        dtype = torch.float64
    model, tok = _variant(11, dtype, **overrides)
    atol = 1e-4
    if variant == "bfloat16":  # no LoRA (a bf16 base with fp32 adapters goes to generate): norms unfolded
        model, atol = model.merge_and_unload().to(torch.bfloat16), 1e-2
    policy = HFPolicy(model, tok)
    assert llama_engine(model) is not None
    prompts = _prompts(policy)
    torch.manual_seed(0)
    smp = policy.sample(prompts, max_new_tokens=12, min_new_tokens=12)
    want = _forward_logprobs(model, prompts, smp, forbid=policy.eos_ids)
    for i, lp in enumerate(smp.logprobs):
        assert torch.allclose(torch.tensor(lp, dtype=torch.float64), want[i].double(), atol=atol), (variant, i)


def test_a_rotary_table_other_than_rotate_halfs_falls_back_to_generate(policy):
    """The complex rotary multiply assumes cos and sin repeat after half the head dimension (rotate_half's pairs);
    a rotary module that breaks this must send sampling back to generate()."""
    tok = tiny_lm.make_tokenizer()
    model = tiny_lm.make_model(tok, seed=12)
    assert llama_engine(model) is not None
    rotary = model.model.rotary_emb

    class Shuffled(torch.nn.Module):
        def forward(self, x, position_ids):
            cos, sin = rotary(x, position_ids)
            ramp = torch.linspace(0.5, 1.5, cos.shape[-1])
            return cos * ramp, sin * ramp

    model.model.rotary_emb = Shuffled()
    assert llama_engine(model) is None
