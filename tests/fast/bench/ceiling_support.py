"""What the ceiling report's tests share (test_ceiling.py, test_drafting_replay.py): a tokenizer of
one token per character, and a bench-serve results.json of two configs over two prompts."""


class CharTokenizer:
    def encode(self, text):
        return [ord(c) for c in text]

    def chat_prompt_ids(self, messages):
        return [ord(c) for m in messages for c in m["content"]]


def _results(tmp_path, text_a, text_b):
    prompts = tmp_path / "w.jsonl"
    prompts.write_text('{"id": "a", "category": "edit", "prompt": "def f(x): return x + 1"}\n'
                       '{"id": "b", "category": "chat", "prompt": "hello there"}\n')
    request = lambda i, c, t, n: {"id": i, "category": c, "ok": True, "text": t, "completion_tokens": n,  # noqa: E731
                                  "ttft_ms": 100.0, "e2e_ms": 100.0 + 10.0 * n}
    level = {"concurrency": 1, "configs": {
        "tandem-spec": {"request_records": [request("a", "edit", text_a, len(text_a)), request("b", "chat", text_b, 4),
                                     request("a~1", "edit", "ignored", 3)]},
        "llama-server": {"request_records": [request("a", "edit", text_a, 5)]}}}
    return {"settings": {"prompts_file": str(prompts)}, "machine": {}, "levels": [level]}, level
