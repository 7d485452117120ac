"""Placeholders in script arguments and the ranks' environment model: pure, no hosts needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.errors import UsageError
from clusterrun.plan import environment, placeholders, torchrun

HOST = {"node_rank": 2, "nnodes": 3, "master_addr": "10.0.0.11", "master_port": 29500}


@pytest.mark.parametrize(("arg", "expected"), [
    ("-rn", "-rn"),
    ("{node_rank}", "2"),
    ("tcp://{master_addr}:{master_port}", "tcp://10.0.0.11:29500"),
    ('{"lr": 0.1}', '{"lr": 0.1}'),
    ('{"a": {"b": 1}}', '{"a": {"b": 1}}'),
    ("{{node_rank}", "{node_rank}"),
    ("{{}}", "{}}"),
    ("{ node_rank }", "{ node_rank }"),
    ("{NODE_RANK}", "{NODE_RANK}"),
    ("{node_rank}{nnodes}", "23"),
    ("{rank}", "{rank}"),  # a per-process one, left for the process's own expansion
    ("λ→{nnodes}", "λ→3"),
])
def test_only_exact_tokens_change(arg: str, expected: str) -> None:
    assert placeholders.expand(arg, HOST) == expected


def test_one_pass_so_an_escaped_token_is_never_expanded_later() -> None:
    values = {**HOST, "rank": 5, "local_rank": 1, "world_size": 6}
    assert placeholders.expand("{{rank}-{rank}", values) == "{rank}-5"


def test_per_process_tokens_need_no_torchrun() -> None:
    placeholders.check(["--id", "{node_rank}"], per_process=False)
    placeholders.check(["--id", "{rank}"], per_process=True)
    placeholders.check(["--id", "{{rank}"], per_process=False)  # escaped: plain text
    with pytest.raises(UsageError, match="--no-torchrun"):
        placeholders.check(["--id", "{local_rank}"], per_process=False)


def test_forwarding_takes_the_allow_list_and_never_cuda_visible_devices() -> None:
    env = {"NCCL_DEBUG": "INFO", "WANDB_API_KEY": "k", "HF_TOKEN": "t", "HOME": "/root",
           "CUDA_VISIBLE_DEVICES": "0", "CUDA_HOME": "/usr/cuda", "MY_FLAG": "1",
           "OMP_NUM_THREADS": "4", "PATH": "/bin"}
    assert environment.forwarded(env) == {"CUDA_HOME": "/usr/cuda", "HF_TOKEN": "t",
                                          "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4",
                                          "WANDB_API_KEY": "k"}
    assert environment.forwarded(env, ["MY_*"])["MY_FLAG"] == "1"


def test_env_file_reads_dotenv_without_interpolation(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    path.write_text("# comment\n\nexport A=1\nB = two words  # note\nC='$(id) #not a comment'\n"
                    'D="line\\nnext \\"q\\""\nE=\nF=a=b\n')
    assert environment.read_env_file(path) == {
        "A": "1", "B": "two words", "C": "$(id) #not a comment", "D": 'line\nnext "q"',
        "E": "", "F": "a=b"}


@pytest.mark.parametrize("line", ["NOEQUALS", "1BAD=x", "A='open", 'B="x" trailing'])
def test_env_file_errors_name_the_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / ".env"
    path.write_text(f"OK=1\n{line}\n")
    with pytest.raises(UsageError, match=rf"{path}:2: "):
        environment.read_env_file(path)


def test_later_layers_win() -> None:
    assert environment.merge([{"A": "fwd", "B": "fwd"}, {"B": "file", "C": "file"},
                              {"C": "cli"}]) == {"A": "fwd", "B": "file", "C": "cli"}


@pytest.mark.parametrize("arg", ["--monitor-interval=1", "--start-method=spawn",
                                 "--signals-to-handle=SIGTERM,SIGUSR1"])
def test_other_torchrun_options_pass_through(arg: str) -> None:
    assert torchrun.passthrough([arg]) == (arg,)


@pytest.mark.parametrize(("arg", "owned"), [
    ("--nnodes=4", "--nnodes"), ("--node_rank=1", "--node-rank"),
    ("--master-addr=1.2.3.4", "--master-addr"), ("--max_restarts=3", "--max-restarts"),
    ("-r", "--redirects"), ("--standalone", "--standalone"), ("--local-addr=10.0.0.1",
                                                             "--local-addr")])
def test_options_clusterrun_owns_are_refused_with_the_reason(arg: str, owned: str) -> None:
    with pytest.raises(UsageError, match=f"clusterrun sets {owned} itself"):
        torchrun.passthrough([arg])


def test_a_bare_value_is_refused() -> None:
    with pytest.raises(UsageError, match="one torchrun option per --torchrun-arg"):
        torchrun.passthrough(["spawn"])
