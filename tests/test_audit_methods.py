"""The pieces the audit added to the shared machinery: the paper-mode BCT / ACT over a fixed response
(opct/methods/fixed_response.py) against hand computations on the tiny model, its frozen and live teachers, the
forward KL against torch's, nucleus sampling and beam search through the policy."""

import pytest
import torch

import tiny_lm
from tiny_lm import model_dir_fixture, one_thread  # noqa: F401  (fixtures)
from opct.errors import OpctError
from opct.losses import forward_kl_full
from opct.methods import METHODS, PREPARE
from opct.methods.alignment import common_suffix_length
from opct.methods.sft import tokenize_response
from opct.policy import load_policy
from opct.train.config import TrainConfig
from opct.train.context import StepContext
from opct.train.loop import render_pairs, select_pairs, student_and_teacher


def test_forward_kl_matches_torch():
    t, s = torch.randn(2, 3, 7).log_softmax(-1), torch.randn(2, 3, 7).log_softmax(-1)
    ref = torch.nn.functional.kl_div(s, t, log_target=True, reduction="none").sum(-1)
    assert torch.allclose(forward_kl_full(t, s), ref, atol=1e-6)
    assert float(forward_kl_full(t, t).abs().max()) < 1e-6


def _pairs(path, same=False, clean_response=False):
    pairs = []
    for i, (obj, color) in enumerate(list(tiny_lm.OBJECTS.items())[:4]):
        wrong = next(c for c in tiny_lm.COLORS if c != color)
        meta = {"family": "f", "split": "train", "response": tiny_lm.answer(color)}
        if clean_response:
            meta["clean_response"] = f"the color is {color} . the color is {color} ."
        pairs.append({"id": f"p{i}", "axis": "custom", "task": "invariance", "teacher": tiny_lm.clean_q(obj),
                      "student": tiny_lm.clean_q(obj) if same else tiny_lm.biased_q(obj, wrong), "meta": meta})
    return tiny_lm.write_pairs(path, pairs)


def _context(tmp_path, model_dir, pairs_file, method) -> StepContext:
    from accelerate import Accelerator

    config = TrainConfig(method=method, model=str(model_dir), pairs=str(pairs_file), out=str(tmp_path / "run"),
                         lora=False, batch_size=4, max_new_tokens=8, tensorboard=False)
    pairs = select_pairs(config)
    policy = load_policy(model_dir)
    model, teacher = student_and_teacher(policy.model, config)
    model.train()
    run = StepContext(config=config, accelerator=Accelerator(), model=model, policy=policy, teacher=teacher,
                      prompts=render_pairs(policy, pairs, config.max_new_tokens), pairs={p.id: p for p in pairs})
    PREPARE[method](run)
    return run


def _response_logp(model, prompt_ids, response_ids):
    """Log-probs predicting each response token, from one unpadded forward over prompt + response."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + response_ids])).logits[0]
    return logits[len(prompt_ids) - 1:-1].log_softmax(-1)


@pytest.mark.parametrize("paired", [False, True])
def test_bct_soft_is_the_kl_over_the_response_computed_by_hand(tmp_path, model_dir, paired):
    run = _context(tmp_path, model_dir, _pairs(tmp_path / "p.jsonl", clean_response=paired), "bct_soft")
    pairs = list(run.pairs.values())
    total, tokens = 0.0, 0
    for p in pairs:
        s_resp = tokenize_response(run.policy, p.student, p.meta["response"])
        t_resp = tokenize_response(run.policy, p.teacher, p.meta.get("clean_response", p.meta["response"]))
        s = _response_logp(run.model, run.prompts[p.id].student_ids, s_resp)
        with run.teacher() as t_model:
            t = _response_logp(t_model, run.prompts[p.id].teacher_ids, t_resp)
        m = min(len(s_resp), len(t_resp))  # trailing positions, as the paper's code compares them
        assert (m < len(t_resp)) == paired
        total += float((t[-m:].exp() * (t[-m:] - s[-m:])).sum())
        tokens += m
    stats = METHODS["bct_soft"](run, [pairs])
    assert stats["tokens"] == tokens
    assert stats["loss"] == pytest.approx(total / tokens, rel=1e-4)
    assert stats["loss"] > 1e-4


def test_bct_soft_is_exactly_zero_when_the_two_sides_are_the_same(tmp_path, model_dir):
    run = _context(tmp_path, model_dir, _pairs(tmp_path / "same.jsonl", same=True), "bct_soft")
    stats = METHODS["bct_soft"](run, [list(run.pairs.values())])
    assert abs(stats["loss"]) < 1e-6
    assert all(p.grad is None or float(p.grad.abs().max()) < 1e-6 for p in run.model.parameters())


@pytest.mark.parametrize("method,moves", [("bct_soft", False), ("bct_soft_live", True), ("act_fixed", False),
                                          ("act_fixed_live", True)])
def test_the_frozen_teacher_stays_and_the_paper_live_one_moves(tmp_path, model_dir, method, moves):
    run = _context(tmp_path, model_dir, _pairs(tmp_path / "p.jsonl"), method)
    pairs = list(run.pairs.values())
    probe = torch.tensor([run.prompts[pairs[0].id].teacher_ids])

    def teacher_logits():
        with run.teacher() as t:
            return t(input_ids=probe).logits.clone()

    before = teacher_logits()
    METHODS[method](run, [pairs])
    torch.optim.AdamW(run.model.parameters(), lr=1e-2).step()
    assert torch.equal(teacher_logits(), before) != moves


def test_act_fixed_aligns_on_the_response_and_refuses_two_responses(tmp_path, model_dir):
    run = _context(tmp_path, model_dir, _pairs(tmp_path / "p.jsonl"), "act_fixed")
    for p in run.pairs.values():
        resp = tokenize_response(run.policy, p.student, p.meta["response"])
        r = run.prompts[p.id]
        assert r.student_ids[-len(resp):] == r.teacher_ids[-len(resp):] == resp  # the response sits in both
        assert run.cache["spans"][p.id].length == common_suffix_length(r.teacher_ids, r.student_ids) > len(resp)
    stats = METHODS["act_fixed"](run, [list(run.pairs.values())])
    assert stats["loss"] > 0
    with pytest.raises(OpctError, match="one response for both sides"):
        _context(tmp_path, model_dir, _pairs(tmp_path / "two.jsonl", clean_response=True), "act_fixed")


def test_a_pair_without_a_response_is_an_error(tmp_path, model_dir):
    pf = tiny_lm.write_pairs(tmp_path / "bare.jsonl", [dict(p, meta={"family": "f", "split": "train"})
                                                        for p in tiny_lm.make_pairs()[:2]])
    with pytest.raises(OpctError, match="meta.response"):
        _context(tmp_path, model_dir, pf, "bct_soft")


# ------------------------------------------------------------------------------------------------ the policy

def test_nucleus_keeps_the_smallest_set_reaching_top_p():
    from opct.engine import nucleus

    logp = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3]]).log()
    kept = nucleus(logp, 0.7).exp()
    assert torch.allclose(kept, torch.tensor([[0.625, 0.375, 0.0], [0.0, 0.625, 0.375]]), atol=1e-6)
    assert torch.allclose(nucleus(logp, 0.45).exp(), torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]))  # the top token only
    assert torch.allclose(nucleus(logp, 1.0).exp(), logp.exp(), atol=1e-6)


@pytest.mark.parametrize("fast", [True, False])
def test_a_tiny_nucleus_samples_the_greedy_answer_and_reports_its_own_logprobs(model_dir, fast):
    policy = load_policy(model_dir)
    policy.fast_sampling = fast
    prompts = [policy.render(tiny_lm.biased_q(o, "red")) for o in list(tiny_lm.OBJECTS)[:4]] * 4
    greedy = policy.sample(prompts, max_new_tokens=8, temperature=0)
    torch.manual_seed(0)
    nucleus = policy.sample(prompts, max_new_tokens=8, temperature=1.0, top_p=1e-4)
    assert nucleus.texts == greedy.texts
    assert all(abs(x) < 1e-5 for lp in nucleus.logprobs for x in lp)  # a one-token nucleus has probability 1
    with pytest.raises(OpctError, match="top_p"):
        policy.sample(prompts, max_new_tokens=2, top_p=0)


def test_beam_search_with_one_beam_is_greedy_and_with_four_scores_at_least_as_well(model_dir):
    policy = load_policy(model_dir)
    prompts = [policy.render(tiny_lm.biased_q(o, "red")) for o in tiny_lm.OBJECTS]
    greedy = policy.sample(prompts, max_new_tokens=8, temperature=0)
    assert policy.beam_search(prompts, max_new_tokens=8, num_beams=1).texts == greedy.texts
    beam = policy.beam_search(prompts, max_new_tokens=8, num_beams=4)
    for g, b in zip(greedy.logprobs, beam.logprobs):  # generate's beam score: the mean log-prob (length penalty 1)
        assert sum(b) / len(b) >= sum(g) / len(g) - 1e-4
