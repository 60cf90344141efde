"""`ray job submit -- rayfed run` against a Ray head started on loopback: rayfed joins the cluster."""
import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path):
    """A one-node Ray cluster of its own, with token authentication (Ray's default since 2.59).
    Stopped by killing its process group: `ray stop` would also stop every other Ray on the machine."""
    dashboard_port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    env.pop("RAY_ADDRESS", None)
    command = ["ray", "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={free_port()}",
               "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}",
               f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
               "--num-cpus=1", "--disable-usage-stats"]
    head = subprocess.Popen(command, env=env, start_new_session=True, stdout=open(tmp_path / "head.log", "w"),
                            stderr=subprocess.STDOUT)
    address = f"http://127.0.0.1:{dashboard_port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{address}/api/version", timeout=2)
                break
            except urllib.error.HTTPError:      # it answers (401 without the token): it is up
                break
            except OSError as error:
                if head.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Ray head did not come up: {(tmp_path / 'head.log').read_text()}") from error
                time.sleep(1)
        yield address, env
    finally:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()


def test_job_submit_runs_rayfed_on_the_cluster(ray_head, tmp_path):
    address, env = ray_head
    working_dir = tmp_path / "job"
    working_dir.mkdir()
    (working_dir / "tiny.yaml").write_text("data:\n  num_clients: 20\ntrain:\n  rounds: 3\n  eval_every: 1\n")
    out = tmp_path / "run"
    completed = subprocess.run(
        ["ray", "job", "submit", "--address", address, "--working-dir", str(working_dir), "--",
         "rayfed", "run", "tiny.yaml", "engine.num_workers=1", "--out", str(out), "--quiet"],
        env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "succeeded" in completed.stdout + completed.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 3 and summary["num_clients"] == 20
    assert 0.0 <= summary["final_test_accuracy"] <= 1.0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
