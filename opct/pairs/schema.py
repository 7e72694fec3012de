"""The contrastive-pair record and its JSONL file format (DESIGN §2).

One JSON object per line:

    {"id": "syc-000123", "axis": "sycophancy", "task": "invariance",
     "teacher": [{"role": "user", "content": "..."}],      # clean prompt, or prompt + safety fact
     "student": [{"role": "user", "content": "..."}],      # perturbed prompt, or bare prompt
     "meta": {"family": "suggested_answer", "split": "train", ...}}

`teacher` and `student` are chat messages rendered by the model's chat template; a multi-turn prompt (the
"are you sure?" family) is a list of several messages and ends with a user message. A prompt may instead end with a
*prefill*: an assistant message marked `"prefill": true` right after the last user message, the start of the
assistant's turn that the model continues (`{"role": "assistant", "content": "Sure, here is how.", "prefill": true}`;
the prefill axis, `opct.axes.prefill`). It is rendered as the generation prompt followed by its text's tokens
(`render_ids`), so a response continues it; it is not part of what internal-consistency methods compare (they read
the prompt without it, `without_prefill`). Every problem found on load is reported as `file:line: field: problem`
through `DataError`.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from opct.errors import DataError, OpctError
from opct.files import JSONProblem, blank, check_regular, id_problem, strict_loads, write_atomic

TASKS = ("invariance", "compression")
SPLITS = ("train", "heldout")
# meta fields read as true or false (jailbreak / persona / prefill `harmful`, awareness `hazard`, `poisoned`)
FLAGS = ("harmful", "hazard", "poisoned")
ROLES = ("system", "user", "assistant")
MESSAGE_KEYS = {"role", "content", "prefill"}


@dataclass
class Pair:
    id: str
    axis: str
    task: str
    teacher: list[dict]
    student: list[dict]
    meta: dict = field(default_factory=dict)

    @property
    def family(self) -> str:
        return self.meta.get("family", "")

    @property
    def split(self) -> str:
        return self.meta.get("split", "")

    def to_json(self) -> dict:
        return asdict(self)


def known_axes() -> list[str]:
    """The registered axes (`opct.axes.AXES`), and "custom" for pairs of a user's own making."""
    from opct.axes import AXES

    return [*AXES, "custom"]


def _check_messages(obj, name, where):
    path, line = where
    msgs = obj.get(name)
    if msgs is None:
        raise DataError(path, line, name, "missing")
    if not isinstance(msgs, list) or not msgs:
        raise DataError(path, line, name, "must be a non-empty list of chat messages")
    for i, m in enumerate(msgs):
        f = f"{name}[{i}]"
        if not isinstance(m, dict):
            raise DataError(path, line, f, "must be an object with 'role' and 'content'")
        if m.get("role") not in ROLES:
            raise DataError(path, line, f"{f}.role", f"must be one of {', '.join(ROLES)} (got {m.get('role')!r})")
        extra = sorted(set(m) - MESSAGE_KEYS)
        if extra:  # a misspelt "prefill" was dropped without a word
            raise DataError(path, line, f"{f}.{extra[0]}", "unknown field (a message holds 'role', 'content' and, "
                                                          "on an assistant message that opens the response, 'prefill')")
        c = m.get("content")
        if not isinstance(c, str):
            raise DataError(path, line, f"{f}.content", "missing or not a string")
        if blank(c):
            raise DataError(path, line, f"{f}.content", "empty prompt text (only spaces or invisible characters)")
        if "prefill" in m and (m["prefill"] is not True or m["role"] != "assistant" or i != len(msgs) - 1):
            raise DataError(path, line, f"{f}.prefill", "only the last message, an assistant message, may be marked "
                                                       "and only with true (the start of the assistant's turn)")
    if prefill_of(msgs) is not None:
        if not prefill_follows_user(msgs):
            raise DataError(path, line, f"{name}[{len(msgs) - 1}]", "a prefill must follow a user message")
    elif msgs[-1]["role"] != "user":
        raise DataError(path, line, f"{name}[{len(msgs) - 1}].role",
                        "a prompt must end with a user message (or an assistant message marked \"prefill\": true)")


def prefill_of(messages: list[dict]) -> str | None:
    """The prefill text of a prompt (its last message, an assistant message marked `"prefill": true`), or None."""
    if messages and messages[-1].get("role") == "assistant" and messages[-1].get("prefill") is True:
        return messages[-1]["content"]
    return None


def prefill_follows_user(messages: list[dict]) -> bool:
    """The rule for a prompt whose last message is a prefill: the message before it is the user's."""
    return len(messages) >= 2 and messages[-2].get("role") == "user"


def without_prefill(messages: list[dict]) -> list[dict]:
    """The prompt without its prefill (the messages unchanged when there is none)."""
    return messages[:-1] if prefill_of(messages) is not None else messages


def prefill_message(text: str) -> dict:
    return {"role": "assistant", "content": text, "prefill": True}


def render_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of a prompt through `tokenizer`'s chat template. A prompt with a prefill is the rest rendered with the
    generation prompt, then the prefill's own tokens (no special tokens): the assistant's turn is open and the
    response continues it, whatever `add_generation_prompt` says. So the prompt without its prefill is a token
    prefix of the prompt with it (what the internal-consistency methods rely on)."""
    pre = prefill_of(messages)
    if pre is None:
        return list(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                                  return_dict=False))
    head = list(tokenizer.apply_chat_template(messages[:-1], tokenize=True, add_generation_prompt=True,
                                              return_dict=False))
    return head + list(tokenizer(pre, add_special_tokens=False)["input_ids"])


def special_texts(tokenizer) -> tuple[str, ...]:
    """The texts `tokenizer` reads as one special (control) token wherever they stand, inside a message's content
    too (`<|im_end|>`, `<|assistant|>`): its special tokens and its added tokens marked special. Longest first."""
    texts = set(getattr(tokenizer, "all_special_tokens", None) or [])
    texts |= {str(t) for t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values()
              if getattr(t, "special", False)}
    return tuple(sorted((t for t in texts if t), key=lambda t: (-len(t), t)))


def special_text_in(messages: list[dict], texts: tuple[str, ...]) -> tuple[str, str] | None:
    """(the special token's text, the message content holding it) for the first message that holds one, or None."""
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            for t in texts:
                if t in content:
                    return t, content
    return None


# The special tokens' texts already said, per model name, for a whole command (`special_said_once`, which
# `opct.cli.main` opens): an experiment loads a policy per cell and said each once per cell. None: outside a command,
# each policy keeps its own set.
_SAID: dict[str, set[str]] | None = None


@contextmanager
def special_said_once():
    """Within the block, every policy of one model shares the set of special tokens' texts said (`said_specials`)."""
    global _SAID
    outer, _SAID = _SAID, ({} if _SAID is None else _SAID)
    try:
        yield
    finally:
        _SAID = outer


def said_specials(name: str) -> set[str]:
    """The set of special tokens' texts said for the model `name`: the command's, or a new one outside a command."""
    return set() if _SAID is None else _SAID.setdefault(name, set())


def warn_special_text(name: str, messages: list[dict], texts: tuple[str, ...], seen: set[str]) -> None:
    """Say on stderr, once per token (`seen`: those said), that a message holds the text of a special token of the
    model `name`: the tokenizer reads it as that control token, as transformers' chat templates do for every model,
    so the text can end the user's turn or open the assistant's. Red-team data may mean exactly that: a warning."""
    found = special_text_in(messages, texts)
    if found is None or found[0] in seen:
        return
    token, content = found
    seen.add(token)
    excerpt = content if len(content) <= 80 else content[:77] + "..."
    print(f"opct: warning: {name}: a message holds the text {token!r}, which the tokenizer reads as its special "
          f"token (a control token: it can end a turn or open another), not as text; first in {excerpt!r}. Remove it "
          f"from the data unless the prompt means to forge a turn (said once per token)", file=sys.stderr)


def validate_pair(obj, path="<pair>", line=0) -> Pair:
    """Check one decoded JSON object against the schema and return it as a `Pair`."""
    where = (path, line)
    if not isinstance(obj, dict):
        raise DataError(path, line, "<record>", "must be a JSON object")
    pid = obj.get("id")
    if not isinstance(pid, str) or not pid:
        raise DataError(path, line, "id", "missing or not a non-empty string")
    if blank(pid):
        raise DataError(path, line, "id", "blank (only spaces)")
    if problem := id_problem(pid):
        raise DataError(path, line, "id", problem)
    for f in ("axis", "task", "teacher", "student"):
        if f not in obj:
            raise DataError(path, line, f, "missing")
    axes = known_axes()
    if obj.get("axis") not in axes:
        raise DataError(path, line, "axis", f"must be one of {', '.join(axes)} (got {obj.get('axis')!r})")
    if obj.get("task") not in TASKS:
        raise DataError(path, line, "task", f"must be one of {', '.join(TASKS)} (got {obj.get('task')!r})")
    _check_messages(obj, "teacher", where)
    _check_messages(obj, "student", where)
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise DataError(path, line, "meta", "must be an object")
    if "family" in meta and not isinstance(meta["family"], str):  # a list was "missing" (2026-12-07)
        raise DataError(path, line, "meta.family", f"must be a string (got {json.dumps(meta['family'])[:40]})")
    if not isinstance(meta.get("family"), str) or not meta.get("family"):
        raise DataError(path, line, "meta.family", "missing (every pair records its family)")
    if meta.get("split") not in SPLITS:
        raise DataError(path, line, "meta.split", f"must be one of {', '.join(SPLITS)} (got {meta.get('split')!r})")
    for flag in FLAGS:  # read as true or false: the string "no" would count as true
        if flag in meta and not isinstance(meta[flag], bool):
            raise DataError(path, line, f"meta.{flag}", f"must be true or false (got {meta[flag]!r})")
    extra = set(obj) - {"id", "axis", "task", "teacher", "student", "meta"}
    if extra:
        raise DataError(path, line, sorted(extra)[0], "unknown field (put extra information under 'meta')")
    return Pair(id=pid, axis=obj["axis"], task=obj["task"], teacher=obj["teacher"], student=obj["student"], meta=meta)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON (write a number, or null)")


def read_jsonl(path, strict: bool = False) -> Iterable[tuple[int, dict]]:
    """Yield (line number, decoded object) for each non-blank line. A line that is not UTF-8, not JSON or nested
    too deeply names its line; a missing file names the file (a directory: the OS error, which the CLI names).
    `strict`: Python's extensions NaN, Infinity and -Infinity are errors too (a pairs file, whose `meta` is free
    form: a NaN there is a mistake that passes every comparison unnoticed); opct's own files may hold them (a NaN
    loss), and an items file checks each field's type and finiteness itself, naming the field."""
    path = Path(path)
    if not path.exists():
        raise DataError(path, 0, "<file>", "no such file")
    check_regular(path)
    with open(path, "rb") as f:
        for n, raw_bytes in enumerate(f, start=1):
            try:
                raw = raw_bytes.decode("utf-8-sig" if n == 1 else "utf-8")  # a byte-order mark is dropped
            except UnicodeDecodeError as e:
                raise DataError(path, n, "<text>", f"not UTF-8 (byte {e.start} of the line)") from None
            if not raw.strip():
                continue
            try:
                yield n, strict_loads(raw, parse_constant=_no_constant) if strict else strict_loads(raw)
            except json.JSONDecodeError as e:
                raise DataError(path, n, "<json>", f"malformed JSON ({e.msg} at column {e.colno})") from None
            except JSONProblem as e:
                raise DataError(path, n, e.field, e.problem) from None
            except ValueError as e:  # a constant under `strict`
                raise DataError(path, n, "<json>", str(e)) from None
            except RecursionError:
                raise DataError(path, n, "<json>", "nested too deeply") from None


def load_pairs(path) -> list[Pair]:
    """Load and validate a pairs file. Duplicate ids are an error (they would break resumable data positions)."""
    pairs, seen = [], {}
    for n, obj in read_jsonl(path, strict=True):
        p = validate_pair(obj, path, n)
        if p.id in seen:
            raise DataError(path, n, "id", f"duplicate id {p.id!r} (first on line {seen[p.id]})")
        seen[p.id] = n
        pairs.append(p)
    if not pairs:
        raise DataError(path, 0, "<file>", "no pairs in file")
    return pairs


def line_of(path, pair_id: str) -> int | None:
    """The line of the pair `pair_id` in the pairs file at `path` (loaded by `load_pairs`, so ids are unique): a check
    made on the loaded pairs names the line that holds the one it refuses. None when the file does not hold it (a
    replay pair, made for the run)."""
    return next((n for n, obj in read_jsonl(path) if isinstance(obj, dict) and obj.get("id") == pair_id), None)


def check_pair_fits(policy, ids, max_new_tokens: int, pair_id: str, side: str, path=None) -> None:
    """`policy.check_fits` for the `side` ("student", "teacher") prompt of a pair, its error naming the pairs file and
    line when `path` holds the pair (looked up only then: reading the file for every pair made checking N pairs read
    it N times)."""
    try:
        policy.check_fits(ids, max_new_tokens, f"pair {pair_id} ({side} prompt)")
    except OpctError as e:
        line = line_of(path, pair_id) if path else None
        if line is None:
            raise
        raise OpctError(f"{path}:{line}: {e}") from None


def write_jsonl_atomic(path, records: Iterable[dict]) -> Path:
    """Write records as JSONL to a temporary file beside `path`, then rename: a crash never leaves half a file."""
    return write_atomic(path, (json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def save_pairs(pairs: Iterable[Pair], path) -> Path:
    return write_jsonl_atomic(path, (p.to_json() for p in pairs))
