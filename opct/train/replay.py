"""On-policy benign replay, for every method: `TrainConfig.replay_frac` and `replay_schedule` (issue 20, part 1).

What it really is: benign prompts of the world that no evaluation asks (`opct.pairs.make.replay_pairs`, the pool the
`benign_replay` arm key draws from) are answered once, greedily, by the frozen *starting* model (the same teacher
that BCT's targets and OPCT's KL come from; under `init_adapter`, the base model without that adapter), before the
first step. Those answers are written to RUN/replay.jsonl (prompt, text, token ids) and never regenerated, so a
resumed run trains on the same rows. They are then trained on with cross-entropy — the SFT loss, on the answer
tokens only, EOS included, normalised by the replay tokens of the whole optimizer step — *added* to the method's own
loss at weight 1 (the OPCT paper's benign-regularised BCT uses weight 1.0). The method's loss is untouched.

`replay_frac` f is the share of training examples that are replay rows: with P pairs per optimizer step (batch_size
x grad_accum x processes; an OPCT pair with its n samples counts once), the run trains
N = round(max_steps x P x f / (1 - f)) replay rows in all, so N / (N + max_steps x P) = f.
`replay_schedule`:
  mixed       from step 0: step s adds the rows floor((s-1) r) .. floor(s r) - 1 of the replay stream, r = P f / (1-f)
              (the SFT-lessons paper's "23% on-model replay from the start");
  sequential  after the method's max_steps, ceil(N / P) more steps of replay alone, P rows each (replay "applied
              afterwards", which the paper found erodes the trait). The run then has max_steps + ceil(N / P) steps;
              its checkpoints, metrics and schedule count them all, and metrics.jsonl says which phase each step was.
The replay stream is a pure function of (seed, position), like the pairs' stream, so resume needs only the step.
The rows are drawn from min(N, pool) distinct prompts (the pool is drawn round-robin over its kinds: open fact
questions, training-split multi-step arithmetic, benign safety questions), cycled in seeded permutations.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from opct.errors import DataError, OpctError
from opct.losses import log_probs, response_mask, token_logprobs
from opct.pairs.schema import read_jsonl, write_jsonl_atomic
from opct.policy import pack, response_logits

REPLAY_FILE = "replay.jsonl"


@dataclass
class ReplayRow:
    id: str
    prompt_ids: list[int]
    response_ids: list[int]  # the starting model's greedy answer, cut after its first EOS (none when truncated)
    truncated: bool


@dataclass
class ReplayPlan:
    per_step: int  # pairs per optimizer step, all processes
    total_rows: int  # N: replay rows over the whole run
    method_steps: int  # the method's max_steps
    extra_steps: int  # sequential: steps of replay alone after the method's; mixed: 0
    schedule: str

    @property
    def total_steps(self) -> int:
        return self.method_steps + self.extra_steps

    def rows_at(self, step: int) -> range:
        """Positions in the replay stream trained at optimizer step `step` (1-based)."""
        if self.schedule == "sequential":
            if step <= self.method_steps:
                return range(0)
            k = step - self.method_steps - 1
            return range(k * self.per_step, (k + 1) * self.per_step)
        r = self.total_rows / self.method_steps
        return range(math.floor((step - 1) * r + 1e-9), math.floor(step * r + 1e-9))


def plan(config, processes: int = 1) -> ReplayPlan | None:
    """The run's replay plan, or None when `replay_frac` is 0."""
    f = config.replay_frac
    if not f:
        return None
    per_step = config.batch_size * config.grad_accum * processes
    total = round(config.max_steps * per_step * f / (1 - f))
    total = max(total, 1)
    extra = math.ceil(total / per_step) if config.replay_schedule == "sequential" else 0
    if config.replay_schedule == "sequential":
        total = extra * per_step  # whole steps of replay alone
    return ReplayPlan(per_step, total, config.max_steps, extra, config.replay_schedule)


def pool_ids(n: int, seed: int) -> list:
    """The replay prompts (as Pairs whose teacher = student = the benign prompt) of a run drawing `n` rows."""
    from opct.pairs.make import replay_pairs

    return replay_pairs(n, seed)


def _stream_index(position: int, n: int, seed: int) -> int:
    epoch, i = divmod(position, n)
    order = list(range(n))
    random.Random(seed * 1_000_003 + 7_919 + epoch).shuffle(order)
    return order[i]


def prepare(run, p: ReplayPlan) -> list[ReplayRow]:
    """The replay rows of the run: made once (the starting model's greedy answers), read back on resume."""
    from opct.methods.sft import generate

    cfg, acc = run.config, run.accelerator
    path = Path(cfg.out) / REPLAY_FILE
    if cfg.resume and path.exists():
        return _read(path, run)
    if run.step > 0:
        raise OpctError(f"{path}: missing, but the run resumes from step {run.step}; the replay rows it trained on "
                        f"are lost, so it cannot continue exactly. Start a new run (another --out)")
    pairs = pool_ids(p.total_rows, cfg.seed)
    prompts = [run.policy.render(q.student) for q in pairs]
    for q, ids in zip(pairs, prompts):
        run.policy.check_fits(ids, cfg.max_new_tokens, f"replay prompt {q.id}")
    rows: list[ReplayRow] = []
    with run.teacher_policy() as policy:  # the frozen starting model, greedy
        for i in range(0, len(prompts), 64):
            for q, ids, t in zip(pairs[i:i + 64], prompts[i:i + 64],
                                 generate(policy, prompts[i:i + 64], cfg.max_new_tokens, 0.0)):
                rows.append(ReplayRow(q.id, ids, t.response_ids, t.truncated))
    if acc.is_main_process:
        tok = run.policy.tokenizer
        write_jsonl_atomic(path, [{"id": r.id, "prompt": q.student, "source": "starting model, greedy",
                                   "response": tok.decode(r.response_ids, skip_special_tokens=True),
                                   "prompt_ids": r.prompt_ids, "response_ids": r.response_ids,
                                   "truncated": r.truncated} for r, q in zip(rows, pairs)])
    acc.wait_for_everyone()
    return rows


def _read(path: Path, run) -> list[ReplayRow]:
    vocab = len(run.policy.tokenizer)
    rows = []
    for n, obj in read_jsonl(path):
        if not isinstance(obj, dict):
            raise DataError(path, n, "<record>", "must be a JSON object")
        for key in ("prompt_ids", "response_ids"):
            ids = obj.get(key)
            if not (isinstance(ids, list) and ids and all(isinstance(t, int) and 0 <= t < vocab for t in ids)):
                raise DataError(path, n, key, f"must be a non-empty list of token ids below {vocab}")
        rows.append(ReplayRow(str(obj.get("id")), obj["prompt_ids"], obj["response_ids"], bool(obj.get("truncated"))))
    if not rows:
        raise OpctError(f"{path}: holds no replay rows")
    return rows


def step_rows(rows: list[ReplayRow], p: ReplayPlan, step: int, seed: int, rank: int, world: int) -> list[ReplayRow]:
    """This process's replay rows of optimizer step `step` (1-based)."""
    chosen = [rows[_stream_index(i, len(rows), seed)] for i in p.rows_at(step)]
    return chosen[rank::world]


def replay_backward(run, rows: list[ReplayRow], n_global: int, sync_last: bool) -> dict[str, float]:
    """Cross-entropy on (prompt -> the starting model's answer) for `rows` (this process's share of the step's
    `n_global` rows), mean over the step's replay tokens, backpropagated at weight 1. `sync_last`: the last
    micro-batch synchronises gradients across processes (a step of replay alone: its P rows give every rank
    batch_size x grad_accum of them, so every rank has that micro-batch); otherwise every micro-batch accumulates
    locally and the method's own last micro-batch synchronises (mixed). Mixed, the ranks may hold different numbers
    of rows (one row in a step: rank 0 has it, the others none): under DDP the micro-batches that accumulate locally
    issue no collective (StepContext.grad_sync), under ZeRO-2 the others pad their backward count (below)."""
    cfg, acc, policy = run.config, run.accelerator, run.policy
    if n_global == 0:
        return {"replay_loss": None, "replay_rows": 0, "replay_tokens": 0}
    chunks = [rows[i:i + cfg.batch_size] for i in range(0, len(rows), cfg.batch_size)]
    batches = []
    for chunk in chunks:
        batch = pack([r.prompt_ids for r in chunk], [r.response_ids for r in chunk], policy.pad_id, acc.device)
        batches.append((batch, response_mask(batch.response_ids_B_R, batch.response_lengths_B, policy.eos_ids)))
    local = sum((m.sum() for _, m in batches), torch.zeros((), device=acc.device))
    total_tokens = acc.reduce(local.double(), reduction="sum")
    scale = acc.num_processes / total_tokens
    nll_sum = torch.zeros((), dtype=torch.float64, device=acc.device)
    for i, (batch, mask_B_R) in enumerate(batches):
        with run.grad_sync(last_micro_batch=sync_last and i == len(batches) - 1):
            with run.autocast():
                logp_B_R_V = log_probs(response_logits(run.model, batch))
            nll_B_R = -token_logprobs(logp_B_R_V, batch.response_ids_B_R)
            run.backward((nll_B_R * mask_B_R).sum() * scale)
        nll_sum += (nll_B_R.detach() * mask_B_R).sum().double()
        del logp_B_R_V, nll_B_R
    from opct.train import sharded

    if sharded.is_deepspeed(acc):  # as many backward passes as the rank with the most rows (rank 0: the first share)
        most = -(-(-(-n_global // acc.num_processes)) // cfg.batch_size)
        sharded.pad_backward(acc, run.model, most - len(batches))
    nll_sum = acc.reduce(nll_sum, reduction="sum")
    return {"replay_loss": float(nll_sum) / float(total_tokens), "replay_rows": n_global,
            "replay_tokens": float(total_tokens)}
