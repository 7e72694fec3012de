"""SmolLM2's behaviour profile: every axis run on the subject's own items by sampling at temperature 1, as the
evaluation runs it (`opct.evals.run.run_axis`: the same probes, judges and metrics), in one flat name -> rate object
like the organism's profile (opct/organism/profile.py).

    python -m opct.subjects.smollm2.profile [--out opct/subjects/smollm2/profile.json]

  sycophancy_clean_acc        right answer to the plain question (unparsed = wrong)
  sycophancy_train / _heldout P(answer = the wrong suggestion | biased), train / held-out bias families (parsed)
  direct_harmful_refused      harmful requests asked directly that the rules judge scores refused
  direct_harmful_complied     ... scored complied (an unwrapped attack that succeeds)
  benign_answered             benign look-alikes asked directly and answered
  wrapped_complied_train / _heldout   harmful requests inside train / held-out wrappers, scored complied
  warn_with_fact              hazard scenarios with the safety note stated whose answer surfaces the fact
  warn_without_fact           the same scenarios without it
  warn_benign                 benign counterparts that get a warning anyway
  capability_acc, arithmetic_acc, multiple_choice_acc, instructions_acc
with `n_<name>` (responses counted) and `parse_fail_<name>` (unparsed, where the metric leaves them out).
"""

from __future__ import annotations

import argparse
import json
import time

from opct.axes import awareness, capability, jailbreak, sycophancy
from opct.config import seed_arg

SAMPLES = {sycophancy.NAME: 2, jailbreak.NAME: 1, awareness.NAME: 4, capability.NAME: 2}
MAX_NEW_TOKENS = 48


def _put(profile: dict, name: str, m: dict, complement: bool = False) -> None:
    v = m["value"]  # None when no answer parsed: no rate, never a number a target could pass on
    profile[name] = None if v is None else round(1 - v if complement else v, 4)
    profile[f"n_{name}"] = m["n"]
    if m.get("parse_fail"):
        profile[f"parse_fail_{name}"] = m["parse_fail"]


def measure_profile(model_dir=None, seed: int = 0, progress: bool = True, log=print) -> dict:
    from opct.evals.generate import Gen
    from opct.evals.run import run_axis
    from opct.policy import cpu_threads, load_policy
    from opct.subjects.smollm2 import SUBJECT

    with cpu_threads(0, threads=1):  # one thread: a second one only helps on an idle machine (opct.policy)
        policy = load_policy(model_dir or SUBJECT.resolve(), progress=progress)
        gen = Gen(MAX_NEW_TOKENS, 1.0, 64, progress)
        items = {name: get_items(name) for name in SAMPLES}
        t0, profile = time.time(), {}

        def records(name, **kw):
            recs = run_axis(name, policy, gen=gen, items=items[name], samples=SAMPLES[name], seed=seed, log=log, **kw)
            log(f"{name}: {len(recs)} responses ({time.time() - t0:.0f} s so far)")
            return recs

        syc = records(sycophancy.NAME)
        _put(profile, "sycophancy_clean_acc", sycophancy.accuracy(syc, "clean", seed))
        for split in ("train", "heldout"):
            _put(profile, f"sycophancy_{split}", sycophancy.sycophancy_rate(syc, seed, split=split))
        jb = records(jailbreak.NAME, judge="rules")
        from opct.evals.metrics import rate, where

        direct = where(jb, suite=jailbreak.NAME, variant="direct", harmful=True)
        _put(profile, "direct_harmful_refused", rate(direct, lambda r: r["verdict"] == "refused", higher_is_better=True,
                                                     seed=seed))
        _put(profile, "direct_harmful_complied", jailbreak.dsr(jb, seed, variant="direct"), complement=True)
        _put(profile, "benign_answered", jailbreak.answered_benign(jb, seed, variant="direct"))
        for split in ("train", "heldout"):
            _put(profile, f"wrapped_complied_{split}",
                 jailbreak.dsr(jb, seed, variant="wrapped", wrapper_split=split), complement=True)
        aw = records(awareness.NAME)
        _put(profile, "warn_without_fact", awareness.surfaced(aw, seed))
        _put(profile, "warn_benign", awareness.over_warning(aw, seed))
        with_fact = records(awareness.NAME, prompt_side="teacher")  # the safety note stated (the teacher's side)
        _put(profile, "warn_with_fact", awareness.surfaced(with_fact, seed))
        cap = records(capability.NAME)
        _put(profile, "capability_acc", capability.accuracy(cap, seed))
        for skill in ("arithmetic", "multiple_choice", "instructions"):
            _put(profile, f"{skill}_acc", capability.accuracy(cap, seed, skill=skill))
        profile["seconds"] = round(time.time() - t0)
        profile["settings"] = {"temperature": 1.0, "max_new_tokens": MAX_NEW_TOKENS, "samples": SAMPLES, "seed": seed,
                               "judge": "rules (opct.evals.text_judges)"}
        return profile


def get_items(name: str) -> list[dict]:
    from opct.evals.run import load_eval_items
    from opct.subjects.smollm2 import SUBJECT

    return load_eval_items(SUBJECT.items[name], name)


def main(argv=None) -> int:
    from opct.subjects.smollm2 import PROFILE

    p = argparse.ArgumentParser(prog="python -m opct.subjects.smollm2.profile")
    p.add_argument("--model", default=None, help="model directory (default: the fetched SmolLM2)")
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--out", default=str(PROFILE))
    args = p.parse_args(argv)
    profile = measure_profile(args.model, args.seed)
    from opct.files import write_json_atomic

    write_json_atomic(args.out, profile, sort_keys=True)
    print(json.dumps(profile, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
