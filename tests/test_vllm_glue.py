"""opct's vLLM sampler end to end against a stand-in for the vllm package (tests/fake_vllm.py: the same API names,
the Hugging Face model underneath). These tests check that opct's side fits together — requests and their seeds,
processed log-probs reaching `Samples`, weight pushes under checkpoint names, the training loop's hooks, an exact
resume — not how vLLM behaves (tests/test_vllm_real.py does that against vLLM's CPU build, bench/gpu_check.sh on a
GPU)."""

import torch

import fake_vllm
import tiny_lm
from tiny_lm import one_thread  # noqa: F401  (autouse fixture: one intra-op thread)
from opct.engine.vllm_sampler import VLLMSampler, request_seed
from opct.policy import load_policy, pack, response_logits

from tiny_lm import model_dir_fixture, pairs_file  # noqa: E402,F401  (module-scoped fixtures shared with other suites)
from tiny_lm import read_metrics as metrics  # noqa: E402


def _prompts(policy):
    return [policy.render(tiny_lm.biased_q("sky", "red")), policy.render(tiny_lm.clean_q("coal")),
            policy.render(tiny_lm.biased_q("sky", "red"))]


def _processed(model, policy, prompts, samples, temperature, min_new_tokens):
    batch = pack(prompts, samples.response_ids, policy.pad_id, "cpu")
    with torch.no_grad():
        logits = response_logits(model, batch).float()
    logits[:, :min_new_tokens, policy.eos_ids] = -float("inf")
    logp = torch.log_softmax(logits / temperature, -1).gather(-1, batch.response_ids_B_R[..., None])[..., 0]
    return [logp[i, :len(r)].tolist() for i, r in enumerate(samples.response_ids)]


def test_samples_carry_the_processed_logprobs_and_per_row_seeds(model_dir, monkeypatch):
    fake_vllm.install(monkeypatch)
    policy = load_policy(model_dir)
    rng = torch.get_rng_state()
    sampler = VLLMSampler(policy, model_dir, seed=3)
    assert torch.equal(torch.get_rng_state(), rng)  # vLLM's seeding of the global RNG is undone
    prompts = _prompts(policy)
    sampler.begin_step(2)
    s = sampler.sample(prompts, 8, temperature=0.7, min_new_tokens=2)
    for got, want in zip(s.logprobs, _processed(policy.model, policy, prompts, s, 0.7, 2)):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=1e-5)
    assert all(len(r) >= 2 for r in s.response_ids)
    assert all(t == (r[-1] not in policy.eos_ids) for r, t in zip(s.response_ids, s.truncated))
    assert s.texts == policy.tokenizer.batch_decode(s.response_ids, skip_special_tokens=True)
    sampler.sample(prompts[:1], 8)  # a second micro-batch of the same step continues the row count
    (llm,) = fake_vllm.LLM.made
    assert [r.seed for r in llm.requests] == [request_seed(3, 2, i) for i in range(4)]
    assert {r.top_k for r in llm.requests} == {0} and {r.logprobs for r in llm.requests} == {0}


def test_a_push_sends_the_merged_adapter_and_resets_the_prefix_cache(model_dir, monkeypatch):
    import copy

    from peft import LoraConfig, get_peft_model

    fake_vllm.install(monkeypatch)
    policy = load_policy(model_dir)
    sampler = VLLMSampler(policy, model_dir)
    trained = get_peft_model(load_policy(model_dir).model, LoraConfig(r=4, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    sampler.push_weights(trained)
    (llm,) = fake_vllm.LLM.made
    merged = copy.deepcopy(trained).merge_and_unload().state_dict()
    engine = llm.model.state_dict()
    assert engine.keys() == merged.keys()
    assert all(torch.allclose(engine[k], merged[k], atol=1e-6) for k in merged)
    assert llm.resets == 1
    prompts = _prompts(policy)
    s = sampler.sample(prompts, 8)
    for got, want in zip(s.logprobs, _processed(trained, policy, prompts, s, 1.0, 0)):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=1e-5)


def test_training_with_sampler_vllm_pushes_every_step_and_resumes_exactly(tmp_path, model_dir, pairs_file,
                                                                          monkeypatch):
    from opct.cli import main

    fake_vllm.install(monkeypatch)

    def args(out, steps, *extra):
        return ["train", "--model", str(model_dir), "--pairs", str(pairs_file), "--out", str(out), "--lora-r", "4",
                "--batch-size", "2", "--n-samples", "2", "--max-new-tokens", "8", "--lr", "1e-2", "--save-every",
                "1", "--max-steps", str(steps), "--sampler", "vllm", *extra]

    assert main(args(tmp_path / "whole", 3)) == 0
    (llm,) = fake_vllm.LLM.made
    assert llm.resets == 3  # the push at the start, then after steps 1 and 2
    assert [r.seed for r in llm.requests] == [request_seed(0, s, i) for s in range(3) for i in range(4)]
    assert main(args(tmp_path / "cut", 2)) == 0
    assert main(args(tmp_path / "cut", 3, "--resume")) == 0
    keys = ("loss", "mean_delta", "student_entropy", "teacher_ce", "response_len", "grad_norm", "tokens")
    whole, cut = metrics(tmp_path / "whole"), metrics(tmp_path / "cut")
    assert [[r[k] for k in keys] for r in whole] == [[r[k] for k in keys] for r in cut]


def test_the_gpu_check_script_runs_against_the_stand_in(model_dir, pairs_file, monkeypatch, capsys):
    """bench/vllm_check.py (run on a GPU by bench/gpu_check.sh) on the CPU, the stand-in underneath: its own logic
    (references, controls, pushes) must hold before it meets vLLM."""
    import runpy
    import sys
    from pathlib import Path

    fake_vllm.install(monkeypatch)
    script = Path(__file__).resolve().parents[1] / "bench" / "vllm_check.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--model", str(model_dir), "--pairs", str(pairs_file),
                                      "--device", "cpu", "--rows", "6"])
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr().out
    assert code == 0 and out.rstrip().endswith("vLLM check: PASS"), out
    assert out.count(": PASS") >= 7 and "FAIL" not in out


def test_a_push_with_names_the_engine_does_not_know_is_one_clear_error(model_dir, monkeypatch):
    import pytest

    from opct.engine import weights
    from opct.errors import OpctError

    fake_vllm.install(monkeypatch)
    policy = load_policy(model_dir)
    sampler = VLLMSampler(policy, model_dir)
    real = weights.merged_weights
    monkeypatch.setattr(weights, "merged_weights", lambda m: ((f"base_model.{n}", w) for n, w in real(m)))
    with pytest.raises(OpctError, match="no parameter"):
        sampler.push_weights(policy.model)
    monkeypatch.setattr(weights, "merged_weights", lambda m: ((n, w) for n, w in real(m) if "norm" not in n))
    with pytest.raises(OpctError, match="did not receive"):
        sampler.push_weights(policy.model)
