"""torchrun launch (issue 19 items 1-2): two torchrun agents on this machine (``--nnodes 2
--nproc-per-node 2``, c10d rendezvous on 127.0.0.1) run dp2 x mp2 and pp2 x dp2 plans of a
2-layer LLaMA-style model with gloo and pass ``--verify``; a measured run writes the
report and the CSV row on rank 0; killing one agent and its ranks mid-run ends the other
with the dead ranks named within bounded time."""

from __future__ import annotations

import csv
import dataclasses
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executor.launch import free_port
from meshplan.cli import main
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from tests._cli import one_line_error

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
LLAMA = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
         "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1000,
         "max_position_embeddings": 64, "num_hidden_layers": 2}
#: seconds one run of two agents may take on a loaded 2-core machine
RUN_TIMEOUT = 120


def _plan(tmp_path: Path, name: str, **kw) -> Path:
    cfg = tmp_path / "llama2.json"
    cfg.write_text(json.dumps(LLAMA))
    s = Strategy(dtype="float32", optimizer="sgd", micro_batch_size=1, global_batch_size=4, **kw)
    # two nodes of the cpu-local cluster hold the 4 ranks the prediction costs
    return Plan(str(cfg), "cpu-local", s, seq_len=64, nodes=2).save(tmp_path / f"{name}.json")


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the first agent never listened on {port}: {proc.communicate()[0][-2000:]}")


def _agents(plan: Path, *args: str) -> list[subprocess.Popen]:
    """Two torchrun agents of 2 processes each; the first hosts the c10d rendezvous (it is
    started, and listening, before the second)."""
    port = free_port()
    cmd = [*TORCHRUN, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"test{port}",
           "-m", "meshplan.executor.run", str(plan), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    kw = dict(cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    first = subprocess.Popen(cmd, **kw)
    _wait_listening(port, first)
    return [first, subprocess.Popen(cmd, **kw)]


def _finish(agents: list[subprocess.Popen], timeout: float = RUN_TIMEOUT) -> list[tuple[int, str]]:
    out = []
    for a in agents:
        try:
            text, _ = a.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            a.kill()
            text = a.communicate()[0] + "\n<timed out>"
        out.append((a.returncode, text))
    return out


@pytest.mark.distributed
@pytest.mark.parametrize("name, kw", [("dp2_mp2", {"dp": 2, "tp": 2}), ("pp2_dp2", {"dp": 2, "pp": 2})])
def test_two_agents_verify(tmp_path, name, kw):
    """Losses and every parameter after 2 steps match one process within 1e-5."""
    plan = _plan(tmp_path, name, **kw)
    results = _finish(_agents(plan, "--verify", "--json"))
    for rc, text in results:
        assert rc == 0, text[-3000:]
    docs = [json.loads(ln) for _, text in results for ln in text.splitlines() if ln.startswith("{")]
    assert len(docs) == 1  # rank 0 alone reports
    doc = docs[0]
    assert doc["ok"] and doc["nproc"] == 4 and doc["loss_error"] <= 1e-5
    assert len(doc["losses"]) == 2 and doc["losses"][1] < doc["losses"][0]  # SGD descends


@pytest.mark.slow
@pytest.mark.distributed
def test_two_agents_measure_and_write_the_report_and_csv(tmp_path):
    plan = _plan(tmp_path, "pp2_dp2", dp=2, pp=2)
    out_csv = tmp_path / "v.csv"
    traces = tmp_path / "traces"
    results = _finish(_agents(plan, "--steps", "2", "--warmup", "1", "--csv", str(out_csv),
                              "--profile-trace", str(traces)))
    for rc, text in results:
        assert rc == 0, text[-3000:]
    # --profile-trace: every rank's trace of one extra step, its named spans all ops of the plan
    from executor.trace_calibrate import load_trace
    from executor.trace_match import match_trace, plan_labels

    for r in range(4):
        meta = json.loads((traces / f"rank{r}.json").read_text())["meshplan"]
        assert meta["rank"] == r and len(meta["step_times_s"]) == 2 and meta["world_size"] == 4
        run = Plan.load(plan)
        run = dataclasses.replace(run, strategy=run.strategy.replace(layers_per_stage=tuple(meta["layers_per_stage"])))
        samples = match_trace(load_trace(traces / f"rank{r}.json"), plan_labels(run, r))
        assert sum(s.kind == "gemm" for s in samples) > 0
    report = "".join(text for _, text in results)
    assert report.count("step time (ms)") == 1 and "stage 1 T_F (ms)" in report
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 1 and (rows[0]["dp"], rows[0]["pp"], rows[0]["nproc"]) == ("2", "2", "4")
    assert float(rows[0]["measured_step_time_ms"]) > 0 and float(rows[0]["predicted_step_time_ms"]) > 0


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.distributed
@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs /proc to find an agent's ranks")
def test_a_killed_agent_ends_the_other_with_its_ranks_named(tmp_path):
    """SIGKILL the second agent and its two ranks (a lost node) once every rank is past its
    first step; the first agent's ranks name the dead ranks (beats stopped, or rank 0's
    store gone when it was among them) and the agent exits non-zero within 30 s."""
    plan = _plan(tmp_path, "pp2_dp2", dp=2, pp=2)
    prog = tmp_path / "progress"
    agents = _agents(plan, "--steps", "10000", "--heartbeat", "0.5", "--dead-after", "5",
                     "--progress-dir", str(prog), "--csv", str(tmp_path / "v.csv"))
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        docs: list[dict] = []
        while time.monotonic() < deadline and not (len(docs) == 4 and all(d["step"] >= 1 for d in docs)):
            time.sleep(0.2)
            docs = []
            for f in glob.glob(str(prog / "rank*.json")):
                try:
                    docs.append(json.loads(Path(f).read_text()))
                except (OSError, json.JSONDecodeError):
                    pass
        assert len(docs) == 4, "the ranks never started their steps"
        victim = agents[1]
        killed = sorted(d["rank"] for d in docs if _parent(d["pid"]) == victim.pid)
        assert len(killed) == 2
        t0 = time.monotonic()
        victim.kill()
        for d in docs:
            if d["rank"] in killed:
                os.kill(d["pid"], signal.SIGKILL)
        (rc, text), _ = _finish(agents, timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
    assert rc not in (0, None) and elapsed < 30, (rc, elapsed, text[-3000:])
    errors = [ln for ln in text.splitlines() if ln.startswith("error: rank")]
    assert errors, text[-3000:]
    if 0 in killed:
        assert any("rank 0 is unreachable" in ln for ln in errors), errors
    else:
        assert any(f"ranks {killed} stopped reporting" in ln or
                   any(f"rank {r} stopped reporting" in ln for r in killed) for ln in errors), errors


def test_outside_torchrun_the_entry_point_says_so(tmp_path):
    plan = _plan(tmp_path, "dp2", dp=2)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                             "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-m", "meshplan.executor.run", str(plan)], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert "not set: start this under torchrun" in proc.stderr and "Traceback" not in proc.stderr


def test_validate_prints_the_torchrun_command(tmp_path, capsys):
    plan = _plan(tmp_path, "pp2_dp2", dp=2, pp=2)
    assert main(["validate", str(plan), "--launcher", "torchrun", "--nnodes", "2", "--steps", "5"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "
        f"HEAD_NODE:29500 --rdzv-id meshplan -m meshplan.executor.run {plan} --steps 5")
    line = one_line_error(main(["validate", str(plan), "--launcher", "torchrun", "--nnodes", "3"]),
                          *capsys.readouterr())
    assert "--nnodes 3 must divide the plan's 4 ranks" in line
    line = one_line_error(main(["validate", str(plan), "--launcher", "slurm"]), *capsys.readouterr())
    assert "--launcher must be one of ['local', 'torchrun']" in line


def test_the_torchrun_command_carries_validates_options_quoted(tmp_path, capsys):
    """A bad-input hunt: the printed command dropped --cluster, --backend, --csv, --json and
    --profile-trace (all options of meshplan.executor.run), ignored --nproc and did not
    quote a path with a space or a $(...) in it."""
    import shlex

    odd = tmp_path / "my dir"
    odd.mkdir()
    plan = _plan(odd, "p$(id)", dp=2)
    assert main(["validate", str(plan), "--launcher", "torchrun", "--cluster", "dgx-h100",
                 "--backend", "nccl", "--csv", "x.csv", "--json", "--profile-trace", "tr/"]) == 0
    argv = shlex.split(capsys.readouterr().out.strip())
    at = argv.index("meshplan.executor.run") + 1
    assert argv[at] == str(plan)
    assert argv[at + 1:] == ["--steps", "10", "--cluster", "dgx-h100", "--backend", "nccl",
                             "--csv", "x.csv", "--json", "--profile-trace", "tr/"]
    line = one_line_error(main(["validate", str(plan), "--launcher", "torchrun", "--nproc", "3"]),
                          *capsys.readouterr())
    assert line.startswith("error: --nproc 3: the plan runs dp*tp*pp*cp = 2 ranks")


@pytest.mark.distributed
def test_a_bad_plan_under_torchrun_is_one_error_and_exit_2(tmp_path):
    """Rank 0 reads the plan; a world size that does not match WORLD_SIZE is refused on
    every rank before any step, printed once by rank 0."""
    plan = _plan(tmp_path, "dp2", dp=2)
    proc = subprocess.run([*TORCHRUN, "--nnodes", "1", "--nproc-per-node", "1",
                           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                           "-m", "meshplan.executor.run", str(plan)], cwd=ROOT,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert proc.returncode != 0
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("error:")]
    assert errors == ["error: plan needs dp*tp*pp = 2*1*1 = 2 ranks but WORLD_SIZE is 1"], errors


@pytest.mark.distributed
def test_a_hung_rank_is_named_as_the_one_that_hangs(tmp_path):
    """Rank 1 sleeps before its second step (tests/_torchrun_hang.py) while rank 0 waits for
    it; after --hang-after 6 s rank 0 names rank 1 as hanging in that sleep, not itself."""
    plan = _plan(tmp_path, "dp2", dp=2)
    env = {**os.environ, "HANG_RANK": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.monotonic()
    proc = subprocess.run([*TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2",
                           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                           "-m", "tests._torchrun_hang", str(plan), "--steps", "5", "--warmup", "0",
                           "--heartbeat", "0.5", "--hang-after", "6", "--dead-after", "30",
                           "--csv", str(tmp_path / "v.csv")],
                          cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env)
    assert proc.returncode != 0
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("error: rank")]
    assert errors, (proc.stdout + proc.stderr)[-3000:]
    assert any(" rank 1 hangs at step 0 " in ln and "stuck_forever" in ln and
               "ranks [0] wait for it" in ln for ln in errors), errors
    assert time.monotonic() - t0 < RUN_TIMEOUT


def test_which_errors_wait_for_the_watchdogs_verdict():
    """A broken collective (gloo's plain RuntimeError, DistError) may be a peer's death,
    named by the watchdog; the executor's own errors are reported at once."""
    import torch.distributed as dist

    from executor.rank_exec import ExecError
    from meshplan.executor.run import broken_collective

    assert broken_collective(RuntimeError("Connection reset by peer"))
    assert broken_collective(dist.DistBackendError("nccl"))
    assert not broken_collective(ExecError("op 3 failed"))
    assert not broken_collective(ValueError("bad"))
