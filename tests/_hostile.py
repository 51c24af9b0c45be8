"""Generated hostile inputs, one generator per fault kind the issue-43 hunt found (issue
43, item 7). Each ``make(rng, folder)`` writes what it needs under ``folder`` and returns a
:class:`Case`: the ``meshplan`` command line and what must happen (``refused``: one
``error:`` line, exit 2, no traceback, the files named in ``untouched`` unchanged).
Shared by tests/meshplan/test_fuzz_slice.py (a few per kind) and benchmarks/fuzz_entry_points.py
(the recorded run of 1,000+ inputs)."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PIR = ROOT.parent / "shared" / "data" / "programs" / "mlp_sgd_no_dist_attrs.pir"
CLUSTER_YAML = ROOT / "clusters" / "catalog" / "dgx-h100.yaml"
COST = ["cost", "-m", "llama2-7b", "--cluster", "dgx-h100", "--global-batch", "8", "--layers", "2"]
SIM = ["simulate", "--schedule", "1F1B", "--stages", "2", "--microbatches", "4", "--tf", "1", "--tb", "1"]
TUNE = ["tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
        "--global-batch-size", "32", "--seq-len", "4096", "--layers", "4", "--no-progress",
        "--trials", "2", "--storage", "memory"]


@dataclass
class Case:
    """One hostile input: ``argv`` (a meshplan command line), the answer it must get, and
    files whose bytes must not change."""

    kind: str
    argv: list[str]
    expect: str = "refused"
    untouched: list[Path] = field(default_factory=list)
    needle: str = ""  # a word the error line must carry ("" : any)


def _repeated(rng: random.Random, d: Path) -> Case:
    base, opts = rng.choice([
        (COST, [("--dp", ["1", "2", "4", "8"]), ("--tp", ["1", "2"]), ("--zero", ["0", "1"]),
                ("--seq-len", ["1024", "2048"]), ("-m", ["llama2-7b", "llama2-13b"])]),
        (SIM, [("--tf", ["1", "2", "3"]), ("--tcomm", ["0", "0.5"])]),
        (TUNE, [("--seed", ["1", "2", "3"]), ("--trials", ["2", "3"])]),
        (["clusters", "show", "dgx-h100"], [("--nodes", ["1", "2", "4"])]),
        (["calibrate", "-o", str(d / "c.yaml")], [("--nproc", ["2", "3"])]),
    ])
    flag, values = rng.choice(opts)
    a, b = rng.sample(values, 2)
    return Case("repeated_option", [*base, flag, a, flag, b], needle="twice")


_YAML_11 = ["1:30", "-2:00", "1:30:00", "yes", "no", "on", "off", "Yes", "OFF", "010", "0b101",
            "1_000", "1_0.5", "2024-01-02", "0o17_0"]


def _yaml11(rng: random.Random, d: Path) -> Case:
    doc = yaml.safe_load(CLUSTER_YAML.read_text())
    section, key = rng.choice([("cluster", "num_nodes"), ("node", "devices_per_node"),
                               ("node", "intra_bandwidth"), ("device", "memory_bytes"),
                               ("node", "nic_count")])
    doc[section][key]["value"] = "@@"
    p = d / f"c{rng.randrange(10**6)}.yaml"
    p.write_text(yaml.safe_dump(doc).replace("'@@'", rng.choice(_YAML_11)))
    return Case("yaml_1_1_scalar", ["clusters", "validate", str(p)], needle="YAML")


def _deep(rng: random.Random, d: Path) -> Case:
    n = rng.randint(33, 2500)
    kind = rng.choice(["deepspeed", "hf", "plan", "toml", "pir"])
    obj = '{"a": ' * n + "1" + "}" * n if rng.random() < 0.5 else "[" * n + "1" + "]" * n
    if kind == "deepspeed":
        (p := d / "ds.json").write_text(obj)
        argv = ["cost", "--deepspeed-config", str(p), "-m", "llama2-7b", "--cluster", "dgx-h100"]
    elif kind == "hf":
        (p := d / "config.json").write_text(obj)
        argv = ["cost", "-m", str(p), "--cluster", "dgx-h100", "--global-batch", "8"]
    elif kind == "plan":
        (p := d / "plan.json").write_text(obj)
        argv = ["cost", str(p)]
    elif kind == "toml":
        inner = "[" * n + "1" + "]" * n if rng.random() < 0.5 else "{a=" * n + "1" + "}" * n
        (p := d / "job.toml").write_text(f"[training]\nx = {inner}\n")
        argv = ["cost", "--torchtitan-config", str(p), "-m", "llama2-7b", "--cluster", "dgx-h100"]
    else:
        inner = "[" * n + "1" + "]" * n if rng.random() < 0.5 else "{a:" * n + "1" + "}" * n
        (p := d / "deep.pir").write_text(PIR.read_text().replace("need_clip:[true]", f"need_clip:{inner}", 1))
        argv = ["program", "show", "-m", str(p)]
    return Case(f"deep_nesting_{kind}", argv, needle="nested")


def _storage(rng: random.Random, d: Path) -> Case:
    kind = rng.choice(["/dev/full", "/dev/zero", "/dev/null", "dir", "fifo", "foreign", "empty"])
    untouched = []
    if kind == "dir":
        path = str(d)
    elif kind == "fifo":
        path = str(d / f"pipe{rng.randrange(10**6)}")
        os.mkfifo(path)
    elif kind == "foreign":
        p = d / f"notes{rng.randrange(10**6)}.txt"
        p.write_bytes(bytes(rng.randrange(32, 127) for _ in range(rng.randint(1, 200))) or b"x")
        path, untouched = str(p), [p]
    elif kind == "empty":
        path = ""
    else:
        path = kind
    argv = [*TUNE[:-2], "--storage", path, "--output", str(d / "out")]
    return Case(f"storage_{'device' if kind.startswith('/dev') else kind}", argv, untouched=untouched)


_OUTPUTS = [(COST, "--trace", ".json"), (COST, "--plot", ".png"), (COST, "--memory-png", ".png"),
            (SIM, "--trace", ".json"), (SIM, "--plot", ".svg"),
            (["export", "--to", "deepspeed", *COST[1:], "--dp", "8"], "-o", ".json"),
            (["export", "--to", "torchtitan", *COST[1:], "--dp", "8"], "-o", ".toml"),
            (["calibrate", "--quick"], "-o", ".yaml")]


def _existing(rng: random.Random, d: Path) -> Case:
    base, flag, suffix = rng.choice(_OUTPUTS)
    p = d / f"out{rng.randrange(10**6)}{suffix}"
    p.write_bytes(os.urandom(rng.randint(1, 64)))
    return Case("existing_output", [*base, flag, str(p)], untouched=[p], needle="exists")


def _suffix(rng: random.Random, d: Path) -> Case:
    base, flag, suffix = rng.choice(_OUTPUTS)
    wrong = rng.choice([s for s in (".txt", ".csv", ".json", ".png", ".yaml", ".toml", "") if s != suffix
                        and not (flag in ("--plot", "--memory-png") and s == ".png")])
    return Case("output_suffix", [*base, flag, str(d / f"x{rng.randrange(10**6)}{wrong}")], needle="must end in")


def _torchtitan_section(rng: random.Random, d: Path) -> Case:
    name = rng.choice(["paralelism", "trainig", "bogus", "parallel", "float16", "optim", "fsdp"])
    p = d / "job.toml"
    p.write_text(f"[{name}]\nx = 1\n[parallelism]\ndata_parallel_shard_degree = 8\n[training]\n"
                 f"local_batch_size = 1\nseq_len = 2048\n[activation_checkpoint]\nmode = \"none\"\n")
    return Case("torchtitan_unknown_section",
                ["cost", "--torchtitan-config", str(p), "-m", "llama2-7b", "--cluster", "dgx-h100",
                 "--layers", "2"], needle="not a section")


def _deepspeed_null(rng: random.Random, d: Path) -> Case:
    section, key = rng.choice([("zero_optimization", "stage"), ("zero_optimization", "zero_hpz_partition_size"),
                               ("tensor_parallel", "autotp_size")])
    p = d / "ds.json"
    p.write_text(json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
                             "bf16": {"enabled": True}, section: {key: None}}))
    return Case("deepspeed_null", ["cost", "--deepspeed-config", str(p), "-m", "llama2-7b",
                                   "--cluster", "dgx-h100", "--layers", "2"], needle="null")


def _positions(rng: random.Random, d: Path) -> Case:
    seq = rng.choice([2050, 3000, 4096, 8192, 100000])
    return Case("seq_past_learned_positions", ["cost", "-m", "gpt3-175b", "--cluster", "dgx-h100", "--dp", "8",
                                               "--global-batch", "8", "--layers", "2", "--seq-len", str(seq)],
                needle="position table")


def _process_id(rng: random.Random, d: Path) -> Case:
    big = rng.randint(2**20, 10**15)
    text = (PIR.parent / "mlp_sgd_after_partition.pir").read_text().replace("process_ids:[0,1]",
                                                                             f"process_ids:[0,{big}]")
    (p := d / "big.pir").write_text(text)
    return Case("pir_process_id", ["complete", "-p", str(p)], needle="process id")


def _plan_doc(d: Path, tp: int, annotations: dict) -> Path:
    doc = {"version": 2, "model": "llama2-7b", "cluster": "dgx-h100", "nodes": 1, "num_layers": 2,
           "seq_len": 2048, "strategy": {"dp": 8 // tp if 8 % tp == 0 else 2, "tp": tp, "global_batch_size": 8},
           "annotations": annotations}
    p = d / f"plan{tp}_{len(annotations)}.json"
    p.write_text(json.dumps(doc))
    return p


def _partial_param(rng: random.Random, d: Path) -> Case:
    w = rng.choice(["decoder.layers.0.mlp.up_proj.weight", "decoder.layers.0.self_attn.q_proj.weight",
                    "embed_tokens.weight", "lm_head.weight"])
    op = rng.choice(["sum", "avg", "max", "min"])
    p = _plan_doc(d, 2, {w: ["Replicate()", f"Partial(reduce_op='{op}')"]})
    return Case("partial_parameter", ["cost", str(p)], needle="Partial")


def _tp_heads(rng: random.Random, d: Path) -> Case:
    tp = rng.choice([3, 5, 6, 7])
    p = _plan_doc(d, tp, {"decoder.layers.0.mlp.up_proj.weight": ["Replicate()", "Shard(dim=1)"]})
    return Case("tp_not_dividing_heads", ["cost", str(p), "--nodes", "1"], needle="")


def _unused(rng: random.Random, d: Path) -> Case:
    argv, needle = rng.choice([
        ([*TUNE, "--vpp", str(rng.randint(2, 4)), "--pp", "1"], "needs pp > 1"),
        ([*TUNE, "--fix", rng.choice(["", ",", "tp=2,", ",pp=2"])], "empty item"),
        ([*TUNE, "--objective", rng.choice(["cost", "time"])], "--objective"),
        (["calibrate", "-o", str(d / "c.yaml"), "--plan", "p.json"], "--from-trace"),
        ([*COST, "--dp", "8", "--schedule", rng.choice(["VPP", "ZBH1", "FThenB", "ZB"])], "pp 1"),
        (["complete", "-m", "llama2-7b", "--layers", "1", "--seq-len", "64", "--batch-size",
          str(rng.choice([3, 5, 7])), "--dp", "2"], "not a multiple"),
    ])
    return Case("option_without_effect", argv, needle=needle)


def _processes(rng: random.Random, d: Path) -> Case:
    from meshplan.resources import process_limit

    n = rng.randint(process_limit() + 1, 64)
    argv = rng.choice([["calibrate", "--quick", "--nproc", str(n), "-o", str(d / "c.yaml")],
                       [*TUNE[:-2], "--workers", str(n), "--output", str(d / "w")]])
    return Case("processes_beyond_cores", argv, needle="core")


def _fp8_peak(rng: random.Random, d: Path) -> Case:
    doc = yaml.safe_load(CLUSTER_YAML.read_text())
    bf16 = doc["device"]["peak_flops"]["bf16"]["value"]
    doc["device"]["peak_flops"]["fp8"]["value"] = float(f"{bf16 * rng.uniform(0.01, 0.99):.4e}")
    (p := d / "lowfp8.yaml").write_text(yaml.safe_dump(doc))
    return Case("fp8_peak_below_bf16", ["clusters", "validate", str(p)], needle="fp8 peak")


#: fault kind -> generator
KINDS: dict[str, Callable[[random.Random, Path], Case]] = {
    "repeated_option": _repeated, "yaml_1_1_scalar": _yaml11, "deep_nesting": _deep,
    "storage_path": _storage, "existing_output": _existing, "output_suffix": _suffix,
    "torchtitan_unknown_section": _torchtitan_section, "deepspeed_null": _deepspeed_null,
    "seq_past_learned_positions": _positions, "pir_process_id": _process_id,
    "partial_parameter": _partial_param, "tp_not_dividing_heads": _tp_heads,
    "option_without_effect": _unused, "processes_beyond_cores": _processes,
    "fp8_peak_below_bf16": _fp8_peak,
}


def check(case: Case, rc: int, out: str, err: str, before: dict[Path, bytes]) -> str | None:
    """None when ``case`` got the answer it must; else what went wrong: ``traceback``,
    ``silent`` (accepted an input it must refuse), ``changed`` (a file it must not touch),
    or ``message`` (refused, but not in one line naming the fault)."""
    if "Traceback" in out + err or rc not in (0, 1, 2):
        return "traceback"
    if case.expect == "refused" and rc == 0:
        return "silent"
    for p, b in before.items():
        if not p.exists() or p.read_bytes() != b:
            return "changed"
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("error: ")]
    if rc != 2 or len(lines) != 1 or (case.needle and case.needle.lower() not in lines[0].lower()):
        return "message"
    return None
