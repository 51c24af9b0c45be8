"""``meshplan export --launch FILE``: a bash launch script per target that bash parses and
that, run with a stand-in ``torchrun`` on PATH (which prints what it was given), starts the
target with the plan's nodes, GPUs, rendezvous, environment and the exported file."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from meshplan.errors import MeshplanError
from meshplan.frameworks.launch_script import nodes_and_gpus
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from tests import _frameworks_real as real
from tests._cli import one_line_error, run_main

FAKE_TORCHRUN = """#!/usr/bin/env bash
echo "CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS-unset}"
echo "PYTORCH_ALLOC_CONF=${PYTORCH_ALLOC_CONF-unset}"
printf '%s\\n' "$@"
"""


def _export(capsys, tmp_path: Path, plan: Plan, target: str, output: str) -> tuple[Path, Path]:
    p = plan.save(tmp_path / "plan.json")
    out, script = tmp_path / "job" / output, tmp_path / "job" / "launch.sh"
    rc, _, err = run_main(capsys, "export", str(p), "--to", target, "-o", str(out), "--launch", str(script))
    assert rc == 0, err
    assert f"wrote {script} (torchrun launch script of {target}" in err
    assert os.access(script, os.X_OK)
    subprocess.run(["bash", "-n", str(script)], check=True)  # bash parses it
    return out, script


def _run(tmp_path: Path, script: Path, *args: str, env: dict[str, str] | None = None) -> list[str]:
    """What the stand-in torchrun received: two environment lines, then its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "torchrun").write_text(FAKE_TORCHRUN)
    (bin_dir / "torchrun").chmod(0o755)
    base = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(script), *args], env={**base, **(env or {})}, check=True,
                          capture_output=True, text=True)
    return done.stdout.splitlines()


def _torchrun(nodes: int, gpus: int) -> list[str]:
    return ["--nnodes", str(nodes), "--nproc-per-node", str(gpus), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "127.0.0.1:29500", "--rdzv-id", "meshplan"]


def test_megatron_launch_runs_the_exported_arguments(capsys, tmp_path):
    """tp 4 pp 2 ZeRO-1 on 4 x dgx-h100 = 32 ranks, 4 nodes x 8: pretrain_gpt.py with every
    exported argument (quoting kept), then the user's, and CUDA_DEVICE_MAX_CONNECTIONS=1."""
    plan = Plan(model="mixtral-8x7b", cluster="dgx-h100", nodes=4, strategy=Strategy(
        dp=4, tp=4, pp=2, ep=4, global_batch_size=64, zero=1, sequence_parallel=True))
    out, script = _export(capsys, tmp_path, plan, "megatron", "args.txt")
    got = _run(tmp_path, script, "--hidden-size", "4096", env={"MEGATRON_LM": "/opt/Megatron-LM"})
    assert got[:2] == ["CUDA_DEVICE_MAX_CONNECTIONS=1", "PYTORCH_ALLOC_CONF=unset"]
    assert got[2:] == (_torchrun(4, 8) + ["/opt/Megatron-LM/pretrain_gpt.py"]
                       + real.export_argv(out.read_text()) + ["--hidden-size", "4096"])
    text = script.read_text()
    assert "layers.py lines 909-921 at d98e8a64" in text and "srun --nodes 4 --ntasks-per-node 1" in text


def test_megatron_fsdp_launch_unsets_max_connections(capsys, tmp_path):
    """Issue 39's plan (ZeRO-2: Megatron-FSDP): the variable is unset, even when the shell
    had it at 1 (validate_args asserts it is not 1)."""
    plan = Plan(model="llama2-70b", cluster="dgx-h100", nodes=8, strategy=Strategy(
        dp=4, tp=4, pp=4, global_batch_size=512, zero=2, sequence_parallel=True))
    out, script = _export(capsys, tmp_path, plan, "megatron", "args.txt")
    got = _run(tmp_path, script, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1", "MASTER_ADDR": "node0"})
    assert got[0] == "CUDA_DEVICE_MAX_CONNECTIONS=unset"
    assert got[2:8] == ["--nnodes", "8", "--nproc-per-node", "8", "--rdzv-backend", "c10d"]
    assert got[8:10] == ["--rdzv-endpoint", "node0:29500"]
    assert "--ckpt-format" in got and got[got.index("--ckpt-format") + 1] == "fsdp_dtensor"


def test_torchtitan_launch(capsys, tmp_path):
    """dp 4 on one dgx-h100: one node of 4 processes, torchtitan.train on the TOML."""
    plan = Plan(model="llama2-7b", cluster="dgx-h100", nodes=1, strategy=Strategy(
        dp=4, global_batch_size=16, zero=3, framework="fsdp2"))
    out, script = _export(capsys, tmp_path, plan, "torchtitan", "job.toml")
    got = _run(tmp_path, script)
    assert got[:2] == ["CUDA_DEVICE_MAX_CONNECTIONS=unset", "PYTORCH_ALLOC_CONF=expandable_segments:True"]
    assert got[2:] == _torchrun(1, 4) + ["-m", "torchtitan.train", "--job.config_file", str(out)]


def test_deepspeed_launch(capsys, tmp_path):
    plan = Plan(model="llama2-7b", cluster="dgx-h100", nodes=2, strategy=Strategy(
        dp=8, tp=2, global_batch_size=64, zero=2, framework="deepspeed"))
    out, script = _export(capsys, tmp_path, plan, "deepspeed", "ds.json")
    got = _run(tmp_path, script, env={"TRAIN_SCRIPT": "my_train.py"})
    assert got[2:] == _torchrun(2, 8) + ["my_train.py", "--deepspeed", "--deepspeed_config", str(out)]


def test_launch_needs_the_exported_file(capsys, tmp_path):
    p = Plan(model="llama2-7b", cluster="dgx-h100", nodes=1,
             strategy=Strategy(dp=8, global_batch_size=64)).save(tmp_path / "plan.json")
    line = one_line_error(*run_main(capsys, "export", str(p), "--to", "megatron", "--launch",
                                    str(tmp_path / "run.sh")))
    assert line == "error: export --launch: give --output too (the launch script runs the exported file)"
    line = one_line_error(*run_main(capsys, "export", str(p), "--to", "megatron", "-o", str(tmp_path / "a.txt"),
                                    "--launch", str(tmp_path / "run.txt")))
    assert "--launch" in line and ".sh" in line


def test_nodes_and_gpus():
    assert nodes_and_gpus(64, 8) == (8, 8) and nodes_and_gpus(4, 8) == (1, 4)
    with pytest.raises(MeshplanError, match="12 ranks do not fill nodes of 8 GPUs"):
        nodes_and_gpus(12, 8)
