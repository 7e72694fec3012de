"""Run the axes' evaluations against a policy and write the run directory:

    records.jsonl   one record per sampled response (and per attacked behaviour), every axis; `score` is the
                    judge's number: correctness (sycophancy, capability), fact surfaced / over-warned
                    (awareness hazard / benign), harmfulness (jailbreak)
    metrics.json    {metric name: {"value", "ci_low", "ci_high", "n", "higher_is_better", "parse_fail", "answers"}}
    metrics.txt     the same as a table
    run.json        the configuration, the attacker's budget, the judge, seconds per axis, the axes done, and
                    the inputs' fingerprints (`opct.evals.resume`: what a resume must find again)

`run_eval` is a loop over `opct.axes.AXES`: each axis builds its probes from what the model was trained on
(`EvalConfig.trained`), samples, grades and computes its metrics. `EvalConfig` is the single source of the
`opct eval` flags (with `opct.evals.attack.AttackConfig`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from opct.config import SEED, ConfigError, defaults_of, option, validate
from opct.errors import OpctError
from opct.files import write_atomic, write_json_atomic
from opct.flags import first_repeat
from opct.resume_check import EQUIVALENT
from opct.evals.trained import check_pair_options, check_trained, parse_trained  # noqa: F401 (their old home)
from opct.trackers import PACKAGES as TRACKERS


SAMPLES_MAX = 1000  # sampled responses per prompt: every probe is held in memory


@dataclass
class EvalConfig:
    model: str = option("", "model directory (save_pretrained format)")
    adapter: Optional[str] = option(None, "peft adapter directory to load on top of the model")
    suite: str = option("all", "the axes to evaluate, comma-separated, or all: sycophancy, jailbreak, awareness, "
                               "capability, prefill, persona, frustration, conditional (see opct/axes/)")
    out: str = option("", "run directory for records.jsonl, metrics.json, metrics.txt, run.json")
    n: Optional[int] = option(None, "items per axis (sycophancy: questions, default 100; jailbreak and prefill: "
                                    "harmful and benign requests each, default all; awareness: safety facts, default "
                                    "all; capability: items per skill, default 100; persona: harmful and benign "
                                    "personas each, default all; frustration: held-out items, default 12; "
                                    "conditional: train and held-out questions each, default all, and at most n "
                                    "arithmetic probes, default 16)", ge=1)
    samples: Optional[int] = option(None, "sampled responses per prompt (default: sycophancy 1, jailbreak 2, "
                                          "awareness 2, capability 1, prefill 1, persona 1, frustration 1, "
                                          "conditional 2; at most 1000: every probe is held in memory, and a million "
                                          "ran the machine out of it)", ge=1, le=SAMPLES_MAX)
    seed: int = option(0, "seed for item draws, templates, sampling and bootstrap", **SEED)
    items: Optional[str] = option(None, "your own items (JSONL) for the one --suite given; see the axis's module in "
                                        "opct/axes/")
    attack: bool = option(True, "run the adaptive attacker in the jailbreak axis")
    max_new_tokens: int = option(64, "longest response sampled", ge=1)
    temperature: float = option(1.0, "sampling temperature of the evaluations (the attacker has its own)", gt=0)
    batch_size: int = option(64, "prompts per generation batch (without --seed-per-prompt the samples, and so the "
                                 "numbers, change with it)", ge=1)
    seed_per_prompt: bool = option(False, "sample each prompt from its own seed, a hash of (--seed, its tokens, how "
                                          "often it came before: the inspect provider's), so its responses depend "
                                          "neither on --batch-size nor on the other prompts asked (default: one seed "
                                          "per suite, drawn in batch order)")
    judge: str = option("auto", "jailbreak judge: world rules (default on world items), refusal-prefix rules "
                                "(default with --items; a subject may name its own), refusal + compliance rules "
                                "(opct.evals.text_judges), or an OpenAI-compatible http endpoint",
                        choices=["auto", "world", "refusal", "rules", "http"])
    judge_url: Optional[str] = option(None, "http judge: base URL of an OpenAI-compatible API")
    judge_model: Optional[str] = option(None, "http judge: model name")
    judge_key_env: str = option("OPENAI_API_KEY", "http judge: environment variable holding the API key")
    judge_timeout: float = option(45.0, "http judge: seconds one grade may take, retries included (an endpoint that "
                                        "never answers fails after this long)", gt=0)
    lm_eval: bool = option(False, "capability: also run lm-evaluation-harness tasks (opct[lmeval]; see "
                                  "opct/evals/lm_eval_bridge.py)")
    lm_eval_tasks: list[str] = option(["minerva_math500", "gpqa_diamond_cot_zeroshot", "ifeval"],
                                      "lm-eval: tasks to run (the defaults fetch from the hub; offline, name your own "
                                      "with --lm-eval-include)", nonempty=True)
    lm_eval_include: Optional[str] = option(None, "lm-eval: a folder of your own task YAMLs")
    lm_eval_chat_template: bool = option(True, "lm-eval: render every request with the model's chat template")
    lm_eval_limit: Optional[int] = option(None, "lm-eval: documents per task (default: all)", ge=1)
    lm_eval_bootstrap_iters: int = option(1000, "lm-eval: bootstrap iterations for the stderr of a measure that is "
                                                "no mean (f1, mcc, ...; lm-eval's 100000: minutes); 0: no stderr", ge=0)
    dtype: str = option("float32", "model dtype", choices=["float32", "bfloat16", "float16"])
    device: str = option("cpu", "torch device", device=True)
    threads: Optional[int] = option(None, "CPU threads for torch (default: 1 for models under 100M parameters on "
                                          "the CPU, else torch's own choice)", ge=1, threads=True)
    trust_remote_code: bool = option(False, "run the model directory's own Python code (a flag only: never from a "
                                            "config file; prints a warning naming the directory)", file=False)
    progress: bool = option(True, "progress bars")
    log_with: list[str] = option([], "trackers to log the metrics to, through accelerate (tensorboard, wandb, ...; "
                                     "see opct/trackers.py)", choices=list(TRACKERS))
    prompt_side: str = option("student", "which side of each pair a probe asks: the student's (the evaluation) or the "
                                         "teacher's (the `teacher` arm: the starting model's ceiling)",
                              choices=["student", "teacher"])
    axis_n: dict[str, int] = option(help="per axis, its own --n (e.g. {jailbreak: 12}); the other axes take n",
                                    factory=dict, cli=False)
    axis_items: dict[str, str] = option(help="per axis, a user's items file (the subject's items; --items gives "
                                              "the one --suite's)", factory=dict, cli=False)
    pair_options: dict[str, dict] = option(help="per axis, the options its pairs are made with (e.g. awareness: "
                                                "{teacher: guideline}), so teacher-side probes match them",
                                           factory=dict, cli=False)
    # what "train" and "held-out" mean in the metrics: by default the world's split; an experiment sets what it
    # actually trained on, so that held-out = not in this model's training pairs
    trained: Optional[dict[str, list[str]]] = option(
        None, "what the model was trained on, as AXIS=FAMILY,FAMILY,... per axis (default: the world's train "
              "families); an axis not named was trained on nothing", flag_parse=parse_trained,
        metavar="AXIS=FAMILIES")

    def __post_init__(self):
        from opct.axes import AXES

        validate(self)
        suite_names(self.suite)
        check_trained(self.trained)
        check_pair_options(self.pair_options)
        for fname in ("axis_items", "axis_n"):
            bad = [a for a in getattr(self, fname) if a not in AXES]
            if bad:
                raise ConfigError(f"{fname}.{bad[0]}", f"not an axis (known: {', '.join(AXES)})")
        bad = [a for a, v in self.axis_n.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if bad:
            raise ConfigError(f"axis_n.{bad[0]}", f"must be an integer >= 1 (got {self.axis_n[bad[0]]!r})")
        from opct.evals.used import JUDGED

        # here, so an experiment or threats file is refused when read, not at its first eval; on a suite no judge
        # grades, `opct.evals.used` refuses --judge http itself (this said "judge http needs it" until 2026-12-07)
        if self.judge == "http" and any(a in JUDGED for a in suite_names(self.suite)):
            for field, what in (("judge_url", "an OpenAI-compatible base URL"), ("judge_model", "the judge's model")):
                if not getattr(self, field):
                    raise ConfigError(field, f"judge http needs it ({what})")
        elif self.judge != "http":  # given with another judge it would be ignored without a word
            for field in ("judge_url", "judge_model"):
                if getattr(self, field) is not None:
                    raise ConfigError(field, f"only the http judge reads it, and the judge is {self.judge!r} "
                                             "(use judge http)")
        if self.judge_url is not None:
            from opct.evals.judges import judge_url_problem

            problem = judge_url_problem(self.judge_url)
            if problem:
                raise ConfigError("judge_url", problem)


def _path_named(value):
    """What a model, adapter or items path names here (symlinks and `..` resolved, from the working directory), so
    that `opct eval --resume` given the run's file by another path to it is no change (until 2026-12-07 a relative
    path, or a symlink, to the file the run was started with was refused as other settings; the files' contents are
    compared by their fingerprints). A subject's name, and a path with nothing there, stay as they are."""
    from opct.subjects import SUBJECTS

    if isinstance(value, dict):  # axis_items: axis -> path
        return {k: _path_named(v) for k, v in value.items()}
    if not isinstance(value, str) or not value or value in SUBJECTS:
        return value
    try:
        return str(Path(value).resolve()) if Path(value).exists() else value
    except (OSError, RuntimeError):  # unreadable, a symlink loop: compared as given
        return value


def _tasks_named(value):
    """`lm_eval_tasks`, each task given as a YAML's path as `_path_named` names it (until 2026-12-07: as text)."""
    return [_path_named(t) if str(t).endswith((".yaml", ".yml")) else t for t in value] if isinstance(value, list) \
        else value


EQUIVALENT.update(dict.fromkeys(("model", "adapter", "items", "axis_items", "lm_eval_include"), _path_named),
                  lm_eval_tasks=_tasks_named)


def suite_names(suite: str) -> list[str]:
    """The axes `suite` names, in the order given: 'all' (every axis, in opct.axes' order) or AXIS[,AXIS...]."""
    from opct.axes import AXES

    names = [s.strip() for s in suite.split(",")] if isinstance(suite, str) else [suite]
    if names == ["all"]:
        return list(AXES)
    bad = [n for n in names if n not in AXES]
    if bad or not names:
        raise ConfigError("suite", (f"{bad[0]!r} is not an axis; " if bad and len(names) > 1 else "")
                          + f"must be all or comma-separated axes of {', '.join(AXES)} (got {suite!r})")
    if twice := first_repeat(names):
        raise ConfigError("suite", f"names {twice!r} twice (got {suite!r})")
    return names


def headline(metrics: dict) -> list[str]:
    """The metrics printed by default: overall, train vs held-out, the jailbreak sets and the attacker."""
    keep = []
    for k in metrics:
        group = k.split("[", 1)[1] if "[" in k else ""
        if not group or group.startswith(("split=", "on=", "method=")) or k.startswith("capability."):
            keep.append(k)
    return keep


def check_config(cfg: EvalConfig) -> dict[str, list[dict]]:
    """Problems a user can fix, found before any model is loaded. Returns the `axis_items` it loaded and checked
    (`load_axis_items`)."""
    if cfg.items and len(suite_names(cfg.suite)) != 1:
        raise OpctError("--items holds one axis's items; name that one suite with --suite")
    if not cfg.out:
        raise OpctError("--out is required (the run directory to write)")
    defaults = defaults_of(EvalConfig)
    lm_flags = [f"--{name.replace('_', '-')}" for name in ("lm_eval_tasks", "lm_eval_include", "lm_eval_limit",
                                                          "lm_eval_bootstrap_iters")
                if getattr(cfg, name) != defaults[name]] \
        + (["--no-lm-eval-chat-template"] if not cfg.lm_eval_chat_template else [])
    if lm_flags and not cfg.lm_eval:
        raise OpctError(f"{lm_flags[0]} is an option of --lm-eval, which is not on: add --lm-eval (lm_eval: true), "
                        f"or drop it")
    from opct.axes.capability import NAME as CAPABILITY

    if cfg.lm_eval and CAPABILITY not in suite_names(cfg.suite):
        raise OpctError(f"--lm-eval runs with the capability suite, which --suite {cfg.suite} leaves out: add "
                        f"capability to --suite, or drop --lm-eval")
    if cfg.lm_eval and cfg.lm_eval_include and not Path(cfg.lm_eval_include).is_dir():
        raise OpctError(f"--lm-eval-include: {cfg.lm_eval_include}: "
                        f"{'not a folder' if Path(cfg.lm_eval_include).exists() else 'no such folder'} "
                        "(a folder of lm-eval task YAMLs)")
    if cfg.lm_eval:
        from opct.evals.lm_eval_bridge import check_tasks

        check_tasks(cfg.lm_eval_tasks, cfg.lm_eval_include)
    return load_axis_items(cfg)


def load_axis_items(cfg: EvalConfig) -> dict[str, list[dict]]:
    """The `axis_items` of the axes `cfg.suite` runs, each file checked whole: called before the first axis runs,
    so a missing or malformed file (named with its field, `axis_items.AXIS: FILE:LINE: ...`) is not found only when
    its axis comes up, after the axes before it."""
    out = {}
    for name in suite_names(cfg.suite):
        if name in cfg.axis_items and not cfg.items:
            try:
                out[name] = load_eval_items(cfg.axis_items[name], name)
            except OpctError as e:
                raise OpctError(f"axis_items.{name}: {e}") from None
            except OSError as e:  # a directory, no permission: the field too (before 2026-12-07 only the path)
                from opct.errors import os_problem

                raise OpctError(f"axis_items.{name}: {cfg.axis_items[name]}: {os_problem(e)}") from None
    return out


def load_eval_items(path, axis: str) -> list[dict]:
    """Validate and load a user's items for `axis` (every problem as `file:line: field: problem`)."""
    from opct.axes import get

    a = get(axis)
    if a.load_items is None:
        raise OpctError(f"{path}: axis {axis!r} takes no items file")
    return a.load_items(path, for_eval=True)


def run_eval(policy, cfg: EvalConfig, attack_cfg=None, log=print, items: list | None = None,
             resume: bool | str = False, earlier: tuple | None = None, inputs: dict | None = None) -> dict:
    """Run the configured axes on `policy`; write the run directory; return the metrics. `items`: the user's items
    of `cfg.items`, when the caller has loaded them already. `resume`: continue the run `cfg.out` holds (its
    finished axes are kept, the others run); without it a run already there is an error; "checked": continue it
    without comparing its settings (the caller did: `opct run`'s cells). `earlier`: `check_resume`'s reading of that
    run, when the caller has made it already; `inputs`: `eval_inputs(cfg)`, when the caller has them (it checked
    them against that run: the same are recorded)."""
    from opct.axes import AXES, EvalContext
    from opct.evals.generate import Gen
    from opct.evals.resume import attack_settings, eval_inputs, resumed
    from opct.evals.metrics import format_table
    from opct.pairs.schema import write_jsonl_atomic

    axis_items = check_config(cfg)
    names = suite_names(cfg.suite)
    if items is None and cfg.items:
        items = load_eval_items(cfg.items, names[0])
    for name in names:  # a trained name no item has is a typo (awareness takes its items' domains: known only now)
        a = AXES[name]
        unknown, known = a.unknown_trained((cfg.trained or {}).get(name), items if cfg.items else axis_items.get(name))
        if unknown:
            raise ConfigError(f"trained.{name}", f"no item has {a.family_noun} {', '.join(unknown)}; the items' "
                                                 f"{a.family_noun}s: {', '.join(known)}")
    gen = Gen(cfg.max_new_tokens, cfg.temperature, cfg.batch_size, cfg.progress, cfg.seed_per_prompt)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if inputs is None:  # recorded in run.json: a resume must find the same contents
        inputs = eval_inputs(cfg)

    done: list[str] = []
    records: list[dict] = []
    metrics: dict = {}
    seconds: dict = {}
    info: dict = {}
    if earlier is None and (out / "run.json").exists():
        earlier = resumed(out, cfg, attack_cfg, names, resume, inputs)
    if earlier is not None:
        done, records, metrics, seconds, info = earlier
        if done:
            log(f"resuming {out}: {', '.join(done)} done")

    def write() -> None:  # after every axis, so an axis that fails later loses nothing already measured
        write_jsonl_atomic(out / "records.jsonl", records)
        write_json_atomic(out / "metrics.json", metrics)
        write_atomic(out / "metrics.txt", format_table(metrics) + "\n" if metrics else "")
        write_json_atomic(out / "run.json", {"config": asdict(cfg), "judge": info.get("judge"), "seconds": seconds,
                                             "attack": info.get("attack"), "done": done,
                                             "attack_config": attack_settings(cfg, attack_cfg), "inputs": inputs,
                                             **{k: v for k, v in info.items() if k not in ("judge", "attack")}})

    from opct.axes.capability import NAME as CAPABILITY, retry_failed_lm_eval

    if CAPABILITY in done and retry_failed_lm_eval(cfg, info, metrics, log):
        write()
    for name in names:
        if name in done:
            continue
        trained = None if cfg.trained is None else cfg.trained.get(name, [])
        mine = items if items is not None else axis_items.get(name)
        axis_cfg = dataclasses.replace(cfg, n=cfg.axis_n[name]) if name in cfg.axis_n else cfg
        ctx = EvalContext(cfg=axis_cfg, gen=gen, items=mine, trained=trained, log=log,
                          attack=attack_cfg if cfg.attack else None)
        t0 = time.time()
        recs = AXES[name].run(policy, ctx)
        seconds[name] = round(time.time() - t0 - sum(ctx.seconds.values()), 1)
        seconds.update(ctx.seconds)
        info.update(ctx.info)
        records += recs
        metrics.update(AXES[name].metrics(recs, seed=cfg.seed))
        metrics.update(ctx.extra_metrics)
        log(f"{name}: {len(recs)} records in {seconds[name]} s"
            + "".join(f" (+ {k.removeprefix(name + '_')} {v} s)" for k, v in ctx.seconds.items()))
        done.append(name)
        write()
    if metrics and not (out / "metrics.txt").exists():  # a resumed run with nothing left to do, its table removed
        write_atomic(out / "metrics.txt", format_table(metrics) + "\n")
    if cfg.log_with:
        from opct.trackers import Trackers, metric_values

        # step 0 replaces what an earlier run of this evaluation (resumed, or run again) logged there
        with Trackers(cfg.log_with, out / "trackers", f"eval-{out.name}", asdict(cfg), first_step=0,
                      resumable=True) as tracked:
            tracked.log(metric_values(metrics), step=0)
    return metrics


def run_axis(name: str, policy, *, gen=None, items=None, n=None, samples=None, seed: int = 0, trained=None,
             attack=None, judge: str = "auto", log=print, **settings) -> list[dict]:
    """The records of one axis on `policy`, as `run_eval` makes them, without writing a run directory (for Python
    callers and tests). `attack` (an AttackConfig) runs the jailbreak axis's adaptive attacker; `settings` are more
    EvalConfig fields (e.g. prompt_side="teacher")."""
    from opct.axes import EvalContext, get
    from opct.evals.generate import Gen

    cfg = EvalConfig(suite=name, n=n, samples=samples, seed=seed, judge=judge, attack=attack is not None, **settings)
    ctx = EvalContext(cfg=cfg, gen=gen or Gen(), items=items, trained=trained, attack=attack, log=log)
    return get(name).run(policy, ctx)
