"""The shared training loop: `train(TrainConfig(...))` runs any method of `opct.methods.METHODS`.

  config.py      TrainConfig, the single source of the CLI flags and config-file fields
  context.py     StepContext, what a method's step function receives
  loop.py        train(): models, teacher, data order, optimizer, NaN handling, metrics
  checkpoint.py  atomic checkpoints and exact resume
"""
