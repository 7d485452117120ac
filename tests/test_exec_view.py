"""`clusterrun exec`'s report, without hosts: outputs gathered as clush -b gathers them, hosts
grouped by exit status in the summary, and the `--json` document."""

from __future__ import annotations

import io
import json
import signal
from pathlib import Path

import pytest

from clusterrun.errors import ExitStatus, Outcome, Result, exit_status
from clusterrun.exec import ExecResult, ExecRun
from clusterrun.execview import Collected, document, gather, nodes, render_gathered, summarize
from clusterrun.transport import parallel
from tests.conftest import Reader, host_spec, run_cli, run_main, start_cli

Row = parallel.HostResult


def ok(name: str, code: int = 0, state: str = "exited", reason: str | None = None,
       elapsed: float | None = None) -> Row:
    return Row(host_spec(f"10.0.0.{name[4:]}", name), name,
               value=ExecResult(code, state, reason, elapsed))


def failed(name: str, outcome: Outcome, message: str) -> Row:
    return Row(host_spec(f"10.0.0.{name[4:]}", name), name,
               failure=parallel.Failure(outcome, f"{name}: {message}"))


def exec_run(*rows: Row, interrupted: int | None = None) -> ExecRun:
    return ExecRun(parallel.GroupResult(list(rows)), interrupted=interrupted)


def fed(outputs: dict[str, bytes], errors: dict[str, bytes] | None = None) -> Collected:
    collected = Collected()
    for name, data in outputs.items():
        # In pieces, as frames arrive: the whole output is what counts.
        for piece in (data[:3], data[3:]):
            collected.feed(name, "stdout", piece)
    for name, data in (errors or {}).items():
        collected.feed(name, "stderr", data)
    return collected


def test_nodes_fold_with_clush_s_count() -> None:
    assert nodes(["gpu01", "gpu02", "gpu03", "gpu05"]) == "gpu[01-03,05] (4)"
    assert nodes(["node31"]) == "node31"


def test_gather_puts_identical_output_in_one_group_and_the_odd_host_apart() -> None:
    names = [f"node{k}" for k in range(1, 33)]
    outputs = dict.fromkeys(names, b"same\n")
    outputs["node17"] = b"odd\n"
    outputs["node30"] = b""  # printed nothing: in no group, as with clush -b
    groups = gather(names, fed(outputs))
    assert [(nodes(g.names), g.text) for g in groups] == [
        ("node[1-16,18-29,31-32] (30)", "same\n"), ("node17", "odd\n")]


def test_gather_orders_largest_first_then_by_the_first_host() -> None:
    names = ["node1", "node2", "node3", "node4", "node5"]
    outputs = {"node1": b"a", "node2": b"b", "node3": b"c", "node4": b"b", "node5": b"c"}
    assert [g.names for g in gather(names, fed(outputs))] == [
        ("node2", "node4"), ("node3", "node5"), ("node1",)]


def test_render_gathered_is_clush_s_layout() -> None:
    out = io.StringIO()
    groups = gather(["gpu01", "gpu02", "gpu03"],
                    fed({"gpu01": b"x\ny\n", "gpu02": b"x\ny\n", "gpu03": b"z"}))
    render_gathered(groups, out)
    rule = "-" * 15
    assert out.getvalue() == f"{rule}\ngpu[01-02] (2)\n{rule}\nx\ny\n{rule}\ngpu03\n{rule}\nz\n"


def test_summary_groups_hosts_by_exit_status() -> None:
    rows = [ok(f"node{k}") for k in range(1, 31)]
    rows += [ok("node31", 1), failed("node32", Outcome.CONNECT_TIMEOUT,
                                      "no SSH answer within 0.9 s")]
    lines, result = summarize(exec_run(*rows))
    assert lines == ["exit 0: node[1-30] (30)", "exit 1: node31",
                     "unreachable: node32: timeout: no SSH answer within 0.9 s"]
    assert exit_status(result) == ExitStatus.UNREACHABLE  # as before: 4 beats the hosts' 1


def test_summary_orders_statuses_then_failures_and_keeps_the_largest_status() -> None:
    rows = [ok("node1", 7), ok("node2", 3), ok("node3", 3),
            ok("node4", 124, state="timeout", reason="timed out after 2 s"),
            ok("node5", 143, state="stopped"), ok("node6"),
            failed("node7", Outcome.PROBE_FAILED, "could not run the command (exit status 1)")]
    lines, result = summarize(exec_run(*rows))
    assert lines == ["exit 0: node6", "exit 3: node[2-3] (2)", "exit 7: node1",
                     "timed out after 2 s (exit 124): node4", "stopped (exit 143): node5",
                     "probe failed: node7: could not run the command (exit status 1)"]
    assert exit_status(result) == 143


def test_hosts_not_started_after_ctrl_c_are_named() -> None:
    rows = [ok("node1", 143, state="stopped"),
            failed("node2", Outcome.INTERRUPTED, "not started (interrupted before its turn)")]
    lines, result = summarize(exec_run(*rows, interrupted=2))
    assert lines == ["stopped (exit 143): node1",
                     "interrupted: node2: not started (interrupted before its turn)"]
    assert exit_status(result) == 130


def test_json_document_has_every_host_s_status_output_and_time() -> None:
    run = exec_run(ok("node1", elapsed=0.51234), ok("node2", 3, elapsed=1.0),
                   failed("node3", Outcome.REFUSED, "connection refused on port 1"))
    collected = fed({"node1": b"hi\n", "node2": b"bad \xff\n"}, {"node2": b"oops\n"})
    _lines, result = summarize(run)
    doc = json.loads(json.dumps(document(run, collected, result)))
    assert doc["ok"] is False and doc["exit_status"] == 4
    assert doc["hosts"] == [
        {"name": "node1", "host": "10.0.0.1", "state": "exited", "exit_status": 0,
         "stdout": "hi\n", "stderr": "", "time": 0.512, "reason": None},
        {"name": "node2", "host": "10.0.0.2", "state": "exited", "exit_status": 3,
         "stdout": "bad \ufffd\n", "stderr": "oops\n", "time": 1.0, "reason": None},
        {"name": "node3", "host": "10.0.0.3", "state": "unreachable", "exit_status": None,
         "stdout": "", "stderr": "", "time": None,
         "reason": "node3: connection refused on port 1"}]
    assert "groups" not in doc


def test_json_document_with_gather_holds_the_groups() -> None:
    run = exec_run(ok("node1"), ok("node2"), ok("node3"))
    collected = fed({"node1": b"a\n", "node2": b"b\n", "node3": b"a\n"})
    doc = document(run, collected, Result(), gathered=True)
    assert doc["ok"] is True and doc["exit_status"] == 0
    assert doc["groups"] == [{"nodes": "node[1,3]", "hosts": ["node1", "node3"], "stdout": "a\n"},
                             {"nodes": "node2", "hosts": ["node2"], "stdout": "b\n"}]


@pytest.mark.parametrize("fanout", ["0", "-3", "many"])
def test_fanout_below_one_is_a_usage_error(capsys: pytest.CaptureFixture[str], home: Path,
                                           fanout: str) -> None:
    code, out, err = run_main(capsys, "exec", "inventories/localhost.yaml", "-f", fanout,
                              "--json", "--", "true")
    assert code == ExitStatus.USAGE, err
    assert "--fanout" in err and "Traceback" not in err
    assert json.loads(out)["error"]["outcome"] == "usage"


def test_json_and_gather_from_the_command_line(home: Path) -> None:
    """The localhost inventory's two nodes (the local transport): the document alone on stdout;
    -b's one group on stdout, stderr as it came, the summary after it."""
    cmd = "echo same; echo to-err >&2; exit 3"
    cp = run_cli("exec", "--json", "-f", "1", "inventories/localhost.yaml", "--", cmd, timeout=60)
    assert cp.returncode == 3, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["ok"] is False and doc["exit_status"] == 3
    assert [(h["name"], h["state"], h["exit_status"], h["stdout"], h["stderr"])
            for h in doc["hosts"]] == [("node0", "exited", 3, "same\n", "to-err\n"),
                                       ("node1", "exited", 3, "same\n", "to-err\n")]
    assert all(isinstance(h["time"], float) for h in doc["hosts"])
    cp = run_cli("exec", "-b", "inventories/localhost.yaml", "--", cmd, timeout=60)
    assert cp.returncode == 3, cp.stderr
    rule = "-" * 15
    assert cp.stdout == f"{rule}\nnode[0-1] (2)\n{rule}\nsame\n"
    assert sorted(cp.stderr.splitlines()) == ["exit 3: node[0-1] (2)", "node0: to-err",
                                              "node1: to-err"]
    assert cp.stderr.splitlines()[-1] == "exit 3: node[0-1] (2)"


def test_ctrl_c_under_fanout_stops_the_running_host_and_starts_no_other(home: Path) -> None:
    proc = start_cli("exec", "-f", "1", "inventories/localhost.yaml", "--",
                     "echo started; sleep 30")
    assert proc.stdout is not None and proc.stderr is not None
    out = Reader(proc.stdout)
    out.wait_for("^node0: started$", timeout=60)
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    assert proc.wait(30) == 130, err
    out.join()
    assert out.text == "node0: started"
    assert err.splitlines()[-2:] == [
        "stopped (exit 143): node0",
        "interrupted: node1: not started (interrupted before its turn)"], err
