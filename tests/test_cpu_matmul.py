"""opct.cpu_matmul: float32 linear layers through oneDNN inside `use("onednn")` — the same values and gradients as
torch's own (to float rounding), only where it applies, nothing left behind after the block — and training with
either backend."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tiny_lm import one_thread  # noqa: F401  (autouse fixture: one intra-op thread)
from tiny_lm import model_dir_fixture, pairs_file  # noqa: F401  (module-scoped fixtures)
from tiny_lm import read_metrics
from opct import cpu_matmul
from opct.cli import main
from opct.train.config import TrainConfig
from opct.train.loop import train

pytestmark = pytest.mark.skipif(not cpu_matmul.available(), reason="this torch build has no oneDNN")


@pytest.fixture
def dnn_calls(monkeypatch):
    """How many times the oneDNN kernel ran (so a test fails if the interception silently stops)."""
    calls = []
    real = cpu_matmul._dnn

    def spy(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(cpu_matmul, "_dnn", spy)
    return calls


def _grads(x, layer, backend):
    x = x.detach().clone().requires_grad_(x.requires_grad)
    layer.zero_grad(set_to_none=True)
    with cpu_matmul.use(backend):
        y = layer(x)
        loss = (y.sin() * torch.linspace(-1, 1, y.shape[-1])).sum()
    loss.backward()
    grads = [p.grad for p in layer.parameters() if p.grad is not None]
    return y.detach(), (x.grad if x.requires_grad else None), grads


@pytest.mark.parametrize("shape", [(7, 24), (3, 5, 24)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("train_weight,input_grad", [(True, True), (False, True), (True, False)])
def test_values_and_gradients_match_torch(dnn_calls, shape, bias, train_weight, input_grad):
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 40, bias=bias)
    layer.requires_grad_(train_weight)
    x = torch.randn(*shape, requires_grad=input_grad)
    y_ref, gx_ref, gw_ref = _grads(x, layer, "blas")
    assert not dnn_calls
    y, gx, gw = _grads(x, layer, "onednn")
    assert dnn_calls  # the forward went through oneDNN (and the input's gradient, when asked for)
    assert len(dnn_calls) == 1 + input_grad
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    if input_grad:
        torch.testing.assert_close(gx, gx_ref, rtol=1e-5, atol=1e-5)
    assert len(gw) == len(gw_ref) == (2 if bias else 1) * train_weight
    for a, b in zip(gw, gw_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_no_grad_forward_and_a_non_contiguous_input(dnn_calls):
    torch.manual_seed(1)
    w, b = torch.randn(16, 12), torch.randn(16)
    x = torch.randn(12, 9).t()  # (9, 12), not contiguous
    with torch.no_grad(), cpu_matmul.use("onednn"):
        y = F.linear(x, w, b)
    assert len(dnn_calls) == 1
    torch.testing.assert_close(y, x @ w.t() + b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["bfloat16", "float64", "autocast", "empty", "blas", "outside"])
def test_left_to_torch_where_it_does_not_apply(dnn_calls, case):
    dtype = {"bfloat16": torch.bfloat16, "float64": torch.float64}.get(case, torch.float32)
    x = torch.randn(0 if case == "empty" else 4, 8, dtype=dtype)
    w = torch.randn(6, 8, dtype=dtype)
    if case == "outside":
        with cpu_matmul.use("onednn"):
            pass
        y = F.linear(x, w)
    else:
        with cpu_matmul.use("blas" if case == "blas" else "onednn"):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "autocast"):
                y = F.linear(x, w)
    assert not dnn_calls
    assert y.shape == (x.shape[0], 6)
    assert y.dtype == (torch.bfloat16 if case == "autocast" else dtype)


def test_the_choice_is_scoped_and_checked():
    assert cpu_matmul.backend() == "blas"
    with cpu_matmul.use("onednn"):
        assert cpu_matmul.backend() == "onednn"
        with cpu_matmul.use("blas"):
            assert cpu_matmul.backend() == "blas"
        assert cpu_matmul.backend() == "onednn"
    assert cpu_matmul.backend() == "blas"
    with pytest.raises(ValueError, match="cpu_matmul must be one of auto, onednn, blas"):
        with cpu_matmul.use("mkl"):
            pass
    with pytest.raises(RuntimeError):  # an error inside the block still restores the choice
        with cpu_matmul.use("onednn"):
            raise RuntimeError
    assert cpu_matmul.backend() == "blas"


def test_sampling_engine_runs_without_the_interception(dnn_calls, model_dir):
    from opct.policy import load_policy

    pol = load_policy(model_dir)
    prompts = [pol.render([{"role": "user", "content": "hello"}])] * 2
    torch.manual_seed(0)
    plain = pol.sample(prompts, 6)
    torch.manual_seed(0)
    with cpu_matmul.use("onednn"):
        inside = pol.sample(prompts, 6)
    assert not dnn_calls  # the engine's loop turns torch-function modes off
    assert inside.response_ids == plain.response_ids and inside.logprobs == plain.logprobs


@pytest.mark.parametrize("method,lora", [("opct", True), ("bct", True), ("opct", False)])
def test_training_with_either_backend_agrees(tmp_path, model_dir, pairs_file, dnn_calls, method, lora):
    small = dict(lora_r=4, batch_size=4, n_samples=2, max_new_tokens=8, tensorboard=False, max_steps=3, lr=1e-2,
                 method=method, lora=lora)
    runs = {}
    for backend in ("blas", "onednn"):
        before = len(dnn_calls)
        runs[backend] = read_metrics(train(TrainConfig(model=str(model_dir), pairs=str(pairs_file),
                                                       out=str(tmp_path / backend), cpu_matmul=backend, **small)))
        used = len(dnn_calls) - before
        assert (used > 0) == (backend == "onednn")
    for a, b in zip(runs["blas"], runs["onednn"]):
        assert a["tokens"] == b["tokens"]  # the same samples (sampling does not depend on the backend) ...
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3, abs=1e-6)  # ... and the same losses to rounding
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3, abs=1e-6)


def test_cli_flag_and_a_bad_value(tmp_path, model_dir, pairs_file, capsys):
    out = tmp_path / "run"
    args = ["train", "--model", str(model_dir), "--pairs", str(pairs_file), "--out", str(out), "--max-steps", "1",
            "--batch-size", "2", "--n-samples", "1", "--max-new-tokens", "4", "--lora-r", "2"]
    with pytest.raises(SystemExit) as e:  # argparse's own error for a value outside the choices
        main(args + ["--cpu-matmul", "mkl"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--cpu-matmul" in err and "onednn" in err and "Traceback" not in err
    assert main(args + ["--cpu-matmul", "blas"]) == 0
    assert '"cpu_matmul": "blas"' in (out / "config.json").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text("cpu_matmul: mkl\n")
    assert main(args + ["--out", str(tmp_path / "run2"), "--config", str(bad)]) != 0
    err = capsys.readouterr().err
    assert "cpu_matmul" in err and "Traceback" not in err


def test_sampling_engine_sends_large_weights_to_onednn(dnn_calls):
    """A model with weights past ENGINE_MIN_WEIGHT: under use("onednn") the engine multiplies by them through oneDNN
    (and by the small ones through the BLAS), drawing the same tokens with log-probs equal to rounding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from opct.engine import llama_engine

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=512, intermediate_size=1024, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                         tie_word_embeddings=True)).eval()
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    out = {}
    for backend in ("blas", "onednn"):
        before = len(dnn_calls)
        with cpu_matmul.use(backend):
            engine = llama_engine(model)
            torch.manual_seed(1)
            out[backend] = engine.sample(prompts, 6, 1.0, [2], 0, 6)
        used = len(dnn_calls) - before
        # onednn: qkv (512 x 1536), o (512 x 512), gate_up (2048 x 512), down (512 x 1024) at prefill + 5 decode
        # steps; the output layer (96 x 512) is below the threshold
        assert used == (4 * 6 if backend == "onednn" else 0)
    assert torch.equal(out["blas"][0], out["onednn"][0])
    torch.testing.assert_close(out["onednn"][1], out["blas"][1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("vendor, capability, picked", [
    ("AuthenticAMD", "AVX512", "onednn"),  # MKL takes its AVX2 path here: oneDNN measured 2.2-2.4x faster
    ("GenuineIntel", "AVX512", "blas"),    # MKL's AVX-512 kernels: measured faster than oneDNN
    ("AuthenticAMD", "AVX2", "blas"),      # no AVX-512 for oneDNN to use either: torch's default
    ("", "DEFAULT", "blas"),               # unknown (no /proc/cpuinfo, ARM)
])
def test_auto_picks_onednn_only_on_an_amd_cpu_with_avx512(monkeypatch, vendor, capability, picked):
    monkeypatch.setattr(cpu_matmul, "_cpu_vendor", lambda: vendor)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    cpu_matmul.auto_backend.cache_clear()
    try:
        assert cpu_matmul.resolve("auto") == picked
        with cpu_matmul.use("auto"):
            assert cpu_matmul.backend() == picked
        assert cpu_matmul.resolve("blas") == "blas" and cpu_matmul.resolve("onednn") == "onednn"
    finally:
        cpu_matmul.auto_backend.cache_clear()
    assert cpu_matmul.backend() == "blas"


def test_this_machines_vendor_is_read():
    vendor = cpu_matmul._cpu_vendor()
    assert isinstance(vendor, str)
    if Path("/proc/cpuinfo").exists() and "vendor_id" in Path("/proc/cpuinfo").read_text():
        assert vendor and vendor in Path("/proc/cpuinfo").read_text()


def test_a_resumed_run_takes_auto_as_the_backend_it_picks_here(monkeypatch):
    from opct.config import changes
    from opct.train.config import TrainConfig

    assert TrainConfig().cpu_matmul == "auto"
    monkeypatch.setattr(cpu_matmul, "auto_backend", lambda: "onednn")
    assert changes({"cpu_matmul": "onednn"}, {"cpu_matmul": "auto"}) == []
    assert changes({"train": {"cpu_matmul": "auto"}}, {"train": {"cpu_matmul": "onednn"}}) == []
    monkeypatch.setattr(cpu_matmul, "auto_backend", lambda: "blas")
    assert changes({"cpu_matmul": "onednn"}, {"cpu_matmul": "auto"}) == [
        "cpu_matmul ('onednn' -> 'auto' (= 'blas' here))"]
    assert changes({"cpu_matmul": "onednn"}, {"cpu_matmul": "blas"}) == ["cpu_matmul ('onednn' -> 'blas')"]
