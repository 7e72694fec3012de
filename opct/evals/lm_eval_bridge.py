"""Optional bridge to EleutherAI's lm-evaluation-harness for capability on real checkpoints.

    pip install lm-eval        # not a dependency of opct
    opct eval --model DIR [--adapter DIR] --suite capability --lm-eval --lm-eval-limit 100 --out RUN

runs `minerva_math500`, `gpqa_diamond_cot_zeroshot` and `ifeval` (MATH-500, GPQA-Diamond, IFEval, as in the OPCT
paper) through the harness's own `hf` model backend (with the peft adapter, if any), and adds one metric per
task and measure to metrics.json as `capability.lm_eval[task=...,measure=...]`. Those intervals are the harness's
normal approximation (value ± 1.96 stderr), not a bootstrap by item; `n` is the number of documents evaluated.
When `lm_eval` is not installed the bridge is skipped with a message saying so — it never fails the run.
The synthetic world's own capability items do not need the harness.
"""

from __future__ import annotations

import importlib.util

TASKS = ("minerva_math500", "gpqa_diamond_cot_zeroshot", "ifeval")


def available() -> bool:
    return importlib.util.find_spec("lm_eval") is not None


SKIP_MESSAGE = ("capability: lm-evaluation-harness bridge skipped: the `lm_eval` package is not installed "
                "(pip install lm-eval to run " + ", ".join(TASKS) + ")")


def run_lm_eval(model_dir, adapter=None, tasks=TASKS, limit: int | None = None, batch_size: int | str = "auto",
                device: str = "cpu", dtype: str = "float32", log=print) -> dict:
    """Run the tasks; return opct metrics (empty, after logging `SKIP_MESSAGE`, when the harness is missing)."""
    if not available():
        log(SKIP_MESSAGE)
        return {}
    import lm_eval

    args = f"pretrained={model_dir},dtype={dtype}" + (f",peft={adapter}" if adapter else "")
    results = lm_eval.simple_evaluate(model="hf", model_args=args, tasks=list(tasks), limit=limit,
                                      batch_size=batch_size, device=device)
    return to_metrics(results)


def to_metrics(results: dict) -> dict:
    """Turn the harness's results dict into opct metric dicts (value, ci from its stderr, n)."""
    out = {}
    n_samples = results.get("n-samples", {})
    for task, res in results.get("results", {}).items():
        n = n_samples.get(task, {}).get("effective", 0)
        for key, value in res.items():
            if not isinstance(value, (int, float)) or "_stderr" in key or key == "alias":
                continue
            measure = key.split(",")[0]
            err = res.get(key.replace(measure, f"{measure}_stderr", 1))
            err = err if isinstance(err, (int, float)) else None
            out[f"capability.lm_eval[task={task},measure={measure}]"] = {
                "value": float(value), "ci_low": None if err is None else float(value) - 1.96 * err,
                "ci_high": None if err is None else float(value) + 1.96 * err, "n": int(n),
                "higher_is_better": True, "parse_fail": 0}
    return out
