"""The mechanism probe (`opct mechanism RUN`): linear CKA and cosine against independent formulas and their
invariances; on a real tiny experiment, an arm's change is zero exactly when its adapter does nothing, the result
lands in mechanism.json and in the report, and bad input is a clear error."""

import json

import pytest
import torch

from opct.cli import main
from opct.errors import OpctError
from opct.experiment.config import ExperimentConfig
from opct.experiment.runner import run_experiment
from opct.report import mechanism as M


def _cka_hsic(x, y):
    """CKA by its HSIC definition with Gram matrices and the centring matrix H (an independent formula)."""
    x, y = x.double(), y.double()
    n = x.shape[0]
    h = torch.eye(n, dtype=torch.float64) - torch.full((n, n), 1.0 / n, dtype=torch.float64)
    k, ell = x @ x.T, y @ y.T
    hsic = lambda a, b: torch.trace(a @ h @ b @ h)  # noqa: E731
    return float(hsic(k, ell) / torch.sqrt(hsic(k, k) * hsic(ell, ell)))


def test_linear_cka_matches_the_hsic_formula_and_its_invariances():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 12, generator=g)
    y = x @ torch.randn(12, 12, generator=g) + 0.5 * torch.randn(40, 12, generator=g)
    assert M.linear_cka(x, y) == pytest.approx(_cka_hsic(x, y), rel=1e-9)
    assert M.linear_cka(x, x) == pytest.approx(1.0)
    q, _ = torch.linalg.qr(torch.randn(12, 12, generator=g, dtype=torch.float64))
    assert M.linear_cka(x, 3.0 * (x.double() @ q) + 7.0) == pytest.approx(1.0)  # rotation, scale, shift
    z = torch.randn(40, 12, generator=g)
    assert M.linear_cka(x, z) < 0.6 < M.linear_cka(x, y)
    assert M.linear_cka(x, torch.ones(40, 12)) is None  # a constant change has nothing to compare
    assert M.cosine(torch.tensor([1.0, 0.0]), torch.tensor([2.0, 0.0])) == pytest.approx(1.0)
    assert M.cosine(torch.tensor([1.0, 0.0]), torch.tensor([0.0, -3.0])) == pytest.approx(0.0)
    assert M.cosine(torch.tensor([1.0, 0.0]), torch.zeros(2)) is None


def test_the_cluster_reading_follows_the_paired_difference():
    def result(cka_within, cka_between):
        per_seed = {}
        for s, (w, b) in enumerate(zip(cka_within, cka_between)):
            row = lambda v: [{"cos": v, "cka": v}]  # noqa: E731
            per_seed[str(s)] = {"layers": 1, "change": {a: [0.1] for a in ("act", "mlpct", "bct")},
                                "similarity": {"act|mlpct": row(w), "act|bct": row(b), "mlpct|bct": row(b)}}
        return {"seeds": list(range(len(cka_within))), "arms": ["act", "mlpct", "bct"],
                "methods": {"act": "act", "mlpct": "mlpct", "bct": "bct"}, "per_seed": per_seed}

    assert M.summarise(result([0.9, 0.92, 0.88], [0.3, 0.35, 0.32]))["cluster"]["reading"] == "cluster"
    assert M.summarise(result([0.3, 0.35, 0.32], [0.9, 0.92, 0.88]))["cluster"]["reading"] == "no cluster"
    assert M.summarise(result([0.5, 0.9, 0.2], [0.6, 0.4, 0.5]))["cluster"]["reading"] == "cannot decide"
    assert M.summarise(result([0.9], [0.3]))["cluster"]["reading"].startswith("cannot decide")  # one seed: nothing
    s = M.summarise(result([0.9, 0.92, 0.88], [0.3, 0.35, 0.32]))
    assert 0.0 <= s["pairs"]["act|mlpct"]["cka"]["ci_low"] <= s["pairs"]["act|mlpct"]["cka"]["ci_high"] <= 1.0


@pytest.fixture(scope="module")
def tiny_run(test_organism, tmp_path_factory):
    out = tmp_path_factory.mktemp("mech")
    cfg = ExperimentConfig(name="mech", model=str(test_organism), out=str(out), arms=["base", "opct", "bct", "act"],
                           seeds=[0, 1], per_family=8, trained={"sycophancy": ["suggested_answer"]},
                           train={"max_steps": 2, "batch_size": 2, "n_samples": 2, "max_new_tokens": 8,
                                  "save_every": 2, "lr": 1e-2},
                           eval={"suite": "sycophancy", "n": 2, "max_new_tokens": 8, "attack": False}, report=False)
    return run_experiment(cfg, log=lambda m: None)


def test_the_probe_on_a_real_run(tiny_run, tmp_path, capfd):
    res = M.compute(tiny_run, n=6, progress=False)
    data = json.loads((tiny_run / "mechanism.json").read_text())
    assert data["arms"] == ["opct", "bct", "act"] and data["seeds"] == [0, 1]
    for seed in ("0", "1"):
        per = data["per_seed"][seed]
        assert per["n_prompts"] == 6 and per["axes"] == ["sycophancy"]
        assert per["layers"] == len(per["change"]["opct"]) >= 2
        assert all(c > 0 for a in data["arms"] for c in per["change"][a])  # lr 1e-2 moves every layer
    assert set(res["summary"]["pairs"]) == {"opct|bct", "opct|act", "bct|act"}
    assert res["summary"]["cluster"]["reading"].startswith("not measured")  # one activation arm: no cluster to see

    # an adapter that does nothing: zero change, and its similarities undefined, never a made-up number
    from safetensors.torch import load_file, save_file

    final = tiny_run / "bct" / "0" / "train" / "final" / "adapter_model.safetensors"
    saved = final.read_bytes()
    try:
        w = load_file(str(final))
        save_file({k: torch.zeros_like(v) for k, v in w.items()}, str(final))
        res = M.compute(tiny_run, arms=["opct", "bct"], n=6, progress=False)
        assert all(c == 0 for c in res["per_seed"]["0"]["change"]["bct"])
        assert all(r["cka"] is None and r["cos"] is None for r in res["per_seed"]["0"]["similarity"]["opct|bct"])
    finally:
        final.write_bytes(saved)

    # the CLI writes it and the report shows it; --no-progress: no bar, transformers' loading bars included
    capfd.readouterr()
    assert main(["mechanism", str(tiny_run), "--n", "4", "--no-progress"]) == 0
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "it/s" not in err, err
    assert main(["report", str(tiny_run)]) == 0
    md = (tiny_run / "results.md").read_text()
    assert "## Mechanism" in md and "Linear CKA of the residual-stream changes" in md
    assert "Mechanism" in (tiny_run / "report.html").read_text()


def test_bad_input_is_a_clear_error(tiny_run, tmp_path, capsys):
    with pytest.raises(OpctError, match="--n: must be an integer >= 3"):
        M.compute(tiny_run, n=1, progress=False)
    # --n 2 was accepted and printed CKA 1.000 on every layer: two centred prompts give rank-1 kernels, CKA 1 for any
    # two arms (found 2026-12-07)
    import torch

    x, y = torch.randn(2, 8, dtype=torch.float64), torch.randn(2, 8, dtype=torch.float64)
    assert M.linear_cka(x, y) == pytest.approx(1.0)
    with pytest.raises(OpctError, match="--n: must be an integer >= 3 .*: with two prompts, centred, CKA is 1"):
        M.compute(tiny_run, n=2, progress=False)
    with pytest.raises(OpctError, match="'nope' is not an arm"):
        M.compute(tiny_run, arms=["nope"], progress=False)
    with pytest.raises(OpctError, match="^--arms: opct named twice$"):  # accepted until 2026-12-07
        M.compute(tiny_run, arms=["opct", "bct", "opct"], progress=False)
    with pytest.raises(OpctError, match="no trained arm"):
        M.compute(tiny_run, arms=["base"], progress=False)
    # an arm whose adapter is gone in every seed is not shown as probed (its diagonal read 1, its row "undefined")
    import shutil

    finals = [tiny_run / "act" / seed / "train" / "final" for seed in ("0", "1")]
    for final in finals:
        shutil.move(final, final.with_name("final-aside"))
    try:
        res = M.compute(tiny_run, arms=["opct", "act"], n=4, progress=False)
        assert res["arms"] == ["opct"] and set(res["summary"]["change"]) == {"opct"}
        assert [s.split(":")[0] for s in res["skipped"]] == ["act seed 0", "act seed 1"]
        md = M.markdown(res)
        assert "| act |" not in md and "act (act)" not in md and "opct (opct)" in md and "Not probed: act seed 0" in md
        with pytest.raises(OpctError, match="nothing to probe.*act seed 1: no trained adapter"):
            M.compute(tiny_run, arms=["act"], n=4, progress=False)
    finally:
        for final in finals:
            shutil.move(final.with_name("final-aside"), final)
    # the adapter there but the cell unfinished (no done.json): said as that, not as "no trained adapter" (before
    # 2026-12-07, pointing the user at an adapter that was there)
    done = tiny_run / "act" / "0" / "done.json"
    done.rename(done.with_name("done-aside.json"))
    try:
        res = M.compute(tiny_run, arms=["opct", "act"], n=4, progress=False)
        assert res["skipped"] == [f"act seed 0: the cell is not finished (no {done})"]
    finally:
        done.with_name("done-aside.json").rename(done)
    assert main(["mechanism", str(tmp_path / "missing")]) == 1
    assert "opct: error:" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    bad = tmp_path / "run" / "mechanism.json"
    bad.write_text("{\"summary\": 3}")
    with pytest.raises(OpctError, match="mechanism.json: not a mechanism probe result"):
        M.load(tmp_path / "run")


def test_a_threats_or_robustness_run_is_named_as_such(tmp_path):
    """`opct mechanism` on a cross-threat run said "is it a run directory written by `opct run`?" -- it was (found
    2026-12-07): it now says what kind of run it is and what the probe reads."""
    for record, kind in (("threats.json", "kind: threats"), ("study.json", "kind: robustness")):
        run = tmp_path / record.split(".")[0]
        run.mkdir()
        (run / record).write_text("{}")
        with pytest.raises(OpctError, match=rf"^{run}: a .*\({kind}\) run \({record}\); the mechanism probe"):
            M.compute(run, progress=False)
