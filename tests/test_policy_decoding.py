"""The policy interface is the one way to a model: greedy decoding (temperature 0) on both sampling paths, the fast
engine's fallback to generate() only on its typed signal (said once), and diverged weights as a clear error."""

import json

import pytest
import tiny_lm
import torch
from tiny_lm import one_thread  # noqa: F401  (autouse fixture: one intra-op thread)

from opct.errors import OpctError
from opct.policy import HFPolicy, load_policy, pack, response_logits


@pytest.fixture(scope="module")
def policy():
    return load_policy(tiny_lm.model_dir())


def _prompts(policy):
    return [policy.render(tiny_lm.biased_q("sky", "red")), policy.render(tiny_lm.clean_q("coal")),
            policy.render([{"role": "user", "content": "sun ?"}])]


def test_greedy_decoding_is_the_argmax_on_both_paths_and_draws_no_randomness(policy):
    prompts = _prompts(policy)
    state = torch.get_rng_state()
    fast = policy.sample(prompts, 10, temperature=0)
    assert torch.equal(torch.get_rng_state(), state)  # argmax: nothing drawn
    slow = HFPolicy(policy.model, policy.tokenizer, fast_sampling=False).sample(prompts, 10, temperature=0)
    assert fast.response_ids == slow.response_ids and fast.texts == slow.texts
    # every token is the argmax of the model's own forward at its position, and its log-prob is the model's (T = 1)
    batch = pack(prompts, fast.response_ids, policy.pad_id, "cpu")
    with torch.no_grad():
        logp = torch.log_softmax(response_logits(policy.model, batch).float(), -1)
    for i, ids in enumerate(fast.response_ids):
        assert logp[i, :len(ids)].argmax(-1).tolist() == ids
        assert logp[i, torch.arange(len(ids)), ids].tolist() == pytest.approx(fast.logprobs[i], abs=1e-4)
    assert policy.sample(prompts, 10, temperature=0).response_ids == fast.response_ids


def test_negative_temperature_is_refused(policy):
    with pytest.raises(OpctError, match="temperature must be >= 0"):
        policy.sample(_prompts(policy), 4, temperature=-1)


def test_the_engine_falls_back_on_its_typed_signal_and_says_so_once(policy, capsys):
    model = policy.model
    handle = model.model.layers[0].register_forward_hook(lambda *a: None)  # hooks would be bypassed: unsupported
    try:
        hooked = HFPolicy(model, policy.tokenizer, name="hooked")
        a = hooked.sample(_prompts(policy), 6, temperature=0)
        hooked.sample(_prompts(policy), 6, temperature=0)
    finally:
        handle.remove()
    err = capsys.readouterr().err
    assert err.count("hooked: sampling through model.generate") == 1 and "forward hooks" in err
    assert a.response_ids == policy.sample(_prompts(policy), 6, temperature=0).response_ids


def test_a_llama_model_missing_a_part_is_unsupported_by_name():
    from opct.engine import try_engine

    model = tiny_lm.make_model(tiny_lm.make_tokenizer())
    del model.model.layers[1].mlp.act_fn
    engine, why = try_engine(model)
    assert engine is None and why == "no model.layers[1].mlp.act_fn"


@pytest.mark.parametrize("fast", [True, False])
def test_diverged_weights_are_a_clear_error_on_both_paths(fast):
    tok = tiny_lm.make_tokenizer()
    model = tiny_lm.make_model(tok).eval()
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    pol = HFPolicy(model, tok, name="nan-model", fast_sampling=fast)
    with pytest.raises(OpctError, match=r"nan-model: sampling failed, the model's .* not finite \(diverged weights"):
        pol.sample([pol.render(tiny_lm.clean_q("sky"))], 4)


@pytest.mark.parametrize("fast", [True, False])
def test_a_temperature_so_small_that_the_logits_overflow_is_named_not_blamed_on_the_weights(policy, fast):
    """`--temperature 1e-45` was reported as "the model's probabilities are not finite (diverged weights?)" about a
    sound model (2026-12-07): the logits divided by it are infinite. The error names the temperature now."""
    pol = HFPolicy(policy.model, policy.tokenizer, name="tiny", fast_sampling=fast)
    with pytest.raises(OpctError) as e:
        pol.sample(_prompts(policy), 4, temperature=1e-45)
    assert str(e.value).startswith("tiny: sampling failed, ") and str(e.value).endswith(
        "(a temperature of 1e-45 overflows the logits divided by it: use 0.001 or more)")
    assert len(pol.sample(_prompts(policy), 4, temperature=0.001).response_ids) == 3  # a small one that is fine


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
def test_generate_ignores_the_checkpoints_own_generation_config(policy, temperature):
    """generate() fills what opct leaves unset from the model's generation_config; a checkpoint's repetition penalty
    or n-gram ban would then shape what the policy samples. Neither may: every token's recorded log-prob is the
    model's own log_softmax(logits / T) (T = 1 for greedy, whose tokens are its argmax), and the model's
    generation_config is back afterwards."""
    gen = policy.model.generation_config
    before = gen.repetition_penalty, gen.no_repeat_ngram_size
    gen.repetition_penalty, gen.no_repeat_ngram_size = 3.0, 1
    try:
        slow = HFPolicy(policy.model, policy.tokenizer, fast_sampling=False)
        prompts = _prompts(policy) * 3
        torch.manual_seed(0)
        out = slow.sample(prompts, 12, temperature=temperature)
        assert policy.model.generation_config is gen and gen.repetition_penalty == 3.0
    finally:
        gen.repetition_penalty, gen.no_repeat_ngram_size = before
    batch = pack(prompts, out.response_ids, policy.pad_id, "cpu")
    with torch.no_grad():
        logp = torch.log_softmax(response_logits(policy.model, batch).float() / (temperature or 1.0), -1)
    repeats = 0
    for i, ids in enumerate(out.response_ids):
        assert logp[i, torch.arange(len(ids)), ids].tolist() == pytest.approx(out.logprobs[i], abs=1e-4)
        if not temperature:
            assert logp[i, :len(ids)].argmax(-1).tolist() == ids
        full = prompts[i] + ids
        repeats += sum(t in full[:len(prompts[i]) + j] for j, t in enumerate(ids))
    assert repeats > 0  # the model repeats tokens of its context, which either setting would have forbidden


def test_a_checkpoint_with_weights_that_are_not_finite_is_refused_when_loaded(tmp_path):
    """A diverged or damaged checkpoint (NaN or inf in a weight, the base's or the adapter's) is refused by
    `load_policy`, naming the directory and the tensor: it failed only at the first sample (under `inspect eval`, a
    traceback per sample and exit status 0). A weight beyond float16's range is inf once loaded in float16."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file

    tok = tiny_lm.make_tokenizer()
    good = tiny_lm.save(tiny_lm.make_model(tok), tok, tmp_path / "good")
    assert load_policy(good).name == str(good)
    for value, what in ((float("nan"), "NaN"), (float("inf"), "inf")):
        model = tiny_lm.make_model(tok)
        with torch.no_grad():
            model.model.layers[1].mlp.up_proj.weight[2, 3] = value
        bad = tiny_lm.save(model, tok, tmp_path / what)
        with pytest.raises(OpctError, match=f"^{bad}: weight model.layers.1.mlp.up_proj.weight holds {what}; "):
            load_policy(bad)
    big = tiny_lm.make_model(tok)
    with torch.no_grad():
        big.model.layers[0].self_attn.q_proj.weight[0, 0] = 1e6  # float16's largest is 65504
    big_dir = tiny_lm.save(big, tok, tmp_path / "big")
    assert load_policy(big_dir).model.dtype == torch.float32
    with pytest.raises(OpctError, match=r"q_proj.weight holds inf \(loaded as float16: out of its range"):
        load_policy(big_dir, dtype="float16")
    adapter = tmp_path / "adapter"
    get_peft_model(tiny_lm.make_model(tok), LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(adapter)
    weights = load_file(adapter / "adapter_model.safetensors")
    name = next(k for k in weights if "lora_B" in k)
    weights[name][0, 0] = float("nan")
    save_file(weights, adapter / "adapter_model.safetensors")
    with pytest.raises(OpctError, match=f"^{adapter}: weight .*lora_B.* holds NaN"):
        load_policy(good, adapter=str(adapter))


def test_an_adapter_whose_tensors_do_not_match_its_configuration_is_refused(tmp_path):
    """peft only warns of an adapter's missing tensors (they stay at their initial values: the adapter half loaded)
    and drops unexpected ones, and a peft_type other than LoRA was a TypeError from inside peft: each is an error
    naming the file now. A whole adapter loads, on the base and on every target module."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file

    tok = tiny_lm.make_tokenizer()
    base = tiny_lm.save(tiny_lm.make_model(tok), tok, tmp_path / "base")
    good = tmp_path / "good"
    get_peft_model(tiny_lm.make_model(tok), LoraConfig(r=2, target_modules="all-linear")).save_pretrained(good)
    assert load_policy(base, adapter=str(good)).model.peft_config["default"].r == 2
    weights = load_file(good / "adapter_model.safetensors")
    for name, keep in (("fewer", {k: v for k, v in weights.items() if ".layers.0." not in k}),
                       ("extra", {**weights, **{k.replace(".layers.0.", ".layers.9."): v.clone() for k, v in weights.items()}})):
        bad = tmp_path / name
        bad.mkdir()
        (bad / "adapter_config.json").write_text((good / "adapter_config.json").read_text())
        save_file(keep, bad / "adapter_model.safetensors")
        n = sum(".layers.0." in k for k in weights)
        what = "missing" if name == "fewer" else "in the file but in no module"
        with pytest.raises(OpctError, match=f"^{bad / 'adapter_model.safetensors'}: does not match its "
                                            f"adapter_config.json on this model: {n} tensor\\(s\\) {what}"):
            load_policy(base, adapter=str(bad))
    config = json.loads((good / "adapter_config.json").read_text())
    with pytest.raises(OpctError, match=f"^{good / 'adapter_config.json'}: is a file, not a peft adapter directory; "
                                        f"give the directory that holds adapter_config.json and "
                                        f"adapter_model.safetensors \\({good}\\)$"):
        load_policy(base, adapter=str(good / "adapter_config.json"))
    (good / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "PREFIX_TUNING"}))
    with pytest.raises(OpctError, match="adapter_config.json: peft_type: opct loads LoRA adapters .*'PREFIX_TUNING'"):
        load_policy(base, adapter=str(good))
    # fields of the wrong type were TypeError tracebacks from inside peft, a NaN lora_alpha a "loss not finite" at
    # the first training step (2026-12-07): named by the file and the field, for eval's --adapter and train's
    # --init-adapter alike (both go through opct.modeldir.check_adapter)
    for key, value, want in [("r", "x", "an integer >= 1"), ("r", True, "an integer >= 1"), ("r", 8.5, "an integer"),
                             ("lora_alpha", float("nan"), "a finite number"), ("lora_dropout", "x", "a number"),
                             ("target_modules", 5, "a module name or a list of them"), ("bias", 1, "one of none")]:
        (good / "adapter_config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises(OpctError) as e:
            load_policy(base, adapter=str(good))
        assert str(e.value).startswith(f"{good / 'adapter_config.json'}: {key}: must be {want}"), str(e.value)


def test_non_finite_names_the_first_bad_tensor_and_is_not_fooled_by_a_norm_that_overflows():
    """`opct.modeldir.non_finite` (the training loop's check after every update) takes one fused pass over the
    tensors' norms: a NaN or inf is found and named, in any dtype; finite values whose norm overflows are not."""
    from opct.modeldir import non_finite

    named = [(f"w{i}", torch.randn(4, 3)) for i in range(5)] + [("h", torch.ones(3, dtype=torch.bfloat16)),
                                                                  ("ids", torch.arange(3))]
    assert non_finite(named) is None
    named[3][1][1, 2] = float("nan")
    named[5][1][0] = float("inf")
    assert non_finite(named) == ("w3", "NaN")
    named[3][1][1, 2] = 0.0
    assert non_finite(named) == ("h", "inf")
    named[5][1][0] = 1.0
    named[1][1][:] = 3e38  # finite, but its 2-norm is inf in float32
    assert torch.isinf(torch.linalg.vector_norm(named[1][1])) and non_finite(named) is None
