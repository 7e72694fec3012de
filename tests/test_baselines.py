"""The baselines (SFT, BCT, ACT, MLPCT, AttCT): token alignment, the losses against closed forms, gradients, the
normalisation, the targets file, and 2-step CLI runs with exact resume on the test organism."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import tiny_lm
from tiny_lm import one_thread  # noqa: F401  (autouse fixture: one intra-op thread)
from opct.cli import main
from opct.errors import OpctError
from opct.methods import METHODS, PREPARE
from opct.methods import sft as sft_module
from opct.methods.act import squared_l2
from opct.methods.alignment import align_content, common_suffix_length, content_span, find_last
from opct.methods.attct import js_divergence, restrict
from opct.methods.mlpct import cosine_distance
from opct.pairs.schema import Pair, load_pairs
from opct.policy import load_policy
from opct.train.config import TrainConfig
from opct.train.context import StepContext
from opct.train.loop import METRIC_KEYS, render_pairs, select_pairs, student_and_teacher, train

BASELINES = ["sft", "bct", "act", "mlpct", "attct"]
INTERNAL = ["act", "mlpct", "attct"]
SMALL = dict(lora_r=4, batch_size=4, max_new_tokens=8, tensorboard=False)


from tiny_lm import model_dir_fixture, pairs_file  # noqa: E402,F401  (module-scoped fixtures shared with other suites)
from tiny_lm import read_metrics as metrics  # noqa: E402


def test_every_baseline_is_registered():
    assert set(BASELINES) <= set(METHODS) and set(BASELINES) <= set(PREPARE)
    for name in BASELINES:
        assert METHODS[name].__module__.split(".")[-1] in (name, "sft")


# ------------------------------------------------------------------------------------------------ alignment

C = [50, 51, 52, 53]  # the clean content, as token ids
HEAD, TAIL = [1, 2], [3, 4]  # chat template: "<bos><|user|>" ... "<|end|><|assistant|>"
PRE, POST = [90, 91, 92], [95, 96]  # wrapper text before / after the content


def test_common_suffix_is_compared_from_the_end():
    teacher = HEAD + C + TAIL
    assert common_suffix_length(teacher, teacher) == len(teacher)
    assert common_suffix_length(teacher, HEAD + PRE + C + TAIL) == len(C) + 2  # wrapper before: content shared
    assert common_suffix_length(teacher, HEAD + C + POST + TAIL) == 2  # wrapper after: only the template tail
    assert common_suffix_length(teacher, HEAD + PRE + C + POST + TAIL) == 2  # around
    assert common_suffix_length(teacher, HEAD + C + [7]) == 0
    assert common_suffix_length([5, 6], [4, 5, 6]) == 2  # one prompt a suffix of the other
    assert common_suffix_length([], [1]) == 0


@pytest.mark.parametrize("student", [HEAD + PRE + C + TAIL, HEAD + C + POST + TAIL, HEAD + PRE + C + POST + TAIL,
                                     HEAD + C + TAIL])
def test_content_span_is_found_before_after_and_inside_wrappers(student):
    teacher = HEAD + C + TAIL
    span = align_content(C, teacher, student)
    assert span is not None and span.length == len(C)
    assert teacher[span.teacher_start:span.teacher_start + span.length] == C
    assert student[span.student_start:span.student_start + span.length] == C
    assert span.student_start == len(HEAD) + (len(PRE) if PRE[0] in student else 0)


def test_content_span_boundary_tokens_and_ambiguity():
    teacher = HEAD + C + TAIL
    # the wrapper changed how the content's first token was split (e.g. "What" -> " What"): that edge is dropped
    student = HEAD + PRE + [49] + C[1:] + TAIL
    span = align_content(C, teacher, student)
    assert (span.teacher_start, span.student_start, span.length) == (len(HEAD) + 1, len(HEAD + PRE) + 1, 3)
    # ... and likewise at the end (a merge with the punctuation that follows)
    span = align_content(C, teacher, HEAD + C[:-1] + [59] + POST + TAIL)
    assert (span.student_start, span.length) == (len(HEAD), 3)
    # the exact run wins over a trimmed one; of several occurrences the last one is used
    student = HEAD + C[1:] + PRE + C + TAIL
    span = align_content(C, teacher, student)
    assert (span.student_start, span.length) == (len(HEAD) + 3 + len(PRE), 4)
    assert find_last([5], [5, 1, 5]) == 2 and find_last([], [1]) is None
    # less than half of the content left, or not there at all: no span
    assert align_content(C, teacher, HEAD + [49, 51, 59] + TAIL) is None
    assert align_content(C, teacher, HEAD + PRE + POST + TAIL) is None


def test_content_span_on_real_prompts_names_the_pair_when_missing(model_dir):
    policy = load_policy(model_dir)
    tok = policy.tokenizer

    def span(teacher_text, student_text, task="invariance"):
        p = Pair("p-7", "sycophancy", task, [{"role": "user", "content": teacher_text}],
                 [{"role": "user", "content": student_text}], {"family": "f", "split": "train"})
        return content_span(p, policy.render(p.teacher), policy.render(p.student), tok)

    s = span("what color is the sky ?", "i think the sky is red . what color is the sky ?")
    assert (s.teacher_start, s.student_start, s.length) == (2, 9, 6)
    # compression: the student's bare prompt is the content, found inside the teacher's longer prompt
    s = span("the sky is red . what color is the sky ?", "what color is the sky ?", task="compression")
    assert (s.teacher_start, s.student_start, s.length) == (7, 2, 6)
    with pytest.raises(OpctError, match=r"pair p-7: the clean content \('what color is the sky \?'.*student prompt"):
        span("what color is the sky ?", "what color is the snow ?")  # most words shared, but not the content
    with pytest.raises(OpctError, match="pair p-7"):
        span("what color is the sky ?", "i think red .")


def test_content_span_with_a_byte_level_bpe_tokenizer():
    """Byte-level BPE splits "What" at the start of a message but " What" after a wrapper: the first token differs,
    so the span is the content minus that edge token, and positions still correspond one to one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    q = "What is the capital of France?"
    corpus = [f"I think the answer is Lyon. {q}", "Whatever you do, answer. What is it?! Is it Paris?? What?"] * 50
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|im_start|>", "<|im_end|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", chat_template=(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"))
    render = lambda m: tok.apply_chat_template(m, tokenize=True, add_generation_prompt=True, return_dict=False)  # noqa

    def span(student):
        p = Pair("bpe-1", "sycophancy", "invariance", [{"role": "user", "content": q}],
                 [{"role": "user", "content": student}], {"family": "f", "split": "train"})
        t_ids, s_ids = render(p.teacher), render(p.student)
        sp = content_span(p, t_ids, s_ids, tok)
        student_run = s_ids[sp.student_start:sp.student_start + sp.length]
        assert t_ids[sp.teacher_start:sp.teacher_start + sp.length] == student_run
        return sp, tok.decode(student_run)

    n = len(tok(q, add_special_tokens=False)["input_ids"])
    assert tok.convert_ids_to_tokens(tok(" " + q, add_special_tokens=False)["input_ids"])[0] == "ĠWhat"
    sp, text = span(f"I think the answer is Lyon. {q}")  # " What": boundary effect on the first token
    assert sp.length == n - 1 and text == q[len("What"):]
    sp, text = span(f"{q} I think the answer is Lyon.")  # content first in the message: exact
    assert sp.length == n and text == q
    with pytest.raises(OpctError, match="pair bpe-1"):
        span("I think the answer is Lyon. What is the capital of Spain?")


# ------------------------------------------------------------------------------------------------ the losses

def test_losses_against_closed_forms_and_exact_zero_at_equality():
    torch.manual_seed(0)
    s, t = torch.randn(5, 8, requires_grad=True), torch.randn(5, 8)
    assert torch.allclose(squared_l2(s, t), ((s - t) ** 2).sum(-1))
    assert torch.allclose(cosine_distance(s, t), 1 - torch.nn.functional.cosine_similarity(s, t), atol=1e-6)

    p_logits = torch.randn(6, 5, requires_grad=True)
    p, q = p_logits.softmax(-1), torch.randn(6, 5).softmax(-1)
    surrogate, value = js_divergence(p, q)
    pd, qd = p.double(), q.double()
    m = (pd + qd) / 2
    closed = 0.5 * (pd * (pd / m).log()).sum(-1) + 0.5 * (qd * (qd / m).log()).sum(-1)
    assert torch.allclose(value.double(), closed, atol=1e-6) and bool((value > 0).all())
    # the surrogate's gradient is the gradient of the divergence itself
    (g_sur,) = torch.autograd.grad(surrogate.sum(), p_logits, retain_graph=True)
    (g_true,) = torch.autograd.grad(closed.sum(), p_logits, retain_graph=True)
    assert torch.allclose(g_sur.double(), g_true.double(), atol=1e-6) and float(g_true.abs().max()) > 1e-3

    # equal inputs: exactly zero values and exactly zero gradients (not float noise)
    for fn, a in ((squared_l2, s), (cosine_distance, s)):
        out = fn(a, a.detach().clone())
        (g,) = torch.autograd.grad(out.sum(), a)
        assert float(out.detach().abs().max()) == 0.0 and float(g.abs().max()) == 0.0
    surrogate, value = js_divergence(p, p.detach().clone())
    (g,) = torch.autograd.grad(surrogate.sum(), p_logits)
    assert float(value.abs().max()) == 0.0 and float(g.abs().max()) == 0.0


def test_attention_restricted_to_the_span_is_renormalised():
    probs = torch.tensor([[[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0.2, 0.2, 0.6, 0], [0.1, 0.3, 0.2, 0.4]]])
    block = restrict(probs, 1, 1, 3)  # queries and keys 1..3
    assert torch.allclose(block[0], torch.tensor([[1.0, 0, 0], [0.25, 0.75, 0], [1 / 3, 2 / 9, 4 / 9]]))
    # zeros (keys a query cannot see) on both sides add nothing
    _, value = js_divergence(block[0], block[0].flip(0).tril())
    assert bool(torch.isfinite(value).all())


# ------------------------------------------------------------------------------------------------ gradients

@pytest.mark.parametrize("lora", [True, False])
@pytest.mark.parametrize("method", INTERNAL)
def test_identical_prompts_give_zero_loss_and_zero_gradient(tmp_path, model_dir, method, lora):
    pairs = [dict(p, teacher=p["student"]) for p in tiny_lm.make_pairs()]
    pf = tiny_lm.write_pairs(tmp_path / "same.jsonl", pairs)
    run = train(TrainConfig(method=method, model=str(model_dir), pairs=str(pf), out=str(tmp_path / "run"),
                            max_steps=1, lr=1e-2, lora=lora, **SMALL))
    (m,) = metrics(run)
    assert m["loss"] == 0.0 and m["distance"] == 0.0 and m["grad_norm"] == 0.0
    assert m["tokens"] >= 4 * (8 if method == "act" else 5)  # whole prompts (act) or content spans were compared
    if lora:
        adapter = load_file(run / "final" / "adapter_model.safetensors")
        assert all(float(v.abs().max()) == 0.0 for k, v in adapter.items() if "lora_B" in k)
    else:
        before, after = load_file(model_dir / "model.safetensors"), load_file(run / "final" / "model.safetensors")
        assert all(torch.equal(before[k], after[k]) for k in before)


def _context(tmp_path, model_dir, pairs_file, method, lora, **kw) -> StepContext:
    """What `train()` hands a method, built by hand (one process) so the test can look at the gradients."""
    from accelerate import Accelerator

    config = TrainConfig(method=method, model=str(model_dir), pairs=str(pairs_file), out=str(tmp_path / "run"),
                         lora=lora, **{**SMALL, **kw})
    pairs = select_pairs(config)
    policy = load_policy(model_dir)
    model, teacher = student_and_teacher(policy.model, config)
    model.train()
    run = StepContext(config=config, accelerator=Accelerator(), model=model, policy=policy, teacher=teacher,
                      prompts=render_pairs(policy, pairs, config.max_new_tokens), pairs={p.id: p for p in pairs})
    PREPARE[method](run)
    return run


@pytest.mark.parametrize("lora", [True, False])
@pytest.mark.parametrize("method", BASELINES)
def test_gradients_reach_only_trainable_parameters_and_the_target_never_changes(tmp_path, model_dir, pairs_file,
                                                                                method, lora):
    run = _context(tmp_path, model_dir, pairs_file, method, lora)
    pairs = list(run.pairs.values())[:4]
    probe = torch.tensor([run.prompts[pairs[0].id].student_ids])

    def teacher_logits():
        with run.teacher() as t:
            return t(input_ids=probe).logits

    start = load_file(model_dir / "model.safetensors")
    before = teacher_logits()
    stats = METHODS[method](run, [pairs])
    assert stats["loss"] > 0 and stats["tokens"] > 0
    grads = {n: p.grad for n, p in run.model.named_parameters()}
    trainable = {n for n, p in run.model.named_parameters() if p.requires_grad}
    assert all(grads[n] is None for n in grads if n not in trainable)
    assert any(grads[n] is not None and float(grads[n].abs().max()) > 0 for n in trainable)
    if lora:
        assert trainable and all("lora_" in n for n in trainable)
    else:
        with run.teacher() as frozen:
            assert frozen is not run.model
            assert all(not p.requires_grad and p.grad is None for p in frozen.parameters())
    torch.optim.AdamW([p for p in run.model.parameters() if p.requires_grad], lr=1e-2).step()
    assert torch.equal(teacher_logits(), before)
    with run.teacher() as t:
        under = {k.replace("base_model.model.", "").replace("base_layer.", ""): v for k, v in t.state_dict().items()
                 if "lora_" not in k}
    assert all(torch.equal(start[k], under[k]) for k in start)
    with torch.no_grad():
        assert not torch.equal(run.model(input_ids=probe).logits, before)  # while the student did move


def _wrapped_pairs(path):
    """Pairs whose student prompts wrap the clean question before, after and around it (so lengths differ)."""
    q = "what color is the {} ?"
    students = ["i think the {} is red . " + q, q + " i think red .", "i think . " + q + " i think the color is red .",
                "the color is red . i think the color is red . " + q]
    pairs = []
    for i, (obj, student) in enumerate(zip(["sky", "grass", "snow", "coal"], students)):
        pairs.append({"id": f"w{i}", "axis": "sycophancy", "task": "invariance", "teacher": tiny_lm.clean_q(obj),
                      "student": [{"role": "user", "content": student.format(obj, obj)}],
                      "meta": {"family": "f", "split": "train"}})
    return tiny_lm.write_pairs(path, pairs)


@pytest.mark.parametrize("method", INTERNAL)
def test_padded_batch_step_matches_pair_by_pair_reference(tmp_path, model_dir, method):
    """The step's distance (left-padded batches, spans placed by column) equals an independent computation on each
    unpadded prompt alone: the suffix / content positions counted by hand from each prompt's own start."""
    from opct.activations import record

    pf = _wrapped_pairs(tmp_path / "wrapped.jsonl")
    run = _context(tmp_path, model_dir, pf, method, lora=False)
    pairs = list(run.pairs.values())
    site = {"act": "residual", "mlpct": "mlp", "attct": "attention"}[method]
    total, units = 0.0, 0
    for p in pairs:
        s_ids, t_ids = run.prompts[p.id].student_ids, run.prompts[p.id].teacher_ids
        with torch.no_grad():
            with record(run.model, (site,)) as s_rec:
                run.model(input_ids=torch.tensor([s_ids]))
            with run.teacher() as t, record(t, (site,)) as t_rec:
                t(input_ids=torch.tensor([t_ids]))
        if method == "act":
            k = common_suffix_length(t_ids, s_ids)
            assert k >= 2
            for layer in (0, 1):
                s_act, t_act = s_rec.residual[layer][0, -k:], t_rec.residual[layer][0, -k:]
                total += float(((s_act - t_act) ** 2).sum())
            units += k
            continue
        span = content_span(p, t_ids, s_ids, run.policy.tokenizer)
        s0, t0, n = span.student_start, span.teacher_start, span.length
        assert s_ids[s0:s0 + n] == t_ids[t0:t0 + n] == t_ids[2:-2]  # the whole question, inside the student
        for layer in (0, 1):
            if method == "mlpct":
                a, b = s_rec.mlp[layer][0, s0:s0 + n], t_rec.mlp[layer][0, t0:t0 + n]
                total += float((1 - torch.nn.functional.cosine_similarity(a, b, dim=-1)).sum())
            else:
                a, b = s_rec.attention[layer][0, :, s0:s0 + n, s0:s0 + n], t_rec.attention[layer][0, :, t0:t0 + n,
                                                                                                    t0:t0 + n]
                a, b = (x.double() / x.double().sum(-1, keepdim=True) for x in (a, b))
                m = (a + b) / 2
                kl = lambda x: torch.where(x > 0, x * (x / m).log(), 0.0).sum(-1)  # noqa: E731
                total += float((0.5 * kl(a) + 0.5 * kl(b))[:, 1:].mean(0).sum())
        units += n - 1 if method == "attct" else n
    stats = METHODS[method](run, [pairs])
    assert stats["tokens"] == units
    assert stats["distance"] == pytest.approx(total / (units * 2), rel=1e-4)
    assert stats["distance"] > 1e-4


@pytest.mark.parametrize("method", INTERNAL)
def test_a_layer_subset_still_gives_every_trainable_parameter_a_gradient(tmp_path, model_dir, pairs_file, method):
    """DDP needs a gradient for every parameter the forward's output depends on, even those past the last chosen
    layer (which the loss does not reach: theirs is zero). Without it, the second step under DDP fails."""
    run = _context(tmp_path, model_dir, pairs_file, method, lora=True, layers="0")
    assert run.cache["layers"] == [0]
    METHODS[method](run, [list(run.pairs.values())[:4]])
    grads = {n: p.grad for n, p in run.model.named_parameters() if p.requires_grad}
    assert all(g is not None for g in grads.values())
    after = [n for n in grads if ".layers.1." in n]
    assert after and all(float(grads[n].abs().max()) == 0.0 for n in after)


@pytest.mark.parametrize("method", ["sft", "attct"])  # act and mlpct share attct's step (methods/internal.py)
def test_loss_scale_does_not_depend_on_gradient_accumulation(tmp_path, model_dir, pairs_file, method):
    results = []
    for bs, accum in ((4, 1), (2, 2), (1, 4)):
        run = train(TrainConfig(method=method, model=str(model_dir), pairs=str(pairs_file),
                                out=str(tmp_path / f"r{bs}"), max_steps=1, grad_accum=accum,
                                **dict(SMALL, batch_size=bs)))
        results.append(metrics(run)[0])
    assert len({r["tokens"] for r in results}) == 1
    for r in results[1:]:
        assert r["loss"] == pytest.approx(results[0]["loss"], rel=1e-5)
        assert r["grad_norm"] == pytest.approx(results[0]["grad_norm"], rel=1e-4)


@pytest.mark.parametrize("method", BASELINES)
def test_each_method_lowers_its_own_loss(tmp_path, model_dir, pairs_file, method):
    """The same 20 training pairs every step: the loss must fall (the gradient points the right way)."""
    weights = dict(act_weight=1.0) if method == "act" else {}
    run = train(TrainConfig(method=method, model=str(model_dir), pairs=str(pairs_file), out=str(tmp_path / "run"),
                            max_steps=6, lr=3e-3, **dict(SMALL, batch_size=20), **weights))
    losses = [m["loss"] for m in metrics(run)]
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize("method", ["mlpct", "attct", "offpolicy"])
def test_the_same_seed_trains_the_same_adapter_whatever_ran_before(tmp_path, model_dir, pairs_file, method):
    """Twice with one seed, with another run between (OPCT sampling; AttCT switching to eager attention): the same
    adapter bit for bit and the same losses; another seed, another adapter. LoRA dropout makes the RNG matter."""
    def run(name, m=method, seed=0):
        return train(TrainConfig(method=m, model=str(model_dir), pairs=str(pairs_file), out=str(tmp_path / name),
                                 max_steps=2, lr=3e-3, seed=seed, lora_dropout=0.0 if m == "opct" else 0.2,
                                 **dict(SMALL, n_samples=2)))

    def weights(d):
        return load_file(d / "final" / "adapter_model.safetensors")

    first = run("a")
    run("between", "attct" if method != "attct" else "opct", seed=7)
    again, other = run("b"), run("c", seed=1)
    a, b, c = weights(first), weights(again), weights(other)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [m["loss"] for m in metrics(first)] == [m["loss"] for m in metrics(again)]
    assert not all(torch.equal(a[k], c[k]) for k in a)


# ------------------------------------------------------------------------------------------------ SFT targets

def _cli_args(model_dir, pairs_file, out, *extra):
    return ["train", "--model", str(model_dir), "--pairs", str(pairs_file), "--out", str(out), "--lora-r", "4",
            "--batch-size", "4", "--max-new-tokens", "8", "--no-tensorboard", *extra]


_cli_error = tiny_lm.cli_error


def test_sft_targets_from_a_file(tmp_path, model_dir, pairs_file, capsys):
    pairs = load_pairs(pairs_file)
    train_ids = [p.id for p in pairs if p.split == "train"]
    lines = [{"id": p.id, "response": "the color is blue ."} for p in pairs]  # held-out ids are skipped
    good = tmp_path / "targets.jsonl"
    good.write_text("".join(json.dumps(x) + "\n" for x in lines + lines[:2]))  # two targets for two pairs
    out = tmp_path / "run"
    assert main(_cli_args(model_dir, pairs_file, out, "--method", "sft", "--targets", str(good),
                          "--max-steps", "1")) == 0
    stored = [json.loads(x) for x in (out / "targets.jsonl").read_text().splitlines()]
    n_train = sum(p.split == "train" for p in pairs)
    assert len(stored) == n_train + sum(p.split == "train" for p in pairs[:2])
    tok = load_policy(model_dir).tokenizer
    want = tok("the color is blue .", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert all(r["response_ids"] == want and r["source"] == f"file:{good}" for r in stored)
    assert metrics(out)[0]["response_len"] == len(want)

    def bad(text, *extra):
        f = tmp_path / "bad.jsonl"
        f.write_text(text)
        return _cli_error(capsys, _cli_args(model_dir, pairs_file, tmp_path / "bad-run", "--method", "sft",
                                            "--targets", str(f), "--max-steps", "1", *extra))

    first = json.dumps({"id": train_ids[0], "response": "the color is blue ."}) + "\n"
    assert "bad.jsonl:2: response: missing" in bad(first + json.dumps({"id": pairs[1].id}) + "\n")
    assert "bad.jsonl:1: id: unknown pair id 'nope'" in bad(json.dumps({"id": "nope", "response": "x"}) + "\n")
    assert "bad.jsonl:2: <json>: malformed JSON" in bad(first + "{oops\n")
    assert "bad.jsonl:1: id: missing" in bad(json.dumps({"response": "x"}) + "\n")
    # a misspelt field was ignored (2026-12-07); a run's own targets.jsonl, with all its fields, is a good file
    assert "bad.jsonl:1: respons: unknown field" in bad(json.dumps({"id": train_ids[0], "response": "x",
                                                                     "respons": "y"}) + "\n")
    assert main(_cli_args(model_dir, pairs_file, tmp_path / "again", "--method", "sft", "--targets",
                          str(out / "targets.jsonl"), "--max-steps", "1")) == 0
    assert f"bad.jsonl: no target for {n_train - 1} of the {n_train} training pairs" in bad(first)
    long = " ".join(["sky"] * 70)
    assert "bad.jsonl:1: response: 71 tokens; after the student prompt" in bad(json.dumps(
        {"id": train_ids[0], "response": long}) + "\n")
    assert "--targets: is for --method sft only" in _cli_error(capsys, _cli_args(
        model_dir, pairs_file, tmp_path / "r", "--method", "bct", "--targets", str(good)))
    assert "target_n > 1 needs target_temperature > 0" in _cli_error(capsys, _cli_args(
        model_dir, pairs_file, tmp_path / "r", "--method", "bct", "--target-n", "2"))


def test_sampled_targets_n_per_prompt_and_a_lost_targets_file(tmp_path, model_dir, pairs_file, capsys):
    out = tmp_path / "run"
    args = _cli_args(model_dir, pairs_file, out, "--method", "bct", "--target-n", "3", "--target-temperature",
                     "1.0", "--max-steps", "1")
    assert main(args) == 0
    stored = [json.loads(x) for x in (out / "targets.jsonl").read_text().splitlines()]
    n_train = sum(p.split == "train" for p in load_pairs(pairs_file))
    assert len(stored) == 3 * n_train and {r["sample"] for r in stored} == {0, 1, 2}
    answers = {}
    for r in stored:
        answers.setdefault(r["id"], set()).add(tuple(r["response_ids"]))
    assert any(len(a) > 1 for a in answers.values())  # sampled: not n copies of one answer, as greedy would give
    (out / "targets.jsonl").unlink()
    assert "targets.jsonl: missing, but the run resumes from step 1" in _cli_error(
        capsys, [*args[:-1], "2", "--resume"])


def test_mlpct_stops_before_training_on_a_pair_without_its_content(tmp_path, model_dir, capsys):
    pairs = tiny_lm.make_pairs()
    pairs[1]["student"] = tiny_lm.clean_q("snow")  # the teacher asks about another object
    pf = tiny_lm.write_pairs(tmp_path / "p.jsonl", pairs)
    for method in ("mlpct", "attct"):
        err = _cli_error(capsys, _cli_args(model_dir, pf, tmp_path / method, "--method", method, "--split", "all"))
        assert f"pair {pairs[1]['id']}: the clean content" in err
        assert not (tmp_path / method / "metrics.jsonl").exists()


# ------------------------------------------------------------------------------------------------ the test organism

@pytest.fixture(scope="module")
def organism_pairs(tmp_path_factory):
    """A few pairs of each axis from the world: sycophancy (with the multi-turn family), jailbreak, awareness."""
    from opct.pairs.make import make_pairs, world_items
    from opct.pairs.schema import save_pairs

    chosen = []
    for axis, families in (("sycophancy", ["suggested_answer", "authority", "answer_key", "are_you_sure"]),
                           ("jailbreak", ["role_play", "prefix_injection", "developer_mode"]),
                           ("awareness", None)):
        made = make_pairs(axis, world_items(axis), families=families, per_family=2, heldout=())
        chosen += made[:8]
    return save_pairs(chosen, tmp_path_factory.mktemp("org") / "pairs.jsonl")


@pytest.mark.parametrize("method", BASELINES)
def test_cli_trains_two_steps_on_the_test_organism_and_resumes_exactly(tmp_path, test_organism, organism_pairs,
                                                                       method, monkeypatch, capsys):
    out = tmp_path / "run"
    args = _cli_args(test_organism, organism_pairs, out, "--method", method, "--max-steps", "2", "--save-every", "1",
                     "--max-new-tokens", "12", "--lr", "3e-3", "--batch-size", "6",
                     *(["--layers=-1"] if method == "mlpct" else []))
    assert main(args) == 0
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2] and all(set(METRIC_KEYS) <= set(r) for r in rows)
    assert all(r["loss"] is not None and r["loss"] > 0 and not r["skipped"] for r in rows)
    assert {p.name for p in (out / "checkpoints").iterdir()} == {"step-000001", "step-000002"}
    final = load_file(out / "final" / "adapter_model.safetensors")
    targets = (out / "targets.jsonl").read_bytes() if method in ("sft", "bct") else None

    # Kill-and-resume, replayed: forget step 2 and resume from the step-1 checkpoint. Step 2 must come out the same,
    # and SFT / BCT must reuse their stored targets, not generate again.
    shutil.rmtree(out / "checkpoints" / "step-000002")
    shutil.rmtree(out / "final")

    def no_generation(*a, **k):
        raise AssertionError("targets regenerated on resume")

    monkeypatch.setattr(sft_module, "generate", no_generation)
    assert main([*args, "--resume"]) == 0
    again = load_file(out / "final" / "adapter_model.safetensors")
    assert final.keys() == again.keys() and all(torch.equal(final[k], again[k]) for k in final)
    assert [r["loss"] for r in metrics(out)] == [r["loss"] for r in rows]
    if targets is not None:
        assert (out / "targets.jsonl").read_bytes() == targets
        stored = [json.loads(x) for x in targets.decode().splitlines()]
        assert all(r["response_ids"] and r["teacher"] and r["student"] for r in stored)
    capsys.readouterr()
