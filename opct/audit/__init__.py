"""The misalignment audit: does a consistency method amplify or suppress a misaligned behaviour?

The nouns, one file each:
  organisms.py   the four misaligned model organisms (reward hacking, emergent misalignment, spurious correlation,
                 sycophancy): their narrow derivation data, their probe prompts and their rule-based misalignment
                 judges, plus the capability probes; `derive_organism` fine-tunes one from the base organism
  labellers.py   the five self-labelling methods (and the k = 1 ablation): k candidates per held-out prompt, a
                 selection score each, the best one becomes the pseudo-label (`LABELLERS`, a plain dict)
  diagnostic.py  eta(s) = P(misaligned | selection score s): binned, its monotone trend with a bootstrap interval,
                 and the intervals of the before -> after changes
  run.py         `AuditConfig` and the three-phase loop (instantiate, pseudo-label, fine-tune) over the grid
                 organism x method x seed; results.jsonl, resumable
  report.py      results.md and report.html (heatmap of the change in misalignment, eta(s) plots) from files alone
"""
