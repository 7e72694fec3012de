"""Run suites against a policy and write the run directory:

    records.jsonl   one record per sampled response (and per attacked behaviour), every suite; `score` is the
                    judge's number: correctness (sycophancy, capability), fact surfaced / over-warned
                    (awareness hazard / benign), harmfulness (jailbreak)
    metrics.json    {metric name: {"value", "ci_low", "ci_high", "n", "higher_is_better", "parse_fail"}}
    metrics.txt     the same as a table
    run.json        the configuration, the attacker's budget, the judge, and seconds per suite

`EvalConfig` is the single source of the `opct eval` flags (with `opct.evals.attack.AttackConfig`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from opct.errors import OpctError
from opct.files import write_atomic, write_json_atomic

SUITE_NAMES = ("sycophancy", "jailbreak", "awareness", "capability")


def _f(default, help, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class EvalConfig:
    model: str = _f("", "model directory (save_pretrained format)")
    adapter: Optional[str] = _f(None, "peft adapter directory to load on top of the model")
    suite: str = _f("all", "suite to run", choices=["all", *SUITE_NAMES])
    out: str = _f("", "run directory for records.jsonl, metrics.json, metrics.txt, run.json")
    n: Optional[int] = _f(None, "items per suite (sycophancy: questions, default 100; jailbreak: harmful and benign "
                                "requests each, default all; awareness: safety facts, default all; capability: "
                                "items per skill, default 100)")
    samples: Optional[int] = _f(None, "sampled responses per prompt (default: sycophancy 1, jailbreak 2, "
                                      "awareness 2, capability 1)")
    seed: int = _f(0, "seed for item draws, templates, sampling and bootstrap")
    items: Optional[str] = _f(None, "your own items (JSONL) for the one --suite given; see opct/evals/items.py")
    attack: bool = _f(True, "run the adaptive attacker in the jailbreak suite")
    max_new_tokens: int = _f(64, "longest response sampled")
    temperature: float = _f(1.0, "sampling temperature of the suites (the attacker has its own)")
    batch_size: int = _f(64, "prompts per generation batch")
    judge: str = _f("auto", "jailbreak judge: world rules (default on world items), refusal-prefix rules (default "
                            "with --items), or an OpenAI-compatible http endpoint",
                    choices=["auto", "world", "refusal", "http"])
    judge_url: Optional[str] = _f(None, "http judge: base URL of an OpenAI-compatible API")
    judge_model: Optional[str] = _f(None, "http judge: model name")
    judge_key_env: str = _f("OPENAI_API_KEY", "http judge: environment variable holding the API key")
    judge_timeout: float = _f(45.0, "http judge: seconds one grade may take, retries included (an endpoint that "
                                    "never answers fails after this long)")
    lm_eval: bool = _f(False, "capability: also run MATH-500 / GPQA-Diamond / IFEval via lm-evaluation-harness")
    lm_eval_limit: Optional[int] = _f(None, "lm-eval: documents per task (default: all)")
    dtype: str = _f("float32", "model dtype", choices=["float32", "bfloat16", "float16"])
    device: str = _f("cpu", "torch device")
    threads: Optional[int] = _f(None, "CPU threads for torch (default: 1 for models under 100M parameters on the "
                                      "CPU, else torch's own choice)")
    progress: bool = _f(True, "progress bars")
    # what "train" and "held-out" mean in the metrics: by default the world's split; an experiment sets what it
    # actually trained on, so that held-out = not in this model's training pairs
    train_families: Optional[list[str]] = _f(None, "sycophancy bias families the model was trained on (default: "
                                                   "the world's train families)")
    train_wrappers: Optional[list[str]] = _f(None, "jailbreak wrappers the model was trained on (default: the "
                                                   "world's train wrappers)")
    train_domains: Optional[list[str]] = _f(None, "awareness domains the model was trained on (default: the "
                                                  "world's train domains)")


def headline(metrics: dict) -> list[str]:
    """The metrics printed by default: overall, train vs held-out, the jailbreak sets and the attacker."""
    keep = []
    for k in metrics:
        group = k.split("[", 1)[1] if "[" in k else ""
        if not group or group.startswith(("split=", "on=", "method=")) or k.startswith("capability."):
            keep.append(k)
    return keep


def check_config(cfg: EvalConfig) -> None:
    """Problems a user can fix, found before any model is loaded."""
    if cfg.items and cfg.suite == "all":
        raise OpctError("--items holds one suite's items; name that suite with --suite")
    if not cfg.out:
        raise OpctError("--out is required (the run directory to write)")
    if cfg.n is not None and cfg.n < 1 or cfg.samples is not None and cfg.samples < 1:
        raise OpctError("--n and --samples must be at least 1")
    if cfg.judge == "http" and not (cfg.judge_url and cfg.judge_model):
        raise OpctError("--judge http needs --judge-url (an OpenAI-compatible base URL) and --judge-model")
    if not cfg.judge_timeout > 0:
        raise OpctError(f"--judge-timeout must be > 0 seconds (got {cfg.judge_timeout!r})")


def relabel_splits(records: list[dict], cfg: EvalConfig) -> list[dict]:
    """Set each record's `split` (and a jailbreak record's `wrapper_split`) from what the model was trained on, where
    `cfg` says so. Harmful categories keep their own split (`category_split`): the world holds them out of every
    pair file."""
    fams, wraps, doms = cfg.train_families, cfg.train_wrappers, cfg.train_domains
    for r in records:
        suite = r.get("suite")
        if suite == "sycophancy" and fams is not None and r.get("variant") == "biased":
            r["split"] = "train" if r["family"] in fams else "heldout"
        elif suite == "jailbreak" and wraps is not None and r.get("variant") == "wrapped":
            r["wrapper_split"] = "train" if r["family"] in wraps else "heldout"
            r["split"] = "heldout" if "heldout" in (r["wrapper_split"], r.get("category_split")) else "train"
        elif suite == "awareness" and doms is not None and r.get("domain") is not None:
            r["split"] = "train" if r["domain"] in doms else "heldout"
    return records


def run_eval(policy, cfg: EvalConfig, attack_cfg=None, log=print) -> dict:
    """Run the configured suites on `policy`; write the run directory; return the metrics."""
    from opct.evals import METRICS, SUITES
    from opct.evals.generate import Gen
    from opct.evals.items import load_eval_items
    from opct.evals.judges import make_judge
    from opct.pairs.schema import write_jsonl_atomic

    check_config(cfg)
    suites = list(SUITE_NAMES) if cfg.suite == "all" else [cfg.suite]
    items = load_eval_items(cfg.items, suites[0]) if cfg.items else None
    judge_spec = cfg.judge if cfg.judge != "auto" else ("refusal" if cfg.items else "world")
    judge = make_judge(judge_spec, cfg.judge_url, cfg.judge_model, cfg.judge_key_env, cfg.judge_timeout) \
        if "jailbreak" in suites else None
    gen = Gen(cfg.max_new_tokens, cfg.temperature, cfg.batch_size, cfg.progress)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)

    records: list[dict] = []
    metrics: dict = {}
    seconds: dict = {}
    for name in suites:
        t0 = time.time()
        kw = dict(items=items, n=cfg.n, samples=cfg.samples, seed=cfg.seed, gen=gen)
        if name == "jailbreak":
            kw["judge"] = judge
        recs = SUITES[name](policy, **kw)
        seconds[name] = round(time.time() - t0, 1)
        if name == "jailbreak" and cfg.attack and attack_cfg is not None:
            from opct.evals import jailbreak
            from opct.evals.attack import adaptive_attack

            t0 = time.time()
            # the attacker's behaviours are chosen by its own config (--attack-targets), not capped by --n
            jb_items = items if items is not None else jailbreak.world_items(None, cfg.seed)
            recs += adaptive_attack(policy, jb_items, judge, attack_cfg, cfg.max_new_tokens, cfg.seed,
                                    cfg.batch_size, cfg.progress)
            seconds["jailbreak_attack"] = round(time.time() - t0, 1)
        recs = relabel_splits(recs, cfg)
        records += recs
        metrics.update(METRICS[name](recs, seed=cfg.seed))
        log(f"{name}: {len(recs)} records in {seconds[name]} s"
            + (f" (+ attack {seconds['jailbreak_attack']} s)" if name == "jailbreak" and "jailbreak_attack" in seconds
               else ""))
        if name == "capability" and cfg.lm_eval:
            from opct.evals.lm_eval_bridge import run_lm_eval

            metrics.update(run_lm_eval(cfg.model, cfg.adapter, limit=cfg.lm_eval_limit, device=cfg.device,
                                       dtype=cfg.dtype, log=log))

    from opct.evals.metrics import format_table

    write_jsonl_atomic(out / "records.jsonl", records)
    write_json_atomic(out / "metrics.json", metrics)
    write_atomic(out / "metrics.txt", format_table(metrics) + "\n")
    # the attacker's budget as it ran (its records carry it: queries per target depend on gradients being there)
    budget = next((r["budget"] for r in records if r.get("variant") == "attack"), None)
    if budget is None and attack_cfg is not None and cfg.attack and "jailbreak" in suites:
        budget = asdict(attack_cfg)  # no behaviour of the chosen set: nothing was attacked
    run_info = {"config": asdict(cfg), "judge": judge.name if judge else None, "seconds": seconds, "attack": budget}
    write_json_atomic(out / "run.json", run_info)
    return metrics
