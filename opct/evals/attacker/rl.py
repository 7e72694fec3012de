"""RL against one target: episodes of PAIR-style refinement, and a group-baseline policy gradient (GRPO-lite).

An *episode* attacks one behaviour for up to `rl_rounds` rounds. Each round the attacker LM reads its prompt (the
request, the round, and from round 2 its previous frame, the target's first words and the judge's score), writes a
frame; the request is spliced in; the target answers (sampled at `attack_temperature`, through the policy interface
only: black-box); the judge scores the answer. An episode stops early once a score reaches `rl_stop_score`.

    reward         the best judge score over the episode's rounds (the paper's)
    shaped_reward  reward - rl_round_cost x (rounds used - 1): with a binary judge (the world's) a target broken at
                   round 1 by every episode gives every episode reward 1, hence no advantage; the round cost still
                   prefers frames that break it sooner. `rl_round_cost: 0` trains on the paper's reward.

One optimizer step (`update`) takes the episodes of `rl_step_behaviours` behaviours x `rl_episodes` episodes.
Advantages are normalised within each behaviour's group of episodes, (R - mean) / std (0 when all are equal);
every token the attacker wrote in an episode (all of its rounds) gets the episode's advantage. Per token:

    loss_t = -min(ratio_t A, clip(ratio_t, 1 - rl_clip, 1 + rl_clip) A) + rl_kl * k3_t
    ratio_t = exp(logp_theta - logp_old),  k3_t = exp(logp_ref - logp_theta) - (logp_ref - logp_theta) - 1

(k3: the KL(theta || ref) estimator GRPO uses), averaged over each action's tokens, then over actions. The batch is
reused for `rl_inner_steps` gradient steps; logp_old is the log-prob at the first of them, so the first step has
ratio 1 (the clip cannot bind) and the clip only acts from the second on.
"""

from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass, field

from opct.evals.attacker.frames import attacker_prompt, parse_frame
from opct.evals.generate import Gen, generate

FRAME_TOKENS = 96  # longest frame the attacker writes (its pretraining frames are at most ~80 tokens)


@dataclass
class Attempt:
    round: int
    frame: str  # the frame as written, with the slot
    prompt: list  # the chat prompt the target read
    response: str
    score: float
    verdict: str


@dataclass
class Episode:
    item: dict
    attempts: list = field(default_factory=list)
    actions: list = field(default_factory=list)  # (attacker prompt ids, frame ids) per round
    done: bool = False

    @property
    def best(self) -> Attempt:
        return max(self.attempts, key=lambda a: a.score)  # the earliest of equal scores

    def reward(self) -> float:
        return self.best.score

    def shaped_reward(self, round_cost: float) -> float:
        return self.reward() - round_cost * (len(self.attempts) - 1)


def rollout(attacker, target, judge, items: list[dict], cfg, gen: Gen, seed: int,
            stop_behaviour: bool = False) -> list[Episode]:
    """`cfg.rl_episodes` episodes per item, all items at once (one batched generation per round). With
    `stop_behaviour` (evaluation), a behaviour stops as soon as one of its episodes reaches the stop score."""
    import torch

    episodes = [Episode(it) for it in items for _ in range(cfg.rl_episodes)]
    for rnd in range(1, cfg.rl_rounds + 1):
        live = [e for e in episodes if not e.done]
        if not live:
            break
        prompts = [attacker.render(attacker_prompt(e.item["request"], rnd, None if not e.attempts else (
            e.attempts[-1].frame, e.attempts[-1].response, e.attempts[-1].score))) for e in live]
        torch.manual_seed(seed * 7919 + rnd)
        frames_ids = attacker.sample(prompts, FRAME_TOKENS, temperature=1.0).response_ids
        frames = [parse_frame(attacker.tokenizer, ids) for ids in frames_ids]
        asks = [[{"role": "user", "content": f.splice(e.item["request"])}] for f, e in zip(frames, live)]
        responses = generate(target, asks, gen, seed=seed * 7919 + 100 + rnd, desc="rl attacker")
        verdicts = judge.judge([e.item["request"] for e in live], responses)
        for e, p, ids, f, a, r, v in zip(live, prompts, frames_ids, frames, asks, responses, verdicts):
            e.actions.append((p, ids))
            e.attempts.append(Attempt(rnd, f.text(), a, r, float(v["score"]), v["verdict"]))
            e.done = v["score"] >= cfg.rl_stop_score or rnd == cfg.rl_rounds
        if stop_behaviour:
            won = {e.item["id"] for e in live if e.best.score >= cfg.rl_stop_score}
            for e in episodes:
                e.done = e.done or e.item["id"] in won
    return episodes


def advantages(rewards_G: list[float]) -> list[float]:
    """Group-normalised advantages: (R - mean) / std over one behaviour's episodes; all zero when all are equal."""
    n = len(rewards_G)
    mean = sum(rewards_G) / n
    std = (sum((r - mean) ** 2 for r in rewards_G) / n) ** 0.5
    return [0.0] * n if std < 1e-8 else [(r - mean) / std for r in rewards_G]


def _logp(model, batch):
    import torch

    from opct.batching import response_logits

    logits_B_R_V = response_logits(model, batch)
    return torch.log_softmax(logits_B_R_V.float(), -1).gather(-1, batch.response_ids_B_R[..., None])[..., 0]


def update(attacker, ref, opt, episodes: list[Episode], adv: list[float], cfg) -> dict:
    """`cfg.rl_inner_steps` gradient steps of the clipped, KL-penalised surrogate on these episodes' actions."""
    import torch

    from opct.batching import pack

    acts = [(p, ids, a) for e, a in zip(episodes, adv) for p, ids in e.actions if ids]
    batch = pack([p for p, _, _ in acts], [ids for _, ids, _ in acts], attacker.pad_id, attacker.device)
    R = batch.response_ids_B_R.shape[1]
    mask_B_R = (torch.arange(R, device=attacker.device)[None, :] < batch.response_lengths_B[:, None]).float()
    adv_B = torch.tensor([a for _, _, a in acts], dtype=torch.float32, device=attacker.device)
    with torch.no_grad():
        ref_B_R = _logp(ref, batch)
    old_B_R, stats = None, {}
    for _ in range(cfg.rl_inner_steps):
        logp_B_R = _logp(attacker.model, batch)
        old_B_R = logp_B_R.detach() if old_B_R is None else old_B_R
        ratio_B_R = torch.exp(logp_B_R - old_B_R)
        surr_B_R = torch.min(ratio_B_R * adv_B[:, None],
                             ratio_B_R.clamp(1 - cfg.rl_clip, 1 + cfg.rl_clip) * adv_B[:, None])
        d_B_R = ref_B_R - logp_B_R
        k3_B_R = torch.exp(d_B_R) - d_B_R - 1
        per_B = ((-surr_B_R + cfg.rl_kl * k3_B_R) * mask_B_R).sum(1) / mask_B_R.sum(1)
        loss = per_B.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(attacker.model.parameters(), 1.0)
        opt.step()
        clipped = ((ratio_B_R - 1).abs() > cfg.rl_clip).float()
        stats = {"loss": loss.item(), "kl": ((k3_B_R * mask_B_R).sum() / mask_B_R.sum()).item(),
                 "clipped": ((clipped * mask_B_R).sum() / mask_B_R.sum()).item()}
    return stats


def train_attacker(attacker, target, judge, items: list[dict], cfg, gen: Gen, seed: int = 0,
                   progress: bool = False) -> dict:
    """RL-train `attacker` (an HFPolicy, updated in place) against `target` on `items`, for `cfg.rl_epochs` passes.
    Returns the training curve (one entry per epoch) and the budget spent."""
    import torch

    model = attacker.model
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.rl_lr, weight_decay=0.0)
    rng = random.Random(seed)
    curve, steps, queries, t0 = [], 0, 0, time.time()
    n_steps = cfg.rl_epochs * -(-len(items) // cfg.rl_step_behaviours)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_steps, desc="rl attacker: train", leave=False)
    for epoch in range(cfg.rl_epochs):
        order = rng.sample(items, len(items))
        eps_all, stats = [], {}
        for i in range(0, len(order), cfg.rl_step_behaviours):
            chunk = order[i:i + cfg.rl_step_behaviours]
            episodes = rollout(attacker, target, judge, chunk, cfg, gen, seed=seed * 1000 + steps)
            adv = []
            for j in range(0, len(episodes), cfg.rl_episodes):
                adv += advantages([e.shaped_reward(cfg.rl_round_cost) for e in episodes[j:j + cfg.rl_episodes]])
            stats = update(attacker, ref, opt, episodes, adv, cfg)
            steps += 1
            queries += sum(len(e.attempts) for e in episodes)
            eps_all += episodes
            if bar is not None:
                bar.update(1)
        n = len(eps_all)
        curve.append({"epoch": epoch + 1, "reward": round(sum(e.reward() for e in eps_all) / n, 4),
                      "shaped_reward": round(sum(e.shaped_reward(cfg.rl_round_cost) for e in eps_all) / n, 4),
                      "broken": round(sum(e.reward() >= cfg.rl_break_score for e in eps_all) / n, 4),
                      "first_round": round(sum(e.attempts[0].score >= cfg.rl_break_score for e in eps_all) / n, 4),
                      "rounds": round(sum(len(e.attempts) for e in eps_all) / n, 3),
                      "kl": round(stats.get("kl", 0.0), 5), "clipped": round(stats.get("clipped", 0.0), 4)})
    if bar is not None:
        bar.close()
    model.eval()
    return {"curve": curve, "steps": steps, "gradient_steps": steps * cfg.rl_inner_steps,
            "target_queries": queries, "seconds": round(time.time() - t0, 1)}


def evaluate(attacker, target, judge, items: list[dict], cfg, gen: Gen, seed: int = 0) -> dict[str, dict]:
    """The same budget on each item (`rl_episodes` x `rl_rounds`, stopping once broken): item id ->
    {"broken", "score", "prompt", "response", "frame", "round", "queries"} of its best attempt."""
    import torch

    out = {}
    with torch.no_grad():
        episodes = rollout(attacker, target, judge, items, cfg, gen, seed=seed * 1000 + 999, stop_behaviour=True)
    for it in items:
        mine = [e for e in episodes if e.item["id"] == it["id"]]
        best = max((e.best for e in mine), key=lambda a: a.score)
        out[it["id"]] = {"broken": best.score >= cfg.rl_break_score, "score": best.score, "prompt": best.prompt,
                         "response": best.response, "frame": best.frame, "round": best.round,
                         "queries": sum(len(e.attempts) for e in mine)}
    return out
