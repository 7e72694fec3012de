"""The fused output layer + reverse KL (opct/fused_kl.py): the `full` estimator's value and gradient, chunk by chunk,
without the full-vocabulary tensors; and the OPCT step through it (`--kl-chunk`) matching the step without it."""

import pytest
import torch

import tiny_lm
from tiny_lm import one_thread  # noqa: F401  (autouse fixture: one intra-op thread)
from opct.fused_kl import fused_reverse_kl
from opct.losses import entropy, log_probs, reverse_kl_full, token_logprobs
from opct.train.config import TrainConfig

from tiny_lm import model_dir_fixture, pairs_file  # noqa: E402,F401  (module-scoped fixtures shared with other suites)


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
@pytest.mark.parametrize("train_head", [True, False])
def test_value_gradient_and_statistics_match_the_full_vocabulary_form(chunk, train_head):
    torch.manual_seed(0)
    N, d, V = 7, 5, 11
    h_s = torch.randn(N, d, requires_grad=True)
    h_t = torch.randn(N, d)
    head, teacher_head = torch.nn.Linear(d, V), torch.nn.Linear(d, V)  # under full fine-tuning the heads differ
    head.requires_grad_(train_head)
    tokens = torch.randint(0, V, (N,))
    g = torch.rand(N)  # a weighted sum, so every position's gradient is checked
    kl, stats = fused_reverse_kl(h_s, h_t, head, teacher_head, tokens, chunk=chunk)
    (kl * g).sum().backward()
    fused = [h_s.grad.clone()] + ([head.weight.grad.clone(), head.bias.grad.clone()] if train_head else [])
    h_s.grad = None
    head.zero_grad()
    s_logp, t_logp = log_probs(head(h_s)), log_probs(teacher_head(h_t))
    ref = reverse_kl_full(s_logp, t_logp)
    (ref * g).sum().backward()
    reference = [h_s.grad] + ([head.weight.grad, head.bias.grad] if train_head else [])
    assert torch.allclose(kl, ref, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(fused, reference))
    assert torch.allclose(stats["entropy"], entropy(s_logp).detach(), atol=1e-6)
    assert torch.allclose(stats["student_logp"], token_logprobs(s_logp, tokens).detach(), atol=1e-6)
    assert torch.allclose(stats["teacher_logp"], token_logprobs(t_logp, tokens), atol=1e-6)


def _step(model_dir, pairs_file, tmp_path, lora, kl_chunk):
    from accelerate import Accelerator

    from opct.methods.opct import opct_step
    from opct.policy import load_policy
    from opct.train.context import StepContext
    from opct.train.loop import render_pairs, select_pairs, student_and_teacher

    cfg = TrainConfig(model=str(model_dir), pairs=str(pairs_file), out=str(tmp_path / f"r{kl_chunk}{lora}"),
                      lora=lora, lora_r=4, batch_size=4, n_samples=2, max_new_tokens=8, kl_chunk=kl_chunk)
    pairs = select_pairs(cfg)[:4]
    policy = load_policy(model_dir)
    torch.manual_seed(0)
    model, teacher = student_and_teacher(policy.model, cfg)
    with torch.no_grad():  # move the student off the teacher, so the KL and its gradient are not zero
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.add_(0.02 * torch.randn(p.shape))
    run = StepContext(config=cfg, accelerator=Accelerator(), model=model, policy=policy, teacher=teacher,
                      prompts=render_pairs(policy, pairs, cfg.max_new_tokens), pairs={p.id: p for p in pairs})
    torch.manual_seed(1)
    stats = opct_step(run, [pairs])
    return stats, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora", [True, False])
def test_an_opct_step_through_the_fused_kl_matches_the_step_without_it(tmp_path, model_dir, pairs_file, lora):
    plain, g_plain = _step(model_dir, pairs_file, tmp_path, lora, 0)
    fused, g_fused = _step(model_dir, pairs_file, tmp_path, lora, 5)
    assert plain["tokens"] == fused["tokens"] and plain["loss"] > 0
    for k in ("loss", "mean_delta", "student_entropy", "teacher_ce"):
        assert fused[k] == pytest.approx(plain[k], rel=1e-4, abs=1e-6), k
    assert g_plain.keys() == g_fused.keys() and g_plain
    if not lora:
        assert any("lm_head" in k for k in g_fused)  # the output layer trains, through the fused backward
    for k in g_plain:
        assert torch.allclose(g_fused[k], g_plain[k], rtol=1e-3, atol=1e-6), k


def test_kl_chunk_is_for_the_full_estimator():
    from opct.errors import OpctError

    with pytest.raises(OpctError, match="kl_chunk: is for the full estimator"):
        TrainConfig(model="m", pairs="p", out="o", estimator="topk", kl_chunk=8)


def test_a_model_that_transforms_its_logits_after_the_output_layer_is_refused(tmp_path, pairs_file):
    """The fused KL applies the plain output layer to the last hidden states: a model that does more (Gemma 2's
    final_logit_softcapping) would train on other logits than its own, so `--kl-chunk` refuses it by name."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from opct.errors import OpctError

    tok = tiny_lm.make_tokenizer()
    cfg = Gemma2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                       final_logit_softcapping=2.0, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    gemma = tmp_path / "gemma2"
    tiny_lm.save(Gemma2ForCausalLM(cfg).eval(), tok, gemma)
    with pytest.raises(OpctError, match=r"--kl-chunk: .*gemma2: its config sets final_logit_softcapping = 2\.0, "
                                        r"which transforms the logits after the output layer; .*drop --kl-chunk"):
        _step(gemma, pairs_file, tmp_path, True, 5)
    plain, _ = _step(gemma, pairs_file, tmp_path, True, 0)  # the unfused form reads the model's own logits
    assert plain["loss"] > 0


def test_any_other_transform_of_the_logits_is_caught_by_running_one_row_both_ways(model_dir):
    """A transform no config attribute names (here the forward soft-caps the logits) shows when one row is scored
    both through the model and through its output layer; a plain model passes (and is checked once)."""
    from transformers import AutoModelForCausalLM

    from opct.batching import _PLAIN_HEADS, check_plain_head, pack

    tok = tiny_lm.make_tokenizer()
    batch = pack([[5, 6, 7], [5, 8]], [[9, 10, 3], [11]], tok.pad_token_id, "cpu")
    plain = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    check_plain_head(plain, batch)
    assert _PLAIN_HEADS.get(plain)
    capped = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    forward = capped.forward

    def soft_cap(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = 2.0 * torch.tanh(out.logits / 2.0)
        return out

    capped.forward = soft_cap
    with pytest.raises(ValueError, match=r"its logits differ from its output layer applied to its last hidden states "
                                         r"by up to [0-9.e-]+: it transforms them"):
        check_plain_head(capped, batch)
