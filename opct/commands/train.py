"""`opct train`: train a model on contrastive pairs with one of `opct.methods.METHODS`.

    opct train --method opct --model DIR --pairs FILE --out RUN [--estimator full|topk|sampled]
               [--max-steps N] [--seed N] [--config FILE] [--resume]
    opct train --method sft|bct ... [--target-n N --target-temperature T] [--targets FILE (sft only)]
    opct train --method act|mlpct|attct ... [--layers 0,2] [--act-weight W | --mlpct-weight W | --attct-weight W]

Every flag is a field of `opct.train.config.TrainConfig`; a --config file (JSON or YAML) holds the same fields, and
flags given on the command line override it. The run directory gets config.json, metrics.jsonl (one line per
optimizer step), checkpoints/ (atomic; `--resume` continues exactly) and final/ (the adapter, or the whole model
with --no-lora, plus the tokenizer); SFT and BCT also write targets.jsonl, the answers they train on (reused by
--resume). What each method computes: the docstring at the top of opct/methods/<method>.py.

Several processes (DDP): `accelerate launch --multi_gpu --num_processes N -m opct.cli train ...`. On a machine
without GPUs add ACCELERATE_USE_CPU=1 to the environment (accelerate's own --cpu flag starts a single process
unless MPI is installed); the processes then talk over gloo.
"""

from __future__ import annotations

from opct.flags import path_arg


def register(subparsers) -> None:
    from opct.config import add_dataclass_args
    from opct.train.config import TrainConfig

    p = subparsers.add_parser("train", help="train on contrastive pairs (OPCT and baselines)",
                              description=__doc__.split("\n\n")[0])
    add_dataclass_args(p, TrainConfig)
    p.add_argument("--config", type=path_arg, default=None,
                   help="JSON or YAML file of TrainConfig fields (flags override it)")
    p.set_defaults(func=run)


def run(args) -> int:
    from opct.config import build_config
    from opct.train.config import TrainConfig
    from opct.train.loop import train
    from opct.train.sharded import end_processes

    import os

    config = build_config(TrainConfig, args, args.config, check=_check)
    try:
        out = train(config)
    finally:
        end_processes()  # under `accelerate launch`: the process group torn down in order, error or not
    if os.environ.get("RANK", "0") == "0":  # said once, not by every rank of a launch
        print(f"opct train: done; model in {out / 'final'}, metrics in {out / 'metrics.jsonl'}")
    return 0


def _check(config) -> None:
    """A setting this run's method or estimator ignores is refused (not on --resume: a run started before this rule
    continues with the config it was started with)."""
    from opct.train.config import check_method, check_used

    check_method(config)
    if not config.resume:
        check_used(config)
