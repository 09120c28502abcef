"""``cpkv run-dist`` (spawns its ranks) and ``torchrun -m cpkv.executor``: max abs error, per-rank tokens,
and with ``--attention nsa`` the measured logits elements and the top-k agreement; with ``--kv-access
local --decode-steps N`` the decoded tokens and the communication accounting, also in torchrun's
two-"node" form."""

import json
import os
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner

import oracle
from cpkv.cli import main
from cpkv.executor.cli_entry import TOLERANCE, DistCommandResult, run_dist_cli

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

ARGS = [
    "--page-size",
    "16",
    "--prefix-len",
    "0",
    "--extend-len",
    "9",
    "--prefix-len",
    "21",
    "--extend-len",
    "40",
    "--chunks",
    "3",
    "--seed",
    "1",
]
NSA = ["--attention", "nsa", "--index-topk", "8", "--index-heads", "4"]


def check_nsa_json(out: dict) -> None:
    """Every forward: each rank's measured logits elements (both layers) == estimate == the oracle's;
    top-k rows agree with the reference (or differ only at near ties)."""
    assert out["attention"] == "nsa" and out["index_topk"] == 8 and out["ok"] is True
    C, P = out["cp_size"], out["page_size"]
    for f in out["forwards"]:
        want = oracle.mqa_logits_elements(
            f["prefix_lens"], f["extend_lens"], C, P, head_owners=f["head_owners"], phases=f["phases"]
        )
        assert f["logits_estimated"] == want
        assert f["logits_measured"] == [[e, e] for e in want]
        assert f["topk_mismatched"] == f["topk_near_tie"]
    assert out["logits_match"] is True
    assert out["topk_rows"] == 2 * sum(sum(f["extend_lens"]) for f in out["forwards"])


@pytest.mark.clause("C-NSA")
def test_run_dist_nsa_json_with_unequal_lanes():
    res = CliRunner().invoke(
        run_dist_cli, ["--cp-size", "2", "--json", "--pages-per-lane", "9,8", *NSA, *ARGS]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["ok"] is True and out["max_abs_err"] <= TOLERANCE == out["tolerance"]
    assert (out["cp_size"], out["page_size"], out["kv_mode"], out["kv_row_width"]) == (2, 16, "mla", 576)
    assert out["pages_per_lane"] == [9, 8]
    assert out["policy"] == os.environ.get("CPKV_OWNER_POLICY", "balanced")  # the default policy (C-PHASE)
    check_nsa_json(out)
    # Per-rank tokens add up to every token computed: wave 1 (21 + 9 + 40) and the reuse wave.
    fw = out["forwards"]
    assert sum(out["per_rank_tokens"]) == sum(sum(f["extend_lens"]) for f in fw)
    assert sum(sum(f["extend_lens"]) for f in fw[:4]) == 21 + 9 + 40
    assert all(len(f["per_rank_tokens"]) == 2 for f in fw)


def test_run_dist_command_text_and_bad_flags(capsys):
    res = CliRunner().invoke(
        run_dist_cli, ["--cp-size", "1", "--policy", "legacy", "--kv-mode", "mha", *ARGS]
    )
    assert res.exit_code == 0, res.output
    assert "max abs error vs single-process reference" in res.output and "OK" in res.output
    assert "per-rank tokens (all forwards): [" in res.output
    assert "attention=dense" in res.output and "logits" not in res.output
    bad = CliRunner().invoke(run_dist_cli, ["--cp-size", "2", "--prefix-len", "0"])
    assert isinstance(bad.exception, ValueError) and "one prefix_len per extend_len" in str(bad.exception)
    # Bad flags: one line on stderr, exit 2, before any rank starts.
    for argv, msg in [
        (["--pages-per-lane", "9,10"], "--pages-per-lane has 2 entries, cp_size=4 needs 4"),
        (["--pages-per-lane", "9,x"], "'9,x' is not an int or a comma-separated list of ints"),
        (["--attention", "nsa", "--kv-mode", "mha"], "needs kv_mode='mla', got kv_mode='mha'"),
        (["--attention", "nsa", "--index-topk", "0"], "index_topk must be >= 1, got 0"),
        (["--decode-steps", "-1"], "--decode-steps must be >= 0, got -1"),
    ]:
        assert main(["run-dist", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("cpkv: error: ") and msg in err, err


def test_pages_per_lane_one_says_page_zero_is_reserved(capsys):
    """Q=1 leaves lane 0 nothing to hand out: the one-line error says that page 0 is reserved."""
    assert main(["run-dist", "--cp-size", "1", "--pages-per-lane", "1", *ARGS]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lane 0 exhausted" in err
    assert "--pages-per-lane gives lane 0 1 page, 0 usable: page 0 is reserved for padding writes" in err


@pytest.mark.clause("C-NSA")
def test_torchrun_entry_nsa():
    """``torchrun -m cpkv.executor`` (run as ``python -m torch.distributed.run``, torchrun's module)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "cpkv.executor",
        "--json",
        "--no-reuse",
        *NSA,
        *ARGS,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert out["cp_size"] == 2 and out["ok"] is True
    assert sum(out["per_rank_tokens"]) == 21 + 9 + 40
    check_nsa_json(out)


LOCAL = ["--kv-access", "local", "--decode-steps", "2", "--no-reuse"]


def check_local_json(out: dict) -> None:
    """A local NSA run with decode: the result, the decoded tokens, the logits counts (local formula: their
    sum over the ranks is C-ESTIMATE's) and some exchange between ranks."""
    assert out["ok"] is True and out["kv_access"] == "local" and out["kv_buffer"] == "local"
    assert out["tokens_match"] is True and out["decode_steps"] == 2
    C, P = out["cp_size"], out["page_size"]
    for f in out["forwards"]:
        shared = oracle.mqa_logits_elements(
            f["prefix_lens"], f["extend_lens"], C, P, head_owners=f["head_owners"], phases=f["phases"]
        )
        assert sum(f["logits_estimated"]) == sum(shared)
        assert f["logits_measured"] == [[e, e] for e in f["logits_estimated"]]
    assert out["logits_match"] is True and out["topk_mismatched"] == out["topk_near_tie"]
    assert sorted(r for d in out["decodes"] for r in d["request_ids"]) == [0, 1]
    for d in out["decodes"]:
        assert d["tokens"] == d["reference_tokens"] and d["max_abs_err"] <= TOLERANCE
    total = out["comm_bytes"]
    assert sum(total["queries"]["sent"]) == sum(total["queries"]["recv"]) > 0
    assert sum(total["topk"]["sent"]) == sum(total["topk"]["recv"]) > 0


@pytest.mark.clause("C-MERGE")
def test_run_dist_local_decode_json_and_its_text(capsys):
    """``cpkv run-dist --kv-access local --decode-steps 2`` on 2 ranks; the text summary of the same result
    has the access mode, a communication line per forward and decode step, and the decoded tokens."""
    res = CliRunner().invoke(run_dist_cli, ["--cp-size", "2", "--json", *LOCAL, *NSA, *ARGS])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    check_local_json(out)
    text = DistCommandResult(**{k: v for k, v in out.items() if k not in ("ok", "tolerance")}).summary()
    assert "kv_access=local decode_steps=2" in text and "kv_buffer=local" in text
    assert "(local_logits_elements) for every rank and layer of all 4 forwards and decode steps" in text
    comm = text[text.index("communication, bytes sent per rank") :].splitlines()
    assert [" ".join(line.split()[:2]) for line in comm[1:6]] == [
        "fwd 0",
        "fwd 1",
        "fwd 2",
        "fwd 3",
        "dec 3.0-1",
    ]
    assert comm[6].split()[0] == "total"
    assert "decoded tokens vs single-process greedy reference: 4 tokens, all identical" in text
    assert text.rstrip().splitlines()[-2].endswith("OK")


@pytest.mark.clause("C-MERGE")
def test_torchrun_two_nodes_local_gives_the_spawned_figures():
    """``torchrun --nnodes 2 --nproc-per-node 2 --node-rank {0,1} --rdzv-endpoint 127.0.0.1:PORT`` (two
    "nodes" on this machine, run as ``python -m torch.distributed.run``): exits 0 on both nodes, and rank
    0 prints the figures a spawned 4-rank run of the same flags prints (wall time aside)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flags = ["--json", *LOCAL, *NSA, *ARGS]
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--node-rank",
                str(n),
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "-m",
                "cpkv.executor",
                *flags,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in (0, 1)
    ]
    outs = [p.communicate(timeout=170) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], [e[-2000:] for _, e in outs]
    assert outs[1][0] == ""  # only global rank 0 prints
    two_nodes = json.loads(outs[0][0][outs[0][0].index("{") :])
    spawned = CliRunner().invoke(run_dist_cli, ["--cp-size", "4", *flags])
    assert spawned.exit_code == 0, spawned.output
    spawned_out = json.loads(spawned.output)
    assert two_nodes["cp_size"] == 4
    check_local_json(two_nodes)
    for d in (two_nodes, spawned_out):
        d.pop("wall_s")
    assert two_nodes == spawned_out
