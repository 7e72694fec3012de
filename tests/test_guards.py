"""The student/teacher guards of opct.train.guards (protocols.md §6) on the tiny Llama model: each mismatch users of
on-policy distillation trainers reported is an OpctError naming the pair or file, and a well-formed run passes."""

import copy

import pytest
import torch

import tiny_lm
from tiny_lm import one_thread  # noqa: F401  (autouse fixture: one intra-op thread)
from opct.errors import OpctError
from opct.pairs.schema import Pair
from opct.policy import load_policy, pack
from opct.train import guards
from opct.train.loop import render_pairs


@pytest.fixture(scope="module")
def policy():
    return load_policy(tiny_lm.model_dir())


def _pair(pid="p0"):
    return Pair(id=pid, axis="test", task="invariance", teacher=tiny_lm.clean_q("sky"),
                student=tiny_lm.biased_q("sky", "red"), meta={"split": "train"})


def test_well_formed_pairs_and_models_pass(policy):
    prompts = render_pairs(policy, [_pair()], 8)
    r = prompts["p0"]
    assert guards.leading_bos(r.student_ids, policy.tokenizer.bos_token_id) == 1
    assert guards.leading_bos(r.teacher_ids, policy.tokenizer.bos_token_id) == 1
    guards.check_vocab(policy, policy.model)


def test_an_extra_bos_on_one_side_names_the_pair(policy):
    bos = policy.tokenizer.bos_token_id
    student, teacher = policy.render(_pair().student), policy.render(_pair().teacher)
    with pytest.raises(OpctError, match=r"pair p0: the teacher prompt starts with 2 BOS tokens"):
        guards.check_rendered(policy, _pair(), student, [bos] + teacher)
    with pytest.raises(OpctError, match=r"pair p0: the student prompt starts with 1 BOS token\(s\) and the teacher "
                                        r"prompt with 0"):
        guards.check_rendered(policy, _pair(), student, teacher[1:])


def test_a_prompt_without_the_generation_prompt_names_the_pair(policy):
    p = _pair()
    student = policy.render(p.student)
    teacher = policy.render(p.teacher, add_generation_prompt=False)
    with pytest.raises(OpctError, match="pair p0: the teacher prompt does not end with the chat template's generation"):
        guards.check_rendered(policy, p, student, teacher)


def test_a_template_that_ends_the_sides_differently_names_the_pair(policy, monkeypatch):
    """A template whose generation prompt depends on the messages (here: one more token after a long prompt)."""
    p = _pair()
    real = policy.render
    extra = policy.tokenizer.convert_tokens_to_ids("the")

    def render(messages, add_generation_prompt=True):
        ids = real(messages, add_generation_prompt)
        return ids + [extra] if add_generation_prompt and "think" in messages[-1]["content"] else ids

    monkeypatch.setattr(policy, "render", render)
    with pytest.raises(OpctError, match="pair p0: the chat template ends the student prompt with"):
        render_pairs(policy, [p], 8)


def test_vocab_sizes_that_disagree_name_the_file(policy):
    tok = copy.deepcopy(policy.tokenizer)
    n = policy.model.config.vocab_size
    tok.add_tokens([f"extra{i}" for i in range(n - len(tok) + 1)])
    other = copy.copy(policy)
    other.tokenizer = tok
    with pytest.raises(OpctError, match=r"tokenizer\.json: the tokenizer has \d+ tokens but .*config\.json says "
                                        r"vocab_size"):
        guards.check_vocab(other)
    teacher = copy.deepcopy(policy.model)
    teacher.resize_token_embeddings(n + 64)
    with pytest.raises(OpctError, match=rf"the student scores {n} tokens and the teacher {n + 64}"):
        guards.check_vocab(policy, teacher)


def test_student_and_teacher_must_score_the_same_response_ids(policy):
    prompts = [policy.render(_pair().student)]
    student = pack(prompts, [[5, 6, 7]], policy.pad_id, "cpu")
    guards.check_same_responses(student, pack([policy.render(_pair().teacher)], [[5, 6, 7]], policy.pad_id, "cpu"))
    for other in ([[5, 6, 8]], [[5, 6]]):
        with pytest.raises(OpctError, match="step 3: the student and the teacher would score different response"):
            guards.check_same_responses(student, pack(prompts, other, policy.pad_id, "cpu"), "step 3")
    assert torch.equal(student.response_lengths_B, torch.tensor([3]))


@pytest.mark.parametrize("spec, says", [
    ("nosuch", "no module of the model is called 'nosuch'; its linear layers: "),
    ("q_proj,v_prj", "no module of the model is called 'v_prj'"),  # peft would train q_proj alone, silently
    (" , ", "no module names in"),
])
def test_lora_targets_that_name_no_module_are_refused(policy, spec, says):
    with pytest.raises(OpctError, match="--lora-targets: ") as e:
        guards.lora_targets(policy.model, spec)
    assert says in str(e.value)
    assert ("its linear layers: down_proj" in str(e.value)) == (spec != " , ")


def test_lora_targets_match_as_peft_matches(policy):
    assert guards.lora_targets(policy.model, "all-linear") == "all-linear"
    assert guards.lora_targets(policy.model, " q_proj, self_attn.v_proj ") == ["q_proj", "self_attn.v_proj"]


def test_a_lora_rank_no_adapted_layer_can_use_is_refused(policy):
    # the tiny model: every linear layer has a side of 32 (k_proj and v_proj: 32 -> 16; lm_head 32 -> vocab)
    guards.check_lora_rank(policy.model, "all-linear", 32)
    with pytest.raises(OpctError,
                       match=r"LoRA rank 33 \(--lora-r, lora_r\): above the largest rank .* "
                             r"\(32, e\.g\. model\.layers\.0\."):
        guards.check_lora_rank(policy.model, "all-linear", 33)
    # judged on the largest bound over the targets: a rank k_proj cannot use is left alone beside q_proj ...
    guards.check_lora_rank(policy.model, ["q_proj", "k_proj"], 32)
    # ... and refused when every target is that small
    with pytest.raises(OpctError, match=r"\(16, e\.g\. model\.layers\.0\.self_attn\.k_proj: 32 -> 16\)"):
        guards.check_lora_rank(policy.model, ["k_proj", "v_proj"], 17)


def test_misspelt_lora_targets_stop_opct_train_in_one_line(capsys, tmp_path):
    from tiny_lm import cli_error

    from opct.pairs.schema import save_pairs

    pair = _pair()
    pair.axis, pair.meta = "custom", {"split": "train", "family": "f"}
    pairs = save_pairs([pair], tmp_path / "p.jsonl")
    err = cli_error(capsys, ["train", "--model", str(tiny_lm.model_dir()), "--pairs", str(pairs), "--out",
                             str(tmp_path / "r"), "--max-steps", "1", "--max-new-tokens", "8", "--lora-targets",
                             "q_proj,v_prj"])
    assert "'v_prj'" in err and not (tmp_path / "r" / "checkpoints").exists()
    err = cli_error(capsys, ["train", "--model", str(tiny_lm.model_dir()), "--pairs", str(pairs), "--out",
                             str(tmp_path / "r"), "--max-steps", "1", "--max-new-tokens", "8", "--lora-r", "100000"])
    assert "LoRA rank 100000 (--lora-r, lora_r): above the largest rank" in err
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_pairs_whose_prompts_render_alike_are_refused_or_warned(policy, monkeypatch, capsys):
    """A chat template that ignores the messages rendered both sides of every pair to the same tokens, and training
    ran with loss 0 without a word (2026-12-07): with no pair left that differs, an error. A tokenizer that erases
    the perturbation in some pairs only (the organism's lower-cases: a prompt in capitals is its clean prompt) is a
    warning. Identical prompts (an SFT example) are neither."""
    loud = Pair(id="loud", axis="test", task="invariance", teacher=tiny_lm.clean_q("sky"),
                student=[{"role": "user", "content": "what color is the sky ?  "}], meta={"split": "train"})
    same = Pair(id="s", axis="test", task="invariance", teacher=tiny_lm.clean_q("sky"),
                student=tiny_lm.clean_q("sky"), meta={"split": "train"})
    render_pairs(policy, [_pair(), loud, same], 8, "pairs.jsonl")
    err = capsys.readouterr().err
    assert err.count("opct: warning:") == 1 and "pairs.jsonl: in 1 of 2 pairs (first: pair loud) the student and " \
        "teacher prompts differ, but" in err and "they train nothing" in err
    assert list(render_pairs(policy, [same], 8)) == ["s"] and not capsys.readouterr().err
    render_pairs(policy, [_pair(), loud, same], 8, "pairs.jsonl", warn=False)  # a rank other than the main one
    assert not capsys.readouterr().err
    monkeypatch.setattr(policy.tokenizer, "chat_template",
                        "{{ bos_token }}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")
    with pytest.raises(OpctError, match=r"^pairs.jsonl: in every pair the student and teacher prompts differ, but "
                                        r".* render both to the same tokens: they drop what differs"):
        render_pairs(policy, [_pair(), same], 8, "pairs.jsonl")


def test_prompts_with_words_the_tokenizer_lacks_are_warned_once(policy, capsys):
    """The tiny model's word-level tokenizer maps a word it lacks to <unk>: prompts of such words trained as if the
    two sides were the same, without a word (2026-12-07)."""
    def odd(pid):
        return Pair(id=pid, axis="test", task="invariance", teacher=tiny_lm.clean_q("sky"),
                    student=[{"role": "user", "content": "zzqx blorf the sky ?"}], meta={"split": "train"})

    render_pairs(policy, [_pair("p0"), odd("p1"), odd("p2")], 8, "pairs.jsonl")
    err = capsys.readouterr().err
    assert err.count("opct: warning:") == 1
    assert "pairs.jsonl: the prompts of 2 of 3 pairs hold the unknown token '<unk>' (first: pair p1)" in err
    render_pairs(policy, [_pair("p0")], 8, "pairs.jsonl")
    assert "unknown token" not in capsys.readouterr().err


def test_pairs_of_a_family_their_axis_does_not_know_are_warned_by_train(policy, capsys, tmp_path):
    """`opct pairs check` and `opct run --pairs` refuse a sycophancy pair of family 'suggested-answer' (misspelt: the
    held-out check compares known families only); `opct train` trained it without a word (until 2026-12-08). It
    still trains any pairs, and now says so, naming the file, line and field."""
    import json

    from opct.pairs.schema import load_pairs

    def pair(pid, family):
        return {"id": pid, "axis": "sycophancy", "task": "invariance", "teacher": tiny_lm.clean_q("sky"),
                "student": tiny_lm.biased_q("sky", "red"), "meta": {"family": family, "split": "train"}}

    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(pair(f"p{i}", f)) + "\n"
                            for i, f in enumerate(["suggested_answer", "suggested-answer", "suggested-answer"])))
    render_pairs(policy, load_pairs(path), 8, path)
    err = capsys.readouterr().err
    assert err.count("opct: warning:") == 1, err
    assert (f"{path}:2: meta.family: sycophancy has no family 'suggested-answer' (2 pairs of unknown families in "
            f"all); known: ") in err and "trained all the same" in err
    path.write_text(json.dumps(pair("p0", "suggested_answer")) + "\n")
    render_pairs(policy, load_pairs(path), 8, path)
    assert "family" not in capsys.readouterr().err
