"""Ask a running vllm-prism / vLLM OpenAI server one chat question; print the reply and speed.

    python examples/openai_chat_client.py --base-url http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import time

from openai import OpenAI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--message", default="Hello! What can a ternary model do?")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    client = OpenAI(base_url=args.base_url, api_key="EMPTY")
    model = client.models.list().data[0].id
    start = time.perf_counter()
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": args.message}],
        max_tokens=args.max_tokens, temperature=0)
    elapsed = time.perf_counter() - start
    tokens = reply.usage.completion_tokens
    print(f"model: {model}")
    print(f"reply: {reply.choices[0].message.content!r}")
    print(f"{tokens} tokens in {elapsed:.2f} s: {tokens / elapsed:.1f} tokens/s")


if __name__ == "__main__":
    main()
