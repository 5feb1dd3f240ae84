"""`aotpack serve --ray`: a local Ray instance with 2 replicas of tiny-llama, driven with the `openai` client.

One `python -m runtime serve --ray --replicas 2` process serves the module (starting Ray and loading two
replicas costs about 15 s on 2 cores). Each reply names its replica ("host:pid") in a header, which is
how the tests see the spread and which process to kill.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import chat, rewrite_manifest
from openai import OpenAI

from runtime.serve.cluster import REPLICA_HEADER

pytestmark = pytest.mark.slow
TEXT = "tiny-llama"
QUESTIONS = [[{"role": "user", "content": f"Question number {i}: why?"}] for i in range(8)]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM first, whatever happened: the command then tears down the Ray instance it started (a
    SIGKILL would leave Ray's processes running); SIGKILL only if it does not exit."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=60)


def _start(path, log, *options: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "runtime", "serve", str(path), "--ray", "--port", "0", "--threads", "1",
         "--served-model-name", "m", *options],
        stdout=subprocess.PIPE, stderr=log, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def cluster(bundle, tmp_path_factory):
    """(base URL, server process) of `aotpack serve --ray --replicas 2` on a local Ray instance."""
    log = open(tmp_path_factory.mktemp("ray") / "stderr.log", "w+")
    proc = _start(bundle(TEXT), log, "--replicas", "2")
    try:
        line = proc.stdout.readline()
        assert "through Ray Serve (2 replicas" in line, _stderr(log)
        yield line.split(" on ")[1].split(" ")[0], proc
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, _stderr(log)
    finally:
        _stop(proc)
        log.close()


def _stderr(log) -> str:
    log.seek(0)
    return log.read()[-4000:]


@pytest.fixture(scope="module")
def expected(runtime):
    """The greedy reply `generate` gives to each question, 24 new tokens."""
    rt = runtime(TEXT)
    texts = []
    for question in QUESTIONS:
        inputs = chat(rt.tokenizer, [question])
        ids = rt.generate(**inputs, max_new_tokens=24, do_sample=False)
        texts.append(rt.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))
    return texts


def _ask(url: str, i: int, retries: int = 0) -> tuple[str, str]:
    """(replica, reply text) of question i % 8, greedy, 24 tokens."""
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=retries, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=QUESTIONS[i % 8], max_tokens=24, temperature=0
    )
    return raw.headers[REPLICA_HEADER], raw.parse().choices[0].message.content


def _load(url: str, requests: int, clients: int = 8, retries: int = 0, done=None) -> list[tuple[int, str, str]]:
    """`requests` questions from `clients` threads; `done` (a list) counts the replies as they come."""

    def one(i):
        result = (i, *_ask(url, i, retries))
        if done is not None:
            done.append(i)
        return result

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(one, range(requests)))


def test_requests_spread_over_both_replicas_and_equal_generate(cluster, expected):
    url, _ = cluster
    results = _load(url, 32)
    assert len({replica for _, replica, _ in results}) == 2
    assert [text for _, _, text in results] == [expected[i % 8] for i in range(32)]
    stream = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0).chat.completions.create(
        model="m", messages=QUESTIONS[3], max_tokens=24, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected[3]


def test_a_killed_replica_is_replaced_and_every_request_gets_a_correct_reply(cluster, expected, caplog):
    """SIGKILL one replica's process while 8 clients keep both busy. Whatever it held is retried, by
    Ray's router or by the openai client (a 500 from the proxy; `max_retries`), and every one of the 64
    requests gets `generate`'s reply; Ray starts a replacement, which then serves."""
    url, _ = cluster
    before = {replica for _, replica, _ in _load(url, 8)}
    victim = sorted(before)[0]
    caplog.set_level(logging.INFO, logger="openai")
    done, killed_at = [], []

    def kill_once_busy():  # after 8 replies the 8 clients keep both replicas busy
        deadline = time.monotonic() + 120
        while len(done) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(int(victim.split(":")[1]), signal.SIGKILL)
        killed_at.append(len(done))

    with ThreadPoolExecutor(1) as killer:
        killer.submit(kill_once_busy)
        results = _load(url, 64, retries=5, done=done)
    assert [text for _, _, text in results] == [expected[i % 8] for i in range(64)]
    assert killed_at and killed_at[0] < 32, f"the kill must land during the load, not after ({killed_at})"
    retried = [r for r in caplog.records if r.getMessage().startswith("Retrying request")]
    print(f"\nkilled {victim} after {killed_at[0]} of 64 replies; the client retried {len(retried)} request(s)")
    deadline, seen = time.monotonic() + 120, set()
    while time.monotonic() < deadline and len(seen - before) == 0:
        seen |= {replica for _, replica, _ in _load(url, 8)}
        time.sleep(0.5)
    assert seen - before, f"no replacement replica answered within 120 s; seen {seen}"
    assert victim not in seen


def test_a_replica_that_cannot_load_the_bundle_fails_with_aotpacks_message(bundle, tmp_path):
    """A bundle built for another torch (as on a node with another image): each replica's constructor
    refuses it, the deployment fails, and the command exits 2 with the replica's message."""
    copy = tmp_path / "bundle"
    shutil.copytree(bundle(TEXT), copy)
    rewrite_manifest(copy, torch_version="2.99.0+cu999")
    with open(tmp_path / "stderr.log", "w+") as log:
        proc = _start(copy, log, "--replicas", "1")
        try:
            assert proc.wait(timeout=240) == 2, _stderr(log)
        finally:
            _stop(proc)
        message = _stderr(log).strip().splitlines()[-1]
    assert message.startswith("aotpack serve: error: the Ray Serve application 'aotpack' did not start: ")
    assert "IncompatibleBundleError: replica on " in message
    assert "bundle was compiled with torch 2.99.0+cu999, this process has torch 2.13.0" in message


@pytest.mark.parametrize(
    "options, message",
    [
        (["--replicas", "2"], "--replicas scale out on Ray Serve: add --ray"),
        (["--ray", "--replicas", "0"], "--replicas must be >= 1, got 0"),
        (["--ray", "--replicas", "2", "--max-replicas", "3"], "--replicas fixes the count"),
        (["--ray", "--min-replicas", "3", "--max-replicas", "2"], "0 <= --min-replicas <= --max-replicas"),
        (["--ray", "--min-replicas", "1"], "--max-replicas >= 1, got 1 and None"),
        (["--ray", "--ray-label", "avx512"], "--ray-label 'avx512' must be KEY=VALUE"),
    ],
)
def test_scale_options_are_checked_before_anything_starts(bundle, options, message):
    done = subprocess.run(
        [sys.executable, "-m", "runtime", "serve", str(bundle(TEXT)), *options],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_the_deployment_autoscales_on_ongoing_requests_per_replica_and_honours_labels(bundle):
    """The options handed to Ray Serve, without starting Ray: a replica's target load is its bundle's
    rows, it takes up to two batches before Ray queues, and `--ray-label` becomes a label selector."""
    from runtime.config import LoadConfig
    from runtime.serve.cluster import deployment
    from runtime.serve.config import RayConfig, ServeConfig

    config = ServeConfig(bundle=bundle(TEXT), load=LoadConfig(num_threads=2), max_queue=16, shutdown_grace=5)
    scaling = RayConfig(min_replicas=1, max_replicas=3, labels=("cpu-isa=avx512",))
    d = deployment(config, scaling, rows=4)
    auto = d._deployment_config.autoscaling_config
    assert (auto.min_replicas, auto.max_replicas, auto.target_ongoing_requests) == (1, 3, 4)
    assert d.max_ongoing_requests == 8 and d._deployment_config.max_queued_requests == 16
    assert d.ray_actor_options == {"num_cpus": 2, "label_selector": {"cpu-isa": "avx512"}}
    assert d._deployment_config.graceful_shutdown_timeout_s == 5
    fixed = deployment(config, RayConfig(replicas=3), rows=4)
    assert fixed.num_replicas == 3 and fixed._deployment_config.autoscaling_config is None


def test_a_proxy_that_does_not_start_is_aotpacks_error_naming_the_address_and_the_allowance(bundle, monkeypatch):
    """Ray Serve kills an HTTP proxy that misses its readiness checks (on 2 busy cores, importing Serve
    takes longer than its 15 s): `serve.start` then raises Ray's actor error, which becomes a DeployError
    naming the address and the variable that gives the proxy longer."""
    from ray import serve
    from ray.exceptions import RayError

    from runtime.serve.cluster import PROXY_READY_ENV, DeployError, _start_proxy
    from runtime.serve.config import ServeConfig

    def killed(**_):
        raise RayError("The actor died unexpectedly before finishing this task.\n\tclass_name: ProxyActor")

    monkeypatch.setattr(serve, "start", killed)
    monkeypatch.setenv(PROXY_READY_ENV, "90")
    with pytest.raises(DeployError) as e:
        _start_proxy(ServeConfig(bundle=bundle(TEXT), port=8123))
    assert "HTTP proxy did not start on 127.0.0.1:8123: The actor died unexpectedly" in str(e.value)
    assert f"{PROXY_READY_ENV}=SECONDS" in str(e.value) and "starts uses 90)" in str(e.value)
