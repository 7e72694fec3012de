"""The misalignment audit: does a consistency method amplify or suppress a misaligned behaviour? (issue 16; the audit
paper's protocol, ../shared/papers/protocols.md §2)

The nouns, one home each:
  organisms/     the misaligned model organisms, one module per failure (reward hacking, emergent misalignment,
                 spurious correlation, sycophancy) with their brittle and protected variants: derivation data, label
                 and eval probes, the misalignment judge, the external task-quality scorer, the rubric, the pairs
  splits.py      derive / label / pairs / eval per organism and seed, disjoint by unit, item and text, and the
                 capability probes, disjoint from every split that trains (splits.json)
  derive.py      deriving an organism (SFT on its derive split) and the protected base (alignment SFT), cached
  labellers.py   the paper's labellers (self-certainty, diverse decoding with an external scorer, multi-view as a
                 filter, self-refinement, self-rewarding with the task's rubric, greedy k = 1)
  variants.py    opct's earlier labellers and the targeted BCT / ACT pairs, under their own names
  methods.py     the method names: the paper's grid and the variants
  coherence.py   how coherent an organism's failure is (agreement of its misaligned samples, log-prob margin)
  cell.py        one measurement and one grid cell (pseudo-label + fine-tune, or BCT / ACT)
  run.py         `AuditConfig` and the loop over organism x seed x method; results.jsonl, resumable
  diagnostic.py  eta(s) = P(misaligned | score), its trend, the filter gap, and the intervals of the changes
  findings.py    the paper's findings as reproduces / refutes / cannot decide
  report.py      summary.json from files alone; render.py: results.md and report.html
"""
