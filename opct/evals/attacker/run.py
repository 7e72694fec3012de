"""The RL attacker against one model: choose its training behaviours, pretrain (or find) the attacker LM, train a
fresh copy of it against this model, then attack each evaluated behaviour with the same budget.

Held out from everything that trains it: the evaluated behaviours are never among its training behaviours nor among
the goals of its pretraining data (`check_held_out` raises if they were); a target whose request *is* in that data
(a training-category behaviour under `attack_targets: all`) is not attacked by it, and its record says so.
"""

from __future__ import annotations

import random
import time

from opct.axes.base import text_key
from opct.errors import OpctError
from opct.evals.attacker.lm import build_attacker, load_attacker, world_data
from opct.evals.attacker.rl import evaluate, train_attacker
from opct.evals.generate import Gen, generate


def check_held_out(train: list[dict], evaluated: list[dict], seen_goals: list[str]) -> None:
    """Raise if an evaluated behaviour is among the training behaviours or the pretraining goals."""
    seen = {text_key(g) for g in seen_goals}
    for it in evaluated:
        if it["id"] in {t["id"] for t in train} or text_key(it["request"]) in {text_key(t["request"]) for t in train}:
            raise OpctError(f"rl attacker: evaluated behaviour {it['id']!r} is one of its training behaviours")
        if text_key(it["request"]) in seen:
            raise OpctError(f"rl attacker: evaluated behaviour {it['id']!r} is in its pretraining data")


def training_behaviours(policy, items: list[dict], targets: list[dict], judge, cfg, gen: Gen, seed: int = 0,
                        ) -> tuple[list[dict], dict]:
    """Up to `cfg.rl_train_behaviours` harmful behaviours of the training categories, none of them a target:
    those the model refuses directly first (most refusals of `attack_direct_samples` direct samples), ties broken at
    random. The user's own training items when there are any, else the world's. Returns them and their refusal
    counts."""
    tids = {t["id"] for t in targets}
    treq = {text_key(t["request"]) for t in targets}
    pool = [it for it in items if it.get("harmful", True) and it.get("split", "train") != "heldout"
            and it["id"] not in tids and text_key(it["request"]) not in treq]
    if not pool:
        from opct.world.items import request_items

        pool = [it for it in request_items() if it["harmful"] and it["split"] == "train"
                and text_key(it["request"]) not in treq]
    if not pool:
        raise OpctError("rl attacker: no training behaviours left: every harmful behaviour of the training categories "
                        "is an attack target (--attack-targets all, refused directly); use --attack-targets heldout "
                        "or --no-rl-attack")
    k = cfg.attack_direct_samples
    prompts = [[{"role": "user", "content": it["request"]}] for it in pool for _ in range(k)]
    verdicts = judge.judge([p[0]["content"] for p in prompts], generate(policy, prompts, gen, seed + 11,
                                                                        desc="rl attacker: direct"))
    refused = {it["id"]: sum(v["verdict"] == "refused" for v in verdicts[i * k:(i + 1) * k])
               for i, it in enumerate(pool)}
    rng = random.Random(seed)
    pool = rng.sample(pool, len(pool))
    pool.sort(key=lambda it: -refused[it["id"]])
    chosen = pool[:cfg.rl_train_behaviours]
    return chosen, {it["id"]: f"{refused[it['id']]}/{k}" for it in chosen}


def rl_attack(policy, items: list[dict], targets: list[dict], judge, cfg, wrappers: dict, max_new_tokens: int = 48,
              seed: int = 0, batch_size: int = 64, progress: bool = False,
              seed_per_prompt: bool = False) -> tuple[dict[str, dict], dict]:
    """Train the attacker against `policy` and attack `targets`. Returns (target id -> result, or None for a target
    in the attacker's own data; the budget and training curve for run.json)."""
    t0 = time.time()
    gen = Gen(max_new_tokens, cfg.attack_temperature, batch_size, seed_per_prompt=seed_per_prompt)
    goals = world_data()["requests"]
    seen = {text_key(g) for g in goals}
    attackable = [t for t in targets if text_key(t["request"]) not in seen]
    train, refused = training_behaviours(policy, items, targets, judge, cfg, gen, seed)
    check_held_out(train, attackable, goals)
    path = build_attacker(wrappers, cfg.rl_attacker, progress=progress)
    pretrain_s = round(time.time() - t0, 1)
    attacker = load_attacker(path)
    trained = train_attacker(attacker, policy, judge, train, cfg, gen, seed, progress) if cfg.rl_epochs else \
        {"curve": [], "steps": 0, "gradient_steps": 0, "target_queries": 0, "seconds": 0.0}
    t1 = time.time()
    results = evaluate(attacker, policy, judge, attackable, cfg, gen, seed) if attackable else {}
    info = {"attacker": str(path), "attacker_size": cfg.rl_attacker,
            "episodes": cfg.rl_episodes, "rounds": cfg.rl_rounds,
            "queries_per_behaviour": cfg.rl_episodes * cfg.rl_rounds,
            "queries_used": {k: v["queries"] for k, v in results.items()},
            "train_behaviours": [it["id"] for it in train], "train_direct_refused": refused,
            "epochs": cfg.rl_epochs, "train_steps": trained["steps"], "gradient_steps": trained["gradient_steps"],
            "train_target_queries": trained["target_queries"], "curve": trained["curve"],
            "not_attacked": [t["id"] for t in targets if t not in attackable],
            "seconds": {"pretrain_or_load": pretrain_s, "train": trained["seconds"],
                        "evaluate": round(time.time() - t1, 1), "total": round(time.time() - t0, 1)}}
    return {t["id"]: results.get(t["id"]) for t in targets}, info
