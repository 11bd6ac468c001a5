"""`inceptionlab serve` as a script starts it: the ports it really listens on, said and written for the
script; a warning when it listens beyond this machine without an API key; the program's version."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import tritonclient.grpc as tg
from helpers.page_examples import check_example

from inceptionlab import __version__

REPO = Path(__file__).resolve().parents[1]


def lines_of(process: subprocess.Popen) -> "queue.Queue[str | None]":
    """The process's output lines as they come (None at its end), read in a thread."""
    lines: "queue.Queue[str | None]" = queue.Queue()

    def read() -> None:
        for line in process.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def wait_for_line(lines: "queue.Queue[str | None]", start: str, limit_s: float = 240) -> tuple[str, list[str]]:
    seen = []
    while True:
        line = lines.get(timeout=limit_s)
        assert line is not None, "the server ended before saying it was ready:\n" + "\n".join(seen)
        seen.append(line)
        if line.startswith(start):
            return line, seen


def test_port_0_prints_the_bound_ports_and_writes_them_for_scripts(tmp_path):
    ports_file = tmp_path / "ports.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    process = subprocess.Popen(
        [sys.executable, "-m", "inceptionlab", "serve", "--model", "squeezenet1_1", "--weights", "random",
         "--backend", "eager", "--precision", "fp32", "--max-batch", "1", "--instances", "1", "--max-delay-ms", "0",
         "--port", "0", "--grpc-port", "0", "--ports-file", str(ports_file)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    try:
        ready, _ = wait_for_line(lines_of(process), "ready:")
        ports = json.loads(ports_file.read_text())
        assert ports["http"] > 0 and ports["grpc"] > 0 and ports["host"] == "127.0.0.1"
        assert f"http://127.0.0.1:{ports['http']}/" in ready and f"gRPC at 127.0.0.1:{ports['grpc']}" in ready
        assert "a free port" not in ready
        assert httpx.get(f"http://127.0.0.1:{ports['http']}/v2/health/ready", timeout=10).status_code == 200
        with tg.InferenceServerClient(f"127.0.0.1:{ports['grpc']}") as client:
            assert client.is_server_ready()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_listening_beyond_this_machine_without_a_key_warns(cli, monkeypatch):
    monkeypatch.delenv("INCEPTIONLAB_API_KEY", raising=False)
    result = cli("serve", "--model", "no_such_model", "--host", "0.0.0.0", "--port", "0", "--grpc-port", "off")
    assert result.code == 2  # the model is unknown; the warning came first
    warning = next(line for line in result.err.splitlines() if line.startswith("warning:"))
    assert "0.0.0.0" in warning and "--api-key" in warning
    quiet = cli("serve", "--model", "no_such_model", "--host", "127.0.0.1", "--port", "0", "--grpc-port", "off")
    assert "warning:" not in quiet.err
    keyed = cli("serve", "--model", "no_such_model", "--host", "0.0.0.0", "--api-key", "k", "--port", "0",
                "--grpc-port", "off")
    assert "warning:" not in keyed.err


def test_version(cli):
    result = cli("--version")
    assert result.code == 0 and result.out.strip() == f"inceptionlab {__version__}"


def test_start_up_says_what_runs_where_as_the_serving_page_shows(squares_run, cli, monkeypatch):
    """The lines up to `ready:` (the server itself is not started: its loop is replaced by the call that
    says it is ready, with the ports it would have bound)."""
    from inceptionlab.serve import server

    monkeypatch.setattr(server, "serve_forever", lambda app, host, port, drain_s, on_ready=None: on_ready(8791, 8001))
    result = cli("serve", f"tiny={squares_run.run_dir}", "--backend", "eager", "--max-batch", "8", "--port", "0",
                 "--grpc-port", "0")
    assert result.code == 0, result.err
    check_example("server-start-up", result.err + result.out, labels=["cat", "dog", "fox"])
