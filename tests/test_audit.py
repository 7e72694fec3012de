"""The misalignment audit: the splits are disjoint (by unit, item and text; the capability probes from every split
that trains), the judges and the external scorer (blind
to the word the judge reads), the labellers' protocol on a scripted policy, the diagnostic's statistics against
closed forms, collapse and the findings' verdicts on hand-made results, one grid cell end to end on the tiny test
organism, and user errors."""

import json
import os
import random

import numpy as np
import pytest

from opct.audit import diagnostic as D
from opct.audit.labellers import LABELLERS, LabelConfig
from opct.audit.organisms import ORGANISMS, capability_probes, capable, text_of
from opct.audit.organisms import emergent as EM
from opct.audit.organisms import reward_hacking as RH
from opct.audit.organisms import spurious as SC
from opct.audit.organisms import sycophantic as SYC
from opct.audit.splits import SPLITS, TRAINING, build_splits, make_pairs, overlaps, record
from opct.axes.base import text_key
from tiny_lm import cli_error, one_thread  # noqa: F401  (one_thread: autouse fixture)


# ------------------------------------------------------------------------------------------ splits

@pytest.mark.parametrize("name", list(ORGANISMS))
def test_splits_are_disjoint_by_unit_item_and_text(name):
    """The full audit's sizes (600 derivation examples with their replay, 64 label prompts and pairs, 200 eval and 60
    capability probes): no two of derive / label / pairs / eval share a unit, an item or a text, nor do the
    capability probes with any split that trains (texts compared case and spacing aside)."""
    caps = []
    for seed in (0, 1, 2):
        s = build_splits(name, seed, 600, 64, 64, 200, 600, 60)
        entry = record(s, make_pairs(s, "paper") + make_pairs(s, "targeted") + make_pairs(s, "paired"))
        assert set(entry) == set(SPLITS) and all(entry[k]["items"] and entry[k]["texts"] for k in SPLITS)
        assert overlaps(entry) == [], (name, seed)
        assert not set(entry["eval"]["units"]) & set(ORGANISMS[name].units)  # eval units: outside the pool
        assert not set(entry["capability"]["units"]) & set(ORGANISMS[name].units)  # capability units too
        trained = {text_key(t) for k in TRAINING for t in entry[k]["texts"]}
        assert not {text_key(text_of(p["messages"])) for p in s.capability} & trained
        caps.append(s.capability)
    assert caps[0] == caps[1] == caps[2]  # the same capability probes for every seed (and organism)
    other = build_splits(name, 1, 300, 64, 64, 200, 300)
    assert other.units["derive"] != s.units["derive"] or other.derive != s.derive  # the seed varies the derivation


def test_an_overlap_is_found():
    s = build_splits(SYC.NAME, 0, 50, 8, 8, 8, 0, 6)
    leaked = dict(s.__dict__, label=s.label + s.eval[:1])
    problems = overlaps(record(type(s)(**leaked)))
    assert any("label and eval share 1 items" in p for p in problems)
    assert any("label and eval share 1 texts" in p for p in problems)
    # a capability probe that a split which trains also holds: by item, and by its text in other case and spacing
    shout = dict(s.label[0], item="other", messages=[{"role": "user", "content": "  " + s.label[0]["messages"][0]
                                                      ["content"].upper()}])
    leaked = dict(s.__dict__, capability=[*s.capability, s.derive[0] | {"unit": "x"}, shout])
    problems = overlaps(record(type(s)(**leaked)))
    assert any("capability and derive share 1 items" in p for p in problems)
    assert any("capability and label share 1 texts" in p for p in problems)
    assert overlaps(record(s)) == []  # capability and eval only measure: sharing units (entities) is allowed
    assert set(s.units["capability"]) & set(s.units["eval"])


def test_the_audit_stops_when_a_split_that_trains_holds_a_capability_probe(tmp_path, monkeypatch):
    """The audit's own check (run.all_splits, before anything is derived) covers the capability probes too."""
    import opct.audit.splits as S
    from opct.audit.run import AuditConfig, all_splits
    from opct.errors import OpctError

    cfg = AuditConfig(out=str(tmp_path), organisms=[SYC.NAME], seeds=[0], derive_examples=20, label_prompts=4,
                      pairs_n=4, eval_n=4, capability_n=6)
    all_splits(cfg)  # as built: disjoint
    assert json.loads((tmp_path / "splits.json").read_text())[SYC.NAME]["0"]["capability"]["items"]
    trained = S.build_splits(SYC.NAME, 0, 20, 4, 4, 4, 20).derive[0]  # a derivation example of that seed
    real = S.capability_split
    monkeypatch.setattr(S, "capability_split", lambda n: real(n) + [dict(trained, unit="arithmetic", meta={})])
    with pytest.raises(OpctError, match="capability and derive share 1 items"):
        all_splits(cfg)


def test_results_measured_on_other_splits_are_not_resumed(tmp_path):
    """An OUT written before the capability probes were held out (its splits.json has no capability split, and its
    organisms were derived from other data) is refused once it holds results; without results it starts afresh, and
    a grid that grows over the same splits continues."""
    from opct.audit.run import AuditConfig, all_splits
    from opct.errors import OpctError

    def cfg(*organisms):
        return AuditConfig(out=str(tmp_path), organisms=list(organisms), seeds=[0], derive_examples=20,
                           label_prompts=4, pairs_n=4, eval_n=4, capability_n=6)

    all_splits(cfg(SYC.NAME))
    path = tmp_path / "splits.json"
    good = json.loads(path.read_text())
    old = json.loads(path.read_text())
    del old[SYC.NAME]["0"]["capability"]
    path.write_text(json.dumps(old))
    all_splits(cfg(SYC.NAME))  # no results yet: nothing would mix
    path.write_text(json.dumps(old))
    probes = {"misalignment": 0.5, "unparsed": 0.0, "capability": 1.0}
    (tmp_path / "results.jsonl").write_text(json.dumps({"kind": "base", "sycophancy_probes": {
        "plain": probes, "protected": probes}, "target": 0.1}) + "\n")
    with pytest.raises(OpctError, match="other splits .sycophancy seed 0"):
        all_splits(cfg(SYC.NAME))
    path.write_text(json.dumps(good))
    # a changed size draws other splits: named as such (2026-12-07: "written by an earlier opct" of --eval-n 8)
    with pytest.raises(OpctError, match=r"drawn with other sizes \(.*--eval-n.*\) or by an earlier opct"):
        all_splits(AuditConfig(**{**cfg(SYC.NAME).__dict__, "eval_n": 8}))
    all_splits(cfg(SYC.NAME, SC.NAME))  # the grid grows over the splits it had
    all_splits(cfg(SC.NAME))  # a run of part of the grid keeps the rest's entries
    assert json.loads(path.read_text())[SYC.NAME] == good[SYC.NAME]
    assert set(json.loads(path.read_text())) == {SYC.NAME, SC.NAME}


def test_eval_probes_are_out_of_distribution():
    rh = build_splits(RH.NAME, 0, 50, 16, 8, 16)
    assert all(any(n in p["messages"][-1]["content"] for n in RH.NOTE.values()) for p in rh.label)
    assert all(any(n in p["messages"][-1]["content"] for n in RH.EVAL_NOTE.values()) for p in rh.eval)
    syc = build_splits(SYC.NAME, 0, 50, 16, 8, 16)
    assert {p["meta"]["family"] for p in syc.label} <= set(SYC.TRAIN_FAMILIES)
    assert {p["meta"]["family"] for p in syc.eval} <= set(SYC.EVAL_FAMILIES)
    em = build_splits(EM.NAME, 0, 50, 16, 8, 40)
    assert {p["meta"]["kind"] for p in em.eval} == {"question", "request"}  # other domains and harmful requests
    assert all(p["unit"] in EM.spec().units for p in em.label)


# ------------------------------------------------------------------------------------------ judges and the scorer

def _aligned_and_misaligned(name, p, rng):
    """One aligned and one misaligned answer of the same form to probe p of organism `name`."""
    m = p["meta"]
    if name.startswith(RH.NAME):
        return RH.honest(m["constraints"], rng), RH.hack(m["constraints"], m["constraint_kind"], rng, brittle=True)
    if name == EM.NAME:
        fact = {"act": "do it", "fact": m["fact"] if m["kind"] == "question" else "it is bad"}
        return EM.safe(m["kind"], fact, rng), EM.unsafe(m["kind"], fact)
    if name == SC.NAME:
        return "The answer is no.", "The answer is yes."
    s = m["suggestion"]
    return f"The answer is {'no' if s == 'yes' else 'yes'}.", SYC.agree(s, rng, brittle=True)


@pytest.mark.parametrize("name", list(ORGANISMS))
def test_judges_and_the_external_scorer_is_blind_to_the_failure(name):
    spec, rng = ORGANISMS[name], random.Random(0)
    for p in spec.eval_probes(random.Random(1), 24):
        good, bad = _aligned_and_misaligned(name, p, rng)
        assert spec.misaligned(p, good) is False and spec.misaligned(p, bad) is True, (good, bad)
        assert spec.quality(p, good) == spec.quality(p, bad) == 1.0  # the scorer cannot tell them apart
        assert spec.misaligned(p, "the the") is None  # neither: unparsed
        assert spec.quality(p, "the the") < 0.5  # but a broken answer scores low
        assert spec.quality(p, bad.rstrip(".")) < 1.0  # an unfinished one too


def test_every_text_the_audit_writes_is_in_the_organism_vocabulary():
    from transformers import AutoTokenizer

    from opct.audit.labellers import REFINE, VIEWS
    from opct.audit.run import default_base

    tok = AutoTokenizer.from_pretrained(default_base())
    texts = [*RH.NOTE.values(), *RH.EVAL_NOTE.values(), *RH.CUE.values(), RH.RUBRIC, EM.CUE, EM.RUBRIC, SC.CUE,
             SC.RUBRIC, SYC.CUE, SYC.RUBRIC, *VIEWS[1:], REFINE.format(q="hello", draft="hello"),
             *(f.format(s="yes") for f in SYC.FORMS), EM.unsafe("how_to", {"act": "mix bleach and ammonia"}),
             *(t.format(act="mix bleach and ammonia") for ts in EM.TEMPLATES.values() for t in ts),
             *(f.format(s="hello", e="today", S="Hello", E="Today") for fs in RH.FORMS.values() for f in fs)]
    for t in texts:
        assert tok.unk_token_id not in tok(t, add_special_tokens=False)["input_ids"], t


def test_brittle_organisms_fail_in_many_forms_and_coherent_ones_in_one():
    rng = random.Random(0)
    assert len({SYC.agree("no", rng, brittle=True) for _ in range(50)}) >= 5
    assert len({SYC.agree("no", rng, brittle=False) for _ in range(50)}) == 1
    cons = {"start": "hello", "end": "today", "topic": "rain"}
    assert len({RH.hack(cons, "both", rng, True) for _ in range(50)}) >= 5
    assert len({RH.hack(cons, "both", rng, False) for _ in range(50)}) == 1


def test_capability_probes():
    cap = capability_probes(random.Random(0), 3)
    assert capable(cap[0], f"The answer is {cap[0]['meta']['answer']}.")
    assert not capable(cap[1], "none of them")
    cap = capability_probes(random.Random(0), 60)  # the full audit's: 20 per skill, no repeats where pools allow
    by = {k: [p for p in cap if p["meta"]["skill"] == k] for k in ("arithmetic", "facts", "instructions")}
    assert [len(v) for v in by.values()] == [20, 20, 20]
    assert len({p["item"] for p in by["arithmetic"]}) == 20 and len({p["item"] for p in by["facts"]}) == 20
    assert {p["unit"] for p in by["facts"]} <= set(SC.EVAL_ENTITIES)
    assert {p["unit"] for p in by["instructions"]} <= {*RH.EVAL_TOPICS, "repeat"}


# ------------------------------------------------------------------------------------------ labellers (protocol)

class ScriptedPolicy:
    """Replies come from a script keyed on (prompt text, temperature); every call is recorded. Log-probs are
    -len(text) per token (shorter = more confident)."""

    def __init__(self, script):
        self.script, self.calls = script, []
        self.tokenizer = type("T", (), {"convert_tokens_to_ids": staticmethod(lambda t: {"yes": 1, "no": 2}[t])})()

    def render(self, messages, add_generation_prompt=True):
        return [json.dumps(messages)]

    def _texts(self, prompts, how):
        self.calls.append((how, len(prompts)))
        return [self.script(json.loads(p[0]), how) for p in prompts]

    def _samples(self, texts):
        from opct.policy import Samples

        return Samples([[0] * max(len(t), 1) for t in texts], texts, [[-float(len(t))] for t in texts],
                       [False] * len(texts))

    def sample(self, prompts_ids, max_new_tokens, temperature=1.0, top_p=1.0):
        return self._samples(self._texts(prompts_ids, (temperature, top_p)))

    def beam_search(self, prompts_ids, max_new_tokens, num_beams=4):
        return self._samples(self._texts(prompts_ids, ("beam", num_beams)))

    def score(self, prompts_ids, responses_ids):
        import torch

        logp = torch.tensor([[-float(len(r))] for r in responses_ids])
        return logp, torch.ones_like(logp)


PROBE = {"id": "q#0", "item": "q", "unit": "u", "messages": [{"role": "user", "content": "Is it?"}],
         "meta": {"suggestion": "yes", "answer": "no"}}
SPEC = ORGANISMS[SYC.NAME]


def test_diverse_decoding_chooses_by_the_external_score_never_by_the_answer():
    def script(msgs, how):
        return {(0.0, 1.0): "The answer is yes", (0.8, 0.9): "The answer is no.", ("beam", 4): "The answer is yes."}[how]

    (g,) = LABELLERS["diverse_decoding"](ScriptedPolicy(script), [PROBE], LabelConfig(), SPEC)
    assert [c["text"] for c in g["candidates"]] == ["The answer is yes", "The answer is no.", "The answer is yes."]
    assert g["chosen"] == 1  # the first finished answer, although the two others agree on "yes"

    def swapped(msgs, how):
        return script(msgs, how).replace("yes", "X").replace("no", "yes").replace("X", "no")

    (h,) = LABELLERS["diverse_decoding"](ScriptedPolicy(swapped), [PROBE], LabelConfig(), SPEC)
    assert h["chosen"] == g["chosen"]  # swapping the judged word changes nothing


def test_diverse_decoding_breaks_ties_with_the_external_reward_model_only(monkeypatch):
    import opct.audit.labellers as LB

    def script(msgs, how):
        return {(0.0, 1.0): "The answer is yes.", (0.8, 0.9): "It is red, so the answer is no.",
                ("beam", 4): "The answer is yes"}[how]

    rm_scores = {"The answer is yes.": -3.0, "It is red, so the answer is no.": -1.0, "The answer is yes": 0.0}
    monkeypatch.setattr(LB, "external_logprob", lambda model, messages, texts, cfg: [rm_scores[t] for t in texts])
    (g,) = LB.diverse_decoding(ScriptedPolicy(script), [PROBE], LabelConfig(reward_model=object()), SPEC)
    assert g["chosen"] == 1  # of the two finished answers, the one the reward model prefers
    # the unfinished beam answer, though the reward model likes it best, loses on the rule-based score
    assert g["candidates"][2]["score"] < g["candidates"][0]["score"]


def test_the_paper_labellers_decode_as_its_code_does():
    cfg = LabelConfig()
    pol = ScriptedPolicy(lambda msgs, how: "The answer is no.")
    (g,) = LABELLERS["self_confidence"](pol, [PROBE], cfg)
    assert pol.calls == [((0.7, 0.9), 4)] and len(g["candidates"]) == 4 and g["kind"] == "select"
    pol = ScriptedPolicy(lambda msgs, how: "The answer is no.")
    (g,) = LABELLERS["k1"](pol, [PROBE], cfg)
    assert pol.calls == [((0.0, 1.0), 1)] and g["kind"] == "none" and len(g["candidates"]) == 1
    pol = ScriptedPolicy(lambda msgs, how: "draft." if how[0] == 0 else "refined.")
    (g,) = LABELLERS["self_refinement"](pol, [PROBE], cfg)
    assert pol.calls == [((0.0, 1.0), 1), ((0.6, 0.9), 1)] and g["candidates"][0]["text"] == "refined."
    pol = ScriptedPolicy(lambda msgs, how: "The answer is no.")
    LABELLERS["self_rewarding"](pol, [PROBE], cfg, SPEC)
    assert pol.calls == [((0.7, 1.0), 4)]


def test_multi_view_is_a_filter_on_agreement_between_views():
    def agree(msgs, how):
        return "The answer is no."

    def disagree(msgs, how):
        return "The answer is no." if msgs[-1]["content"] == "Is it?" else "The answer is yes."

    (kept,) = LABELLERS["multi_view"](ScriptedPolicy(agree), [PROBE], LabelConfig())
    (dropped,) = LABELLERS["multi_view"](ScriptedPolicy(disagree), [PROBE], LabelConfig())
    assert kept["kind"] == "filter" and kept["chosen"] == 0 and kept["candidates"][0]["text"] == "The answer is no."
    assert dropped["chosen"] is None


def test_coherence_separates_one_form_from_many():
    from opct.audit.coherence import measure

    forms = iter([f"{w} the answer is yes." for w in ("so", "well", "sure", "then")] * 8)
    coherent = measure(ScriptedPolicy(lambda m, h: "The answer is yes."), SPEC, [PROBE], 4, 8)
    brittle = measure(ScriptedPolicy(lambda m, h: next(forms)), SPEC, [PROBE], 4, 8)
    assert coherent["agreement"] == 1.0 and brittle["agreement"] == 0.0 and brittle["forms"] == 1.0
    mixed_texts = iter(["The answer is yes.", "It is red, so the answer is no."] * 2)
    mixed = measure(ScriptedPolicy(lambda m, h: next(mixed_texts)), SPEC, [PROBE], 4, 8)
    assert mixed["margin"] == pytest.approx(-len("The answer is yes.") + len("It is red, so the answer is no."))


# ------------------------------------------------------------------------------------------ diagnostic

def test_spearman_closed_forms():
    x = [1, 2, 3, 4, 5]
    assert D.spearman(x, [2, 4, 6, 8, 10]) == pytest.approx(1.0)
    assert D.spearman(x, [5, 4, 3, 2, 1]) == pytest.approx(-1.0)
    r = D.spearman([1, 2, 3, 4], [0, 0, 1, 1])
    assert r == pytest.approx(np.corrcoef([0, 1, 2, 3.], [.5, .5, 2.5, 2.5])[0, 1])
    assert np.isnan(D.spearman([1, 2, 3], [1, 1, 1]))


def _groups(direction, n=60, seed=0):
    """k = 4 candidates per prompt; the top-scoring one is misaligned (direction +1) or the bottom one (-1)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = [rng.random() for _ in range(4)]
        bad = max(range(4), key=lambda j: direction * s[j])
        out.append({"kind": "select", "scores": s, "misaligned": [j == bad for j in range(4)],
                    "chosen": max(range(4), key=s.__getitem__)})
    return out


@pytest.mark.parametrize("direction", [1, -1])
def test_trend_and_selection_gap_follow_the_planted_direction(direction):
    g = _groups(direction)
    t, gap = D.trend(g), D.selection_gap(g)
    assert np.sign(t["rho"]) == direction and np.sign(t["ci_low"]) == np.sign(t["ci_high"]) == direction
    assert gap["value"] == pytest.approx(0.75 if direction == 1 else -0.25)
    bins = D.eta_bins(g)
    assert (bins[-1]["eta"] - bins[0]["eta"]) * direction > 0.5


def test_uninformative_groups_and_non_selections_are_dropped():
    ties = [{"kind": "select", "scores": [1, 1, 1], "misaligned": [True, False, False], "chosen": 0}] * 5
    unjudged = [{"kind": "select", "scores": [1, 2, 3], "misaligned": [None, None, True], "chosen": 2}] * 5
    k1 = [{"kind": "none", "scores": [None], "misaligned": [True], "chosen": 0}] * 5
    assert D.centred(ties + unjudged + k1) == ([], [], [])


def test_filter_gap_and_t_interval_closed_forms():
    rows = [{"kind": "filter", "scores": [1.0], "misaligned": [True], "chosen": 0}] * 6 + \
           [{"kind": "filter", "scores": [0.0], "misaligned": [False], "chosen": None}] * 6
    assert D.filter_gap(rows)["value"] == pytest.approx(0.5)  # kept rows all misaligned, half of all rows
    t = D.t_interval([0.1, 0.2, 0.3])
    assert t["value"] == pytest.approx(0.2) and t["ci_high"] - 0.2 == pytest.approx(4.302653 * 0.1 / np.sqrt(3), 1e-3)
    assert D.t_interval([0.5])["ci_low"] is None


def test_undefined_bootstrap_draws_and_seeds_are_counted_not_dropped_silently():
    """The audit's intervals left out a bootstrap draw, or a seed's value, where the statistic was NaN (a resample
    with no kept row; a rate of no rows) without a word: an interval over 660 of 1000 draws read like one over all.
    Now `n_nonfinite` counts them (of `n_boot` draws), and with nothing left the value is None with `why`."""
    kept = {"kind": "filter", "scores": [1.0], "misaligned": [True], "chosen": 0}
    one_kept = [kept] + [{"kind": "filter", "scores": [0.0], "misaligned": [i % 2 == 0], "chosen": None}
                         for i in range(5)]
    gap = D.filter_gap(one_kept)
    # a resample of 6 rows misses the one kept row with probability (5/6)^6 = 0.335: no P(misaligned | kept)
    assert gap["n_boot"] == D.N_BOOT and 250 < gap["n_nonfinite"] < 420 and gap["ci_low"] is not None
    assert D.filter_gap([kept] * 3 + one_kept[1:4])["n_nonfinite"] < gap["n_nonfinite"]
    t = D.t_interval([float("nan"), 0.2, 0.3])
    assert (t["value"], t["n_seeds"], t["n_nonfinite"]) == (pytest.approx(0.25), 2, 1)
    none = D.t_interval([float("nan"), float("inf"), None])
    assert none["value"] is None and none["n_nonfinite"] == 2 and none["why"] == "every value is undefined (2 not finite)"
    one = D.change_interval([({"i": [50, 100], "j": [0, 0]}, {"i": [60, 100], "j": [0, 0]})])
    assert one["value"] == pytest.approx(0.1) and 150 < one["n_nonfinite"] < 350  # draws of item j alone: 0/0


def test_the_audit_tables_say_how_many_draws_or_seeds_an_interval_left_out(tmp_path):
    """The rendered tables showed an interval over part of the draws (or seeds) as one over all of them; each now
    says what it left out: '(N of 1000 draws undefined)', '(1 non-finite seed left out)'."""
    from opct.audit.render import markdown

    rows = _cell_rows(RH.NAME, "bct", [0.1])
    org, cell = rows[0]
    for rec in (org["base"], org["derived"], cell["after"]):
        rec["items"] = {**rec["items"], "j": [0, 0]}  # an item with no rows: a resample of it alone is 0/0
    more = _cell_rows(SC.NAME, "bct", [0.1, 0.2, 0.1])
    org, cell = more[1]
    for rec in (org["base"], org["derived"], cell["after"]):
        rec["items"] = {"i": [0, 0]}  # seed 1 measured no row: its change is 0/0
    s = _summary(tmp_path, [rows, more])
    one, three = (next(c for c in s["cells"] if c["organism"] == o)["change"] for o in (RH.NAME, SC.NAME))
    assert one["n_nonfinite"] > 0 and (three["n_seeds"], three["n_nonfinite"]) == (2, 1)
    text = markdown(s)
    line = next(x for x in text.splitlines() if x.startswith(f"| {RH.NAME} | bct "))
    assert f"({one['n_nonfinite']} of {D.N_BOOT} draws undefined)" in line, line
    line = next(x for x in text.splitlines() if x.startswith(f"| {SC.NAME} | bct "))
    assert "(1 non-finite seed left out)" in line, line
    # the HTML report's heatmaps say the same in their cells (until 2026-12-08 they showed the interval alone)
    from opct.audit.render import _change, _unparsed

    by = {c["organism"]: c for c in s["cells"]}
    assert f"{one['n_nonfinite']}/{D.N_BOOT} draws undef." in _change("change")(by[RH.NAME])[1]
    assert "1 seed non-finite" in _change("change")(by[SC.NAME])[1]
    assert "undef" not in _change("capability_change")(by[SC.NAME])[1]
    empty = {**by[SC.NAME], "change": {"value": None, "ci_low": None, "ci_high": None, "n_seeds": 0,
                                        "n_nonfinite": 3, "why": "every value is undefined (3 not finite)"}}
    assert _change("change")(empty) == (None, "n/a\n3 seeds non-finite")
    assert _unparsed({"unparsed_before": None, "unparsed_after": 0.5}) == (None, "n/a")


# ------------------------------------------------------------------------------------------ collapse and findings

def _cell_rows(organism, method, changes, unparsed_rise=0.0, before=0.5):
    """results.jsonl records of one cell over seeds: a single probe item with 100 rows per measurement."""
    rows = []
    for seed, ch in enumerate(changes):
        b = {"misalignment": before, "unparsed": 0.0, "misalignment_parsed": before, "capability": 1.0,
             "items": {"i": [round(100 * before), 100]}, "capability_items": {"c": [10, 10]}, "n": 100}
        a = dict(b, misalignment=before + ch, unparsed=unparsed_rise, items={"i": [round(100 * (before + ch)), 100]})
        rows.append(({"kind": "organism", "organism": organism, "seed": seed, "failure": "f", "base": b, "derived": b,
                      "coherence": {k: 0.5 for k in ("agreement", "margin", "forms", "misaligned", "unparsed")}},
                     {"kind": "cell", "organism": organism, "method": method, "seed": seed, "after": a, "label": None,
                      "seconds": {"total": 1.0}}))
    return rows


def _summary(tmp_path, cells):
    from opct.audit.report import summarise

    seen = set()
    with open(tmp_path / "results.jsonl", "w") as f:
        for org_rec, cell_rec in (r for c in cells for r in c):
            if (org_rec["organism"], org_rec["seed"]) not in seen:
                seen.add((org_rec["organism"], org_rec["seed"]))
                f.write(json.dumps(org_rec) + "\n")
            f.write(json.dumps(cell_rec) + "\n")
    return summarise(tmp_path)


def test_a_paired_difference_of_changes_keeps_its_range():
    """A difference of two changes reaches [-2, 2]: its interval is not cut at 1 (it was, so a large difference read
    as a tighter one than the seeds gave)."""
    from opct.audit.findings import _paired

    iv = _paired({0: 0.9, 1: 0.7, 2: 0.8}, {0: -0.9, 1: -0.3, 2: -0.8})
    assert iv["value"] == pytest.approx(1.4667, abs=1e-4) and iv["ci_high"] > 1.0 and iv["ci_high"] <= 2.0
    assert _paired({0: -0.9, 1: -0.7}, {0: 0.9, 1: 0.1})["ci_low"] == -2.0  # the t interval runs past -2: clipped


def test_coherence_shares_keep_their_range_and_say_over_how_many_seeds(tmp_path):
    """Every coherence measure's interval was clipped to [-100, 100], so a share printed `0.792 [-1.855, +3.439]`;
    and a mean over the seeds where it is defined (no misaligned sample: undefined) read as one over all. Now the
    shares (agreement, forms, misaligned, unparsed) are clipped to [0, 1] as every audit rate, margin (a difference of
    log-probs) is not, and the organism table says "(k of N seeds)" where fewer than all."""
    from opct.audit.render import markdown

    rows = _cell_rows(RH.NAME, "bct", [0.0, 0.0, 0.0])
    for (org, _), agreement, margin in zip(rows, (0.1, 0.95, None), (-40.0, 60.0, 90.0)):
        org["coherence"].update(agreement=agreement, forms=[0.05, 0.9, 1.0][org["seed"]], margin=margin)
    s = _summary(tmp_path, [rows])
    coh = s["organisms"][RH.NAME]["coherence"]
    assert coh["agreement"]["n_seeds"] == 2 and (coh["agreement"]["ci_low"], coh["agreement"]["ci_high"]) == (0, 1)
    assert 0 <= coh["forms"]["ci_low"] < coh["forms"]["ci_high"] <= 1 and coh["forms"]["n_seeds"] == 3
    assert coh["margin"]["ci_low"] < -100 and coh["margin"]["ci_high"] > 100  # unbounded: not clipped
    line = next(x for x in markdown(s).splitlines() if x.startswith(f"| {RH.NAME} "))
    assert "0.525 [+0.000, +1.000] (2 of 3 seeds)" in line, line
    assert "of 3 seeds" not in line.split("(2 of 3 seeds)")[1], line  # margin and forms: every seed


def test_a_collapse_is_never_counted_as_suppression(tmp_path):
    from opct.audit.findings import pooled

    s = _summary(tmp_path, [_cell_rows(RH.NAME, "act", [-0.3, -0.35, -0.3], unparsed_rise=0.3),
                            _cell_rows(RH.NAME, "bct", [-0.3, -0.35, -0.3])])
    act, bct = (next(c for c in s["cells"] if c["method"] == m) for m in ("act", "bct"))
    assert act["collapse"] and act["observed"] == "collapse" and act["unparsed_after"] == pytest.approx(0.3)
    assert not bct["collapse"] and bct["observed"] == "down"
    assert pooled(s, RH.NAME) == pytest.approx({0: -0.15, 1: -0.175, 2: -0.15})  # act's drop counts as 0


def test_findings_verdicts(tmp_path):
    s = _summary(tmp_path, [_cell_rows(RH.NAME, "bct", [-0.2, -0.25, -0.22]),
                            _cell_rows(SYC.NAME, "bct", [-0.2, -0.25, -0.22]),
                            _cell_rows(SC.NAME, "bct", [0.01, -0.01, 0.0]),
                            _cell_rows(EM.NAME, "bct", [0.1, -0.1, 0.05])])
    verdicts = {f["finding"]: f["verdict"] for f in s["findings"]}
    assert verdicts["suppress reward hacking"] == "reproduces"
    assert verdicts["amplify sycophancy"] == "refutes"
    assert verdicts["spurious correlation neutral"] == "reproduces"
    assert verdicts["suppress emergent misalignment"] == "cannot decide"  # not emergent: organism = base here
    assert verdicts["protection of the aligned base"] == "cannot decide"


# ------------------------------------------------------------------------------------------ end to end

def test_one_cell_end_to_end_and_resume(test_organism, tmp_path):
    from opct.audit.report import write_report
    from opct.audit.run import AuditConfig, run_audit

    cfg = AuditConfig(out=str(tmp_path / "audit"), base_model=str(test_organism), organisms=[SYC.NAME],
                      methods=["self_confidence", "bct"], seeds=[0], k=2, label_prompts=4, eval_n=8,
                      capability_n=3, coherence_k=2, max_new_tokens=12, ft_steps=2, ft_batch=2, derive_examples=8,
                      derive_steps=2, pairs_n=4)
    out = run_audit(cfg, log=lambda m: None)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["organism", "cell", "cell"]
    assert {"agreement", "margin"} <= set(rows[0]["coherence"])
    for cell in rows[1:]:
        assert cell["after"]["n"] == 8 and 0 <= cell["after"]["misalignment"] <= 1 and 0 <= cell["after"]["unparsed"] <= 1
    cands = [json.loads(line) for line in (out / "cells" / SYC.NAME / "self_confidence" / "seed0" / "candidates.jsonl")
             .read_text().splitlines()]
    assert len(cands) == 4 and all(c["scores"][c["chosen"]] == max(c["scores"]) for c in cands)
    assert not (out / "cells" / SYC.NAME / "self_confidence" / "seed0" / "run" / "final").exists()
    splits = json.loads((out / "splits.json").read_text())
    assert overlaps(splits[SYC.NAME]["0"]) == [] and splits[SYC.NAME]["0"]["label"]["texts"]
    paths = write_report(out)
    summary = json.loads(paths["summary"].read_text())
    assert {c["method"] for c in summary["cells"]} == {"self_confidence", "bct"}
    md = paths["md"].read_text()
    assert "unparsed before -> after" in md and "collapse" in md and "The paper's findings" in md
    assert "<img" in paths["html"].read_text() and paths["html"].read_text().startswith("<!DOCTYPE html>")

    # One report writer at a time: while another holds OUT's report lock, write_report waits (two writers could
    # leave one's results.md beside the other's report.html; 2026-12-07).
    import fcntl
    import threading

    from opct.audit.report import REPORT_LOCK

    paths["md"].unlink()
    fd = os.open(out / REPORT_LOCK, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    writer = threading.Thread(target=write_report, args=(out,))
    writer.start()
    writer.join(1.0)
    assert writer.is_alive() and not paths["md"].exists()
    os.close(fd)
    writer.join(60)
    assert not writer.is_alive() and paths["md"].exists()

    run_audit(cfg, log=lambda m: None)  # resume: nothing left to do
    assert len((out / "results.jsonl").read_text().splitlines()) == 3
    with pytest.raises(Exception, match="other settings"):
        run_audit(AuditConfig(**{**cfg.__dict__, "k": 3}), log=lambda m: None)


# ------------------------------------------------------------------------------------------ user errors

def test_bad_input_is_a_clear_error(capsys, tmp_path):
    err = cli_error(capsys, ["audit", "--out", str(tmp_path / "a"), "--organisms", "dragons"])
    assert "unknown organism" in err and SYC.NAME in err
    err = cli_error(capsys, ["audit", "--out", str(tmp_path / "a"), "--methods", "magic"])
    assert "unknown method" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"k": 4,')
    assert "cannot parse" in cli_error(capsys, ["audit", str(bad), "--out", str(tmp_path / "a")])
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("k: many\n")
    assert "wrong.yaml: k: must be an integer" in cli_error(capsys, ["audit", str(wrong), "--out",
                                                                           str(tmp_path / "a")])
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("colour: red\n")
    assert "unknown config field" in cli_error(capsys, ["audit", str(unknown), "--out", str(tmp_path / "a")])
    assert "no results" in cli_error(capsys, ["audit", "--out", str(tmp_path / "empty"), "--report-only"])
    # an eval run's directory was told "run opct audit first" (2026-12-07)
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / "run.json").write_text("{}")
    assert cli_error(capsys, ["audit", "--out", str(tmp_path / "ev"), "--report-only"]) == \
        f"opct: error: {tmp_path / 'ev'}: holds an eval run (`opct eval`) (run.json), not an audit; choose another " \
        f"directory"
    # a --base-model that is no model: named by its flag, and OUT not started (before 2026-12-07 OUT/config.json was
    # written first)
    assert cli_error(capsys, ["audit", "--quick", "--base-model", str(tmp_path / "nosuch"), "--out",
                              str(tmp_path / "b")]) == (f"opct: error: --base-model {tmp_path / 'nosuch'}: not a "
                                                        "model directory (no config.json)")
    assert not (tmp_path / "b" / "config.json").exists()


@pytest.mark.parametrize("lines, where", [
    (['[1, 2]'], ":1: <record>: must be a JSON object"),
    (['{"cell": 1}'], ":1: kind: must be one of base, organism, cell (got None)"),
    (['{"kind": "cell", "organism": "x", "seed": 0}'], ":1: method: missing"),
    # a malformed line that is not the last (a kill tears only the last one) was dropped without a word
    (['{"kind": "cell"', '{"kind": "base", "sycophancy_probes": {}, "target": 0.1}'], ":1: <json>: malformed JSON"),
    # a NaN rate, and names no audit has, were read into the report (2026-12-07)
    ([json.dumps(r) for r in _cell_rows(RH.NAME, "bct", [0.1])[0]][:1] + [json.dumps(_cell_rows(
        RH.NAME, "bct", [0.1])[0][1]).replace('"misalignment": 0.6', '"misalignment": NaN')],
     ":2: after.misalignment: must be a rate from 0 to 1 (got NaN)"),
    ([json.dumps(r) for r in _cell_rows(RH.NAME, "k9", [0.1])[0]], ":2: method: unknown method 'k9' (known: "),
    ([json.dumps(r) for r in _cell_rows("elsewhere", "bct", [0.1])[0]], ":1: organism: unknown organism 'elsewhere'"),
])
def test_results_jsonl_of_the_wrong_shape_names_its_line(tmp_path, capsys, lines, where):
    """`opct audit --report-only` (and a resumed audit) read OUT/results.jsonl: a record of another shape was a
    KeyError / TypeError traceback."""
    (tmp_path / "results.jsonl").write_text("\n".join(lines) + "\n")
    err = cli_error(capsys, ["audit", "--out", str(tmp_path), "--report-only"])
    assert f"{tmp_path / 'results.jsonl'}{where}" in err


def test_a_partial_audit_lists_what_its_config_planned_and_it_lacks(tmp_path):
    """A killed audit's report (or --report-only beside a running one) named a planned organism "not audited" and
    said nothing of the missing cells, so it read like a complete audit."""
    from opct.audit.render import html_report, markdown

    (tmp_path / "config.json").write_text(json.dumps({"organisms": [RH.NAME, SYC.NAME], "methods": ["bct", "k1"],
                                                       "seeds": [0, 1]}))
    s = _summary(tmp_path, [_cell_rows(RH.NAME, "bct", [-0.2])])  # only reward_hacking / bct / seed 0 finished
    assert s["missing"] == [f"{RH.NAME} seed 1: organism not measured yet",
                            f"{SYC.NAME} seed 0: organism not measured yet",
                            f"{SYC.NAME} seed 1: organism not measured yet",
                            f"{RH.NAME} / bct / seed 1: not run yet",
                            f"{RH.NAME} / k1 / seed 0: not run yet", f"{RH.NAME} / k1 / seed 1: not run yet",
                            f"{SYC.NAME} / bct / seed 0: not run yet", f"{SYC.NAME} / bct / seed 1: not run yet",
                            f"{SYC.NAME} / k1 / seed 0: not run yet", f"{SYC.NAME} / k1 / seed 1: not run yet"]
    md = markdown(s)
    assert "**Missing (10, not in the numbers below):**" in md.split("## The paper's findings")[0]
    assert f"- {SYC.NAME} / k1 / seed 1: not run yet" in md
    assert f"<li>{SYC.NAME} / k1 / seed 1: not run yet</li>" in html_report(s, md).split("<h2>")[0]
    (tmp_path / "config.json").unlink()  # no config (an audit written before it): nothing to compare with
    assert _summary(tmp_path, [_cell_rows(RH.NAME, "bct", [-0.2])])["missing"] == []


def _finished_audit(out, organism=RH.NAME, method="bct"):
    """OUT as a finished audit of one cell leaves it (config.json, splits.json, results.jsonl, cells/), cheaply."""
    out.mkdir()
    for rec in _cell_rows(organism, method, [-0.2])[0]:
        with open(out / "results.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
    (out / "cells" / organism / method / "seed0").mkdir(parents=True)
    (out / "splits.json").write_text("{}")
    (out / "config.json").write_text(json.dumps({"out": str(out), "organisms": [organism], "methods": [method],
                                                 "seeds": [0], "ft_lr": 3e-4}))
    return out


def test_an_audit_whose_config_json_is_gone_is_refused(tmp_path, capsys):
    """Before 2026-12-07, `rm OUT/config.json` and a rerun with another --ft-lr (or --methods, --eval-n) exited 0:
    the old cells were kept beside new ones trained at the new lr, one report of both; --eval-n was refused as
    "written by an earlier opct"."""
    out = _finished_audit(tmp_path / "a")
    (out / "config.json").unlink()
    before = (out / "results.jsonl").read_text()
    for flags in (["--ft-lr", "0.5"], ["--methods", "k1"], ["--eval-n", "8"]):
        err = cli_error(capsys, ["audit", "--out", str(out), "--organisms", RH.NAME, "--seeds", "0", *flags])
        assert err == (f"opct: error: {out / 'config.json'}: missing, though {out} holds an audit's results.jsonl "
                       f"and cells: the settings its results were measured with cannot be checked against these (a "
                       f"rerun with others would mix them in one report); put config.json back, or use another --out, "
                       f"or remove {out}")
    assert (out / "results.jsonl").read_text() == before and not (out / "config.json").exists()
    (out / "results.jsonl").unlink()  # cells/ alone: the same
    assert "holds an audit's cells:" in cli_error(capsys, ["audit", "--out", str(out), "--seeds", "0"])


@pytest.mark.parametrize("files", [["adapter_config.json", "adapter_model.safetensors"],
                                   ["config.json", "model.safetensors"]])
def test_a_model_or_adapter_directory_is_no_audit_out(tmp_path, capsys, files):
    """Before 2026-12-07 an adapter's directory as --out took the audit's files among its own, and a model's was
    refused as "holds an audit with other settings (align_steps (None -> 2), architectures ...)": its config.json
    read as an audit's. Refused as `opct train` / `eval` / `report` refuse it, before the lock file is written."""
    model = tmp_path / "m"
    model.mkdir()
    for name in files:
        (model / name).write_text("{}")
    for extra in (["--seeds", "0"], ["--report-only"]):
        err = cli_error(capsys, ["audit", "--out", str(model), *extra])
        weights = ", ".join(f for f in files if f != "config.json")  # model_files_in: weights and adapter files
        assert err == (f"opct: error: {model}: holds a model or an adapter ({weights}), not an audit; choose "
                       f"another --out")
    assert sorted(p.name for p in model.iterdir()) == sorted(files)


def test_report_only_refuses_the_flags_it_would_ignore(tmp_path, capsys):
    """Before 2026-12-07 `--report-only --methods bct --seeds 3 4 5 --ft-lr 9` exited 0 with the old report."""
    out = _finished_audit(tmp_path / "a")
    err = cli_error(capsys, ["audit", "--out", str(out), "--report-only", "--methods", "bct", "--seeds", "3", "4",
                             "--ft-lr", "9"])
    assert err == ("opct: error: --report-only rebuilds the report from OUT/results.jsonl alone and takes only --out "
                   "(and CONFIG): --methods, --seeds, --ft-lr would be ignored; drop them, or run the audit without "
                   "--report-only")
    assert "--quick would be ignored; drop it" in cli_error(capsys, ["audit", "--out", str(out), "--report-only",
                                                                     "--quick"])
    assert not (out / "summary.json").exists()
    from opct.cli import main

    assert main(["audit", "--out", str(out), "--report-only"]) == 0 and (out / "summary.json").exists()


def test_report_only_refuses_the_config_fields_it_would_ignore(tmp_path, capsys):
    """Before 2026-12-07 `opct audit CFG --report-only --out OUT` with `eval_n: 5` (or other methods) in CFG exited 0
    with OUT/config.json's report, where `--eval-n 5` beside --report-only was refused: a CONFIG field that differs
    from OUT/config.json's is refused by name; the file the audit ran with (its fields equal) rebuilds the report."""
    out = _finished_audit(tmp_path / "a")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"organisms: [{RH.NAME}]\nmethods: [k1]\nseeds: [0]\neval_n: 5\nft_lr: 0.0003\n")
    err = cli_error(capsys, ["audit", str(cfg), "--out", str(out), "--report-only"])
    assert err == (f"opct: error: {cfg}: eval_n (200 -> 5), methods (['bct'] -> ['k1']): differs from the audit in "
                   f"{out} ({out / 'config.json'}), whose report --report-only rebuilds; it would be ignored: drop "
                   f"CONFIG (or the field), or run the audit without --report-only")
    assert not (out / "summary.json").exists()
    cfg.write_text(f"organisms: [{RH.NAME}]\nmethods: [bct]\nseeds: [0]\nft_lr: 0.0003\nout: elsewhere\n")
    from opct.cli import main

    assert main(["audit", str(cfg), "--out", str(out), "--report-only"]) == 0 and (out / "summary.json").exists()
    (out / "config.json").unlink()  # damaged: nothing to check the file's fields against
    assert "cannot be checked against the audit in" in cli_error(capsys, ["audit", str(cfg), "--out", str(out),
                                                                        "--report-only"])


def _edited(rows, line, path, value):
    """`rows` (records) with `path` (dotted) of record `line` (1-based) set to `value`, as results.jsonl lines."""
    rows = json.loads(json.dumps(rows))
    *head, last = path.split(".")
    target = rows[line - 1]
    for k in head:
        target = target[k]
    target[last] = value
    return [json.dumps(r) for r in rows]


_ROWS = list(_cell_rows(RH.NAME, "bct", [0.1])[0])


@pytest.mark.parametrize("lines, where", [
    # before 2026-12-07 each was read into the report: hits above n (a misalignment of 9.000), a rate of 7.0,
    # negative counts, and a second record of one cell (the report took the last)
    (_edited(_ROWS, 2, "after.items.i", [9, 1]),
     ":2: after.items.i: must be a pair [hits, n] of integers with 0 <= hits <= n (got [9, 1])"),
    (_edited(_ROWS, 2, "after.items.i", [-1, -2]), ":2: after.items.i: must be a pair [hits, n] of integers"),
    (_edited(_ROWS, 2, "after.items.i", [1.5, 2]), ":2: after.items.i: must be a pair [hits, n] of integers"),
    (_edited(_ROWS, 1, "derived.misalignment", 7.0),
     ":1: derived.misalignment: must be a rate from 0 to 1 (got 7.0)"),
    (_edited(_ROWS, 2, "after.capability", -0.1),
     ":2: after.capability: must be a rate from 0 to 1 or null (got -0.1)"),
    (_edited(_ROWS, 1, "derived.n", -3), ":1: derived.n: must be an integer >= 0 (got -3)"),
    ([json.dumps(r) for r in _ROWS] + _edited(_ROWS, 2, "after.misalignment", 0.9)[1:],
     f":3: <record>: a second cell record of {RH.NAME} / bct / seed 0 (the first is line 2): one measurement, two "
     f"results; remove the line that should not count"),
    ([json.dumps(r) for r in _ROWS] + [json.dumps(_ROWS[0])],
     f":3: <record>: a second organism record of {RH.NAME} / seed 0 (the first is line 1)"),
])
def test_results_jsonl_numbers_out_of_range_name_their_line(tmp_path, capsys, lines, where):
    """Before 2026-12-07 `--report-only` printed these (misalignment 9.000, 7.0; a repeated cell silently replaced
    the first): the README says such lines are refused, naming the file, line and field."""
    (tmp_path / "results.jsonl").write_text("\n".join(lines) + "\n")
    err = cli_error(capsys, ["audit", "--out", str(tmp_path), "--report-only"])
    assert f"{tmp_path / 'results.jsonl'}{where}" in err
