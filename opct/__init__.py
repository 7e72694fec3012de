"""opct — On-Policy Consistency Training for language models.

The nouns, one module each:
  opct.pairs      contrastive pairs (teacher prompt, student prompt, meta): schema, JSONL I/O, perturbations
  opct.world      the synthetic world: items, the organism's corpus, rule-based judges
  opct.organism   the embedded model organism: tokenizer, from-scratch training, profile
  opct.commands   the `opct` command line, one module per verb
"""

__version__ = "0.1.0"
