"""The README's cluster path, exercised: a head started with ``ray start --head`` (dashboard on),
the index job submitted to it through Ray's ``JobSubmissionClient`` with ``--working-dir``-style
upload of the repository, the job SUCCEEDED and its build complete.

Ray (2.60) turns token authentication on for ``ray start``; a client reaches the job server only
with ``RAY_AUTH_MODE=token`` in its environment (the token is in ``~/.ray/auth_token``), as the
README says, so the client runs as a user runs it: in its own process with that environment.

The head runs in its own temp dir and ports (8330-8339) and is stopped by terminating exactly the
processes it started (``ray stop`` would stop every Ray on the machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from cluster.fake import stop_processes
from longrag.index.artifacts import ArtifactStore

pytestmark = [pytest.mark.cluster, pytest.mark.scenario, pytest.mark.ray("b")]

ROOT = Path(__file__).resolve().parents[2]
GCS_PORT, DASHBOARD_PORT = 8330, 8331
PORTS = {  # every port of the head, so it collides with no other Ray on the machine
    "--ray-client-server-port": 8332, "--dashboard-agent-listen-port": 8333, "--dashboard-agent-grpc-port": 8334,
    "--metrics-export-port": 8335, "--node-manager-port": 8336, "--object-manager-port": 8337,
    "--runtime-env-agent-port": 8338,
}


def _stop(proc: subprocess.Popen) -> None:
    try:
        parent = psutil.Process(proc.pid)
    except psutil.NoSuchProcess:
        return
    stop_processes([*parent.children(recursive=True), parent], timeout_s=40)


# The client, as a user runs it: its own process, RAY_AUTH_MODE from its environment.
CLIENT = r"""
import json, sys, time
from ray.job_submission import JobStatus, JobSubmissionClient

address, entrypoint, working_dir, timeout_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
deadline = time.time() + timeout_s
while True:  # the job server comes up a while after `ray start`
    try:
        client = JobSubmissionClient(address)
        client.list_jobs()
        break
    except Exception as exc:
        if "Authentication" in str(exc) or time.time() > deadline:
            print(json.dumps({"error": str(exc)}))
            sys.exit(0)
        time.sleep(2)
if entrypoint == "-":
    print(json.dumps({"ok": True}))
    sys.exit(0)
job_id = client.submit_job(entrypoint=entrypoint, runtime_env={"working_dir": working_dir})
final = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
while (status := client.get_job_status(job_id)) not in final and time.time() < deadline:
    time.sleep(3)
print(json.dumps({"job_id": job_id, "status": str(status), "logs": client.get_job_logs(job_id)[-4000:]}))
"""


def _client(entrypoint: str, auth_mode: str | None, timeout_s: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    if auth_mode:
        env["RAY_AUTH_MODE"] = auth_mode
    out = subprocess.run([sys.executable, "-c", CLIENT, f"http://127.0.0.1:{DASHBOARD_PORT}", entrypoint, str(ROOT),
                          str(timeout_s)], env=env, capture_output=True, text=True, timeout=timeout_s + 120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def head():
    """A local head like `ray start --head --include-dashboard=true --num-cpus=4` (blocking, in the background)."""
    temp_dir = tempfile.mkdtemp(prefix="rayh", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    ray_cli = str(Path(sys.executable).with_name("ray"))
    cmd = [ray_cli, "start", "--head", "--block", f"--port={GCS_PORT}", "--include-dashboard=true",
           f"--dashboard-port={DASHBOARD_PORT}", "--num-cpus=4", f"--temp-dir={temp_dir}", "--disable-usage-stats",
           *(f"{flag}={port}" for flag, port in PORTS.items())]
    log = open(Path(temp_dir) / "ray-start.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    try:
        up = _client("-", "token", 240)
        assert up.get("ok"), (up, (Path(temp_dir) / "ray-start.log").read_text()[-3000:])
        yield proc
    finally:
        _stop(proc)
        log.close()


def test_the_job_server_refuses_a_client_without_token_auth(head):
    """Why the README tells cluster users to set RAY_AUTH_MODE=token on the client."""
    res = _client("-", "disabled", 60)
    assert "Authentication required" in res.get("error", ""), res


def test_index_job_submitted_to_a_local_head_builds_the_sample(head, tmp_path):
    out = tmp_path / "build"
    res = _client(f"{sys.executable} -m jobs.index --source data/sample/enwiki-sample-106-articles.xml.bz2 "
                  f"--format wikixml --out {out} --unit grouped --text-mode lead --shards 2", "token", 600)
    assert res.get("status") == "SUCCEEDED", res
    manifest = ArtifactStore.open(str(out)).read_manifest()
    assert manifest.status == "complete" and len(manifest.shards) == 2
    assert manifest.counts.documents > 100 and manifest.counts.units > 0 and manifest.counts.chunks > 0
    assert manifest.provenance.command[:3] == ["python", "-m", "jobs.index"]
