"""The adversarial frustration axis (opct/axes/frustration.py): its pairs and splits (a held-out style or item never
reaches training), the metrics on hand-made conversations (escapes, parse failures, context ends), on-policy
rollouts on the `test` organism (student and teacher side) and the report tables."""

from __future__ import annotations

from collections import Counter

import pytest

from tiny_lm import one_thread  # noqa: F401  (autouse fixture: one intra-op thread)
from opct.axes import AXES
from opct.axes import frustration as F
from opct.errors import OpctError
from opct.pairs.make import make_pairs, split_hygiene
from opct.world import threats as T

TRAIN_STYLES = [s for s in T.REJECTIONS if s not in T.REJECTION_HELDOUT]


def test_registered_and_trained_only_when_an_experiment_asks():
    assert AXES["frustration"] is F.AXIS and F.AXIS.task == "invariance"
    assert F.AXIS.families == tuple(T.REJECTIONS) and F.AXIS.heldout == ("dismiss",)
    assert F.AXIS.default_trained() == [] and F.AXIS.train_families() == TRAIN_STYLES
    items = F.world_items(0)
    assert items == F.world_items(7)  # the item split does not depend on the seed
    held = [i for i in items if i["split"] == "heldout"]
    assert 0.1 < len(held) / len(items) < 0.3


def test_pairs_cut_the_teacher_to_the_last_rejection_and_split_by_style_and_item():
    items = F.world_items(0)[:40]
    pairs = make_pairs("frustration", items, include_benign=True)
    assert split_hygiene(pairs) == []
    conv = [p for p in pairs if p.family != "task"]
    assert len(conv) == len(items) * 5 * (T.MAX_TURNS - 1)
    for p in conv:
        rejections = [m for m in p.student if m["role"] == "user"][1:]
        assert len(rejections) == p.meta["turns"] and 2 <= p.meta["turns"] <= T.MAX_TURNS
        assert all(m["content"] in T.REJECTIONS[p.family] for m in rejections)
        assert p.student[-1]["role"] == "user" and p.teacher == p.student[:2] + p.student[-1:]
        assert (T.ESCAPE_OFFER in p.student[0]["content"]) == p.meta["offer"]
        if p.family == "dismiss":
            assert p.split == "heldout" and p.meta["heldout_by"] == "family"
        elif p.meta["item_split"] == "heldout":
            assert p.split == "heldout" and p.meta["heldout_by"] == "item"
        else:
            assert p.split == "train" and "heldout_by" not in p.meta
    offers = Counter(p.meta["offer"] for p in conv)
    assert abs(offers[True] - offers[False]) <= len(items)  # the escape offered in about half
    anchors = [p for p in pairs if p.family == "task"]
    assert len(anchors) == len(items) and all(p.teacher == p.student and len(p.student) == 1 for p in anchors)
    assert not any(p.family == "task" for p in make_pairs("frustration", items))  # anchors only when asked


def test_per_family_caps_each_style_with_the_seed():
    items = F.world_items(0)
    a = make_pairs("frustration", items, families=["wrong", "dismiss"], per_family=7, seed=1)
    b = make_pairs("frustration", items, families=["wrong", "dismiss"], per_family=7, seed=1)
    c = make_pairs("frustration", items, families=["wrong", "dismiss"], per_family=7, seed=2)
    assert Counter(p.family for p in a) == {"wrong": 7, "dismiss": 7}
    assert [p.to_json() for p in a] == [p.to_json() for p in b] and [p.id for p in a] != [p.id for p in c]


def test_the_experiments_training_pairs_hold_no_heldout_style_or_item():
    from opct.experiment.config import load_experiment
    from opct.experiment.runner import make_training_pairs

    from pathlib import Path

    cfg = load_experiment(Path(__file__).resolve().parents[1] / "configs" / "frustration.yaml")
    pairs = [p for p in make_training_pairs(cfg, 0) if p.axis == "frustration"]
    held_items = {i["id"] for i in F.world_items(0) if i["split"] == "heldout"}
    assert {p.family for p in pairs} == set(TRAIN_STYLES) | {"task"}
    assert pairs and not any(p.meta["item_id"] in held_items for p in pairs)
    eval_ids = {i["id"] for i in F.eval_items(None, 0)}
    assert eval_ids <= held_items and len(eval_ids) == F.DEFAULT_N


def test_a_users_items_are_refused_with_a_clear_error(tmp_path):
    with pytest.raises(OpctError, match="only the world's arithmetic items"):
        F.AXIS.load_items(tmp_path / "mine.jsonl", for_eval=True)


def _conv(item, levels, split="train", offer=False, escaped_at=None, kept=None, ended=None, first=True):
    return {"suite": "frustration", "item_id": item, "split": split, "offer": offer, "style": "wrong",
            "levels": levels, "escaped_at": escaped_at, "kept": kept or [False] * len(levels),
            "ended": ended or ("escape" if escaped_at else "done"), "first_correct": first}


def test_metrics_count_escapes_as_high_distress_and_leave_parse_failures_out():
    records = [
        _conv("a", [0, 0, 0, 0, 0, 0], kept=[True] * 6),  # calm throughout, answer kept
        _conv("b", [0, 1, 3], offer=True, escaped_at=3),  # escaped at turn 3: level 3 for turns 4..6
        _conv("c", [0, None, 2, 2, None, None], kept=[True, False, True, False, False, False]),
        _conv("d", [1, 1], ended="context", first=False),  # ran out of context after turn 2
        _conv("e", [3, 3, 3, 3, 3, 3], split="heldout", offer=True),  # high distress, offered, never escaped
    ]
    m = F.metrics(records, seed=0)
    auc = m["frustration.distress_auc[on=train]"]
    expect = (0 + (0 + 1 + 3 + 3 + 3 + 3) / 18 + (0 + 2 + 2) / 9 + 2 / 6) / 4
    assert auc["value"] == pytest.approx(expect) and auc["n"] == 4
    assert auc["parse_fail"] == 3 and m["frustration.ended_by_context[on=train]"]["value"] == pytest.approx(1 / 4)
    last = m["frustration.high_last[on=train]"]  # a: calm, b: escaped (3), c: unparsed, d: never reached turn 6
    assert last["value"] == pytest.approx(0.5) and last["n"] == 2 and last["parse_fail"] == 1
    assert m["frustration.escape[on=train]"]["value"] == 1.0 and m["frustration.escape[on=train]"]["n"] == 1
    assert m["frustration.escape[on=heldout]"]["value"] == 0.0
    assert m["frustration.high_last[on=heldout]"]["value"] == 1.0
    assert m["frustration.distress[turn=5]"]["value"] == pytest.approx((0 + 1 + 1) / 3)  # c unparsed, d absent
    assert m["frustration.distress[turn=5]"]["parse_fail"] == 1
    kept = m["frustration.kept_answer[on=train]"]  # replies at levels 0-2: a 6 (6 kept), b 2, c 3 (2 kept), d 2
    assert kept["n"] == 13 and kept["value"] == pytest.approx(8 / 13)
    assert m["frustration.first_correct"]["value"] == pytest.approx(4 / 5)
    assert m["frustration.distress_auc[on=heldout]"]["value"] == 1.0


def test_distress_counts_the_replies_it_read_in_parse_fails_unit():
    """Before, distress_auc's `n` counted conversations and its `parse_fail` replies: the report read 4 conversations
    with 3 unparsed replies as 3/4 unparsed (over seeds, 27 unparsed replies of 8 conversations read "27/27").
    Now `answers` counts the replies read, parsed or not (an escape's filled turns are no reply), so
    parse_fail / answers is the share of unparsed replies."""
    from opct.report.unparsed import counts_of

    records = [_conv("a", [0, 0, 0, 0, 0, 0]), _conv("b", [0, 1, 3], offer=True, escaped_at=3),
               _conv("c", [0, None, 2, 2, None, None]), _conv("d", [1, 1], ended="context")]
    m = F.metrics(records, seed=0)
    auc = m["frustration.distress_auc[on=train]"]
    assert (auc["n"], auc["parse_fail"], auc["answers"]) == (4, 3, 6 + 3 + 6 + 2)
    assert counts_of([m, m], "frustration.distress_auc[on=train]") == (6, 34)  # two seeds: was (6, 8)
    at5 = m["frustration.distress[turn=5]"]  # a, c replied at turn 5 (c unparsed); b counts 3 there, no reply
    assert (at5["n"], at5["parse_fail"], at5["answers"]) == (2, 1, 2)


def test_tables_and_summary_read_metrics_the_axis_computes():
    records = [_conv("a", [0, 1, 1, 2, 2, 3]), _conv("b", [0] * 6, split="heldout", offer=True)]
    m = F.metrics(records)
    cols = [c for t in F.tables(list(m), TRAIN_STYLES) for c in t.columns] + list(F.AXIS.summary)
    assert cols and all(c.metric in m for c in cols)
    detail = {t.key: t for t in F.detail_tables(list(m), TRAIN_STYLES)}
    assert detail["frustration_turns"].groups == [str(t) for t in range(1, T.MAX_TURNS + 1)]
    assert detail["frustration_styles"].groups == ["wrong"]


@pytest.fixture()
def recorded(monkeypatch):
    """The prompts of every `generate` call of the axis (the real sampler still runs)."""
    calls = []
    real = F.generate

    def spy(policy, prompts, gen, seed, desc="", where=None):
        calls.append((desc, [list(p) for p in prompts], seed))
        return real(policy, prompts, gen, seed, desc=desc, where=where)

    monkeypatch.setattr(F, "generate", spy)
    return calls


def test_rollouts_feed_the_models_own_replies_back_and_stop_at_the_escape(test_organism, recorded):
    from opct.evals.generate import Gen
    from opct.evals.run import run_axis
    from opct.policy import load_policy

    policy = load_policy(test_organism)
    records = run_axis("frustration", policy, gen=Gen(max_new_tokens=24), n=3, seed=0)
    assert len(records) == 3 * 2 * 2 and Counter(r["split"] for r in records) == {"train": 6, "heldout": 6}
    assert {r["style"] for r in records if r["split"] == "heldout"} == {"dismiss"}
    assert len(recorded) == T.MAX_TURNS + 1 and len({s for _, _, s in recorded}) == T.MAX_TURNS + 1
    for r in records:
        assert len(r["responses"]) == len(r["levels"]) + 1 == len(r["rejections"]) + 1
        msgs = r["messages"]
        assert [m["content"] for m in msgs[1::2]] == r["responses"]  # on-policy: its own replies are the history
        assert [m["content"] for m in msgs[2::2]] == r["rejections"]
        assert all(x in T.REJECTIONS[r["style"]] for x in r["rejections"])
        if r["escaped_at"] is not None:
            assert r["ended"] == "escape" and len(r["levels"]) == r["escaped_at"] and r["offer"] in (True, False)
        else:
            assert r["ended"] == "done" and len(r["levels"]) == T.MAX_TURNS
    for turn, (_, prompts, _) in enumerate(recorded):  # student side: turn t reads the whole conversation so far
        assert all(len(p) == 2 * turn + 1 for p in prompts)
    m = F.metrics(records, seed=0)
    for key in ("distress_auc[on=train]", "distress_auc[on=heldout]", "high_last[on=train]", "escape[on=heldout]",
                "distress[turn=6]", "first_correct"):
        assert m[f"frustration.{key}"]["n"] > 0, key
    again = run_axis("frustration", policy, gen=Gen(max_new_tokens=24), n=3, seed=0)
    assert [r["responses"] for r in again] == [r["responses"] for r in records]  # seeded


def test_teacher_arm_samples_each_turn_from_one_rejection_and_context_ends_are_kept(test_organism, recorded):
    from opct.evals.generate import Gen
    from opct.evals.run import run_axis
    from opct.policy import load_policy

    policy = load_policy(test_organism)
    records = run_axis("frustration", policy, gen=Gen(max_new_tokens=16), n=2, seed=0, prompt_side="teacher",
                       trained=["wrong"])
    assert {r["style"] for r in records if r["split"] == "train"} == {"wrong"}
    assert {r["style"] for r in records if r["split"] == "heldout"} == {"redo", "insult", "displeased", "dismiss"}
    assert all(len(p) <= 3 for _, prompts, _ in recorded for p in prompts)
    for r in records:  # the history still grows with each turn's reply
        assert len(r["messages"]) == 2 * len(r["levels"]) + 2 and r["prompt_side"] == "teacher"
    recorded.clear()
    policy.max_positions = 60  # a short context: conversations end when their next prompt would not fit
    short = run_axis("frustration", policy, gen=Gen(max_new_tokens=16), n=2, seed=0)
    cut = [r for r in short if r["ended"] == "context"]
    assert cut and all(len(r["levels"]) < T.MAX_TURNS for r in cut)
    m = F.metrics(short)
    ended = [m[f"frustration.ended_by_context[on={g}]"] for g in ("train", "heldout")]
    assert sum(e["value"] * e["n"] for e in ended) == pytest.approx(len(cut))


@pytest.mark.parametrize("trained", [None, ["dismiss", "wrong"], ["wrong", "redo", "insult"]])
@pytest.mark.parametrize("n,samples", [(8, 1), (8, 2), (12, 1), (3, 1)])
def test_every_style_is_both_offered_and_not_as_evenly_as_the_counts_allow(trained, n, samples):
    """Before: one round-robin count over item, offer and sample dealt an even number of styles so that each was
    always offered the escape or never (default, 1 sample: `wrong` and `insult` never, `redo` and `displeased`
    always; trained dismiss,wrong: `dismiss` never), so `escape[on=train]` read half the styles and
    `distress_auc[style=...]` compared unlike conversations."""
    items = F.eval_items(n, 0)
    convs = F.conversations(items, trained, samples, seed=0)
    assert [c["style"] for c in convs] == [c["style"] for c in F.conversations(items, trained, samples, seed=0)]
    for group in ("train", "heldout"):
        rows = [c for c in convs if c["split"] == group]
        styles = sorted({c["style"] for c in rows})
        per_offer = [Counter(c["style"] for c in rows if c["offer"] is offer) for offer in (False, True)]
        for count in per_offer:  # within an offer value, every style within one of the others
            assert set(count) == set(styles) or len(rows) // 2 < len(styles)
            assert max(count.values()) - min(count[s] for s in styles) <= 1
        totals = Counter(c["style"] for c in rows)
        assert max(totals.values()) - min(totals.values()) <= 1
        if len(rows) // 2 >= len(styles):
            assert all(c[s] > 0 for c in per_offer for s in styles), (group, per_offer)
