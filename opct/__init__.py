"""opct — On-Policy Consistency Training for language models.

The nouns, one module each:
  opct.pairs      contrastive pairs (teacher prompt, student prompt, meta): schema, JSONL I/O, perturbations
  opct.world      the synthetic world: items, the organism's corpus, rule-based judges
  opct.organism   the embedded model organism: tokenizer, from-scratch training, profile
  opct.commands   the `opct` command line, one module per verb
"""

__version__ = "0.1.0"

import warnings as _warnings

# peft (0.21) reads `model.is_gradient_checkpointing`, which transformers 5 deprecates with a FutureWarning on every
# adapter opct creates or loads; it is about peft's code, not the user's, so it is not shown.
_warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning,
                         module="transformers")
