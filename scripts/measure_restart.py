"""What the disk tier gives a restarted server: a conversation's first turn (a ~1,000-token source
file and a question), the server stopped (SIGTERM) and started again on the same `--cache-dir`,
then the second turn; against the same second turn on a server started with an empty folder.

    python scripts/measure_restart.py [--target qwen2.5-coder-1.5b-instruct] [--threads 2]

Prints the second turn's time to first token and cached prompt tokens for both (name the CPU
beside the figures; the script prints /proc/cpuinfo's model line).
"""

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tandem.hardware import cpu_model

SOURCE = Path(__file__).parents[1] / "src" / "tandem" / "engine" / "prompt_cache.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--threads", default="2")
    args = parser.parse_args()
    first = [{"role": "user", "content": f"```python\n{SOURCE.read_text()}\n```\nWhat does `place` do?"}]
    with tempfile.TemporaryDirectory() as kept, tempfile.TemporaryDirectory() as empty:
        server = _start(args, kept)
        answer = _ask(server[1], args.target, first)
        _stop(server[0])
        second = first + [{"role": "assistant", "content": answer["text"]},
                          {"role": "user", "content": "And `evict_idle`?"}]
        rows = []
        for label, folder in (("restarted on its --cache-dir", kept), ("restarted on an empty folder", empty)):
            server = _start(args, folder)
            rows.append((label, _ask(server[1], args.target, second)))
            _stop(server[0])
    print(f"CPU: {cpu_model()}; target {args.target}, {args.threads} threads; first turn "
          f"{answer['prompt_tokens']} prompt tokens")
    print("| second turn | prompt tokens | cached | TTFT |")
    print("|---|---:|---:|---:|")
    for label, result in rows:
        print(f"| {label} | {result['prompt_tokens']} | {result['cached']} | {result['ttft_s']:.2f} s |")


def _start(args, folder: str):
    command = [sys.executable, "-m", "tandem.cli.main", "serve", "--target", args.target, "--threads", args.threads,
               "--port", "0", "--cache", "off", "--cache-dir", folder]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        if match:
            url = match.group(0)
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                        return process, url
                except httpx.HTTPError:
                    time.sleep(0.5)
    raise SystemExit(f"tandem serve exited ({process.wait()})")


def _stop(process) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(120)


def _ask(url: str, model: str, messages) -> dict:
    body = {"model": model, "messages": messages, "max_tokens": 32, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start, ttft, text, usage = time.perf_counter(), None, [], {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    ttft = ttft or time.perf_counter() - start
                    text.append(choice["delta"]["content"])
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"text": "".join(text), "ttft_s": ttft, "prompt_tokens": usage.get("prompt_tokens"), "cached": cached}


if __name__ == "__main__":
    main()
