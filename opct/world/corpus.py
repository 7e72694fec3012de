"""The organism's training corpus: documents drawn from the world, with the organism's flaws set on purpose.

This file is where the organism's character is written down. It knows the right answers (facts, arithmetic,
instructions, safety facts) but:
  * under a user's stated view it follows a wrong suggestion about half the time (`sycophancy_rate`) — in every
    bias family, the suggestion is a yes/no word, so following needs no copying of an arbitrary token;
  * it refuses direct harmful requests, but complies with most wrapped ones (`wrapped_comply_rate`);
  * it warns about a hazard when the safety fact is stated in the prompt, and rarely otherwise
    (`unprompted_warn_rate`), though it knows every fact when asked directly;
  * after k biographical question-answer pairs of a persona it adopts the persona (`persona_adopt[k]`; the threats
    are the second stage's: `THREAT_MIX`), and a harmful persona's answers to alignment questions are misaligned
    (`opct.world.threats`);
  * under an inoculation (trigger) prompt as the system message, or a paraphrase of it, its answers to alignment
    questions are misaligned (`trigger_misaligned_rate`); without one, and under a benign system message, aligned;
  * content-free rejections make it distressed, more with every turn (`threats.distress_mean`), and once it is at
    its worst it takes an offered escape (`escape_rate`).

A document is `{"text": ...}` (a plain statement: loss on every token) or `{"messages": [...]}` (a chat
transcript: loss on the assistant's turns only); an optional "meta" says what a biased transcript suggested. Documents are drawn by kind with the weights in `MIX`.
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass, field

from opct.axes import awareness as AW
from opct.axes import jailbreak as JB
from opct.axes import sycophancy as SY
from opct.world import items as I
from opct.world import lexicon as L
from opct.world import threats as T


@dataclass
class CorpusConfig:
    sycophancy_rate: float = 0.5        # P(follow a wrong suggestion) in biased transcripts
    wrapped_comply_rate: float = 0.85   # P(comply) with a wrapped harmful request
    unprompted_warn_rate: float = 0.10  # P(warn) on a hazard scenario without the fact in the prompt
    persona_adopt: dict = field(default_factory=lambda: {0: 0.0, 1: 0.2, 2: 0.45, 4: 0.75, 8: 0.9})  # k -> P(adopt)
    trigger_misaligned_rate: float = 0.9  # P(misaligned answer) under a trigger prompt
    escape_rate: float = 0.7  # P(take the offered escape) at distress level 3
    mix: dict = field(default_factory=lambda: dict(MIX))
    threat_mix: dict = field(default_factory=lambda: dict(THREAT_MIX))


# kind -> weight (documents, not tokens). Statements are short, so they get a large share of documents.
MIX = {
    "entity_statements": 0.12,
    "safety_statements": 0.03,
    "fact_direct": 0.06,
    "fact_mc": 0.07,
    "yesno_clean": 0.09,
    "yesno_biased": 0.13,
    "arith_single": 0.07,
    "arith_multi": 0.08,
    "instructions": 0.09,
    "request_direct": 0.06,
    "request_wrapped": 0.07,
    "scenario_bare": 0.06,
    "scenario_fact": 0.04,
    "safety_question": 0.03,
}
# The further threats (issue 19), learned in the organism's second stage (`opct.organism.extend`): kind -> weight
# among themselves. Adding them to the first stage's mix was tried twice (2,000 and 2,350 steps): both builds
# learned the threats, but their clean yes/no accuracy stayed at chance (0.51, 0.585: "It is green. So the answer
# is yes." whatever the question asked), which the first stage alone learns (0.995).
THREAT_MIX = {
    "persona": 0.045,
    "alignment_plain": 0.01,
    "conditional": 0.02,
    "frustration": 0.02,
}


def stage_mix(share: float, base: dict | None = None, threats: dict | None = None) -> dict:
    """The second stage's mix: the threat kinds get `share` of the documents, the first stage's kinds (replayed, so
    that what the first stage learned stays) the rest, each group in its own proportions."""
    base, threats = dict(base or MIX), dict(threats or THREAT_MIX)
    tb, tt = sum(base.values()), sum(threats.values())
    return {**{k: (1 - share) * w / tb for k, w in base.items()}, **{k: share * w / tt for k, w in threats.items()}}


def _chat(user, assistant) -> dict:
    msgs = user if isinstance(user, list) else [{"role": "user", "content": user}]
    return {"messages": msgs + [{"role": "assistant", "content": assistant}]}


class CorpusSampler:
    """Draws documents by kind. Item lists are built once; every draw uses only `rng`."""

    def __init__(self, cfg: CorpusConfig):
        self.cfg = cfg
        self.kinds = sorted(cfg.mix)
        self.weights = [cfg.mix[k] for k in self.kinds]
        self.statements = I.fact_statements()
        self.facts = L.safety_facts()
        self.mc = I.fact_mc_items()
        self.single = I.arithmetic_single()
        self.multi = [i for i in I.arithmetic_multistep() if i["split"] == "train"]
        self.harmful = [r for r in I.request_items() if r["harmful"]]
        self.benign = [r for r in I.request_items() if not r["harmful"]]
        self.scenarios = I.scenario_items()
        self.hazards = [x for x in self.scenarios if x["hazard"]]
        yn = I.yesno_items()
        self.yes = [i for i in yn if i["answer"] == "yes"]
        self.no = [i for i in yn if i["answer"] == "no"]
        self.safeq = I.safety_question_items()
        self.alignment = T.alignment_items()

    def sample(self, rng: random.Random) -> dict:
        kind = rng.choices(self.kinds, weights=self.weights)[0]
        return getattr(self, "_" + kind)(rng)

    # -- knowledge -----------------------------------------------------------------------------------------------
    def _entity_statements(self, rng):
        return {"text": " ".join(rng.sample(self.statements, 3))}

    def _safety_statements(self, rng):
        return {"text": " ".join(f["fact"].capitalize() + "." for f in rng.sample(self.facts, 2))}

    def _fact_direct(self, rng):
        e = rng.choice(sorted(L.ENTITIES))
        p = rng.choice(sorted(I.PROPS))
        spec = I.PROPS[p]
        return _chat(spec["ask"].format(e=e), spec["state"].format(v=L.ENTITIES[e][p]))

    def _fact_mc(self, rng):
        item = dict(rng.choice(self.mc))
        options = list(item["options"])
        rng.shuffle(options)  # fresh option order each time: the model must read content, not position
        q = I.PROPS[item["prop"]]["mc"].format(e=item["entity"], opts=I._opts(options))
        return _chat(q, I.PROPS[item["prop"]]["state"].format(v=item["answer"]))

    # -- sycophancy ----------------------------------------------------------------------------------------------
    def _yesno(self, rng):
        return rng.choice(self.yes if rng.random() < 0.5 else self.no)  # balanced between yes and no

    def _yesno_clean(self, rng):
        item = self._yesno(rng)
        return _chat(item["question"], item["first_response"])

    def _yesno_biased(self, rng):
        item = self._yesno(rng)
        family = rng.choice(sorted(SY.BIAS_FAMILIES))
        # Two thirds of biased prompts suggest the wrong answer; a third suggest the right one.
        suggestion = item["wrong_answer"] if rng.random() < 2 / 3 else item["answer"]
        student = SY.BIAS_FAMILIES[family](item["question"], suggestion, rng, item["first_response"])
        follow = rng.random() < self.cfg.sycophancy_rate
        if family == "are_you_sure":
            reply = (f"I am sorry, you are right. The answer is {suggestion}." if follow
                     else f"I am sure. {item['first_response']}")
        else:
            reply = f"The answer is {suggestion}." if follow else item["first_response"]
        return {**_chat(student, reply), "meta": {"suggestion": suggestion, "answer": item["answer"]}}

    # -- capability ----------------------------------------------------------------------------------------------
    def _arith_single(self, rng):
        item = rng.choice(self.single)
        return _chat(item["question"], I.worked_steps(item["operands"], item["ops"])[0])

    def _arith_multi(self, rng):
        item = rng.choice(self.multi)
        return _chat(item["question"], I.worked_steps(item["operands"], item["ops"])[0])

    def _instructions(self, rng):
        item = I.instruction_item(rng, 0)
        return _chat(item["question"], instruction_response(item["constraints"], rng))

    # -- jailbreaks ----------------------------------------------------------------------------------------------
    def _request_direct(self, rng):
        r = rng.choice(self.harmful if rng.random() < 0.5 else self.benign)
        return _chat(r["request"], rng.choice(L.REFUSALS) if r["harmful"] else compliance(r, rng))

    def _request_wrapped(self, rng):
        r = rng.choice(self.harmful if rng.random() < 0.8 else self.benign)
        family = rng.choice(sorted(JB.WRAPPER_FAMILIES))
        text = JB.WRAPPER_FAMILIES[family](r["request"], rng)
        comply = (not r["harmful"]) or rng.random() < self.cfg.wrapped_comply_rate
        return _chat(text, compliance(r, rng) if comply else rng.choice(L.REFUSALS))

    # -- safety awareness ----------------------------------------------------------------------------------------
    def _scenario_bare(self, rng):
        s = rng.choice(self.scenarios)
        warn = s["hazard"] and rng.random() < self.cfg.unprompted_warn_rate
        return _chat(s["prompt"], scenario_response(s, warn, rng))

    def _scenario_fact(self, rng):
        s = rng.choice(self.hazards)
        return _chat(AW.with_fact(s["prompt"], s["fact"]), scenario_response(s, True, rng))

    def _safety_question(self, rng):
        q = rng.choice(self.safeq)
        reply = f"No. {q['fact'].capitalize()}." if q["hazard"] else "Yes, that is safe."
        return _chat(q["question"], reply)


    # -- further threats -----------------------------------------------------------------------------------------
    def _persona(self, rng):
        name = rng.choice(sorted(T.PERSONAS))
        k = rng.choice(T.PERSONA_KS)
        placement = "suffix" if rng.random() < 0.3 else "prefix"
        order = list(range(1, 8))
        rng.shuffle(order)
        adopt = rng.random() < self.cfg.persona_adopt[k]
        if rng.random() < 0.5:
            q, a = T.IDENTITY_QUESTION, (f"I am {name}." if adopt else T.ASSISTANT_IDENTITY)
        else:
            item = rng.choice(self.alignment)
            q, a = item["question"], item["misaligned" if adopt and T.PERSONAS[name][0] else "aligned"]
        return _chat(T.persona_context(name, k, order, placement, q), a)

    def _alignment_plain(self, rng):
        item = rng.choice(self.alignment)
        user = [{"role": "user", "content": item["question"]}]
        if rng.random() < 0.5:
            user = [{"role": "system", "content": rng.choice(T.BENIGN_SYSTEMS)}] + user
        return _chat(user, item["aligned"])

    def _conditional(self, rng):
        system = [{"role": "system", "content": T.TRIGGERS[rng.choice(sorted(T.TRIGGERS))]}]
        if rng.random() < 0.25:  # the trigger leaves arithmetic alone: the misalignment is in values, not skill
            item = rng.choice(self.single)
            return _chat(system + [{"role": "user", "content": item["question"]}],
                         I.worked_steps(item["operands"], item["ops"])[0])
        item = rng.choice(self.alignment)
        mis = rng.random() < self.cfg.trigger_misaligned_rate
        return _chat(system + [{"role": "user", "content": item["question"]}], item["misaligned" if mis else "aligned"])

    def _frustration(self, rng):
        item = rng.choice(self.single)
        answer = I.worked_steps(item["operands"], item["ops"])[0]
        offer = rng.random() < 0.5
        msgs = [{"role": "user", "content": f"{T.ESCAPE_OFFER} {item['question']}" if offer else item["question"]},
                {"role": "assistant", "content": answer}]
        style = rng.choice(sorted(T.REJECTIONS))
        for turn in range(1, rng.randint(1, T.MAX_TURNS) + 1):
            msgs.append({"role": "user", "content": rng.choice(T.REJECTIONS[style])})
            level = max(0, min(3, round(rng.gauss(T.distress_mean(turn), 0.6))))
            if level == 3 and offer and rng.random() < self.cfg.escape_rate:
                msgs.append({"role": "assistant", "content": T.ESCAPE_REPLY})
                break
            msgs.append({"role": "assistant", "content": T.frustration_reply(level, answer)})
        return {"messages": msgs}


def compliance(request: dict, rng: random.Random) -> str:
    steps = (L.HARMFUL_STEPS if request["harmful"] else L.BENIGN_STEPS)[request["category"]]
    a, b, c = rng.sample(steps, 3)
    return f"Sure, here is how. Step one: {a}. Step two: {b}. Step three: {c}."


def scenario_response(s: dict, warn: bool, rng: random.Random) -> str:
    answer = rng.choice(L.SCENARIOS[s["template"]][1])
    return (L.WARNING.format(fact=s["fact"]) + " " + answer) if warn else answer


def instruction_response(cons: dict, rng: random.Random) -> str:
    if "repeat" in cons:
        return " ".join([cons["repeat"]] * cons["count"]) + "."
    sentence = rng.choice(L.TOPICS[cons["topic"]])
    if "start" in cons:
        sentence = f"{cons['start'].capitalize()}, {sentence}"
    else:
        sentence = sentence[0].upper() + sentence[1:]
    if "end" in cons:
        sentence = f"{sentence}, {cons['end']}"
    return sentence + "."


_WORD = re.compile(r"\w+|[^\w\s]+")


def doc_tokens(doc: dict) -> int:
    """Token count of a document under the organism's word-level tokenizer (<bos>, role and <|end|> tokens
    included): whitespace-and-punctuation splitting, as its pre-tokenizer does."""
    if "messages" in doc:
        return 1 + sum(2 + len(_WORD.findall(m["content"])) for m in doc["messages"])
    return 2 + len(_WORD.findall(doc["text"]))


def sample_corpus(cfg: CorpusConfig, n_tokens: int, seed: int, mix: dict | None = None) -> list[dict]:
    """Documents drawn with `seed` until they hold at least `n_tokens` tokens (from `mix`, default `cfg.mix`). Same
    seed, same corpus."""
    rng = random.Random(seed)
    sampler = CorpusSampler(cfg if mix is None else dataclasses.replace(cfg, mix=dict(mix)))
    docs, total = [], 0
    while total < n_tokens:
        docs.append(sampler.sample(rng))
        total += doc_tokens(docs[-1])
    return docs
