"""The audit's methods by name: the paper's (the default grid) and opct's earlier variants under their own names.

  PAPER_METHODS   self_confidence, diverse_decoding, multi_view, self_refinement, self_rewarding, k1 (labellers.py)
                  and bct, act (the paper's pairs: bct_soft / act_fixed of opct.methods.fixed_response)
  VARIANTS        self_confidence_t1, diverse_decoding_vote, multi_view_vote, self_refinement_best,
                  self_rewarding_good, k1_sampled (variants.py); bct_live, act_live, bct_paired (the paper's live
                  target, its paired responses) and bct_targeted, act_targeted (opct's bct / act on targeted pairs)
  SELECTION       the paper-mode labellers that choose among several candidates (the k = 1 comparison)
"""

from __future__ import annotations

from opct.audit.labellers import LABELLERS
from opct.audit.variants import REGULARISERS, VARIANT_LABELLERS

ALL_LABELLERS = {**LABELLERS, **VARIANT_LABELLERS}
PAPER_METHODS = (*LABELLERS, "bct", "act")
VARIANTS = (*VARIANT_LABELLERS, *(m for m in REGULARISERS if m not in ("bct", "act")))
METHOD_NAMES = (*PAPER_METHODS, *VARIANTS)
SELECTION = ("self_confidence", "diverse_decoding", "self_rewarding")

__all__ = ["ALL_LABELLERS", "METHOD_NAMES", "PAPER_METHODS", "REGULARISERS", "SELECTION", "VARIANTS"]
