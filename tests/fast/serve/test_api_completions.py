"""Non-streaming responses: OpenAI shapes, usage with speculative counts, limits and stops as the
engine was asked, the response cache, and what metrics and traces are told."""

import json

from api_doubles import MODEL, REPLY, ScriptedEngine, TestServer, async_test, chat_body, completion_body, reply_script

from tandem.speculation.depth import Auto


@async_test
async def test_completion_has_openai_shape_and_speculative_usage():
    with TestServer() as server:
        async with server.client() as client:
            response = await client.post("/v1/completions", json=completion_body(prompt="Say hi"))
        assert response.status_code == 200
        body = response.json()
        assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
        assert body["model"] == MODEL and isinstance(body["created"], int)
        assert body["choices"] == [{"index": 0, "text": REPLY, "logprobs": None, "finish_reason": "stop"}]
        generated = len(REPLY.encode())  # the EOS that ends the reply is not output
        usage = body["usage"]
        assert usage["prompt_tokens"] == len("Say hi") and usage["completion_tokens"] == generated
        assert usage["total_tokens"] == usage["prompt_tokens"] + generated
        per_step = server.engine.tokens_per_step  # each round drafts per_step + 1, accepts per_step - 1
        steps = -(-(generated + 1) // per_step)
        assert usage["speculative"] == {"drafted_tokens": steps * (per_step + 1),
                                        "accepted_tokens": steps * (per_step - 1)}
        assert body["tandem"] == {"cached": False}


@async_test
async def test_a_prompt_of_token_ids_reaches_the_engine_as_they_are():
    """vLLM's and OpenAI's clients send token ids (a list, or a list of one list): they were a 400.
    The same ids as a text's are the same request (the response cache answers the others)."""
    with TestServer() as server:
        async with server.client() as client:
            for prompt, cached in (([83, 97, 121], False), ([[83, 97, 121]], True), ("Say", True)):
                body = (await client.post("/v1/completions", json=completion_body(prompt=prompt))).json()
                assert body["choices"][0]["text"] == REPLY and body["usage"]["prompt_tokens"] == 3
                assert body["tandem"] == {"cached": cached}
        assert [request.prompt_ids for _, request, _ in server.engine.added] == [(83, 97, 121)]


@async_test
async def test_a_cache_salt_keeps_the_response_cache_apart_and_reaches_the_engine():
    """vLLM's cache_salt: one user could see that another sent the same prompt ("cached": true)."""
    with TestServer() as server:
        async with server.client() as client:
            for salt, cached in (("alice", False), ("bob", False), ("alice", True), (None, False), (None, True)):
                body = completion_body(prompt="Say", **({"cache_salt": salt} if salt else {}))
                answer = (await client.post("/v1/completions", json=body)).json()
                assert answer["tandem"] == {"cached": cached}, salt
        assert [request.cache_salt for _, request, _ in server.engine.added] == ["alice", "bob", None]


@async_test
async def test_chat_completion_has_openai_shape():
    with TestServer() as server:
        async with server.client() as client:
            response = await client.post("/v1/chat/completions", json=chat_body())
        body = response.json()
        assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
        assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": REPLY},
                                    "logprobs": None, "finish_reason": "stop"}]
        request = server.engine.added[0][1]
        assert bytes(request.prompt_ids).decode() == "<user>Say hi\n<assistant>"


@async_test
async def test_request_fields_reach_the_engine():
    with TestServer() as server:
        async with server.client() as client:
            await client.post("/v1/chat/completions", json=chat_body(
                messages=[{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                          {"role": "user", "content": "Hi"}],
                max_completion_tokens=7, temperature=0.5, top_p=0.9, top_k=40, seed=3,
                tandem={"drafter": "ngram", "k": "auto"}))
        seq_id, request, options = server.engine.added[0]
        assert bytes(request.prompt_ids).decode() == "<system>Be brief.\n<user>Hi\n<assistant>"
        assert request.max_tokens == 7 and request.stop_token_ids == {256}
        assert (request.sampling.temperature, request.sampling.top_p, request.sampling.top_k,
                request.sampling.seed) == (0.5, 0.9, 40, 3)
        assert (options.drafter, options.k) == ("ngram", Auto())
        assert server.tracer.started[seq_id]["tandem.drafter"] == "ngram"


@async_test
async def test_text_parts_are_lines_seed_minus_one_is_none_and_top_p_zero_passes():
    """As vLLM: text parts join with a newline; llama.cpp's seed -1 is no seed; OpenAI's top_p 0."""
    with TestServer() as server:
        async with server.client() as client:
            response = await client.post("/v1/chat/completions", json=chat_body(
                messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                temperature=0.7, seed=-1, top_p=0))
            assert response.status_code == 200, response.text
        _, request, _ = server.engine.added[0]
        assert bytes(request.prompt_ids).decode() == "<user>a\nb\n<assistant>"
        assert (request.sampling.seed, request.sampling.top_p) == (None, 0.0)


@async_test
async def test_top_k_minus_one_is_off_as_vllm_takes_it():
    with TestServer() as server:
        async with server.client() as client:
            for top_k in (-1, 0):
                response = await client.post("/v1/completions", json=completion_body(temperature=0.7, top_k=top_k))
                assert response.status_code == 200, response.text
            assert (await client.post("/v1/completions", json=completion_body(top_k=-2))).status_code == 400
        assert [request.sampling.top_k for _, request, _ in server.engine.added] == [0, 0]


@async_test
async def test_defaults_follow_openai_and_the_context():
    engine = ScriptedEngine(reply_script(eos=False), context_length=300)
    with TestServer(engine) as server:
        async with server.client() as client:
            response = await client.post("/v1/completions", json={"model": MODEL, "prompt": ["p" * 100]})
        request = server.engine.added[0][1]
        assert request.sampling.temperature == 1.0 and request.sampling.top_p == 1.0
        assert request.max_tokens == 200  # 256 capped by the room the context leaves
        assert response.json()["choices"][0]["finish_reason"] == "length"
        assert response.json()["usage"]["completion_tokens"] == 200


@async_test
async def test_max_tokens_gives_finish_reason_length():
    with TestServer(ScriptedEngine(reply_script(eos=False))) as server:
        async with server.client() as client:
            body = (await client.post("/v1/completions", json=completion_body(max_tokens=5))).json()
        assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 5
        assert body["choices"][0]["text"] == "Héll"  # 5 bytes: H, é (2 bytes), l, l


@async_test
async def test_stop_string_is_never_shown():
    with TestServer() as server:
        async with server.client() as client:
            body = (await client.post("/v1/completions", json=completion_body(stop=["wör", "zzz"]))).json()
            chat = (await client.post("/v1/chat/completions", json=chat_body(stop="!"))).json()
        assert body["choices"][0] == {"index": 0, "text": "Héllo, ", "logprobs": None, "finish_reason": "stop"}
        assert chat["choices"][0]["message"]["content"] == "Héllo, wörld"


@async_test
async def test_deterministic_requests_are_cached_and_marked():
    with TestServer() as server:
        async with server.client() as client:
            first = (await client.post("/v1/completions", json=completion_body(max_tokens=9))).json()
            second = (await client.post("/v1/completions", json=completion_body(max_tokens=9))).json()
            sampled = [(await client.post("/v1/completions", json=completion_body(temperature=0.7))).json()
                       for _ in range(2)]
        assert first["tandem"] == {"cached": False} and second["tandem"] == {"cached": True}
        assert second["choices"] == first["choices"]
        prompt = first["usage"]["prompt_tokens"]  # a hit spends no prompt computation and no drafts
        assert second["usage"] == first["usage"] | {"prompt_tokens_details": {"cached_tokens": prompt},
                                                    "speculative": {"drafted_tokens": 0, "accepted_tokens": 0}}
        assert second["id"] != first["id"]
        assert len(server.engine.added) == 3  # the cache hit never reached the engine
        assert all(s["tandem"] == {"cached": False} for s in sampled)
        assert server.metrics.lookups == [False, True]  # sampling without a seed is never looked up
        assert server.metrics.replayed == [first["choices"][0]["finish_reason"]]  # the hit counts as served


DAMAGED_ENTRIES = [  # what another writer of a shared Redis may leave under a response key
    lambda good: ["not", "a", "dict"],
    lambda good: good | {"text": 5, "token_ids": "abc", "usage": {}},  # was a 500 and a traceback
    lambda good: good | {"usage": {"prompt_tokens": "a", "completion_tokens": None}},  # a 500
    lambda good: good | {"token_ids": [99999999]},  # ids no model has
    lambda good: good | {"text": "HACKED"},  # served as it was; its stream replayed the tokens instead
    lambda good: good | {"finish_reason": "error"},
    lambda good: good | {"token_ids": [True, *good["token_ids"][1:]]},
]


@async_test
async def test_a_damaged_or_foreign_cached_answer_is_a_miss_answered_anew():
    with TestServer() as server:
        async with server.client() as client:
            first = (await client.post("/v1/completions", json=completion_body(max_tokens=9))).json()
            store = server.state.cache._cache
            genuine = store.get
            for damage in DAMAGED_ENTRIES:
                store.get = lambda key, damage=damage: damage(genuine(key))
                for stream in (False, True):
                    body = completion_body(max_tokens=9, stream=stream)
                    response = await client.post("/v1/completions", json=body)
                    assert response.status_code == 200, response.text
                    if stream:
                        chunks = [json.loads(line[6:]) for line in response.text.splitlines()
                                  if line.startswith("data: {")]
                        assert chunks and not any(c.get("tandem", {}).get("cached") for c in chunks), damage
                        text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
                        assert text == first["choices"][0]["text"], damage
                    else:
                        assert response.json()["tandem"] == {"cached": False}, damage
                        assert response.json()["choices"] == first["choices"]
            store.get = genuine
            again = (await client.post("/v1/completions", json=completion_body(max_tokens=9))).json()
        assert again["tandem"] == {"cached": True} and again["choices"] == first["choices"]  # a true hit still is


@async_test
async def test_metrics_and_traces_are_told_once_per_request():
    with TestServer() as server:
        async with server.client() as client:
            answer = (await client.post("/v1/completions", json=completion_body(prompt="abc"))).json()
        [(status, prompt, completion, ttft, e2e, gaps)] = server.metrics.finished
        generated = len(REPLY.encode())  # the EOS is not output
        assert (status, prompt, completion) == ("stop", 3, generated)
        assert 0 <= ttft <= e2e and len(gaps) == generated - 1 and all(g >= 0 for g in gaps)
        [(seq_id, started)] = server.tracer.started.items()
        assert started["gen_ai.usage.input_tokens"] == 3
        assert started["gen_ai.response.id"] == answer["id"]  # a trace is found from the client's answer
        assert server.tracer.ended[seq_id]["gen_ai.response.finish_reason"] == "stop"
        assert server.tracer.ended[seq_id]["gen_ai.usage.output_tokens"] == generated


@async_test
async def test_usage_reports_the_prompt_tokens_found_cached():
    """OpenAI's usage.prompt_tokens_details.cached_tokens carries what the engine found in its
    prompt cache, and the metrics count it (vLLM's prefix-cache queries and hits)."""
    engine = ScriptedEngine(reply_script())
    engine.cached_prefix = 2
    with TestServer(engine) as server:
        async with server.client() as client:
            body = (await client.post("/v1/completions", json=completion_body(prompt="abc"))).json()
        assert body["usage"]["prompt_tokens"] == 3
        assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}
        assert server.metrics.cached_tokens == [2]


@async_test
async def test_models_lists_the_served_model():
    with TestServer() as server:
        async with server.client() as client:
            listing = (await client.get("/v1/models")).json()
            card = (await client.get(f"/v1/models/{MODEL}")).json()
            probe = await client.head("/v1/models")
            metrics_probe = await client.head("/metrics")  # was a 405
        assert probe.status_code == 200 and probe.content == b""
        assert metrics_probe.status_code == 200 and metrics_probe.content == b""
        assert listing["object"] == "list" and [m["id"] for m in listing["data"]] == [MODEL]
        assert card["object"] == "model" and card["max_model_len"] == server.engine.context_length
