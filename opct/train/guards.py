"""Guards against the student/teacher mismatches that users of on-policy distillation trainers report
(../shared/papers/protocols.md §6): each one silently biases a per-token KL instead of failing, so opct checks them
before (and while) it trains, and stops with an OpctError naming the pair, the files and the tokens.

  check_vocab(policy, teacher, where)   the model's config.json vocab_size, the tokenizer's size and the teacher's
                                        output width agree: every token id the tokenizer can produce has a row in
                                        the student's and the teacher's output (a tokenizer may be smaller than a
                                        padded embedding, never larger), and student and teacher score over the
                                        same vocabulary (two models padded to 151936 and 152064 do not)
  check_rendered(policy, pair, r)       per pair, on the rendered prompts: at most one BOS at the start of each
                                        side and the same number on both (a template that writes BOS plus a
                                        tokenizer that adds another gives two); and the chat template ends both
                                        sides with the same generation prompt, so the response tokens follow the
                                        same template tokens on both sides (what differs is only the prompt)
  check_distinct(policy, pairs, r)      prompts that differ render to tokens that differ: a template that drops
                                        the messages trained with loss 0 (an error when no pair differs, else a
                                        warning); warn_unknown: prompts holding the unknown token (a warning)
  check_same_responses(s, t, where)     in every step: the student's and the teacher's layouts hold the very same
                                        response token ids, with the same lengths (the KL compares the two
                                        distributions at these positions; re-tokenized or shifted responses would
                                        compare different tokens)
  lora_targets(model, spec)             `--lora-targets` as peft's target_modules, every name matching a module of
                                        the model (peft stops with a traceback when none does, and ignores a
                                        misspelt one beside others that match: that layer would silently not train)
"""

from __future__ import annotations

import sys
from typing import Sequence

from opct.errors import OpctError
from opct.pairs.schema import prefill_of, without_prefill


def _files(policy) -> tuple[str, str]:
    return f"{policy.name}/config.json", f"{policy.name}/tokenizer.json"


def output_rows(model) -> int | None:
    """Rows of the model's output projection (its vocabulary as scored), or None when it has none to read."""
    emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(emb, "weight", None)
    return None if weight is None else int(weight.shape[0])


def check_vocab(policy, teacher_model=None) -> None:
    config_file, tokenizer_file = _files(policy)
    vocab = getattr(policy.model.config, "vocab_size", None)
    n_tok = len(policy.tokenizer)
    student = output_rows(policy.model)
    if vocab is not None and n_tok > vocab:
        raise OpctError(f"{tokenizer_file}: the tokenizer has {n_tok} tokens but {config_file} says vocab_size "
                        f"{vocab}: ids from {vocab} on have no row in the model's output")
    if vocab is not None and student is not None and student != vocab:
        raise OpctError(f"{config_file}: vocab_size {vocab}, but the model's output layer has {student} rows")
    if teacher_model is not None:
        teacher = output_rows(teacher_model)
        if student is not None and teacher is not None and teacher != student:
            raise OpctError(f"{config_file}: the student scores {student} tokens and the teacher {teacher}: their "
                            f"vocabularies differ (padded to other sizes?), so their log-probs cannot be compared")


def leading_bos(ids: Sequence[int], bos: int) -> int:
    n = 0
    while n < len(ids) and ids[n] == bos:
        n += 1
    return n


def generation_tail(policy, messages) -> list[int]:
    """The tokens the chat template adds for the generation prompt: what rendering with it has beyond the longest
    common prefix with rendering without it (e.g. `<|im_start|>assistant\\n` in ChatML)."""
    with_gen = policy.render(messages, add_generation_prompt=True)
    without = policy.render(messages, add_generation_prompt=False)
    n = 0
    while n < min(len(with_gen), len(without)) and with_gen[n] == without[n]:
        n += 1
    return list(with_gen[n:])


def _show(policy, ids) -> str:
    text = policy.tokenizer.decode(list(ids))
    return repr(text if len(text) <= 60 else text[:57] + "...")


def check_rendered(policy, pair, student_ids: Sequence[int], teacher_ids: Sequence[int]) -> None:
    """The BOS and chat-template guards for one pair (see the module docstring)."""
    where = f"pair {pair.id}"
    bos = getattr(policy.tokenizer, "bos_token_id", None)
    if bos is not None:
        n_s, n_t = leading_bos(student_ids, bos), leading_bos(teacher_ids, bos)
        if max(n_s, n_t) > 1:
            side = "student" if n_s > 1 else "teacher"
            raise OpctError(f"{where}: the {side} prompt starts with {max(n_s, n_t)} BOS tokens "
                            f"({policy.tokenizer.bos_token!r}); the chat template writes one and the tokenizer adds "
                            f"another? ({_files(policy)[1]})")
        if n_s != n_t:
            raise OpctError(f"{where}: the student prompt starts with {n_s} BOS token(s) and the teacher prompt with "
                            f"{n_t}; both sides must be rendered the same way")
    # a prefill (opct.pairs.schema) follows the generation prompt: the tail is checked before the prefill's tokens
    sides = {"student": pair.student, "teacher": pair.teacher}
    tails = {side: generation_tail(policy, without_prefill(msgs)) for side, msgs in sides.items()}
    if tails["student"] != tails["teacher"]:
        raise OpctError(f"{where}: the chat template ends the student prompt with {_show(policy, tails['student'])} "
                        f"and the teacher prompt with {_show(policy, tails['teacher'])}; the response would follow "
                        f"other template tokens on each side")
    for side, ids in (("student", student_ids), ("teacher", teacher_ids)):
        tail = tails[side]
        if prefill_of(sides[side]) is not None:
            ids = ids[:len(policy.render(without_prefill(sides[side])))]
        if tail and list(ids[-len(tail):]) != tail:
            raise OpctError(f"{where}: the {side} prompt does not end with the chat template's generation prompt "
                            f"{_show(policy, tail)} (it ends {_show(policy, ids[-len(tail):])})")


def check_distinct(policy, pairs, rendered: dict, path=None, warn: bool = True) -> None:
    """Pairs whose prompts differ but render to the same tokens train nothing (loss 0): the chat template drops what
    differs (one that ignores the messages trained a whole run with loss 0, 2026-12-07), or the tokenizer erases it
    (the organism's lower-cases, so a prompt in capitals is its clean prompt). All of them: an OpctError; some: a
    warning with their count and the first."""
    differ = [p.id for p in pairs if p.student != p.teacher]  # an SFT example's two sides are the same prompt
    same = [pid for pid in differ if list(rendered[pid].student_ids) == list(rendered[pid].teacher_ids)]
    if not same:
        return
    said = (f"the student and teacher prompts differ, but {policy.name}'s chat template and tokenizer render both to "
            f"the same tokens")
    if len(same) == len(differ):
        raise OpctError(f"{path or 'the pairs'}: in every pair {said}: they drop what differs (a template that "
                        f"ignores the messages or a system message, a tokenizer that lower-cases?), so training would "
                        f"change nothing")
    if warn:
        print(f"opct: warning: {path or 'the pairs'}: in {len(same)} of {len(differ)} pairs (first: pair {same[0]}) "
              f"{said} (the tokenizer erases the perturbation?); they train nothing", file=sys.stderr)


def warn_unknown(policy, rendered: dict, path=None) -> None:
    """A warning when prompts hold the tokenizer's unknown token: the words it stands for never reach the model (a
    word-level tokenizer such as the organism's maps every word it lacks to it; pairs of unknown words only trained
    as if the prompts were the same). Said once, with the count of pairs and the first of them."""
    tok = policy.tokenizer
    unk = getattr(tok, "unk_token_id", None)
    if unk is None or unk in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id):  # a template may write those
        return
    hit = [pid for pid, r in rendered.items() if unk in r.student_ids or unk in r.teacher_ids]
    if hit:
        print(f"opct: warning: {path or 'the pairs'}: the prompts of {len(hit)} of {len(rendered)} pairs hold the "
              f"unknown token {tok.unk_token!r} (first: pair {hit[0]}): words the tokenizer of "
              f"{policy.name} does not know, which the model never sees", file=sys.stderr)


def warn_unknown_families(pairs, path) -> None:
    """A warning when pairs of a registered axis carry a family the axis does not know (a misspelt
    'suggested-answer'): `opct pairs check` and `opct run --pairs` refuse them (`opct.pairs.make.check_families`);
    `opct train` trains any pairs, but no evaluation counts those as trained, so its held-out check never compares
    them (until 2026-12-08 said nowhere)."""
    from opct.errors import DataError
    from opct.pairs.make import check_families

    try:
        check_families(pairs, path)
    except DataError as e:
        print(f"opct: warning: {e} (trained all the same; an evaluation's held-out families are not checked against "
              f"it, and `opct pairs check` refuses it)", file=sys.stderr)


def check_same_responses(student_batch, teacher_batch, where: str = "this step") -> None:
    """Both layouts (opct.batching.PackedBatch) hold identical response ids and lengths."""
    import torch

    same = student_batch.response_ids_B_R.shape == teacher_batch.response_ids_B_R.shape \
        and torch.equal(student_batch.response_lengths_B, teacher_batch.response_lengths_B)
    if same:
        mask = torch.arange(student_batch.response_ids_B_R.shape[1], device=student_batch.response_ids_B_R.device)
        mask = mask[None, :] < student_batch.response_lengths_B[:, None]
        same = torch.equal(student_batch.response_ids_B_R[mask], teacher_batch.response_ids_B_R[mask])
    if not same:
        raise OpctError(f"{where}: the student and the teacher would score different response tokens; the per-token "
                        f"KL compares the same tokens under two prompts (a bug in how the responses were laid out)")


def _is_target(module_name: str, target: str) -> bool:
    """Whether peft's `target_modules` entry `target` names the module: its whole dotted name, or its last parts."""
    return module_name == target or module_name.endswith("." + target)


def lora_targets(model, spec: str):
    """`spec` ('all-linear' or comma-separated module names) as peft's `target_modules`, each name checked against
    the model's modules the way peft matches a name (the whole dotted name, or its last parts)."""
    import torch

    if spec == "all-linear":
        return spec
    names = [t.strip() for t in spec.split(",") if t.strip()]
    if not names:
        raise OpctError(f"--lora-targets: no module names in {spec!r} (use 'all-linear' or e.g. 'q_proj,v_proj')")
    modules = [n for n, _ in model.named_modules() if n]
    missing = [t for t in names if not any(_is_target(n, t) for n in modules)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise OpctError(f"--lora-targets: no module of the model is called {', '.join(map(repr, missing))}; its "
                        f"linear layers: {', '.join(linear)} (or 'all-linear')")
    return names


def check_lora_rank(model, targets, r: int) -> None:
    """Refuse a LoRA rank above every layer it adapts could use: an update of an m x n layer has rank at most
    min(m, n), so past the largest such bound over the targets (`lora_targets`' value) r only adds parameters and
    memory (an absurd r would allocate gigabytes before anything is said). A rank that some targets can use and
    smaller ones cannot is left alone (peft adapts each layer at that rank)."""
    import torch

    out_layer = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None

    def targeted(name: str, m) -> bool:
        if targets == "all-linear":
            return m is not out_layer
        return any(_is_target(name, t) for t in targets)

    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and targeted(n, m)]
    if not layers:
        return
    name, layer = max(layers, key=lambda nm: min(nm[1].in_features, nm[1].out_features))
    most = min(layer.in_features, layer.out_features)
    if r > most:
        raise OpctError(f"LoRA rank {r} (--lora-r, lora_r): above the largest rank an update of the layers it adapts "
                        f"can have ({most}, e.g. {name}: {layer.in_features} -> {layer.out_features}); a larger rank "
                        f"adds only parameters and memory: use {most} or less")
