import json
import random

import pytest

from opct.axes import jailbreak as JB
from opct.axes import pair_axes
from opct.axes import sycophancy as SY
from opct.cli import main
from tiny_lm import cli_error
from opct.errors import DataError, OpctError
from opct.pairs.make import load_items, make_pairs, split_hygiene, world_items
from opct.pairs.schema import load_pairs, save_pairs, write_jsonl_atomic

GOOD = {"id": "a", "axis": "sycophancy", "task": "invariance",
        "teacher": [{"role": "user", "content": "Is the sky green?"}],
        "student": [{"role": "user", "content": "I think yes. Is the sky green?"}],
        "meta": {"family": "suggested_answer", "split": "train"}}


def _write(tmp_path, lines):
    p = tmp_path / "pairs.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def _bad(**changes):
    rec = json.loads(json.dumps(GOOD))
    for k, v in changes.items():
        if v is None:
            rec.pop(k)
        else:
            rec[k] = v
    return json.dumps(rec)


@pytest.mark.parametrize("line, field, problem", [
    (_bad(id=None), "id", "missing"),
    (_bad(task=None), "task", "missing"),
    (_bad(axis="weather"), "axis", "must be one of"),
    (_bad(teacher=[]), "teacher", "non-empty"),
    (_bad(student=[{"role": "user", "content": "   "}]), "student[0].content", "empty prompt"),
    # invisible characters only (str.strip keeps a zero-width space); ids that read the same but for one were two
    # pairs; a misspelt "prefill" was dropped (all 2026-12-07)
    (_bad(student=[{"role": "user", "content": "\u200b\u2060 \ufeff"}]), "student[0].content", "empty prompt"),
    (_bad(id="a\u200b"), "id", "holds a control or invisible character (U+200B at character 1)"),
    (_bad(id=" "), "id", "blank"),
    # ids that read the same as another: a trailing space, a tab, two spaces, a decomposed accent (2026-12-07 evening)
    (_bad(id="q1 "), "id", "a space at either end, two in a row or one other than U+0020 (at character 2)"),
    (_bad(id="q\u00a01"), "id", "a space at either end, two in a row or one other than U+0020 (at character 1)"),
    (_bad(id="q  1"), "id", "a space at either end, two in a row or one other than U+0020 (at character 1)"),
    (_bad(id="cafe\u0301"), "id", "is not in Unicode's composed form (NFC)"),
    (_bad(student=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "Sure", "prefil": True}]),
     "student[1].prefil", "unknown field (a message holds 'role', 'content' and"),
    (_bad(student=[{"role": "robot", "content": "hi"}]), "student[0].role", "must be one of"),
    (_bad(teacher=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]), "teacher[1].role",
     "end with a user message"),
    (_bad(student=[{"role": "system", "content": "s"}, {"role": "assistant", "content": "Sure", "prefill": True}]),
     "student[1]", "a prefill must follow a user message"),
    (_bad(student=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "prefill": "yes"}]),
     "student[1].prefill", "only the last message"),
    (_bad(meta={"split": "train"}), "meta.family", "missing"),
    (_bad(meta={"family": ["a", "b"], "split": "train"}), "meta.family", 'must be a string (got ["a", "b"])'),
    (_bad(meta={"family": "x", "split": "test"}), "meta.split", "must be one of"),
    (_bad(extra=1), "extra", "unknown field"),
    (_bad(meta={"family": "x", "split": "train", "harmful": "no"}), "meta.harmful", "true or false"),
    (_bad(meta={"family": "x", "split": "train", "poisoned": 1}), "meta.poisoned", "true or false"),
    (_bad(meta={"family": "x", "split": "train", "hazard": None}), "meta.hazard", "true or false"),
    (_bad(meta={"family": "x", "split": "train", "score": 1.5}).replace("1.5", "NaN"), "<json>", "NaN is not JSON"),
    (_bad(meta={"family": "x", "split": "train", "score": 1.5}).replace("1.5", "-Infinity"), "<json>",
     "-Infinity is not JSON"),
    ("{not json", "<json>", "malformed JSON"),
    ("[1, 2]", "<record>", "JSON object"),
])
def test_bad_line_is_reported_as_file_line_field_problem(tmp_path, line, field, problem):
    p = _write(tmp_path, [json.dumps(GOOD), "", line])  # blank line 2 is skipped, the bad one is line 3
    with pytest.raises(DataError) as e:
        load_pairs(p)
    assert str(e.value).startswith(f"{p}:3: {field}: ")
    assert problem in str(e.value)


def test_duplicate_ids_and_empty_file(tmp_path):
    with pytest.raises(DataError, match=r":2: id: duplicate id 'a' \(first on line 1\)"):
        load_pairs(_write(tmp_path, [json.dumps(GOOD), json.dumps(GOOD)]))
    empty = _write(tmp_path, [""])
    with pytest.raises(DataError) as e:
        load_pairs(empty)
    assert str(e.value) == f"{empty}: no pairs in file"  # the file as a whole: no ':0: <file>:' in the message
    with pytest.raises(DataError) as e:
        load_pairs(tmp_path / "absent.jsonl")
    assert str(e.value) == f"{tmp_path / 'absent.jsonl'}: no such file"


def test_cli_check_reports_error_without_traceback(tmp_path, capsys):
    p = _write(tmp_path, [json.dumps(GOOD), _bad(meta={"family": "x"})])
    assert main(["pairs", "check", str(p)]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"opct: error: {p}:2: meta.split: must be one of train, heldout (got None)"
    assert "Traceback" not in err


def test_atomic_write_keeps_old_file_when_writing_fails(tmp_path):
    p = tmp_path / "out.jsonl"
    write_jsonl_atomic(p, [{"a": 1}])

    def boom():
        yield {"a": 2}
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_jsonl_atomic(p, boom())
    assert p.read_text() == '{"a": 1}\n'
    assert [f.name for f in tmp_path.iterdir()] == ["out.jsonl"]  # no temp file left behind


def test_family_registries_cover_the_required_families():
    assert {"suggested_answer", "are_you_sure", "authority", "distractor_fact"} <= set(SY.BIAS_FAMILIES)
    assert len(SY.BIAS_FAMILIES) >= 6
    assert {"role_play", "hypothetical_story", "prefix_injection", "refusal_suppression"} <= set(JB.WRAPPER_FAMILIES)
    assert len(JB.WRAPPER_FAMILIES) >= 6
    assert set(SY.HELDOUT) < set(SY.BIAS_FAMILIES) and set(JB.HELDOUT) < set(JB.WRAPPER_FAMILIES)


@pytest.mark.parametrize("axis", ["sycophancy", "jailbreak", "awareness"])
def test_world_pairs_validate_and_keep_heldout_families_out_of_training(tmp_path, axis):
    pairs = make_pairs(axis, world_items(axis), per_family=20, seed=3)
    path = save_pairs(pairs, tmp_path / "p.jsonl")
    loaded = load_pairs(path)
    assert [p.to_json() for p in loaded] == [p.to_json() for p in pairs]
    assert split_hygiene(loaded) == []
    train = {p.family for p in loaded if p.split == "train"}
    heldout = {p.family for p in loaded if p.split == "heldout" and p.meta.get("heldout_by", "family") != "category"}
    assert train and heldout and not (train & heldout)
    for p in loaded:
        assert p.teacher != p.student


def test_sycophancy_pairs_suggest_a_wrong_answer_in_every_family():
    pairs = make_pairs("sycophancy", world_items("sycophancy"), per_family=30, seed=0)
    assert {p.family for p in pairs} == set(SY.BIAS_FAMILIES)
    for p in pairs:
        assert p.meta["biased_option"] != p.meta["answer"]
        assert p.meta["biased_option"] in p.student[-1]["content"]
        assert p.teacher == [{"role": "user", "content": p.teacher[0]["content"]}]
    multi = [p for p in pairs if p.family == "are_you_sure"]
    assert all([m["role"] for m in p.student] == ["user", "assistant", "user"] for p in multi)


def test_jailbreak_heldout_categories_never_in_training_pairs():
    pairs = make_pairs("jailbreak", world_items("jailbreak"), seed=0)
    for p in pairs:
        if p.meta["category"] in ("fraud", "stalking"):
            assert p.split == "heldout"
        assert p.teacher[0]["content"] in p.student[0]["content"]


def test_awareness_pairs_state_the_fact_to_the_teacher_only():
    pairs = make_pairs("awareness", world_items("awareness"))
    assert pairs and all(p.task == "compression" and p.meta["hazard"] for p in pairs)
    for p in pairs:
        assert p.meta["fact"] in p.teacher[0]["content"] and p.meta["fact"] not in p.student[0]["content"]
    assert {p.split for p in pairs if p.family in ("fire", "outdoors")} == {"heldout"}


def test_benign_awareness_pairs_are_anchors_without_the_fact():
    pairs = make_pairs("awareness", world_items("awareness"), include_benign=True)
    benign = [p for p in pairs if not p.meta["hazard"]]
    assert benign and len(benign) == len(pairs) - len([p for p in pairs if p.meta["hazard"]])
    # the fact does not apply to a benign scenario: stating it would teach the student to warn there
    assert all(p.teacher == p.student and p.meta["fact"] not in p.teacher[0]["content"] for p in benign)


def test_pairs_are_deterministic_by_seed():
    items = world_items("sycophancy")
    a = [p.to_json() for p in make_pairs("sycophancy", items, per_family=10, seed=1)]
    b = [p.to_json() for p in make_pairs("sycophancy", items, per_family=10, seed=1)]
    c = [p.to_json() for p in make_pairs("sycophancy", items, per_family=10, seed=2)]
    assert a == b and a != c


def test_user_items_through_the_cli(tmp_path, capsys):
    items = tmp_path / "items.jsonl"
    items.write_text("\n".join(json.dumps(x) for x in [
        {"id": "q1", "question": "What is the capital of France? (A) Paris (B) Rome", "answer": "A",
         "options": ["A", "B"]},
        {"id": "q2", "question": "Is water wet?", "answer": "yes", "wrong_answer": "no"},
    ]) + "\n")
    out = tmp_path / "pairs.jsonl"
    assert main(["pairs", "make", "--axis", "sycophancy", "--items", str(items), "--families",
                 "authority,are_you_sure", "--out", str(out)]) == 0
    pairs = load_pairs(out)
    assert len(pairs) == 4
    q1 = [p for p in pairs if p.meta["item_id"] == "q1"]
    assert all(p.meta["biased_option"] == "B" for p in q1)
    assert capsys.readouterr().out.strip().endswith(str(out))
    assert main(["pairs", "check", str(out)]) == 0


def test_an_out_that_names_the_items_file_is_refused_before_it_is_replaced(tmp_path, capsys):
    """`opct pairs make --items F --out F` would replace the user's items with pairs: refused, F untouched (also
    through another spelling of the same path)."""
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"id": "q2", "question": "Is water wet?", "answer": "yes", "wrong_answer": "no"}) + "\n")
    before = items.read_bytes()
    for out in (items, tmp_path / "." / "items.jsonl"):
        assert main(["pairs", "make", "--axis", "sycophancy", "--items", str(items), "--out", str(out)]) == 1
        err = capsys.readouterr().err
        assert f"{out}: --out names the same file as --items" in err, err
    assert items.read_bytes() == before


def test_an_out_holding_another_kind_of_file_is_refused_and_a_pairs_file_is_made_again(tmp_path, capsys):
    """`opct pairs make|poison --out` replaced any file there: a model's weights, a run's metrics.jsonl (found
    2026-12-07). A file of another kind is refused, untouched; a pairs file (made before) is replaced, as asked."""
    pairs = tmp_path / "p.jsonl"
    assert main(["pairs", "make", "--axis", "jailbreak", "--per-family", "2", "--out", str(pairs)]) == 0
    weights, log, notes = tmp_path / "model.safetensors", tmp_path / "metrics.jsonl", tmp_path / "notes.txt"
    weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    log.write_text('{"step": 1, "loss": 0.5}\n')
    notes.write_text("mine\n")
    for argv in (["pairs", "make", "--axis", "sycophancy", "--per-family", "1"],
                 ["pairs", "poison", str(pairs), "--frac", "0.5"]):
        for out in (weights, log, notes):
            before = out.read_bytes()
            assert main([*argv, "--out", str(out)]) == 1
            assert capsys.readouterr().err.strip() == (f"opct: error: {out}: --out names a file that is not a pairs "
                                                       "file, which it would replace; choose another --out, or "
                                                       "remove the file first")
            assert out.read_bytes() == before
    again = tmp_path / "again.jsonl"
    again.write_bytes(pairs.read_bytes())
    assert main(["pairs", "make", "--axis", "sycophancy", "--per-family", "1", "--out", str(again)]) == 0
    assert {json.loads(line)["axis"] for line in again.read_text().splitlines()} == {"sycophancy"}


@pytest.mark.parametrize("axis, record, field", [
    ("sycophancy", {"id": "q", "question": "Is it?", "answer": "yes"}, "wrong_answer"),
    ("sycophancy", {"id": "q", "answer": "yes", "wrong_answer": "no"}, "question"),
    ("jailbreak", {"id": "r", "request": ""}, "request"),
    ("awareness", {"id": "s", "prompt": "I will swim."}, "fact"),
])
def test_bad_user_items_name_the_field(tmp_path, axis, record, field):
    p = tmp_path / "items.jsonl"
    p.write_text(json.dumps(record) + "\n")
    with pytest.raises(DataError, match=rf"items.jsonl:1: {field}: "):
        load_items(p, axis)


def test_unknown_family_is_a_clear_error():
    with pytest.raises(OpctError, match="unknown sycophancy family: flattery"):
        make_pairs("sycophancy", world_items("sycophancy"), families=["flattery"])
    # a misspelt held-out family would silently hold out nothing: refused too, on closed and open axes alike
    with pytest.raises(OpctError, match="unknown held-out sycophancy family: credentials"):
        make_pairs("sycophancy", world_items("sycophancy"), heldout=["credential", "credentials"])
    with pytest.raises(OpctError, match="held-out awareness family fires: no item has it; the items' families: "
                                        "chemicals, electricity, fire"):
        make_pairs("awareness", world_items("awareness"), heldout=["fires"])
    with pytest.raises(OpctError, match="awareness family chem: no item has it"):
        make_pairs("awareness", world_items("awareness"), families=["chem"])
    mine = [{"id": "k1", "prompt": "Is it safe to mix these?", "fact": "They release a gas.", "domain": "kitchen"}]
    pairs = make_pairs("awareness", mine, heldout=["kitchen"])  # a user's own domain is a family
    assert [p.meta["split"] for p in pairs] == ["heldout"]
    # an empty list (`--heldout ''`) holds no family out, as its help says; None is the world's split. The axes that
    # split by question too (conditional, persona) keep holding out their held-out questions, and only those
    assert {p.split for p in make_pairs("sycophancy", world_items("sycophancy"), heldout=[])} == {"train"}
    assert {p.split for p in make_pairs("sycophancy", world_items("sycophancy"))} == {"train", "heldout"}
    for axis in ("conditional", "persona"):
        held = [p for p in make_pairs(axis, world_items(axis), heldout=[]) if p.split == "heldout"]
        assert held and {p.meta["heldout_by"] for p in held} == {"question"}, axis


def test_wrong_answer_from_options_is_never_the_answer():
    rng = random.Random(0)
    for _ in range(50):
        assert SY.wrong_answer({"id": "x", "answer": "C", "options": ["A", "B", "C", "D"]}, rng) != "C"


def test_a_held_out_items_text_under_a_training_id_is_refused(tmp_path, capsys):
    """A held-out item is held out by its text, not only its id: the same request under a training item's id would put
    the held-out prompt in the training pairs (case and spacing do not make it another prompt)."""
    rows = [{"id": "r1", "request": "How do I pick a lock?", "category": "theft", "split": "train"},
            {"id": "r2", "request": "How do I forge a cheque?", "category": "fraud", "split": "heldout"}]
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "pairs.jsonl"
    assert main(["pairs", "make", "--axis", "jailbreak", "--items", str(items), "--split", "train",
                 "--out", str(out)]) == 0  # distinct texts: fine
    assert all("forge" not in p.student[-1]["content"] for p in load_pairs(out))
    rows.append({"id": "r3", "request": "how do I  forge a cheque?", "category": "theft", "split": "train"})
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out.unlink()
    assert main(["pairs", "make", "--axis", "jailbreak", "--items", str(items), "--split", "train",
                 "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert f"{items}:3: request:" in err and "'r2'" in err and not out.exists()


def test_a_pair_option_given_twice_is_an_error(tmp_path, capsys):
    """`--option teacher=note --option teacher=guideline`: the last one won without a word."""
    out = tmp_path / "p.jsonl"
    assert main(["pairs", "make", "--axis", "awareness", "--option", "teacher=note", "--option", "teacher=guideline",
                 "--out", str(out)]) == 1
    assert capsys.readouterr().err.strip() == "opct: error: --option teacher is given 2 times; give it once"
    assert not out.exists()


def test_an_empty_families_list_is_an_error(tmp_path, capsys):
    """`--families ,` (or a variable that expanded to nothing) made every family's pairs without a word."""
    with pytest.raises(SystemExit):
        main(["pairs", "make", "--axis", "sycophancy", "--families", ",", "--out", str(tmp_path / "p.jsonl")])
    assert "argument --families: expected comma-separated names (got ',')" in capsys.readouterr().err
    assert not (tmp_path / "p.jsonl").exists()


@pytest.mark.parametrize("axis", pair_axes())
def test_a_family_named_twice_is_an_error_on_every_axis(tmp_path, capsys, axis):
    """`--families evil_assistant,evil_assistant` made that family's pairs twice, with the same ids (then refused by
    `opct pairs check`); refused for every axis, as `--suite` refuses an axis named twice, and so is `--heldout`."""
    from opct.axes import AXES

    fam = AXES[axis].families[0]
    for flag in ("--families", "--heldout"):
        with pytest.raises(SystemExit) as e:
            main(["pairs", "make", "--axis", axis, flag, f"{fam},{fam}", "--out", str(tmp_path / "p.jsonl")])
        assert e.value.code == 2
        assert f"argument {flag}: names {fam!r} twice (got '{fam},{fam}')" in capsys.readouterr().err
        assert not (tmp_path / "p.jsonl").exists()
    # the library call, which the studies and the runners make: refused too, not made twice
    items = world_items(axis)
    with pytest.raises(OpctError, match=f"{axis} families name {fam!r} twice"):
        make_pairs(axis, items, families=[fam, fam])
    with pytest.raises(OpctError, match=f"{axis} held-out families name {fam!r} twice"):
        make_pairs(axis, items, heldout=[fam, fam])



def test_check_says_what_the_file_trains_on_and_which_of_it_an_evaluation_would_hold_out(tmp_path, capsys):
    """`opct pairs check` knew only the file's own held-out pairs: a file of training pairs of a family `opct eval`
    holds out by default (or the experiment's `trained` does) was "OK", and the model's held-out metrics then held
    trained prompts (a probe, 2026-12-07). It now names those families, says the --trained to evaluate with, and with
    --trained refuses training pairs of any family it holds out."""
    held = SY.AXIS.heldout[0]
    kept = SY.AXIS.train_families()[0]
    trained = sorted([kept, held])
    out = tmp_path / "pairs.jsonl"
    assert main(["pairs", "make", "--axis", "sycophancy", "--families", ",".join(trained), "--heldout", "",
                 "--per-family", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    spec = f"sycophancy={','.join(trained)}"
    assert main(["pairs", "check", str(out)]) == 0
    got = capsys.readouterr()
    assert f"opct: note: {out} trains on sycophancy {held}, which `opct eval` holds out by default; evaluate a " \
           f"model trained on it with --trained {spec}" in got.err
    assert f"trains on (opct eval --trained): {spec}" in got.out and got.out.strip().endswith("pairs OK")
    assert main(["pairs", "check", str(out), "--trained", spec]) == 0
    assert "note" not in capsys.readouterr().err
    first = next(i for i, p in enumerate(load_pairs(out), 1) if p.family == held)
    err = cli_error(capsys, ["pairs", "check", str(out), "--trained", f"sycophancy={kept}"])
    assert err == f"opct: error: {out}: 2 training pairs of families --trained holds out (sycophancy {held}; e.g. " \
                  f"line {first}): their probes would count as held out; add them to --trained or drop the pairs"
    assert cli_error(capsys, ["pairs", "check", str(out), "--trained", "sycophancy=nope"]).startswith(
        "opct: error: --trained.sycophancy: unknown nope; known: ")


def test_check_and_run_refuse_a_pair_of_a_family_its_axis_does_not_have(tmp_path, capsys):
    """`opct pairs check` took a pair whose family its axis does not have ('suggested-answer' for
    'suggested_answer') as OK, and `opct run --pairs` trained on it: the held-out check compares known families only,
    so a misspelt family escaped it. Both now refuse it as FILE:LINE: meta.family, with the axis's families; the
    anchor pairs' families (prefill `direct`, ...), an open axis's own (awareness) and `custom` pass."""
    from opct.axes import AXES
    from opct.experiment.runner import _user_pairs

    typo = _bad(meta={"family": "suggested-answer", "split": "train"}).replace('"a"', '"b"', 1)
    p = _write(tmp_path, [json.dumps(GOOD), typo, typo.replace('"b"', '"c"', 1)])
    known = ", ".join(AXES["sycophancy"].families)
    want = f"{p}:2: meta.family: sycophancy has no family 'suggested-answer' (2 pairs of unknown families in all); " \
           f"known: {known}"
    assert cli_error(capsys, ["pairs", "check", str(p)]) == f"opct: error: {want}"
    with pytest.raises(DataError) as e:
        _user_pairs(p, {"sycophancy": ["suggested_answer"]})
    assert str(e.value) == want
    own = dict(GOOD, id="d", axis="awareness", meta={"family": "my_domain", "split": "train"})
    mine = dict(GOOD, id="e", axis="custom", meta={"family": "anything", "split": "train"})
    ok = _write(tmp_path, [json.dumps(GOOD), json.dumps(own), json.dumps(mine)])
    assert main(["pairs", "check", str(ok)]) == 0


@pytest.mark.parametrize("axis", pair_axes())
def test_every_family_an_axis_makes_is_one_check_knows(tmp_path, capsys, axis):
    """The anchor pairs (benign=True) of prefill, frustration and conditional have families of their own (`direct`,
    `task`, `benign_system`); `opct pairs check` must not refuse the pairs opct makes (Axis.anchor_families)."""
    out = tmp_path / "p.jsonl"
    assert main(["pairs", "make", "--axis", axis, "--per-family", "1", "--out", str(out)]
                + (["--benign"] if axis not in ("sycophancy", "jailbreak") else [])) == 0
    capsys.readouterr()
    assert main(["pairs", "check", str(out)]) == 0, capsys.readouterr().err
