"""What a run of many cells (`opct run`: an experiment, a threats matrix, a robustness study) reads, by content, so
that a rerun adds cells built on what its finished cells were built on. Its cells' own records (a training run's
inputs.json, an eval's run.json) are checked only when a cell resumes; a new cell's are new, so before
2026-12-07 a rerun after the pairs file, the eval items or the model's weights were replaced at the same path put
cells of two data sets (or two models) into one report, unsaid.

  ROOT/run_inputs.json                 {input: fingerprint}, written on the first run, extended by reruns; the
                                       lm-eval task files (the include folder's, file by file, and each task given
                                       as a YAML) by path and SHA-256
  experiment_inputs(model, ec, pairs)   (fingerprints, {input: how the file names it}) of one run's inputs
  check_run_inputs(root, now, named, continuing)   a rerun whose inputs changed is an OpctError naming them
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from opct import files
from opct.errors import OpctError

INPUTS = "run_inputs.json"


def experiment_inputs(model: str, ec, pairs: str = "", prefix: str = "") -> tuple[dict[str, str], dict[str, str]]:
    """The fingerprints (`opct.resume_check`) of the model's weights and files, of the eval items the eval config
    `ec` reads (its suite's axes, with `axis_items` set), and of a user's pairs file; with how each is named in the
    file (`prefix` before the eval block's fields: 'studies.washout.')."""
    from opct.evals.resume import eval_inputs

    found = {k: v for k, v in eval_inputs(dataclasses.replace(ec, model=model, adapter=None)).items()
             if k != "lm_eval_include"}  # one fingerprint of the folder: recorded file by file below
    named = {"model": f"model {model} (its weights)",
             "model.files": f"model {model} (its config, tokenizer or chat template)",
             "items": f"{prefix}eval.items {ec.items}"}
    named.update({f"axis_items.{a}": f"the {a} items {p}" for a, p in (ec.axis_items or {}).items()})
    named.update({f"lm_eval_tasks.{t}": f"the lm-eval task file {t}" for t in ec.lm_eval_tasks})
    for key, (path, digest) in lm_eval_files(ec).items():
        found[key], named[key] = digest, f"the lm-eval task file {path}"
    out = {(k if k.startswith("model") else prefix + k): v for k, v in found.items()}
    named = {(k if k.startswith("model") else prefix + k): v for k, v in named.items()}
    if pairs and Path(pairs).is_file():
        try:
            out["pairs"] = files.sha256(pairs)
        except OSError as e:
            raise OpctError(f"{pairs}: {files.os_problem(e)}") from None
        named["pairs"] = f"pairs {pairs}"
    return out, {k: named[k] for k in out}


INCLUDED = "lm_eval_include/"  # key prefix of a file of the lm-eval include folder, by its path inside the folder


def lm_eval_files(ec) -> dict[str, tuple[str, str]]:
    """{`lm_eval_include/REL`: (path, SHA-256)} for every file under the eval config's lm-eval include folder (its task
    YAMLs, and what they include or load: `!function utils.fn`), when lm-eval runs. Until 2026-12 run_inputs.json
    left the task YAMLs out, so a rerun after one was edited measured new cells on the edited task beside cells
    measured on the old one, unsaid."""
    folder = Path(ec.lm_eval_include) if ec.lm_eval and ec.lm_eval_include else None
    if folder is None or not folder.is_dir():
        return {}
    out = {}
    try:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            out[INCLUDED + path.relative_to(folder).as_posix()] = (str(path), files.sha256(path))
    except OSError as e:
        raise OpctError(f"{getattr(e, 'filename', None) or folder}: {files.os_problem(e)}") from None
    return out


def check_run_inputs(root: Path, now: dict[str, str], named: dict[str, str], continuing: bool) -> None:
    """Record `now` in ROOT/run_inputs.json; when `continuing` an earlier run (its cells kept), first refuse inputs
    whose fingerprint differs from the one recorded (an input not recorded yet, new to this rerun, is added)."""
    from opct.resume_check import changed_inputs

    path = root / INPUTS
    saved = {}
    if continuing and path.exists():
        saved = files.read_json(path, "inputs")
        if not isinstance(saved, dict) or not all(isinstance(v, str) for v in saved.values()):
            raise OpctError(f"{path}: not a record of the run's inputs (damaged or edited): the cells already run "
                            f"cannot be checked against these inputs; put the original back, or run under another "
                            f"--name or --out")
        changed = changed_inputs(saved, now)
        # a file of the include folder removed since (the folder still given): its tasks are not what they were
        changed += [k for k in saved if INCLUDED in k and k not in now
                    and any(n.startswith(k.split(INCLUDED)[0] + INCLUDED) for n in now)]
        named = {**{k: f"the lm-eval task file {k.split(INCLUDED)[1]} (removed from the include folder)"
                    for k in saved if INCLUDED in k}, **named}
        if changed:
            one = len(changed) == 1
            differs = "its fingerprint differs" if one else "their fingerprints differ"
            raise OpctError(f"{path}: {', '.join(named.get(k, k) for k in changed)} {'holds' if one else 'hold'} "
                            f"other contents than when the run started ({differs}); "
                            f"the cells already run were built on the earlier contents and new ones would not compare "
                            f"with them: put the original back, or run under another --name or --out")
    files.write_json_atomic(path, {**saved, **now})


def check_not_nested(root: Path) -> None:
    """An OpctError when `root` lies inside another run's directory (a folder above it holds an experiment's, a
    threats run's, a study's, a training run's or an eval's own file, `opct.files.RUN_MARKERS`): `opct run --out
    runs/c1 --name bct` wrote a new experiment into the bct arm's folder of experiment c1 (found 2026-12-07)."""
    for folder in Path(root).absolute().parents:
        for name, (_, what) in files.RUN_MARKERS.items():
            if (folder / name).is_file():
                raise OpctError(f"{root}: inside {folder}, which holds {what} ({name}); a run there would mix its "
                                f"files with that run's cells: choose an --out outside {folder}")
