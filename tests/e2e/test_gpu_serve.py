"""`vllm serve tiny.gguf` on CUDA with no extra flag answers a chat request (the OpenAI
client), in vLLM's default mode, with the reference's greedy reply."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from . import oracle
from .test_server import _free_port, wait_for_server

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
openai = pytest.importorskip("openai")


def test_vllm_serve_answers_chat(tiny_gguf, tmp_path) -> None:
    vllm_cmd = shutil.which("vllm")
    if vllm_cmd is None:
        pytest.skip("the `vllm` command is not on PATH")
    model = tiny_gguf("pq2_0", seed=7)
    port = _free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([vllm_cmd, "serve", str(model), "--port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ})
    try:
        client = wait_for_server(proc, port, tmp_path / "serve.log", 900)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        reply = client.chat.completions.create(model=str(model), messages=messages,
                                               max_tokens=8, temperature=0)
        tok = oracle.load_reference_tokenizer(model)
        ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=False))
        want = oracle.greedy(oracle.load_reference_model(model), ids, 8)[-8:]
        if tok.eos_token_id in want:  # the server stops at the end-of-turn token
            want = want[:want.index(tok.eos_token_id)]
        assert reply.choices[0].message.content == tok.decode(want, skip_special_tokens=True)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)
