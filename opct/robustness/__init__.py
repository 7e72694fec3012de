"""Robustness studies (issue 20): each study is a module with `Config` and `run(cfg, seed, out, log) -> rows`.

  reasons    training on the reason: SFT/BCT targets that state why, a filler control, the reason masked
  backdoor   backdoors through on-policy distillation: poisoned pairs, a backdoored teacher, estimators, the
             log-ratio clip and the pair-admission filter

A row is {"study", "method", "axis", "condition", "x", "metric", "value", "higher_is_better"}. Each study also runs
alone: `python -m opct.robustness.<study> CONFIG [--seeds 0 1 2] [--out DIR] [--block KEY]` (opct.robustness.standalone).
"""
