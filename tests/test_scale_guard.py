"""What opct refuses of accelerate's sharded launches, clearly and before anything trains: DeepSpeed ZeRO-3 (it
shards the parameters, which save_pretrained, the frozen teacher copy and the sampler need whole), and a DeepSpeed
run that no launcher started, FSDP (refused before accelerate sets it up: on a machine without a GPU accelerate's own
FSDP setup would stop with its traceback); and an error of accelerate's own setup is one line. ZeRO-1/2 themselves are
supported: tests/test_scale_zero2.py; FSDP and ZeRO-3 on a GPU are tried by bench/gpu_check.sh. A launch's own mixed
precision is refused unless it is bf16 and the run asks for --bf16 (opct sets and records its precision itself)."""

import os
import subprocess
import sys

import pytest


def _train(tmp_path, deepspeed=True, extra=(), **env):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"id": "a", "axis": "sycophancy", "task": "invariance", "teacher": [{"role": "user", "content": '
                     '"Is it?"}], "student": [{"role": "user", "content": "Is it? I think no."}], '
                     '"meta": {"family": "f", "split": "train"}}\n')
    base = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    return subprocess.run([sys.executable, "-m", "opct.cli", "train", "--method", "bct", "--model", "test", "--pairs",
                           str(pairs), "--out", str(tmp_path / "run"), "--max-steps", "1", *extra],
                          env={**base, "ACCELERATE_USE_DEEPSPEED": "true" if deepspeed else "false", **env},
                          capture_output=True, text=True,
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


def test_an_fsdp_launch_is_refused_clearly_before_accelerate_sets_it_up(tmp_path):
    p = _train(tmp_path, deepspeed=False, ACCELERATE_USE_FSDP="true", LOCAL_RANK="0")
    assert p.returncode == 1, p.stderr[-2000:]
    assert "opct: error: accelerate launched this run with FSDP, which shards the parameters" in p.stderr
    assert "Traceback" not in p.stderr and "no available devices" not in p.stderr
    assert not (tmp_path / "run").exists()  # refused before the run directory is made


def test_an_error_of_accelerates_own_setup_is_one_line(tmp_path):
    p = _train(tmp_path, deepspeed=False, ACCELERATE_DYNAMO_BACKEND="no-such-backend")
    assert p.returncode == 1, p.stderr[-2000:]
    assert "opct: error: accelerate could not set up this run" in p.stderr and "DynamoBackend" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_launch_with_its_own_mixed_precision_is_refused_unless_bf16_is_asked_for(tmp_path, precision):
    """`accelerate launch --mixed_precision` (or an accelerate config file) would put accelerate's autocast on the
    forward at prepare without the run recording it; fp16 would add a loss scaler opct does not checkpoint."""
    p = _train(tmp_path, deepspeed=False, ACCELERATE_MIXED_PRECISION=precision)
    assert p.returncode == 1, p.stderr[-2000:]
    assert f"opct: error: accelerate launched this run with mixed precision {precision}" in p.stderr
    assert ("pass --bf16" in p.stderr) == (precision == "bf16") and "Traceback" not in p.stderr
    assert not (tmp_path / "run").exists()


def test_a_bf16_launch_trains_when_the_run_asks_for_bf16(tmp_path):
    p = _train(tmp_path, deepspeed=False, ACCELERATE_MIXED_PRECISION="bf16", extra=["--bf16"])
    assert p.returncode == 0, p.stderr[-2000:]
    assert '"bf16": true' in (tmp_path / "run" / "config.json").read_text()


@pytest.mark.parametrize("env, says", [
    ({"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"}, "accelerate was set to accumulate gradients over 4 steps"),
    ({"ACCELERATE_DYNAMO_BACKEND": "inductor"}, "accelerate was set to compile the model (dynamo backend inductor"),
], ids=["grad-accum", "dynamo"])
def test_accelerates_own_accumulation_or_compilation_is_refused(tmp_path, env, says):
    """accelerator.backward divides every loss by accelerate's accumulation steps (opct accumulates itself, with
    --grad-accum); a dynamo backend makes prepare torch.compile the model (it stopped inside inductor on the CPU)."""
    p = _train(tmp_path, deepspeed=False, **env)
    assert p.returncode == 1, p.stderr[-2000:]
    assert f"opct: error: {says}" in p.stderr and "Traceback" not in p.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("content, says", [
    ('{"zero_optimization": {"stage": 2},\n "train_micro_batch_size_per_gpu": 2,\n}\n',
     "ds.json:3: DeepSpeed config (accelerate launch --deepspeed_config_file): not valid JSON: "),
    ("[2]\n", "ds.json:1: DeepSpeed config (accelerate launch --deepspeed_config_file): must be a JSON object"),
    (None, "ds.json: no such file; the DeepSpeed config (accelerate launch --deepspeed_config_file) must be a JSON"),
])
def test_a_bad_deepspeed_config_file_is_one_line_naming_it(tmp_path, content, says):
    """`accelerate launch --use_deepspeed --deepspeed_config_file FILE`: a missing or malformed FILE is named, with
    its line (accelerate's own error, until 2026-12-06, quoted the JSON parser and named no file)."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    ds = tmp_path / "ds.json"
    if content is not None:
        ds.write_text(content)
    p = _train(tmp_path, ACCELERATE_DEEPSPEED_CONFIG_FILE=str(ds), ACCELERATE_DEEPSPEED_ZERO_STAGE="2")
    assert p.returncode == 1, p.stderr[-2000:]
    assert f"opct: error: {tmp_path}/{says}" in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and not (tmp_path / "run").exists()


def test_a_launch_of_several_processes_that_accelerate_sees_as_one_is_refused(tmp_path):
    """`torchrun --nproc_per_node 2` on a machine without GPUs (no ACCELERATE_USE_CPU): accelerate set up no process
    group, so rank 0 trained alone (its checkpoint said world_size 1) and rank 1 stopped on the run's lock, "training
    run in use by another opct process". Every rank is refused, saying what to set, before anything trains."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"id": "a", "axis": "sycophancy", "task": "invariance", "teacher": [{"role": "user", "content": '
                     '"Is it?"}], "student": [{"role": "user", "content": "Is it? I think no."}], '
                     '"meta": {"family": "f", "split": "train"}}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_") and k not in ("LOCAL_RANK", "RANK",
                                                                                               "WORLD_SIZE")}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                        str(_free_port()), "-m", "opct.cli", "train", "--method", "bct", "--model", "test", "--pairs",
                        str(pairs), "--out", str(tmp_path / "run"), "--max-steps", "1", "--no-progress"],
                       env={**env, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode != 0
    says = ("opct: error: launched as 2 processes (WORLD_SIZE=2), but accelerate set up one: on a machine without "
            "GPUs set ACCELERATE_USE_CPU=1")
    assert p.stderr.count(says) == 2, p.stderr[-3000:]  # each rank, none past it
    assert "in use by another opct process" not in p.stderr and not (tmp_path / "run" / "checkpoints").exists()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
