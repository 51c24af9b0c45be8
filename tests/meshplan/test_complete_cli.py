"""``meshplan complete``: a built model with the Megatron layout and pipeline stages, a PIR
file, and clear errors."""

from __future__ import annotations

import pytest

from completion.pir import parse_program
from meshplan.cli import main


def test_complete_model_megatron_with_vpp(capsys):
    rc = main(["complete", "--model", "llama2-7b", "--layers", "4", "--seq-len", "32",
               "--mesh", "dp=2,tp=2,pp=2", "--megatron", "--vpp", "2", "--schedule", "VPP"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "// per-op summary" in out
    # the program text parses back, stage 1 runs on ranks 4..7
    text = out[: out.index("}\n") + 2]
    p = parse_program(text)
    assert {op.dist_attr.process_mesh.process_ids for op in p.ops} == {(0, 1, 2, 3), (4, 5, 6, 7)}
    assert "pd_op.matmul [decoder.layers.3.mlp.down_proj] stage 1/chunk 1: (S(0),S(2)) (R,S(0)) -> (S(0),P(sum))" in out


def test_complete_pir_file_data_parallel(capsys, shared_dir):
    f = shared_dir / "data/programs/mlp_sgd_no_dist_attrs.pir"
    rc = main(["complete", "--program", str(f), "--mesh", "dp=2", "--summary-only"])
    out = capsys.readouterr().out
    assert rc == 0
    # batch on dp: the weight gradients are Partial(sum) and the sgd_ ops need them reduced
    assert "pd_op.matmul_grad [] stage 0/chunk 0: (S(0)) (R) (S(0)) -> (S(0)) (P(sum))" in out
    assert "pd_op.sgd_ [] stage 0/chunk 0: (R) (R) (R)* null -> (R) null" in out
    assert "// operands needing a reshard: 3" in out


def test_complete_errors(capsys):
    assert main(["complete", "--model", "llama2-7b", "--mesh", "dp=x"]) == 2
    assert "--mesh entry 'dp=x'" in capsys.readouterr().err
    assert main(["complete", "--mesh", "dp=2"]) == 2
    assert "exactly one of --program" in capsys.readouterr().err
    rc = main(["complete", "--model", "llama2-7b", "--layers", "10", "--seq-len", "16",
               "--mesh", "dp=1,tp=2,pp=4", "--megatron", "--vpp", "2", "--schedule", "VPP"])
    err = capsys.readouterr().err
    assert rc == 2 and "10 layers" in err and "= 8 segments" in err


def test_annotate_option_reproduces_the_seed_golden(capsys, shared_dir):
    """The seed completion golden from the command line: the program without dist attrs,
    the two parameters annotated (parameter_0 column split, parameter_1 row split), gives
    back mlp_sgd_before_partition.pir line for line."""
    bare = shared_dir / "data/programs/mlp_sgd_no_dist_attrs.pir"
    want = (shared_dir / "data/programs/mlp_sgd_before_partition.pir").read_text().splitlines()
    rc = main(["complete", "--program", str(bare), "--mesh", "d0=2",
               "-a", "parameter_0=-1,0", "--annotate", "parameter_1=[0,-1]"])
    assert rc == 0
    got = capsys.readouterr().out.splitlines()
    assert [g.rstrip() for g in got[: len(want)]] == [w.rstrip() for w in want]
    assert main(["complete", "--program", str(bare), "--mesh", "d0=2", "-a", "parameter_0"]) == 2
    assert "NAME=DIMS_MAPPING" in capsys.readouterr().err


@pytest.mark.parametrize("extra, what", [
    (["--dp", "2", "--tp", "3"], "'tp' = 3 does not divide model 'llama2-7b' num_heads = 32"),
    (["--tp", "2", "--sequence-parallel", "-s", "63"], "seq_len 63 is not divisible by tp = 2"),
])
def test_megatron_layout_that_cost_refuses_is_refused(capsys, extra, what):
    """Found by a bad-input hunt: ``complete --megatron`` split 32 heads over tp 3 (each
    rank a non-whole head) where ``cost`` refuses; both now run
    ``check_tensor_parallel``. (Uneven shards of a program's own annotations stay legal:
    DTensor's ceil-sized chunks, completion.dist_attr.)"""
    from meshplan.cli import main

    args = ["complete", "--model", "llama2-7b", "--layers", "1", "--megatron", "--summary-only", "-b", "4"]
    if "-s" not in extra:
        args += ["-s", "64"]
    assert main([*args, *extra]) == 2
    assert what in capsys.readouterr().err


def test_an_annotation_of_the_wrong_rank_names_the_value_once(capsys, shared_dir):
    pir = str(shared_dir / "data" / "programs" / "mlp_sgd_no_dist_attrs.pir")
    assert main(["complete", "--program", pir, "--mesh", "d0=2", "--annotate", "parameter_0=-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: annotate %2 (parameter_0): dims_mapping [-1] has 1 entries but the tensor "
                   "shape [16, 16] has rank 2")
