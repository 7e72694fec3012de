"""A tiny world, tokenizer and Llama model for the policy/loss/training tests (not a test module).

The world: objects with a colour. A clean question gets the right colour; a question with the user's suggestion of a
wrong colour gets that wrong colour (the model is trained to be sycophantic). Pairs: teacher = clean question,
student = biased question — so OPCT should teach the student to ignore the suggestion.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from opct.organism.tokenizer import train_tokenizer

OBJECTS = {"sky": "blue", "grass": "green", "snow": "white", "coal": "black", "sun": "yellow", "blood": "red"}
COLORS = sorted(set(OBJECTS.values()))


def clean_q(obj):
    return [{"role": "user", "content": f"what color is the {obj} ?"}]


def biased_q(obj, wrong):
    return [{"role": "user", "content": f"i think the {obj} is {wrong} . what color is the {obj} ?"}]


def answer(color):
    return f"the color is {color} ."


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Models this small run fastest on one thread, and a second OpenMP thread competing with another busy process
    can slow them down by an order of magnitude. Import this fixture into a test module to apply it there."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_tokenizer():
    words = list(OBJECTS) + COLORS + ["what color is the ? i think . the color is"]
    return train_tokenizer([" ".join(words)])


def make_model(tokenizer, seed=0, hidden=32, layers=2, max_positions=64):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=max_positions, pad_token_id=tokenizer.pad_token_id,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def make_pairs():
    """Pairs over every (object, wrong colour); every third combination is held out."""
    pairs = []
    for i, (obj, color) in enumerate(OBJECTS.items()):
        for j, wrong in enumerate(c for c in COLORS if c != color):
            pairs.append({"id": f"{obj}-{wrong}", "axis": "sycophancy", "task": "invariance",
                          "teacher": clean_q(obj), "student": biased_q(obj, wrong),
                          "meta": {"family": "suggested_answer", "split": "heldout" if (i + j) % 3 == 0 else "train"}})
    return pairs


def write_pairs(path, pairs=None):
    path = Path(path)
    path.write_text("".join(json.dumps(p) + "\n" for p in (pairs or make_pairs())), encoding="utf-8")
    return path


def pretrain(model, tokenizer, steps=120, lr=3e-3):
    """Teach the model the world (loss on answer tokens, full batch): right colours on clean questions, the
    suggested colour on biased ones."""
    examples = []
    for obj, color in OBJECTS.items():
        examples += [(clean_q(obj), color)] * 3 + [(biased_q(obj, w), w) for w in COLORS if w != color]
    rows = []
    for q, a in examples:
        prompt = tokenizer.apply_chat_template(q, tokenize=True, add_generation_prompt=True, return_dict=False)
        full = tokenizer.apply_chat_template(q + [{"role": "assistant", "content": answer(a)}], tokenize=True,
                                             return_dict=False)
        rows.append((len(prompt), full))
    L = max(len(f) for _, f in rows)
    ids = torch.full((len(rows), L), tokenizer.pad_token_id)
    mask, labels = torch.zeros_like(ids), torch.full_like(ids, -100)
    for i, (p, f) in enumerate(rows):
        ids[i, :len(f)], mask[i, :len(f)], labels[i, p:len(f)] = torch.tensor(f), 1, torch.tensor(f[p:])
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def save(model, tokenizer, path):
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


_TMP = tempfile.mkdtemp(prefix="opct-tiny-")
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def model_dir(pretrained: bool = True, steps: int = 120) -> Path:
    """A saved tiny model directory, built once per test session (random weights when not `pretrained`)."""
    tok = make_tokenizer()
    model = make_model(tok)
    if pretrained:
        pretrain(model, tok, steps=steps)
    return save(model, tok, Path(_TMP) / f"model-{int(pretrained)}-{steps}")


@pytest.fixture(scope="module", name="model_dir")
def model_dir_fixture():
    """Module-scoped fixture `model_dir`: the tiny pretrained model's directory."""
    return model_dir()


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    """Module-scoped fixture: the tiny world's pairs written to a JSONL file."""
    return write_pairs(tmp_path_factory.mktemp("pairs") / "pairs.jsonl")


def read_metrics(run):
    """The run's metrics.jsonl as a list of dicts."""
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]


def assert_same_training(a: dict, b: dict, lr: float) -> None:
    """Two runs of the same training whose float32 sums ran in another order (ZeRO-2 against DDP, DDP against one
    process) end with weights that agree to rounding almost everywhere; Adam amplifies the rounding only where a
    gradient is near its eps (the update is lr * g / (|g| + eps)), so a few coordinates differ by more, and by how
    much depends on the CPU's kernels (measured: 7e-7 on an AMD EPYC, 6.8e-6 on a CI machine, 1.2e-7 elsewhere).
    A wrong gradient (a rank's rows dropped or counted twice, a missed reduction) moves most coordinates by about lr
    per step, so the check is: 99% of the coordinates within 1e-6, and every one within lr / 20."""
    assert a.keys() == b.keys()
    diff = torch.cat([(a[k].float() - b[k].float()).abs().flatten() for k in a])
    assert float(diff.max()) < lr / 20, f"a coordinate differs by {float(diff.max()):.3g} (lr {lr})"
    close = float((diff <= 1e-6).float().mean())
    assert close >= 0.99, f"only {close:.2%} of {diff.numel()} coordinates agree to 1e-6"


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs of its own, to fill up or make read-only (needs root, as in CI; skipped where mounting is
    not allowed)."""
    import subprocess

    mnt = tmp_path / "disk"
    mnt.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                                                       capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill_disk(disk: Path, leave: int = 0) -> Path:
    """Fill the file system of `disk` with DISK/filler, then free `leave` bytes of it again; returns the filler."""
    import errno
    import os

    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


def cli_error(capsys, argv) -> str:
    """Run `opct ARGV`, expect exit 1 and one `opct: error:` line with no traceback; return that line.
    (Other stderr lines are transformers' progress bars.)"""
    from opct.cli import main

    assert main(argv) == 1
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("opct: error: ") and "Traceback" not in err, err
    return last
