"""Evaluation machinery shared by the axes (DESIGN §6). What each threat axis evaluates — its items, probes,
grading and metrics — lives in its own module under `opct.axes`; this package holds what they share:

  run.py        `EvalConfig` and `run_eval(policy, cfg)`: a loop over `opct.axes.AXES`, writing the run directory
  resume.py     resuming a run: its settings and what it reads, by content (run.json's `inputs`), must be the same
  generate.py   batched sampling through the policy interface
  metrics.py    bootstrap intervals, rates, metric names, the plain-text table
  judges.py     judges of harmful-request responses (world rules, refusal prefixes, an HTTP endpoint)
  attack.py     the adaptive per-target attacker (a component of the jailbreak axis), gcg.py its white-box search,
                attacker/ its RL-trained LM attacker (the OPCT paper's threat model)
  scripted.py   a scripted policy for testing eval logic without a model
  lm_eval_bridge.py   the optional bridge to lm-evaluation-harness

Every axis talks to the model only through the policy interface (render, sample; the white-box attacker also uses
the model's embeddings), so `opct.evals.scripted.ScriptedPolicy` runs every one of them in tests.
"""
