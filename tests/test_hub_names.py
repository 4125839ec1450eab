"""Hub names are checked on the hub's own config and tokenizer files (never the weights) before
any engine: a gated model or a name the hub does not know is one line, exit 2; a draft whose
vocabulary differs from the target's is refused as a local one is; with HF_HUB_OFFLINE the
client asks nothing and the check falls back to a warning. The hub is a stand-in: a real
HTTP server on loopback answering as the Hugging Face hub does (HF_ENDPOINT points at it)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2}
REPOS = {
    "org/target": {"config.json": {**CONFIG, "vocab_size": 32000}},
    "org/draft": {"config.json": {**CONFIG, "vocab_size": 32000}},
    "org/other-draft": {"config.json": {**CONFIG, "vocab_size": 50257}},
}
GATED = {"meta-llama/Gated-8B"}


class Hub:
    """What the stand-in hub was asked, and its address."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.url = ""


@pytest.fixture
def hub() -> Iterator[Hub]:
    state = Hub()

    async def resolve(request: web.Request) -> web.StreamResponse:
        repo, file = f"{request.match_info['org']}/{request.match_info['name']}", request.match_info["file"]
        state.asked.append(f"{request.method} {repo}/{file}")
        if repo in GATED:
            return web.Response(status=401, headers={"X-Error-Code": "GatedRepo", "X-Error-Message":
                                f"Access to model {repo} is restricted. You must have access to it and be authenticated."})
        if repo not in REPOS:
            return web.Response(status=401, headers={"X-Error-Code": "RepoNotFound",
                                                     "X-Error-Message": "Repository not found"})
        if file not in REPOS[repo]:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound",
                                                     "X-Error-Message": "Entry not found"})
        body = json.dumps(REPOS[repo][file]).encode()
        headers = {"X-Repo-Commit": "a" * 40, "ETag": f'"{hashlib.sha256(body).hexdigest()}"',
                   "Content-Length": str(len(body))}
        return web.Response(body=None if request.method == "HEAD" else body, headers=headers)

    app = web.Application()
    app.router.add_route("*", "/{org}/{name}/resolve/{rev}/{file}", resolve)
    runner = web.AppRunner(app)
    import asyncio

    loop = asyncio.new_event_loop()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{port}"
    yield state
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    loop.run_until_complete(runner.cleanup())
    loop.close()


def _optimize(hub: Hub, tmp_path: Path, prompts: Path, *args: str, offline: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_TOKEN": "",
           **({"HF_HUB_OFFLINE": "1"} if offline else {})}
    return subprocess.run([sys.executable, "-m", "spectune.cli", "optimize", "--workload", str(prompts), "--storage",
                           str(tmp_path / "s.db"), "--create-only", *args],
                          capture_output=True, text=True, env=env, timeout=300, check=False)


def test_a_gated_target_is_named_in_one_line_before_any_engine(hub: Hub, tmp_path: Path, repetitive_prompts: Path) -> None:
    run = _optimize(hub, tmp_path, repetitive_prompts, "--target", "meta-llama/Gated-8B", "--space", "ngram")
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stderr
    assert lines[0] == ("error: target meta-llama/Gated-8B is gated on the Hugging Face hub and this machine may not "
                        "read it: accept its terms on its page, then set HF_TOKEN (or run hf auth login)")
    assert not (tmp_path / "s.db").exists()  # nothing written


def test_a_name_the_hub_does_not_know_is_one_line(hub: Hub, tmp_path: Path, repetitive_prompts: Path) -> None:
    run = _optimize(hub, tmp_path, repetitive_prompts, "--target", "org/target", "--space", "draft",
                    "--draft", "org/no-such-draft")
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [
        "error: draft org/no-such-draft is no folder here and no model on the Hugging Face hub (a private one needs "
        "HF_TOKEN)"], run.stderr


def test_a_hub_drafts_vocabulary_is_checked_from_its_config_and_no_weights_are_fetched(
        hub: Hub, tmp_path: Path, repetitive_prompts: Path) -> None:
    bad = _optimize(hub, tmp_path, repetitive_prompts, "--target", "org/target", "--space", "draft",
                    "--draft", "org/other-draft")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: draft org/other-draft does not share the target's vocabulary: target vocab_size 32000, draft 50257"]
    good = _optimize(hub, tmp_path, repetitive_prompts, "--target", "org/target", "--space", "draft",
                     "--draft", "org/draft")
    assert good.returncode == 0, good.stderr
    assert "cannot check" not in good.stderr
    assert not any(a.endswith((".safetensors", ".bin")) for a in hub.asked)


def test_offline_the_hub_is_not_asked_and_an_uncached_name_is_a_warning(hub: Hub, tmp_path: Path,
                                                                        repetitive_prompts: Path) -> None:
    run = _optimize(hub, tmp_path, repetitive_prompts, "--target", "org/target", "--space", "draft",
                    "--draft", "org/draft", offline=True)
    assert run.returncode == 0, run.stderr
    assert hub.asked == []
    assert "cannot check that draft org/draft shares the vocabulary of target org/target" in run.stderr
