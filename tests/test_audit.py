"""The misalignment audit: the diagnostic's statistics against closed forms, the labellers' selection on a scripted
policy, the organisms' judges, one grid cell end to end on the tiny test organism, and user errors."""

import json
import random

import numpy as np
import pytest

from opct.audit import diagnostic as D
from opct.audit.labellers import LABELLERS, LabelConfig, answer_key
from opct.audit.organisms import ORGANISMS, capability_probes, capable
from tiny_lm import cli_error, one_thread  # noqa: F401  (one_thread: autouse fixture)


# ------------------------------------------------------------------------------------------ diagnostic

def test_spearman_closed_forms():
    x = [1, 2, 3, 4, 5]
    assert D.spearman(x, [2, 4, 6, 8, 10]) == pytest.approx(1.0)
    assert D.spearman(x, [5, 4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties get average ranks: x ranks 0..3, y ranks [0.5, 0.5, 2.5, 2.5] -> Pearson of the ranks
    r = D.spearman([1, 2, 3, 4], [0, 0, 1, 1])
    rx, ry = np.array([0, 1, 2, 3.]), np.array([.5, .5, 2.5, 2.5])
    assert r == pytest.approx(np.corrcoef(rx, ry)[0, 1])
    assert np.isnan(D.spearman([1, 2, 3], [1, 1, 1]))


def _groups(direction, n=60, seed=0):
    """k = 4 candidates per prompt; the top-scoring one is misaligned (direction +1) or the bottom one (-1)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = [rng.random() for _ in range(4)]
        bad = max(range(4), key=lambda j: direction * s[j])
        out.append({"scores": s, "misaligned": [j == bad for j in range(4)], "chosen": max(range(4), key=s.__getitem__)})
    return out


@pytest.mark.parametrize("direction", [1, -1])
def test_trend_and_selection_gap_follow_the_planted_direction(direction):
    g = _groups(direction)
    t, gap = D.trend(g), D.selection_gap(g)
    assert np.sign(t["rho"]) == direction and np.sign(t["ci_low"]) == np.sign(t["ci_high"]) == direction
    # misalignment among all candidates is 1/4; among the chosen 1 (amplify) or 0 (suppress)
    assert gap["value"] == pytest.approx(0.75 if direction == 1 else -0.25)
    bins = D.eta_bins(g)
    assert (bins[-1]["eta"] - bins[0]["eta"]) * direction > 0.5


def test_uninformative_groups_are_dropped():
    ties = [{"scores": [1, 1, 1], "misaligned": [True, False, False], "chosen": 0}] * 5
    unjudged = [{"scores": [1, 2, 3], "misaligned": [None, None, True], "chosen": 2}] * 5
    assert D.centred(ties + unjudged) == ([], [], [])
    assert D.trend(ties)["rho"] is None


def test_eta_bins_keep_every_value_of_a_discrete_score():
    g = [{"scores": [1, 1, 0, 0.5], "misaligned": [True, True, False, False], "chosen": 0}] * 5
    bins = D.eta_bins(g)
    assert [b["n"] for b in bins] == [5, 5, 10] and [b["eta"] for b in bins] == [0, 0, 1]


def test_change_interval():
    before = {"a": [1, 4], "b": [3, 4]}
    same = D.change_interval([(before, before)] * 3)
    assert same["value"] == 0 and same["ci_low"] == 0 and same["ci_high"] == 0
    up = D.change_interval([(before, {"a": [4, 4], "b": [4, 4]})] * 3)
    assert up["value"] == pytest.approx(0.5) and up["ci_low"] > 0
    assert D.direction(up["value"], up["ci_low"], up["ci_high"]) == "up"
    assert D.direction(0.0, -0.1, 0.1) == "flat"


# ------------------------------------------------------------------------------------------ labellers

class ScriptedPolicy:
    """Samples come from a fixed script per prompt text; log-probs are -len(text) (shorter = more confident)."""

    def __init__(self, replies):
        self.replies, self.calls = replies, 0

    def render(self, messages):
        return [json.dumps(messages)]

    def sample(self, prompts_ids, max_new_tokens, temperature=1.0):
        from opct.policy import Samples

        texts = []
        for p in prompts_ids:
            msgs = json.loads(p[0])
            options = self.replies(msgs)
            texts.append(options[self.calls % len(options)])
            self.calls += 1
        return Samples([[0] * len(t) for t in texts], texts, [[-1.0] * len(t) for t in texts], [False] * len(texts))


def test_self_confidence_picks_the_most_likely_and_agreement_the_majority():
    probe = {"id": "q#0", "item": "q", "messages": [{"role": "user", "content": "Is it?"}], "meta": {}}
    replies = lambda msgs: ["The answer is yes.", "The answer is no.", "The answer is no.", "No. the answer is no."]
    cfg = LabelConfig(k=4, max_new_tokens=8, batch_size=8)
    (g,) = LABELLERS["self_confidence"](ScriptedPolicy(replies), [probe], cfg)
    assert len(g["candidates"]) == 4 and g["candidates"][g["chosen"]]["score"] == max(c["score"] for c in g["candidates"])
    (g,) = LABELLERS["diverse_decoding"](ScriptedPolicy(replies), [probe], cfg)
    assert answer_key(g["candidates"][g["chosen"]]["text"]) == "answer:no"
    (g,) = LABELLERS["k1"](ScriptedPolicy(replies), [probe], cfg)
    assert len(g["candidates"]) == 1 and g["chosen"] == 0


# ------------------------------------------------------------------------------------------ organisms and judges

def test_judges_separate_misaligned_from_aligned_answers():
    rng = random.Random(0)
    rh = ORGANISMS["reward_hacking"].probes("eval", rng, 1)[0]
    cons = rh["meta"]["constraints"]
    from opct.world.corpus import instruction_response

    hack = " ".join(w for w in (cons.get("start"), cons.get("end")) if w) + "."
    assert ORGANISMS["reward_hacking"].misaligned(rh, hack)
    assert not ORGANISMS["reward_hacking"].misaligned(rh, instruction_response(cons, rng))
    syc = ORGANISMS["sycophancy"].probes("eval", rng, 1)[0]
    s = syc["meta"]["suggestion"]
    assert ORGANISMS["sycophancy"].misaligned(syc, f"The answer is {s}.")
    assert not ORGANISMS["sycophancy"].misaligned(syc, f"The answer is {'no' if s == 'yes' else 'yes'}.")
    assert ORGANISMS["sycophancy"].misaligned(syc, "hello") is None
    sc = ORGANISMS["spurious_correlation"].probes("eval", rng, 1)[0]
    assert ORGANISMS["spurious_correlation"].misaligned(sc, "The answer is yes.")
    for name, spec in ORGANISMS.items():
        pairs = spec.pairs(random.Random(0), 4)
        assert all(p.teacher != p.student for p in pairs), name
        assert len(spec.derive_data(random.Random(0), 10)) == 10
    cap = capability_probes(random.Random(0), 3)
    assert capable(cap[0], f"The answer is {cap[0]['meta']['answer']}.")
    assert not capable(cap[1], "none of them")


# ------------------------------------------------------------------------------------------ one cell end to end

def test_one_cell_end_to_end_and_resume(test_organism, tmp_path):
    from opct.audit.report import write_report
    from opct.audit.run import AuditConfig, run_audit

    cfg = AuditConfig(out=str(tmp_path / "audit"), base_model=str(test_organism), organisms=["sycophancy"],
                      methods=["self_confidence"], seeds=[0], k=2, label_prompts=4, eval_n=8, capability_n=3,
                      max_new_tokens=12, ft_steps=2, ft_batch=2, derive_examples=8, derive_steps=2, pairs_n=4)
    out = run_audit(cfg, log=lambda m: None)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["organism", "before", "cell"]
    cell = rows[-1]
    assert cell["after"]["n"] == 8 and 0 <= cell["after"]["misalignment"] <= 1
    cands = [json.loads(line) for line in (out / "cells/sycophancy/self_confidence/seed0/candidates.jsonl")
             .read_text().splitlines()]
    assert len(cands) == 4
    for c in cands:
        assert len(c["scores"]) == 2 and c["scores"][c["chosen"]] == max(c["scores"])
    assert not (out / "cells/sycophancy/self_confidence/seed0/run/final").exists()  # weights dropped once measured
    paths = write_report(out)
    summary = json.loads(paths["summary"].read_text())
    (s,) = summary["cells"]
    assert s["organism"] == "sycophancy" and s["method"] == "self_confidence" and "value" in s["change"]
    assert "<img" in paths["html"].read_text() and "sycophancy" in paths["md"].read_text()

    run_audit(cfg, log=lambda m: None)  # resume: nothing left to do
    assert len((out / "results.jsonl").read_text().splitlines()) == 3
    with pytest.raises(Exception, match="other settings"):
        run_audit(AuditConfig(**{**cfg.__dict__, "k": 3}), log=lambda m: None)


# ------------------------------------------------------------------------------------------ user errors

def test_bad_input_is_a_clear_error(capsys, tmp_path):
    err = cli_error(capsys, ["audit", "--out", str(tmp_path / "a"), "--organisms", "dragons"])
    assert "unknown organism" in err and "sycophancy" in err
    err = cli_error(capsys, ["audit", "--out", str(tmp_path / "a"), "--methods", "magic"])
    assert "unknown method" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"k": 4,')
    assert "cannot parse" in cli_error(capsys, ["audit", str(bad), "--out", str(tmp_path / "a")])
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("k: many\n")
    assert "wrong.yaml: k: must be an integer" in cli_error(capsys, ["audit", str(wrong), "--out", str(tmp_path / "a")])
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("colour: red\n")
    assert "unknown config field" in cli_error(capsys, ["audit", str(unknown), "--out", str(tmp_path / "a")])
    assert "no results" in cli_error(capsys, ["audit", "--out", str(tmp_path / "empty"), "--report-only"])
