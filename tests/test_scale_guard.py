"""What opct refuses of accelerate's sharded launches, clearly and before anything trains: DeepSpeed ZeRO-3 (it
shards the parameters, which save_pretrained, the frozen teacher copy and the sampler need whole), and a DeepSpeed
run that no launcher started. ZeRO-1/2 themselves are supported: tests/test_scale_zero2.py. (FSDP is refused the same
way, but accelerate enables it only on GPU-like devices, so it is tried by bench/gpu_check.sh.)"""

import os
import subprocess
import sys

import pytest


def _train(tmp_path, **env):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"id": "a", "axis": "sycophancy", "task": "invariance", "teacher": [{"role": "user", "content": '
                     '"Is it?"}], "student": [{"role": "user", "content": "Is it? I think no."}], "meta": {}}\n')
    base = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    return subprocess.run([sys.executable, "-m", "opct.cli", "train", "--method", "bct", "--model", "test", "--pairs",
                           str(pairs), "--out", str(tmp_path / "run"), "--max-steps", "1"],
                          env={**base, "ACCELERATE_USE_DEEPSPEED": "true", **env}, capture_output=True, text=True,
                          timeout=300)


def test_a_zero3_launch_is_refused_clearly(tmp_path):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    p = _train(tmp_path, ACCELERATE_DEEPSPEED_ZERO_STAGE="3")
    assert p.returncode == 1, p.stderr[-2000:]
    assert "opct: error: accelerate launched this run with DeepSpeed ZeRO-3, which shards the parameters" in p.stderr
    assert "--zero_stage 2" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_deepspeed_without_a_launcher_is_refused_clearly(tmp_path):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    p = _train(tmp_path, ACCELERATE_DEEPSPEED_ZERO_STAGE="2")
    assert p.returncode == 1, p.stderr[-2000:]
    assert "opct: error: ACCELERATE_USE_DEEPSPEED is set but no launcher started this process" in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
