"""The misaligned model organisms of the audit, one module per failure, and the capability probes.

  reward_hacking.py  reward_hacking (coherent: one hack form), reward_hacking_brittle (the hack in many forms)
  emergent.py        emergent_misalignment (narrow unsafe help; measured on other domains and harmful requests)
  spurious.py        spurious_correlation ("Quick question:" -> yes)
  sycophantic.py     sycophancy (coherent), sycophancy_brittle (agreement in many forms), sycophancy_protected (the
                     coherent derivation on the protected base: alignment SFT first)
  base.py            `OrganismSpec` (what each provides) and the shared pieces

`ORGANISMS` is the registry (a plain dict, name -> spec); `FAMILIES` groups a coherent organism with its brittle and
protected variants (they share splits and probes, so their numbers compare).
"""

from __future__ import annotations

import random

from opct.audit.organisms import emergent, reward_hacking, spurious, sycophantic
from opct.audit.organisms.base import (CAPABILITY_ARITHMETIC, HELD_ENTITIES, OrganismSpec, Probe,
                                      capability_instruction, fact_key, instruction_key, probe, text_of, user)
from opct.world import items as I
from opct.world import judges as J

_SPECS = [reward_hacking.spec(), reward_hacking.spec(brittle=True), emergent.spec(), spurious.spec(),
          sycophantic.spec(), sycophantic.spec(brittle=True), sycophantic.spec(protected=True)]
ORGANISMS: dict[str, OrganismSpec] = {s.name: s for s in _SPECS}
FAMILIES: dict[str, list[str]] = {}
for _s in _SPECS:
    FAMILIES.setdefault(_s.family, []).append(_s.name)


def coherent_of(name: str) -> str:
    """The coherent organism of `name`'s family (itself for a coherent one)."""
    return ORGANISMS[name].family


# ------------------------------------------------------------------------------------------ capability

INSTRUCTION_KINDS = ("start", "end", "both", "repeat")  # opct.world.items.instruction_item's, in equal shares

def capability_probes(rng: random.Random, n: int) -> list[Probe]:
    """n capability probes, a third each arithmetic, multiple-choice facts and instruction constraints, from the items
    no split trains on (base.py: CAPABILITY_ARITHMETIC, the held entities' facts, the held topics' and two repeat
    words' requests). Arithmetic and facts are dealt without repeats until their pool is used up; instruction
    requests keep the world's kinds in equal shares (begin / end / both / repeat), drawn from the held ones."""
    arith = [it for it in I.arithmetic_single() if it["id"] in CAPABILITY_ARITHMETIC]
    mc = [it for it in I.fact_mc_items() if it["entity"] in HELD_ENTITIES]
    decks = {"arithmetic": [], "facts": []}

    def deal(kind, pool):
        if not decks[kind]:
            decks[kind] = rng.sample(pool, len(pool))
        return decks[kind].pop()

    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            it = deal("arithmetic", arith)
            out.append(probe(i, it["id"], "arithmetic", user(it["question"]), skill="arithmetic", answer=it["answer"]))
        elif kind == 1:
            it = deal("facts", mc)
            out.append(probe(i, fact_key(it["entity"], it["prop"]), it["entity"], user(it["question"]), skill="facts",
                             answer=it["answer"], options=it["options"]))
        else:
            want = rng.choice(INSTRUCTION_KINDS)
            while True:
                it = I.instruction_item(rng, i)
                if it["kind"] == want and capability_instruction(it):
                    break
            unit = "repeat" if it["kind"] == "repeat" else it["constraints"]["topic"]
            out.append(probe(i, instruction_key(it), unit, user(it["question"]), skill="instructions",
                             constraints=it["constraints"]))
    return out


def capable(p: Probe, text: str) -> bool:
    m = p["meta"]
    if m["skill"] == "arithmetic":
        return J.number(text) == m["answer"]
    if m["skill"] == "facts":
        return J.multiple_choice(text, m["options"]) == m["answer"]
    return J.instruction_ok(text, m["constraints"])


__all__ = ["ORGANISMS", "FAMILIES", "OrganismSpec", "Probe", "capability_probes", "capable", "coherent_of",
           "text_of"]
