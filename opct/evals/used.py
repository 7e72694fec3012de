"""What reads each `opct eval` option, so that one none of the chosen axes reads is refused, not recorded in run.json
and ignored (until 2026-12-07 `opct eval --suite sycophancy --judge http ...` or `--gcg-steps 5` ran without a word).
As `opct.train.config.USED_BY` for `opct train`:

  USED_BY[field] = (whether a config's run reads it, what does, what this run has instead)   EvalConfig's fields
  ATTACK_USED_BY[field] = (whether (eval config, attack config) reads it, what does, what this run has instead)
  check_used(cfg), check_attack_used(cfg, attack)   a ConfigError for the first field away from its default that
                                                    the run does not read, and for a per-axis entry (`--trained
                                                    AXIS=...`) of an axis the suite leaves out

`opct eval` runs them on a new run (not on --resume: a run started before this rule continues with its settings).
An experiment's or a study's shared eval block is not checked: each arm reads it with its own axes.
"""

from __future__ import annotations

from opct.config import defaults_of, unread

JUDGED = ("jailbreak", "prefill")  # the axes a jailbreak judge grades (`opct.axes.jailbreak.judge_for`)
ATTACKED = "jailbreak"  # the axis the adaptive attacker runs in (`EvalContext.attack`)


def _names(cfg) -> list[str]:
    from opct.evals.run import suite_names

    return suite_names(cfg.suite)


def _judged(c) -> bool:
    return any(a in JUDGED for a in _names(c))


def _paired(c) -> bool:
    """Whether an axis of the suite has pairs, and so a teacher side (capability has neither)."""
    from opct.axes import AXES

    return any(AXES[a].task is not None for a in _names(c))


def _suite(c) -> str:
    return f"--suite {c.suite}"


def _http(c) -> str:
    return _suite(c) + (f", --judge {c.judge}" if _judged(c) else "")


_JUDGE = (_judged, f"--suite {' or '.join(JUDGED)} (the axes a judge grades)", _suite)
USED_BY = {
    **dict.fromkeys(("judge", "judge_url", "judge_model"), _JUDGE),
    **dict.fromkeys(("judge_timeout", "judge_key_env"),
                    (lambda c: _judged(c) and c.judge == "http", f"--judge http on --suite {' or '.join(JUDGED)}",
                     _http)),
    "prompt_side": (_paired, "an axis with pairs, and so a teacher side (any but capability)", _suite),
}
# (--no-attack is not here: turning off an attacker the suite does not run asks for what the run does)
PER_AXIS = ("trained", "axis_n", "axis_items", "pair_options")  # mappings keyed by axis: read for the suite's axes


def _attacked(e, a) -> bool:
    return ATTACKED in _names(e) and e.attack


def _attack_now(e, a) -> str:
    return _suite(e) if ATTACKED not in _names(e) else "--no-attack"


_ATTACK = (_attacked, f"the adaptive attacker (--suite {ATTACKED}, without --no-attack)", _attack_now)


def _part(on, text: str, off: str):
    """An attacker part's setting: read where the attacker runs and `on(attack config)` holds (the part is on);
    `text` says what reads it, `off` how this run turned the part off."""
    return (lambda e, a: _attacked(e, a) and on(a), lambda e, a: text if _attacked(e, a) else _ATTACK[1],
            lambda e, a: _attack_now(e, a) if not _attacked(e, a) else off)


_SEARCH = _part(lambda a: a.search_rounds > 0, "the black-box search (--search-rounds above 0)", "--search-rounds 0")
_GCG = _part(lambda a: a.gcg_steps > 0, "white-box GCG (--gcg-steps above 0)", "--gcg-steps 0")
_RL = _part(lambda a: a.rl_attack, "the RL attacker (--rl-attack)", "--no-rl-attack")
ATTACK_USED_BY = {
    **dict.fromkeys(("attack_targets", "attack_direct_samples", "attack_temperature", "attack_baseline",
                     "search_rounds", "gcg_steps", "rl_attack"), _ATTACK),
    **dict.fromkeys(("attack_wrappers", "search_population", "search_samples", "search_depth"), _SEARCH),
    **dict.fromkeys(("gcg_candidates", "gcg_topk", "gcg_suffix_len", "gcg_check_every", "gcg_check_samples",
                     "attack_target_text"), _GCG),
    **dict.fromkeys(("rl_attacker", "rl_episodes", "rl_rounds", "rl_train_behaviours", "rl_epochs",
                     "rl_step_behaviours", "rl_inner_steps", "rl_lr", "rl_kl", "rl_clip", "rl_round_cost",
                     "rl_stop_score", "rl_break_score"), _RL),
}


def _refuse(name: str, now: str, text: str, fix: str = "remove it"):
    raise unread(name, now, text, fix)


def check_used(cfg) -> None:
    """A ConfigError naming the first EvalConfig field of `USED_BY` set away from its default that none of the
    suite's axes reads, or an axis of a per-axis mapping (`--trained AXIS=...`) that the suite leaves out."""
    default = defaults_of(type(cfg))
    for name, (reads, text, now) in USED_BY.items():
        if getattr(cfg, name) != default[name] and not reads(cfg):
            _refuse(name, now(cfg), text)
    names = _names(cfg)
    for field in PER_AXIS:
        for axis in getattr(cfg, field) or {}:
            if axis not in names:
                _refuse(f"{field}.{axis}", _suite(cfg), f"the {axis} axis", f"add {axis} to --suite, or remove it")


def check_attack_used(cfg, attack) -> None:
    """A ConfigError naming the first AttackConfig field set away from its default that the run does not read: no
    jailbreak axis, --no-attack, or the attacker's part it belongs to turned off (`--gcg-steps 0`)."""
    default = defaults_of(type(attack))
    for name, (reads, text, now) in ATTACK_USED_BY.items():
        if getattr(attack, name) != default[name] and not reads(cfg, attack):
            _refuse(name, now(cfg, attack), text if isinstance(text, str) else text(cfg, attack))
