"""`trainer.push_to_hub=REPO` against a local stand-in of the Hugging Face hub's HTTP API.

Nothing on this machine can reach the real hub, so the stand-in below answers the three
requests `huggingface_hub` makes to push a folder (create the repo, ask how each file is to be
uploaded, commit) and keeps the files it receives; the client library and the `rlcli train`
process are the real ones. The stand-in answers "regular" (inline) for every file, so the LFS
and Xet upload paths of large files on the real hub are not exercised here.
"""

import base64
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlcli.cli import main as rlcli
from tests.conftest import REPO


class StandInHub(BaseHTTPRequestHandler):
    files: dict[str, dict[str, bytes]] = {}  # repo -> path -> content
    tokens: list[str | None] = []
    refused = "me/readonly"  # creating this repo is forbidden, as without write access

    def log_message(self, *args):
        pass

    def reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply(404, {"error": "not found"})

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.tokens.append(self.headers.get("Authorization"))
        root = os.environ["HF_ENDPOINT"]
        if self.path == "/api/repos/create":
            request = json.loads(body)
            repo = f"{request.get('organization') or 'me'}/{request['name']}"
            if repo == self.refused:
                return self.reply(403, {"error": "You don't have the rights to create it"})
            self.files.setdefault(repo, {})
            return self.reply(200, {"url": f"{root}/{repo}", "name": repo})
        repo = self.path.removeprefix("/api/models/").rsplit("/", 2)[0]
        if "/preupload/" in self.path:
            files = [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                for f in json.loads(body)["files"]
            ]
            return self.reply(200, {"files": files})
        if "/commit/" in self.path:
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    content = base64.b64decode(item["value"]["content"])
                    self.files[repo][item["value"]["path"]] = content
            oid = "0" * 40
            return self.reply(200, {"commitUrl": f"{root}/{repo}/commit/{oid}", "commitOid": oid})
        self.reply(404, {"error": self.path})


@pytest.fixture
def hub(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    StandInHub.files.clear()
    StandInHub.tokens.clear()
    yield StandInHub
    server.shutdown()


def rlcli_train(run_dir: Path, repo: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_TOKEN": "hf_standin_token", "HF_HUB_OFFLINE": "0"}
    return subprocess.run(
        [sys.executable, "-m", "rlcli", "train", "model=tiny", "sampler=hf",
         "trainer.max_steps=1", "trainer.prompts_per_step=2", "trainer.group_size=2",
         "sampler.max_new_tokens=8", "logger.progress=false", f"trainer.push_to_hub={repo}",
         f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_the_final_checkpoint_is_pushed_without_its_training_state(hub, tmp_path):
    out = rlcli_train(tmp_path / "run", "me/tiny-grpo")
    assert out.returncode == 0, out.stderr[-2000:]
    checkpoint = tmp_path / "run" / "checkpoints" / "step_1"
    pushed = hub.files["me/tiny-grpo"]
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(pushed)
    assert pushed["model.safetensors"] == (checkpoint / "model.safetensors").read_bytes()
    assert not {"optimizer.pt", "trainer_state.json", "manifest.json"} & set(pushed)
    assert set(hub.tokens) == {"Bearer hf_standin_token"}
    assert "pushed step_1 to the hub" in out.stdout


def test_a_failed_push_keeps_the_checkpoint_and_says_how_to_push_it(hub, tmp_path):
    out = rlcli_train(tmp_path / "run", hub.refused)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    checkpoint = tmp_path / "run" / "checkpoints" / "step_1"
    excludes = ("--exclude optimizer.pt --exclude trainer_state.json --exclude manifest.json "
                "--exclude 'critic/*' --exclude '.rlcli-*'")  # fmt: skip
    command = f"hf upload me/tiny-grpo {checkpoint} {excludes}"
    assert f"push it later with `{command.replace('me/tiny-grpo', hub.refused)}`, or" in out.stderr
    assert (checkpoint / "model.safetensors").is_file()
    # The command it suggests pushes the model and none of the training state.
    env = {**os.environ, "HF_TOKEN": "hf_standin_token", "HF_HUB_OFFLINE": "0"}
    hf = Path(sys.executable).with_name("hf")  # the venv's, on PATH or not
    done = subprocess.run(
        command.replace("hf", str(hf), 1),
        shell=True,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    uploaded = set(hub.files["me/tiny-grpo"])
    assert {"model.safetensors", "config.json"} <= uploaded
    assert not {"optimizer.pt", "trainer_state.json", "manifest.json"} & uploaded

    # The same command run again once the push can work: the run is finished, and it pushes.
    again = rlcli_train(tmp_path / "run", "me/tiny-again")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "this run is finished" in again.stdout and "pushed step_1 to the hub" in again.stdout
    assert "training " not in again.stdout  # no model was loaded to train
    pushed = hub.files["me/tiny-again"]
    assert pushed["model.safetensors"] == (checkpoint / "model.safetensors").read_bytes()
    assert not {"optimizer.pt", "trainer_state.json", "manifest.json"} & set(pushed)


def test_a_push_that_cannot_happen_fails_before_training(tmp_path, capsys):
    # conftest sets HF_HUB_OFFLINE=1 for the whole test process.
    with pytest.raises(SystemExit) as exit_:
        rlcli(["train", "model=tiny", "trainer.push_to_hub=me/x", f"hydra.run.dir={tmp_path}"])
    assert exit_.value.code == 2
    assert "HF_HUB_OFFLINE is set" in capsys.readouterr().err
    assert not (tmp_path / "checkpoints").exists()
    with pytest.raises(SystemExit):
        rlcli(["train", "trainer.push_to_hub=not a repo", f"hydra.run.dir={tmp_path}/b"])
    assert "is not a hub repo id" in capsys.readouterr().err


def test_an_empty_repo_and_a_finished_run_rerun_offline_are_refused(tmp_path, capsys):
    # conftest sets HF_HUB_OFFLINE=1 for the whole test process.
    with pytest.raises(SystemExit) as exit_:
        rlcli(["train", "model=tiny", "trainer.push_to_hub=''", f"hydra.run.dir={tmp_path}/a"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "rlcli: error: trainer.push_to_hub='' is empty: give the hub repo to push the final "
        "model to (user/name or org/name), or leave it null (the default) to push nothing.\n"
    )
    run = tmp_path / "run"
    tiny = ["model=tiny", "sampler=hf", "trainer.max_steps=1", "trainer.prompts_per_step=2",
            "trainer.group_size=2", "sampler.max_new_tokens=8", "logger.progress=false",
            f"hydra.run.dir={run}"]  # fmt: skip
    rlcli(["train", *tiny])
    capsys.readouterr()
    # Rerun with a push, the finished run would push its checkpoint: offline, it cannot.
    with pytest.raises(SystemExit) as exit_:
        rlcli(["train", *tiny, "trainer.push_to_hub=me/x"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("rlcli: error: trainer.push_to_hub=me/x but HF_HUB_OFFLINE is set")
    assert "--exclude optimizer.pt --exclude trainer_state.json --exclude manifest.json" in err
    assert (run / "checkpoints" / "step_1" / "model.safetensors").is_file()
