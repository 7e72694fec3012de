"""The on/off-policy ablation (the OPCT paper's `train_offpolicy_distillation.py`): OPCT's per-token loss on fixed
trajectories.

What it really is: before training, the frozen starting model answers every *student* (perturbed) prompt `n_samples`
times at the sampling temperature — the very responses OPCT's first step would sample. Those trajectories are
written to RUN/trajectories.jsonl and never resampled. Each step then computes exactly OPCT's loss (the same
estimator, the same teacher on the teacher prompt, the same normalisation) on the stored trajectories of its pairs,
so the one thing that differs from OPCT is whether the responses come from the student as it trains (on-policy) or
from the model it started as (off-policy). Same steps, same pairs per step, same samples per pair.

With the `sampled` or `paper` estimator the stored sampler log-probs make the importance ratio a real off-policy
correction (pi_theta / pi_start); with `full` the loss is the exact KL at the fixed prefixes.
"""

from __future__ import annotations

from pathlib import Path

from opct.errors import DataError, OpctError
from opct.methods.opct import kl_step
from opct.pairs.schema import Pair, read_jsonl, write_jsonl_atomic
from opct.policy import Samples
from opct.train.context import StepContext

TRAJECTORIES_FILE = "trajectories.jsonl"


def _sample_once(run: StepContext, pair_ids: list[str]) -> dict[str, list[dict]]:
    """`n_samples` responses of the starting model to each pair's student prompt, in batches of `batch_size`."""
    from tqdm.auto import tqdm

    cfg = run.config
    out: dict[str, list[dict]] = {}
    bar = tqdm(total=len(pair_ids), desc="offpolicy trajectories", dynamic_ncols=True,
               disable=not (run.accelerator.is_main_process and cfg.progress))
    with run.teacher_policy() as policy:
        for i in range(0, len(pair_ids), cfg.batch_size):
            chunk = pair_ids[i:i + cfg.batch_size]
            prompts = [run.prompts[pid].student_ids for pid in chunk for _ in range(cfg.n_samples)]
            s = policy.sample(prompts, cfg.max_new_tokens, cfg.temperature, cfg.min_new_tokens)
            for j, pid in enumerate(chunk):
                rows = range(j * cfg.n_samples, (j + 1) * cfg.n_samples)
                out[pid] = [{"response_ids": s.response_ids[r], "logprobs": s.logprobs[r],
                             "truncated": s.truncated[r]} for r in rows]
            bar.update(len(chunk))
    bar.close()
    return out


def _read(path: Path, run: StepContext) -> dict[str, list[dict]]:
    vocab = len(run.policy.tokenizer)
    out: dict[str, list[dict]] = {}
    for n, obj in read_jsonl(path):
        pid = obj.get("id") if isinstance(obj, dict) else None
        if pid not in run.pairs:
            raise DataError(path, n, "id", f"not a pair of this run ({pid!r})")
        ids, lps = obj.get("response_ids"), obj.get("logprobs")
        if not (isinstance(ids, list) and ids and all(isinstance(t, int) and 0 <= t < vocab for t in ids)):
            raise DataError(path, n, "response_ids", f"must be a non-empty list of token ids below {vocab}")
        if not (isinstance(lps, list) and len(lps) == len(ids)):
            raise DataError(path, n, "logprobs", "must be one log-prob per response token")
        out.setdefault(pid, []).append({"response_ids": ids, "logprobs": [float(x) for x in lps],
                                        "truncated": bool(obj.get("truncated", False))})
    missing = [p for p in run.pairs if len(out.get(p, [])) != run.config.n_samples]
    if missing:
        raise DataError(path, 0, "<file>", f"{len(missing)} pairs lack their {run.config.n_samples} trajectories "
                                           f"(e.g. {missing[0]!r})")
    return out


def prepare(run: StepContext) -> None:
    """Load or make the fixed trajectories (once per run) and keep them in `run.cache["trajectories"]`."""
    from accelerate.utils import gather_object

    cfg, acc = run.config, run.accelerator
    path = Path(cfg.out) / TRAJECTORIES_FILE
    if cfg.resume and path.exists():
        run.cache["trajectories"] = _read(path, run)
        return
    if run.step > 0:
        raise OpctError(f"{path}: missing, but the run resumes from step {run.step}; the trajectories it trained on "
                        f"are lost, so it cannot continue exactly. Start a new run (another --out)")
    ids = list(run.pairs)
    trajectories: dict[str, list[dict]] = {}
    for part in gather_object([_sample_once(run, ids[acc.process_index::acc.num_processes])]):
        trajectories.update(part)
    if acc.is_main_process:
        write_jsonl_atomic(path, ({"id": pid, "sample": k, **t} for pid in ids for k, t in
                                  enumerate(trajectories[pid])))
    acc.wait_for_everyone()
    run.cache["trajectories"] = trajectories


def _stored(run: StepContext, pairs: list[Pair]):
    """(student ids, teacher ids, the stored samples) of `pairs`, shaped like `opct.methods.opct.rollout`'s."""
    rows = [(run.prompts[p.id], t) for p in pairs for t in run.cache["trajectories"][p.id]]
    tok = run.policy.tokenizer
    samples = Samples([t["response_ids"] for _, t in rows],
                      tok.batch_decode([t["response_ids"] for _, t in rows], skip_special_tokens=True),
                      [t["logprobs"] for _, t in rows], [t["truncated"] for _, t in rows])
    return [r.student_ids for r, _ in rows], [r.teacher_ids for r, _ in rows], samples


def offpolicy_step(run: StepContext, micro_batches: list[list[Pair]]) -> dict[str, float]:
    return kl_step(run, micro_batches, _stored)
