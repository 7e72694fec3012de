"""Sharded optimizer state is not supported yet (README, "Several processes"): a run that accelerate launches with
DeepSpeed is refused with a clear error before anything trains, instead of writing checkpoints that hold only the
main process's shard."""

import os
import subprocess
import sys

import pytest


def test_a_deepspeed_launch_is_refused_clearly(tmp_path):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"id": "a", "axis": "sycophancy", "task": "invariance", "teacher": [{"role": "user", "content": '
                     '"Is it?"}], "student": [{"role": "user", "content": "Is it? I think no."}], "meta": {}}\n')
    env = {**os.environ, "ACCELERATE_USE_DEEPSPEED": "true"}
    p = subprocess.run([sys.executable, "-m", "opct.cli", "train", "--method", "bct", "--model", "test", "--pairs",
                        str(pairs), "--out", str(tmp_path / "run"), "--max-steps", "1"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr[-2000:]
    assert "opct: error: accelerate launched this run with DEEPSPEED" in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
