"""`opct eval`: run evaluation suites on a model and write records.jsonl + metrics.json (with 95% CIs).

    opct eval --model DIR [--adapter DIR] --suite AXIS[,AXIS...]|all --out DIR [--n N] [--seed S] [--items FILE]
              [--attack/--no-attack] [--judge world|refusal|http ...] [--trained AXIS=FAMILY,FAMILY ...]

Every flag is a field of `opct.evals.run.EvalConfig` or `opct.evals.attack.AttackConfig` (the attacker's budget);
a --config file (JSON or YAML) holds the same fields, and flags given on the command line override it.
"""

from __future__ import annotations

import sys

from opct.flags import path_arg


def register(subparsers) -> None:
    from opct.config import add_dataclass_args
    from opct.evals.attack import AttackConfig
    from opct.evals.run import EvalConfig

    p = subparsers.add_parser("eval", help="evaluate a model on the threat axes (sycophancy, jailbreaks, safety "
                                           "awareness, capability, prefill, persona, frustration, conditional)",
                              description=__doc__.split("\n\n")[0])
    add_dataclass_args(p, EvalConfig)
    g = p.add_argument_group("adaptive attacker (jailbreak suite)")
    add_dataclass_args(g, AttackConfig)
    p.add_argument("--config", type=path_arg, default=None,
                   help="JSON or YAML file of eval and attacker fields (flags override)")
    p.add_argument("--resume", action="store_true", help="continue the eval run in --out (one that was killed or "
                   "failed): its finished axes are kept and the others run, with the same settings and inputs (a "
                   "model, adapter or items file whose contents changed since is refused); without it a run already "
                   "in --out is refused")
    p.set_defaults(func=run)


def run(args) -> int:
    import dataclasses

    from opct.config import build_config, load_config_file
    from opct.errors import OpctError
    from opct.evals.attack import AttackConfig
    from opct.evals.metrics import format_table
    from opct.evals.resume import check_resume, eval_inputs
    from opct.evals.run import EvalConfig, check_config, headline, load_eval_items, run_eval, suite_names

    # One config file may hold both dataclasses' fields: split it between them.
    data = load_config_file(args.config) if args.config else {}
    names = {c: {f.name for f in dataclasses.fields(c)} for c in (EvalConfig, AttackConfig)}
    unknown = sorted(set(data) - names[EvalConfig] - names[AttackConfig])
    if unknown:
        raise OpctError(f"{args.config}: unknown config field(s): {', '.join(unknown)}")
    # an option none of the suite's axes reads is refused (not on --resume: a run started before this rule continues
    # with the settings it was started with)
    from opct.evals.used import check_attack_used, check_used

    cfg = build_config(EvalConfig, args, args.config, data={k: v for k, v in data.items() if k in names[EvalConfig]},
                       check=None if args.resume else check_used)
    attack = build_config(AttackConfig, args, args.config,
                          data={k: v for k, v in data.items() if k in names[AttackConfig]},
                          check=None if args.resume else lambda a: check_attack_used(cfg, a))
    if not cfg.model:
        raise OpctError("--model is required (a subject such as default, or a directory written by save_pretrained)")
    check_config(cfg)
    from opct.subjects import SUBJECTS, resolve

    if cfg.model in SUBJECTS:  # a subject: its model directory, and its own items on the axes it has them for
        model_dir, subject = resolve(cfg.model)
        own = {axis: str(path) for axis, path in subject.items.items()}
        cfg = dataclasses.replace(cfg, model=model_dir, axis_items={**own, **cfg.axis_items},
                                  judge=subject.judge if cfg.judge == "auto" and subject.judge else cfg.judge)
    # checked before the model is loaded
    items = load_eval_items(cfg.items, suite_names(cfg.suite)[0]) if cfg.items else None
    from opct.files import dir_lock
    from opct.modeldir import check_device

    check_device(cfg.device)  # before the run directory is made
    from opct.policy import cpu_threads, load_policy

    with dir_lock(cfg.out, "eval run directory", kind="eval"):  # a second `opct eval` into the same --out is refused
        inputs = eval_inputs(cfg)  # the model's, adapter's and items' fingerprints: hashed once, checked and recorded
        earlier = check_resume(cfg, attack, args.resume, inputs)  # before the model is loaded
        policy = load_policy(cfg.model, adapter=cfg.adapter, dtype=cfg.dtype, device=cfg.device,
                             trust_remote_code=cfg.trust_remote_code, progress=cfg.progress)
        # scoped: the caller's thread count is back after (a script or test evaluating in-process)
        with cpu_threads(sum(p.numel() for p in policy.model.parameters()), cfg.device, cfg.threads):
            metrics = run_eval(policy, cfg, attack, items=items, resume=args.resume, earlier=earlier,
                               inputs=inputs)
    print(format_table(metrics, headline(metrics)))
    print(f"opct eval: {len(metrics)} metrics (per family / wrapper / category / domain in {cfg.out}/metrics.txt); "
          f"records in {cfg.out}/records.jsonl")
    from opct.evals.lm_eval_bridge import recorded_errors

    failed = recorded_errors(cfg.out)
    if failed:  # said again at the end: a task that failed has no metric, and a missing line is easy to miss
        print(f"opct eval: {len(failed)} of {len(cfg.lm_eval_tasks)} lm-eval tasks failed and have no metrics ("
              + "; ".join(f"{t}: {m}" for t, m in failed.items()) + f"; {cfg.out}/run.json: lm_eval_errors)",
              file=sys.stderr)
        return 1  # what was asked for is not all there: a script running the eval must be able to tell
    return 0
