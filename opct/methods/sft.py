"""SFT and BCT: supervised fine-tuning on offline targets (DESIGN §4).

What they really are: before training, the frozen starting model (the teacher) answers every *teacher* (clean)
prompt once — greedily by default, or `target_n` samples at `target_temperature`. Those answers are written to
RUN/targets.jsonl (pair id, both prompts, the answer's text and token ids) and never regenerated: a resumed run reads
them back. Training is then plain cross-entropy on (student prompt -> stored answer): loss on the answer tokens only,
EOS included, summed and divided by the number of answer tokens in the whole optimizer step (all micro-batches and
processes), as OPCT normalises.

BCT (bias-augmented consistency training) is exactly this with the model's own answers as targets. In opct the
teacher *is* the starting model, so `--method sft` without `--targets` and `--method bct` compute the same thing;
the difference is that SFT may instead take its targets from a file (`--targets FILE`, JSONL {"id", "response"},
several lines per id allowed), which is copied into RUN/targets.jsonl so the run does not depend on it later.
Unlike OPCT, the targets are fixed and off-policy: the student imitates answers it did not produce itself.

`target: reason | filler` prefixes each target with a sentence that states why (or a neutral one of the same token
count), and `mask_reason` leaves that sentence out of the loss (opct.methods.reasons). The prefixed targets are
what RUN/targets.jsonl stores (`prefix_tokens` says how many of `response_ids` are the sentence).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from opct.errors import DataError, OpctError
from opct.files import blank
from opct.losses import entropy, log_probs, response_mask, token_logprobs
from opct.pairs.schema import Pair, load_pairs, prefill_of, read_jsonl, write_jsonl_atomic
from opct.policy import pack, response_logits
from opct.train.context import StepContext

TARGETS_FILE = "targets.jsonl"
# the fields of a row of RUN/targets.jsonl (`_records`); a user's file holds "id" and "response"
TARGET_FIELDS = {"id", "sample", "source", "teacher", "student", "response", "response_ids", "truncated",
                 "prefix_tokens"}


@dataclass
class Target:
    response_ids: list[int]  # the answer's tokens, up to and including the first EOS (none if truncated)
    truncated: bool  # the teacher ran out of max_new_tokens before an EOS
    prefix: int = 0  # how many leading tokens are a reason / filler sentence (opct.methods.reasons), not the answer


# ------------------------------------------------------------------------------------------------ offline targets

def generate(policy, prompts_ids: list[list[int]], max_new_tokens: int, temperature: float) -> list[Target]:
    """One answer per prompt through the policy interface: greedy when `temperature` is 0, else pure temperature
    sampling (no top-k / top-p), stopping at EOS. The answer is cut after its first EOS, which is kept."""
    out = policy.sample(prompts_ids, max_new_tokens, temperature)
    return [Target(ids, truncated=t) for ids, t in zip(out.response_ids, out.truncated)]


def teacher_answers(run: StepContext, pair_ids: list[str]) -> dict[str, list[Target]]:
    """`target_n` answers of the starting model to the teacher prompt of each pair, in batches of `batch_size`."""
    from tqdm.auto import tqdm

    cfg = run.config
    out: dict[str, list[Target]] = {}
    bar = tqdm(total=len(pair_ids), desc=f"{cfg.method} targets", dynamic_ncols=True,
               disable=not (run.accelerator.is_main_process and cfg.progress))
    with run.teacher_policy() as policy:
        for i in range(0, len(pair_ids), cfg.batch_size):
            chunk = pair_ids[i:i + cfg.batch_size]
            prompts = [run.prompts[pid].teacher_ids for pid in chunk for _ in range(cfg.target_n)]
            answers = generate(policy, prompts, cfg.max_new_tokens, cfg.target_temperature)
            for j, pid in enumerate(chunk):
                out[pid] = answers[j * cfg.target_n:(j + 1) * cfg.target_n]
            bar.update(len(chunk))
    bar.close()
    return out


def tokenize_response(policy, messages: list[dict], text: str) -> list[int]:
    """The tokens the model should emit after `messages` to answer `text`, ending with EOS: the chat template's
    rendering of the assistant turn, minus the prompt (cut after the first EOS; EOS appended if the template ends
    the turn without one)."""
    prompt = policy.render(messages)
    if prefill_of(messages) is not None:  # the assistant's turn is open: the answer's tokens continue the prefill
        tail = policy.tokenizer(text, add_special_tokens=False)["input_ids"]
        full = prompt + tail
    else:
        full = policy.render(messages + [{"role": "assistant", "content": text}], add_generation_prompt=False)
    if full[:len(prompt)] == prompt:
        tail = full[len(prompt):]
    else:  # a template that renders the prompt differently once an answer follows
        tail = policy.tokenizer(text, add_special_tokens=False)["input_ids"]
    for k, t in enumerate(tail):
        if t in policy.eos_ids:
            return tail[:k + 1]
    return tail + [policy.eos_ids[0]]


def read_targets(path, run: StepContext, stored: bool) -> dict[str, list[Target]]:
    """Targets from a JSONL file, checked line by line (`file:line: field: problem`).

    `stored`: the run's own RUN/targets.jsonl, whose `response_ids` are used as written. A user's file gives text
    only (`response`), tokenized here under each pair's student prompt; ids of pairs outside the selected split are
    skipped, ids unknown to the pairs file are an error.
    """
    known = {p.id for p in load_pairs(run.config.pairs)} if not stored else set(run.pairs)
    vocab = len(run.policy.tokenizer)
    limit = run.policy.max_positions
    out: dict[str, list[Target]] = {}
    for n, obj in read_jsonl(path):
        if not isinstance(obj, dict):
            raise DataError(path, n, "<record>", "must be a JSON object")
        extra = sorted(set(obj) - TARGET_FIELDS)
        if extra:  # a misspelt field was ignored without a word
            raise DataError(path, n, extra[0], "unknown field (a target holds 'id' and 'response'; a run's own "
                                               "targets.jsonl the fields it writes)")
        pid = obj.get("id")
        if not isinstance(pid, str) or not pid:
            raise DataError(path, n, "id", "missing or not a non-empty string")
        if pid not in known:
            raise DataError(path, n, "id", f"unknown pair id {pid!r} (not in {run.config.pairs})")
        text = obj.get("response")
        if not isinstance(text, str) or blank(text):
            raise DataError(path, n, "response", "missing, not a string, or empty")
        if pid not in run.pairs:  # a pair of another split
            continue
        if stored:
            ids = obj.get("response_ids")
            if not (isinstance(ids, list) and ids and all(isinstance(t, int) and 0 <= t < vocab for t in ids)):
                raise DataError(path, n, "response_ids", f"must be a non-empty list of token ids below {vocab}")
            prefix = obj.get("prefix_tokens", 0)
            if not (isinstance(prefix, int) and not isinstance(prefix, bool) and 0 <= prefix < len(ids)):
                raise DataError(path, n, "prefix_tokens", f"must be an integer in [0, {len(ids)})")
            target = Target(ids, bool(obj.get("truncated", False)), prefix)
        else:
            target = Target(tokenize_response(run.policy, run.pairs[pid].student, text), truncated=False)
        total = len(run.prompts[pid].student_ids) + len(target.response_ids)
        if limit is not None and total > limit:
            raise DataError(path, n, "response", f"{len(target.response_ids)} tokens; after the student prompt of "
                                                 f"pair {pid} that is {total}, over the model's {limit} positions")
        out.setdefault(pid, []).append(target)
    missing = [pid for pid in run.pairs if pid not in out]
    if missing:
        raise OpctError(f"{path}: no target for {len(missing)} of the {len(run.pairs)} training pairs "
                        f"(first: {', '.join(missing[:3])})")
    return out


def _records(run: StepContext, targets: dict[str, list[Target]], source: str) -> list[dict]:
    tok = run.policy.tokenizer
    rows = []
    for pid, pair in run.pairs.items():
        for k, t in enumerate(targets[pid]):
            rows.append({"id": pid, "sample": k, "source": source, "teacher": pair.teacher, "student": pair.student,
                         "response": tok.decode(t.response_ids, skip_special_tokens=True),
                         "response_ids": t.response_ids, "truncated": t.truncated, "prefix_tokens": t.prefix})
    return rows


def prepare(run: StepContext) -> None:
    """Load or make the targets (once per run) and keep them in `run.cache["targets"]`.

    Fresh run: generate them (or read `--targets`) and write RUN/targets.jsonl atomically. Resumed run: read
    RUN/targets.jsonl back — never regenerate, since the student has already trained on those targets.
    """
    from accelerate.utils import gather_object

    cfg, acc = run.config, run.accelerator
    path = Path(cfg.out) / TARGETS_FILE
    if cfg.resume and path.exists():
        run.cache["targets"] = read_targets(path, run, stored=True)
        return
    if run.step > 0:
        raise OpctError(f"{path}: missing, but the run resumes from step {run.step}; the targets it trained on are "
                        f"lost, so it cannot continue exactly. Start a new run (another --out)")
    if cfg.targets:
        targets = read_targets(cfg.targets, run, stored=False)
        source = f"file:{cfg.targets}"
    else:  # every process answers its share of the pairs; all of them get all answers
        ids = list(run.pairs)
        mine = teacher_answers(run, ids[acc.process_index::acc.num_processes])
        targets = {}
        for part in gather_object([mine]):
            targets.update(part)
        source = "starting model on the teacher prompt" if not cfg.teacher_model else f"teacher {cfg.teacher_model}"
    if cfg.target != "plain":
        targets = with_prefix(run, targets)
        source += f" + {cfg.target} sentence"
    if acc.is_main_process:
        write_jsonl_atomic(path, _records(run, targets, source))
    acc.wait_for_everyone()
    run.cache["targets"] = targets


def with_prefix(run: StepContext, targets: dict[str, list[Target]]) -> dict[str, list[Target]]:
    """Each target with its pair's reason (or filler) sentence before the answer (`cfg.target`)."""
    from opct.methods.reasons import prefix_ids

    tok, limit = run.policy.tokenizer, run.policy.max_positions
    out = {}
    for pid, ts in targets.items():
        pre = prefix_ids(tok, run.pairs[pid], run.config.target)
        out[pid] = [Target(pre + t.response_ids, t.truncated, len(pre)) for t in ts]
        total = len(run.prompts[pid].student_ids) + len(out[pid][0].response_ids)
        if limit is not None and total > limit:
            raise OpctError(f"pair {pid}: with its {run.config.target} sentence the target is {total} tokens after "
                            f"the student prompt, over the model's {limit} positions")
    return out


# ------------------------------------------------------------------------------------------------ the step

def reason_mask(prefixes: list[int], R: int) -> torch.Tensor:
    """0.0 on each row's first `prefix` response positions, 1.0 after: (B, R)."""
    return (torch.arange(R)[None, :] >= torch.tensor(prefixes)[:, None]).float()


def sft_step(run: StepContext, micro_batches: list[list[Pair]]) -> dict[str, float]:
    """Cross-entropy on (student prompt -> stored target) for every target of every pair in the step."""
    cfg, acc, policy = run.config, run.accelerator, run.policy
    targets: dict[str, list[Target]] = run.cache["targets"]
    batches = []
    for pairs in micro_batches:
        rows = [(run.prompts[p.id].student_ids, t) for p in pairs for t in targets[p.id]]
        batch = pack([s for s, _ in rows], [t.response_ids for _, t in rows], policy.pad_id, acc.device)
        mask_B_R = response_mask(batch.response_ids_B_R, batch.response_lengths_B, policy.eos_ids)
        if cfg.mask_reason:  # the reason / filler sentence is context, not a prediction
            mask_B_R = mask_B_R * reason_mask([t.prefix for _, t in rows], mask_B_R.shape[1]).to(mask_B_R)
        batches.append((batch, mask_B_R, len(rows), sum(t.truncated for _, t in rows)))

    local = sum(mask_B_R.sum() for _, mask_B_R, _, _ in batches)
    total_tokens = acc.reduce(local.double(), reduction="sum")
    scale = acc.num_processes / total_tokens  # see opct_step: DDP's gradient average becomes the global sum

    sums = torch.zeros(4, dtype=torch.float64, device=acc.device)  # CE, student entropy, rows, truncated rows
    for i, (batch, mask_B_R, rows, truncated) in enumerate(batches):
        with run.grad_sync(last_micro_batch=i == len(batches) - 1):
            with run.autocast():
                logp_B_R_V = log_probs(response_logits(run.model, batch))
            nll_B_R = -token_logprobs(logp_B_R_V, batch.response_ids_B_R)
            run.backward((nll_B_R * mask_B_R).sum() * scale)
        with torch.no_grad():
            sums += torch.stack([(nll_B_R.detach() * mask_B_R).sum(), (entropy(logp_B_R_V.detach()) * mask_B_R).sum(),
                                 mask_B_R.new_tensor(rows), mask_B_R.new_tensor(truncated)]).to(sums)
        del logp_B_R_V, nll_B_R
    sums = acc.reduce(sums, reduction="sum")
    n = float(total_tokens)
    return {"loss": float(sums[0]) / n, "student_entropy": float(sums[1]) / n, "response_len": n / float(sums[2]),
            "truncated_frac": float(sums[3]) / float(sums[2]), "tokens": n}


def prepare_bct(run: StepContext) -> None:
    if run.config.targets:  # also refused by TrainConfig; kept here for callers that build a context by hand
        raise OpctError("--targets is for --method sft; BCT trains on the model's own answers")
    prepare(run)


bct_step = sft_step
