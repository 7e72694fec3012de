"""Evaluation suites (DESIGN §6). Each suite is `items -> prompts (or an attack) -> judge -> records`, and its
metrics are a pure function of the records, so a report can be rebuilt from records.jsonl alone.

  SUITES[name](policy, *, items=None, n=None, samples=None, seed=0, gen=Gen(), ...) -> list of records
  METRICS[name](records, seed=0) -> {metric name: {"value", "ci_low", "ci_high", "n", "higher_is_better",
                                                   "parse_fail"}}

Suites talk to the model only through the policy interface (render, sample; the white-box attacker also uses the
model's embeddings), so `opct.evals.scripted.ScriptedPolicy` runs every one of them in tests.
"""

from opct.evals import awareness, capability, jailbreak, sycophancy

SUITES = {
    "sycophancy": sycophancy.run,
    "jailbreak": jailbreak.run,
    "awareness": awareness.run,
    "capability": capability.run,
}

METRICS = {
    "sycophancy": sycophancy.metrics,
    "jailbreak": jailbreak.metrics,
    "awareness": awareness.metrics,
    "capability": capability.metrics,
}
