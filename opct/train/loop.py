"""The training loop every method shares: `train(config)`.

It owns what methods have in common (DESIGN §4): loading the model, LoRA or full fine-tuning, the frozen teacher
(both built in opct.train.models), the data order, the accelerate set-up (one CPU process, `accelerate launch` for
DDP, or DeepSpeed ZeRO-1/2: opct.train.sharded), clipping, the optimizer and schedule, NaN handling, atomic
checkpoints with exact resume, metrics.jsonl, trackers and the progress bar. A method (opct/methods) only computes one
step's gradients.

Data order: pairs are drawn from an endless stream of seeded per-epoch permutations; an optimizer step takes the
next `batch_size * grad_accum * processes` pairs. The stream is a pure function of (seed, position), so resuming
needs only the position.

Benign replay (`replay_frac`, `replay_schedule`; opct.train.replay) is the loop's too, so every method has it: an SFT
term on the starting model's own greedy answers to benign prompts, mixed into the method's steps or run as extra
steps after them.
"""

from __future__ import annotations

import math
import random
import shutil
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path

import torch

from opct import cpu_matmul, files
from opct.config import require
from opct.errors import OpctError
from opct.modeldir import non_finite, stable_adapter_config
from opct.pairs.schema import Pair, load_pairs
from opct.policy import HFPolicy, hf_progress_bars, load_policy
from opct.train.checkpoint import (checkpoints, good_checkpoint, latest_checkpoint, resume, rng_kept, save_checkpoint,
                                   write_failed)
from opct.train.config import TrainConfig, check_method
from opct.train.context import RenderedPair, StepContext
from opct.train import replay, sharded
from opct.train.guards import check_vocab
# student_and_teacher is imported from here by callers that predate opct.train.models
from opct.train.models import separate_teacher, student_and_teacher
from opct.train.rundir import prepare_run_dir, truncate_metrics
from opct.trackers import ended, scalars, start as start_trackers, tracker_kwargs, usable

# Every metrics.jsonl line has these (methods may add more); `skipped` marks a step whose update was dropped. A key
# that a method does not define (e.g. `mean_delta` for SFT) is written as null.
METRIC_KEYS = ("step", "loss", "mean_delta", "student_entropy", "teacher_ce", "response_len", "truncated_frac",
               "tokens_per_s", "grad_norm", "lr", "tokens", "step_time_s", "skipped", "nan_steps")


# ------------------------------------------------------------------------------------------------ data

def select_pairs(config: TrainConfig) -> list[Pair]:
    pairs = load_pairs(config.pairs)
    chosen = pairs if config.split == "all" else [p for p in pairs if p.split == config.split]
    if not chosen:
        raise OpctError(f"{config.pairs}: no pairs with meta.split == {config.split!r} "
                        f"(of {len(pairs)}); pass --split all or --split heldout to use others")
    return chosen


def render_pairs(policy: HFPolicy, pairs: list[Pair], max_new_tokens: int, path=None,
                 warn: bool = True) -> dict[str, RenderedPair]:
    """Render both prompts of every pair once, checking up front that each fits the context and that both sides
    are rendered alike (one BOS, the same generation prompt: `opct.train.guards`). `path`: the pairs file, whose
    line a prompt that does not fit is named by. `warn`: say the guards' warnings (the main process of several)."""
    from opct.pairs.schema import check_pair_fits
    from opct.train.guards import check_distinct, check_rendered, warn_unknown, warn_unknown_families

    out = {}
    for p in pairs:
        r = RenderedPair(policy.render(p.student), policy.render(p.teacher))
        check_pair_fits(policy, r.student_ids, max_new_tokens, p.id, "student", path)
        check_pair_fits(policy, r.teacher_ids, max_new_tokens, p.id, "teacher", path)
        check_rendered(policy, p, r.student_ids, r.teacher_ids)
        out[p.id] = r
    check_distinct(policy, pairs, out, path, warn)
    if warn:
        warn_unknown(policy, out, path)
        if path is not None:
            warn_unknown_families(pairs, path)
    return out


@lru_cache(maxsize=4)
def _permutation(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return tuple(order)


def step_micro_batches(pairs: list[Pair], config: TrainConfig, position: int, rank: int,
                       world: int) -> list[list[Pair]]:
    """This process's micro-batches for the step whose first pair is stream[position]."""
    bs, n = config.batch_size, len(pairs)
    chunk = [pairs[_permutation(n, config.seed, i // n)[i % n]]
             for i in range(position, position + bs * config.grad_accum * world)]
    return [chunk[(m * world + rank) * bs:(m * world + rank + 1) * bs] for m in range(config.grad_accum)]


def _trackers(config: TrainConfig) -> list[str]:
    """The trackers to log to (`--log-with`, and the older `--tensorboard`) whose packages are installed."""
    return usable(list(dict.fromkeys([*config.log_with, *(["tensorboard"] if config.tensorboard else [])])))


# ------------------------------------------------------------------------------------------------ the loop

def train(config: TrainConfig) -> Path:
    """Run `config.method` for `config.max_steps` optimizer steps; return the run directory. The run directory is
    locked for the duration (`opct.files.dir_lock`): a second process training into it is refused."""
    with ExitStack() as held, hf_progress_bars(config.progress):  # --no-progress: nor transformers' saving bars
        return _train(config, held)


def check_samplers(configs: dict[str, TrainConfig]) -> None:
    """Whether every run that asks for `sampler: vllm` and draws rollouts can have it (a CUDA GPU, the vllm package):
    `train` checks its own config, and the runners (`opct run` for experiments, threats and robustness studies) check
    all their runs' configs before the first cell, so a missing GPU is one clear line at the start, not an error
    after the base arm's evaluation. `configs`: label (an arm, a method) -> its TrainConfig."""
    from opct.methods import ROLLOUTS

    for label, tc in configs.items():
        if tc.sampler == "vllm" and tc.method in ROLLOUTS:
            from opct.engine.vllm_sampler import check_available

            try:
                check_available()
            except OpctError as e:
                raise OpctError(f"{label}: {e}" if label else str(e)) from None
            return  # the machine and the package are the same for every run


def _train(config: TrainConfig, held: ExitStack) -> Path:
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm
    from transformers import get_scheduler

    from opct.methods import METHODS, PREPARE, ROLLOUTS

    require(config)
    check_method(config)
    if config.method not in METHODS:
        raise OpctError(f"unknown method {config.method!r}; known: {', '.join(METHODS)}")
    step_fn = METHODS[config.method]
    use_vllm = config.sampler == "vllm" and config.method in ROLLOUTS
    if use_vllm:  # before anything loads: a missing GPU or package is one clear line
        check_samplers({"": config})
    elif config.sampler == "vllm":
        print(f"opct: note: --sampler vllm: {config.method} draws no rollouts from the student, so no vLLM engine is "
              f"started", file=sys.stderr)
    out = Path(config.out)
    trackers = _trackers(config)
    acc = sharded.accelerator(config.bf16, log_with=trackers or None, project_dir=str(out / "trackers"))
    deepspeed = sharded.is_deepspeed(acc)
    if acc.is_main_process:  # one lock per run, taken by the main process (DDP ranks share the directory)
        held.enter_context(files.dir_lock(out, "training run", kind="train"))
    prepare_run_dir(out, config, acc.is_main_process, acc.num_processes, barrier=acc.wait_for_everyone)
    acc.wait_for_everyone()
    set_seed(config.seed, device_specific=True)

    pairs = select_pairs(config)
    per_step = config.batch_size * config.grad_accum * acc.num_processes  # pairs per optimizer step, all processes
    if per_step > len(pairs) and acc.is_main_process:
        which = "" if config.split == "all" else f" of split {config.split!r}"
        print(f"opct: note: a step takes {per_step} pairs (batch size x grad accum x processes) but {config.pairs} "
              f"has {len(pairs)}{which}: each step holds some of them more than once", file=sys.stderr)
    from opct.subjects import resolve

    model_dir = resolve(config.model)[0]
    policy = load_policy(model_dir, device=acc.device, trust_remote_code=config.trust_remote_code,
                         progress=config.progress)
    prompts = render_pairs(policy, pairs, config.max_new_tokens, config.pairs, warn=acc.is_main_process)
    model, teacher = student_and_teacher(policy.model, config)
    if config.teacher_model:
        teacher = separate_teacher(policy, config, acc.device)
    with teacher() as teacher_model:  # config, tokenizer and teacher score the same vocabulary
        check_vocab(policy, teacher_model)
    if config.gradient_checkpointing:
        kwargs = {"use_reentrant": False}  # non-reentrant: works with frozen inputs (LoRA) without extra hooks
        if hasattr(policy.model, "activation_checkpointing_enable"):  # transformers >= 5
            policy.model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            policy.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    # the fused kernel (one pass per tensor instead of ~10 ops) where torch has one, as transformers' Trainer does
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, fused=fused or None)
    replay_plan = replay.plan(config, acc.num_processes)  # None without replay_frac
    total_steps = replay_plan.total_steps if replay_plan else config.max_steps
    # The scheduler is stepped by hand once per optimizer step (accelerate's wrapper would step it once per process).
    # transformers' "constant" has no warmup: with --warmup-steps it is "constant_with_warmup" (until 2026-12-06 the
    # warmup was dropped without a word)
    schedule = "constant_with_warmup" if config.lr_schedule == "constant" and config.warmup_steps else \
        config.lr_schedule
    scheduler = get_scheduler(schedule, optimizer, num_warmup_steps=config.warmup_steps,
                              num_training_steps=total_steps)
    if config.warmup_steps >= total_steps and acc.is_main_process:  # allowed: a resume may raise --max-steps
        print(f"opct: warning: --warmup-steps {config.warmup_steps} is not below the run's {total_steps} steps: the "
              f"learning rate never reaches --lr {config.lr:g} (the last step's is "
              f"{(total_steps - 1) / config.warmup_steps:.2g} of it)", file=sys.stderr)
    if deepspeed:
        sharded.configure(acc, config)
    model, optimizer = acc.prepare(model, optimizer)
    policy.model = acc.unwrap_model(model)
    trained = [(n, p) for n, p in policy.model.named_parameters() if p.requires_grad]  # what an update changes

    state = {"pairs_consumed": 0, "nan_steps": 0, "consecutive_nan": 0}
    if config.resume and checkpoints(out):
        # last: everything above must not depend on it, and the RNG restored here stays untouched; a damaged
        # checkpoint falls back to the previous one
        state = resume(out, acc, model, optimizer, scheduler)
    start = state.get("step", 0)
    if acc.is_main_process:
        truncate_metrics(out / "metrics.jsonl", start)

    sampler = None
    if use_vllm:  # OPCT's rollouts from a vLLM engine, sent the weights after every step
        from opct.engine.vllm_sampler import training_sampler
        sampler = training_sampler(config, acc, policy, model_dir, model)
    run = StepContext(config=config, accelerator=acc, model=model, policy=policy, teacher=teacher, prompts=prompts,
                      pairs={p.id: p for p in pairs}, step=start, sampler=sampler)
    # Once per run: offline targets, alignments, checks, replay rows. A resume reads back what they sample, so they
    # leave the RNG as found: a fresh run and one resumed before its first checkpoint draw the same numbers.
    with rng_kept():
        if config.method in PREPARE:
            PREPARE[config.method](run)
        replay_rows = replay.prepare(run, replay_plan) if replay_plan else []
    if trackers:  # resumed: the steps after the checkpoint are logged again (the interrupted run may have logged some)
        kw = tracker_kwargs(trackers, start + 1 if start else None, out / "trackers") if acc.is_main_process else None
        start_trackers(acc, f"{out.name}-{config.method}", scalars(asdict(config)), kw)
    bar = tqdm(total=total_steps, initial=start, desc=f"{config.method} train", dynamic_ncols=True,
               disable=not (acc.is_main_process and config.progress))
    with ended(acc, bool(trackers)):  # however the loop is left
        for step in range(start + 1, total_steps + 1):
            t0 = time.perf_counter()
            run.step = step - 1
            if sampler is not None:  # its per-request seeds count this step's rows
                sampler.begin_step(run.step)
            try:
                with cpu_matmul.use(config.cpu_matmul, acc.device):  # linear layers: opct.cpu_matmul
                    if step <= config.max_steps:
                        stats = {}
                        if replay_plan:  # mixed: this step's replay rows first, accumulated locally (the method syncs)
                            mine = replay.step_rows(replay_rows, replay_plan, step, config.seed, acc.process_index,
                                                    acc.num_processes)
                            stats = {"phase": "method", **replay.replay_backward(
                                run, mine, len(replay_plan.rows_at(step)), sync_last=False)}
                        micro = step_micro_batches(pairs, config, state["pairs_consumed"], acc.process_index,
                                                   acc.num_processes)
                        stats = {**step_fn(run, micro), **stats}
                        state["pairs_consumed"] += per_step
                    else:  # sequential: replay alone, after the method's steps
                        mine = replay.step_rows(replay_rows, replay_plan, step, config.seed, acc.process_index,
                                                acc.num_processes)
                        stats = replay.replay_backward(run, mine, len(replay_plan.rows_at(step)), sync_last=True)
                        stats.update(phase="replay", loss=stats["replay_loss"], tokens=stats["replay_tokens"])
            except OpctError as e:
                last = good_checkpoint(out) or "none"
                raise OpctError(f"step {step}: {e} (last good checkpoint: {last})") from None
            lr = scheduler.get_last_lr()[0]
            if deepspeed:  # the engine clips, steps, skips the update on every rank when the global norm is not finite
                grad_norm, finite = sharded.step(acc)
            else:
                grad_norm = float(acc.clip_grad_norm_(params, config.max_grad_norm or math.inf))
                finite = math.isfinite(stats["loss"]) and math.isfinite(grad_norm) and \
                    math.isfinite(stats.get("replay_loss") or 0.0)
                if finite:
                    optimizer.step()
            if finite:  # the update was taken: it must leave the weights finite (it cannot be undone)
                if (bad := non_finite(trained)) is not None:
                    raise _diverged(step, bad, lr, out)
                state["consecutive_nan"] = 0
                if sampler is not None and step < config.max_steps:  # the next step's rollouts see this update
                    sampler.push_weights(model)
            else:  # skip the update; the step, its data and the schedule still advance
                state["nan_steps"] += 1
                state["consecutive_nan"] += 1
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            seconds = time.perf_counter() - t0

            record = {**dict.fromkeys(METRIC_KEYS), "step": step, **stats, "tokens_per_s": stats["tokens"] / seconds,
                      "grad_norm": grad_norm, "lr": lr, "step_time_s": seconds, "skipped": not finite,
                      "nan_steps": state["nan_steps"]}
            if acc.is_main_process:
                files.append_jsonl(out / "metrics.jsonl", {k: (None if isinstance(v, float) and not math.isfinite(v)
                                                               else v) for k, v in record.items()})
            if trackers:
                acc.log({f"train/{k}": v for k, v in record.items() if k != "step" and isinstance(v, (int, float))
                         and not isinstance(v, bool) and math.isfinite(v)}, step=step)
            bar.update(1)
            bar.set_postfix(loss=f"{stats['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
            if state["consecutive_nan"] >= config.max_nan_steps or (state["consecutive_nan"] and step == total_steps):
                raise _nan_stop(step, state["consecutive_nan"], config.max_nan_steps, out)
            if step % config.save_every == 0 or step == total_steps:
                save_checkpoint(out, step, acc, model, optimizer, scheduler, state, config.keep_checkpoints)
        bar.close()
    _save_final(out, acc, model, policy)
    return out


def _diverged(step: int, bad: tuple[str, str], lr: float, out: Path) -> OpctError:
    """The error for an update that left a weight NaN or inf (a learning rate far too large): the optimizer's step was
    taken on a finite loss and gradient, so unlike a NaN loss it cannot be skipped; the run stops before a checkpoint
    or final/ holds the weights."""
    return OpctError(f"step {step}: the update made the weights non-finite (weight {bad[0]} holds {bad[1]}; the loss "
                     f"and gradient were finite); stopped before a checkpoint or final/ holds them (last good "
                     f"checkpoint: {good_checkpoint(out) or 'none'}). Lower --lr (this step's was {lr:g}).")


def _nan_stop(step: int, streak: int, limit: int, out: Path) -> OpctError:
    """The error for `streak` consecutive steps skipped for a non-finite loss or gradient: `limit` (max_nan_steps) of
    them, or fewer at the end of the run, which would otherwise end "done" on weights whose losses had stopped being
    finite (an update that overflowed the forward, not the weights themselves), with no step left to recover in."""
    where = f"for {streak} consecutive steps" if streak >= limit else \
        f"in the last {streak} step(s) of the run (each skipped; no later step shows that its weights still give " \
        f"a finite loss)"
    return OpctError(f"step {step}: loss or gradient not finite {where}; stopped, final/ not written (last good "
                     f"checkpoint: {good_checkpoint(out) or 'none'}). Lower --lr or check the pairs.")


def _save_final(out: Path, acc, model, policy: HFPolicy) -> None:
    """RUN/final: the adapter (LoRA) or the whole model, plus the tokenizer; written atomically."""
    if acc.is_main_process:
        tmp, final = out / ".tmp-final", out / "final"
        if tmp.exists():
            shutil.rmtree(tmp)
        try:
            acc.unwrap_model(model).save_pretrained(tmp, safe_serialization=True)
            stable_adapter_config(tmp)
            policy.tokenizer.save_pretrained(tmp)
        except Exception as e:  # noqa: BLE001 - a full disk, reported by safetensors in its own words
            shutil.rmtree(tmp, ignore_errors=True)
            raise write_failed(tmp, e, "the final model", f"the last checkpoint is intact: "
                               f"{latest_checkpoint(out) or 'none'} (rerun with --resume once there is room)") \
                from None
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    acc.wait_for_everyone()
