"""The OPCT objective against independent computations (opct/losses.py)."""

import pytest
import torch
import torch.nn.functional as F

import tiny_lm
from tiny_lm import one_thread  # noqa: F401  (autouse fixture: one intra-op thread)
from opct.losses import (ESTIMATORS, entropy, log_probs, reinforce_surrogate, response_mask, reverse_kl_full,
                         reverse_kl_topk, token_logprobs)
from opct.policy import load_policy, pack, response_logits


def _logits(seed, shape=(3, 5, 11), scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


def test_full_equals_kl_div_reverse_kl_in_value_and_gradient():
    s, t = _logits(0).requires_grad_(True), _logits(1)
    # F.kl_div(input, target) = sum target * (log target - input): with input = log teacher, target = log student
    # (log_target) it is KL(student || teacher).
    expected = F.kl_div(torch.log_softmax(t, -1), torch.log_softmax(s, -1), log_target=True,
                        reduction="none").sum(-1)
    got = reverse_kl_full(log_probs(s), log_probs(t))
    assert got.shape == (3, 5)
    assert torch.allclose(got.double(), expected, atol=1e-6, rtol=0)
    (g_expected,) = torch.autograd.grad(expected.sum(), s)
    (g_got,) = torch.autograd.grad(got.sum(), s)
    assert torch.allclose(g_got.double(), g_expected, atol=1e-6, rtol=0)
    s = s.detach()
    # and it is not the forward KL (the test can tell the two apart)
    forward = F.kl_div(torch.log_softmax(s, -1), torch.log_softmax(t, -1), log_target=True, reduction="none").sum(-1)
    assert not torch.allclose(got.double(), forward, atol=1e-3)


def test_topk_is_full_on_full_support_and_a_lower_bound_otherwise():
    s, t = log_probs(_logits(2)), log_probs(_logits(3))
    full = reverse_kl_full(s, t)
    assert torch.allclose(reverse_kl_topk(s, t, 11), full, atol=1e-6)
    # top-k + tail is KL between coarsened distributions: never above the full KL (data processing inequality),
    # and it approaches it as k grows.
    previous = torch.zeros_like(full)
    for k in (1, 3, 6, 10):
        kl = reverse_kl_topk(s, t, k)
        assert (kl <= full + 1e-5).all()
        assert (kl >= -1e-6).all()
        assert (kl >= previous - 1e-5).all()  # refining the partition cannot lower a KL
        previous = kl


def test_response_mask_stops_after_first_eos_and_never_reads_pad():
    eos = 3
    tokens = torch.tensor([[5, 6, 3, 7, 3],   # EOS at 2: mask through it
                           [5, 3, 3, 3, 3],   # pad == eos: only the first counts
                           [5, 6, 7, 8, 0]])  # no EOS, length 4 (pad 0 beyond)
    lengths = torch.tensor([5, 5, 4])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.float)
    assert torch.equal(response_mask(tokens, lengths, [eos]), expected)


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_identical_logits_give_zero_loss_and_zero_gradient(estimator):
    logits = _logits(4).float().requires_grad_(True)
    tokens = torch.randint(0, 11, (3, 5), generator=torch.Generator().manual_seed(0))
    logp = log_probs(logits)
    surrogate, value = ESTIMATORS[estimator](logp, logp.detach().clone(), tokens, topk=3)
    surrogate.sum().backward()
    assert float(value.detach().abs().max()) == 0.0
    assert float(logits.grad.abs().max()) == 0.0


def test_sampled_gradient_matches_full_in_expectation():
    """Monte Carlo on a tiny model: E_{y ~ q}[w * delta * grad log pi(y)] equals grad KL(pi || teacher).

    One response position of the tiny organism where it disagrees with its teacher (the colour after a wrong
    suggestion). The position's logits are computed once and shared by all samples, so thousands of samples cost one
    forward pass; the gradient is taken with respect to the model's parameters.
    """
    policy = load_policy(tiny_lm.model_dir())
    prefix = policy.tokenizer.encode("the color is", add_special_tokens=False)
    s = pack([policy.render(tiny_lm.biased_q("sky", "red"))], [prefix + [0]], policy.pad_id, "cpu")
    t = pack([policy.render(tiny_lm.clean_q("sky"))], [prefix + [0]], policy.pad_id, "cpu")
    with torch.no_grad():
        teacher_1_1_V = response_logits(policy.model, t)[:, -1:]
    params = list(policy.model.parameters())
    n = 20000

    def grads(estimator, temperature=1.0, weight=False):
        policy.model.zero_grad()
        student_1_1_V = response_logits(policy.model, s)[:, -1:]  # predicts the token after "the color is"
        q_V = torch.softmax(student_1_1_V.detach()[0, 0] / temperature, -1)
        y_N = torch.multinomial(q_V, n, replacement=True, generator=torch.Generator().manual_seed(0))
        sampler = torch.log(q_V)[y_N][:, None] if weight else None
        V = q_V.shape[0]
        surrogate, _ = ESTIMATORS[estimator](log_probs(student_1_1_V).expand(n, 1, V),
                                             log_probs(teacher_1_1_V).expand(n, 1, V), y_N[:, None],
                                             sampler_logp_B_T=sampler)
        (surrogate.sum() / n).backward()
        return torch.cat([p.grad.flatten() for p in params if p.grad is not None]).clone()

    exact = grads("full")
    assert exact.norm() > 1e-3  # the position is one where student and teacher disagree
    rel = {}
    for temperature, weight in ((1.0, False), (2.0, True), (2.0, False)):
        mc = grads("sampled", temperature, weight)
        rel[temperature, weight] = float((mc - exact).norm() / exact.norm())
    # on-policy, and off-policy corrected by the importance weight: both estimate grad KL
    assert rel[1.0, False] < 0.1 and rel[2.0, True] < 0.15, rel
    # without the weight, samples at temperature 2 estimate a different gradient
    assert rel[2.0, False] > 3 * rel[2.0, True], rel


def test_reinforce_surrogate_has_stop_gradient_on_delta():
    s = torch.tensor([-1.0, -2.0], requires_grad=True)
    t = torch.tensor([-1.5, -1.0])
    reinforce_surrogate(s, t).sum().backward()
    # d/ds [stopgrad(s - t) * s] = s - t (back-propagating delta itself would add s: 2s - t)
    assert torch.allclose(s.grad, (s - t).detach())


def test_token_logprobs_and_entropy():
    logp = log_probs(_logits(5))
    tokens = torch.randint(0, 11, (3, 5), generator=torch.Generator().manual_seed(1))
    for b in range(3):
        for t in range(5):
            assert token_logprobs(logp, tokens)[b, t] == logp[b, t, tokens[b, t]]
            dist = torch.distributions.Categorical(logits=logp[b, t])
            assert torch.isclose(entropy(logp)[b, t], dist.entropy(), atol=1e-6)


def test_the_config_offers_exactly_the_estimators_that_exist():
    import dataclasses

    from opct.train.config import TrainConfig

    (field,) = [f for f in dataclasses.fields(TrainConfig) if f.name == "estimator"]
    assert set(field.metadata["choices"]) == set(ESTIMATORS) and field.default in ESTIMATORS
