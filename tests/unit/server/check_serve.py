#!/usr/bin/env python3
"""`pagoda serve --model builtin` on loopback, driven by the official `openai` client (PyPI).

Checks, against references that are not the server's own code path:
  * greedy completions equal `pagoda generate --json` on the same prompt (the CLI's output);
    streamed deltas concatenate to the non-streamed text; chat prompts are the built-in template
    rendered by Python's jinja2 (usage.prompt_tokens = its bytes + BOS);
  * stop strings cut the text before the first occurrence (finish_reason "stop"), also one that
    contains U+FFFD (matched on the text the client receives);
  * logprobs / top_logprobs (completions and chat, streamed and not): one entry per token,
    greedy takes the best alternative, sorted and consistent;
  * logit_bias forces its token (greedy and sampled); a presence penalty reduces repeats; bad
    penalty / bias values are a 400 naming them;
  * a 401 leaves nothing on its keep-alive connection; unimplemented fields
    (completions' tools, suffix, unknown ones) are a 400 naming them, a non-JSON
    Content-Type a 415; a non-streamed request whose client leaves stops early; 30 bodies of
    8 MB leave resident memory within 100 MB of idle;
  * 64 concurrent clients (streaming and not) all get the greedy text of their prompt;
  * servers with --tp 2 and with --overlap on give the same greedy completions, 8 at once, as
    the plain server;
  * a client that closes its stream mid-way frees its request (inflight 0, 0 leaked pages);
  * errors in OpenAI's shape: 400 naming the field, 401 without the key, 404 unknown model and
    route, 413 prompt longer than the context and body too large, 503 when the queue is full;
  * /metrics parses with prometheus_client, serve_harness.Metrics reads the same samples, and
    its counters agree with what clients saw;
  * a soak of --soak-requests random requests (random lengths, streaming or not, random
    disconnects) within a time bound: every request answered 200 or disconnected by us, then
    0 in flight, 0 leaked pages / rows, and resident memory flat after warm-up;
  * SIGTERM drains: a running stream finishes with [DONE], new requests get 503, exit status 0;
  * tool_choice auto (--tool-call-parser llama3): a reply without a call equals tool_choice
    none's text; one that opens with '{' (logit_bias) is held by the lazy grammar to calls with
    schema-valid arguments (structured_checks); without the option, or with an unknown parser
    name, auto is refused naming it; markers that are tokens (forced by logit_bias on a tiny
    checkpoint) start a schema-valid call for each parser, and a special one is in auto's text
    and not in none's.
A missing `openai`, `prometheus_client`, `httpx` or `jinja2` package is a FAILURE, not a skip.
Usage: check_serve.py --pagoda build/pagoda [--seed N] [--soak-requests N]
"""
import argparse
import asyncio
import http.client
import json
import math
import pathlib
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
try:
    try:
        import httpx2 as httpx  # what recent `openai` releases install
    except ImportError:
        import httpx
    import jinja2
    import openai
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:
    print(f"FAIL: {e}; scripts/setup.sh installs openai, prometheus_client and jinja2")
    sys.exit(1)
from serve_harness import Metrics, Server, large_body_memory  # noqa: E402
from structured_checks import test_structured_output  # noqa: E402

KEY = "sk-test-key"
BUILTIN_TEMPLATE = ("{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + "
                    "message['content'] + '\n' }}{% endfor %}{% if add_generation_prompt %}"
                    "{{ '<|assistant|>\n' }}{% endif %}")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def generate_reference(pagoda, prompt, n):
    out = subprocess.run([pagoda, "generate", "--prompt", prompt, "--max-new-tokens", str(n),
                          "--ignore-eos", "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["output_text"]


def client(server, **kw):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60, **kw)


def check_stop_cut(c, prompt, full, stop):
    """With `stop`, the greedy 48-token completion of `prompt` (whose full text is `full`) is cut
    before the stop string's first occurrence, streamed and not, with finish_reason stop."""
    for stream in (False, True):
        r = c.completions.create(model="builtin", prompt=prompt, max_tokens=48, temperature=0,
                                 stop=[stop], stream=stream, extra_body={"ignore_eos": True})
        if stream:
            chunks = list(r)
            text = "".join(ch.choices[0].text for ch in chunks)
            reason = [ch.choices[0].finish_reason for ch in chunks][-1]
        else:
            text, reason = r.choices[0].text, r.choices[0].finish_reason
        check(text == full[:full.find(stop)] and reason == "stop",
              f"stop {stop!r} (stream={stream}): got {text!r} {reason}")


def test_basics(pagoda, server, rng):
    c = client(server)
    prompts = ["Hello, pagoda", "a", "The quick brown fox " * 5]
    for p in prompts:
        n = rng.randint(4, 24)
        want = generate_reference(pagoda, p, n)
        r = c.completions.create(model="builtin", prompt=p, max_tokens=n, temperature=0,
                                 extra_body={"ignore_eos": True})
        check(r.choices[0].text == want, f"completion of {p!r} equals pagoda generate")
        check(r.choices[0].finish_reason == "length", "finish_reason length")
        check(r.usage.completion_tokens == n and r.usage.prompt_tokens == len(p.encode()) + 1,
              f"usage of {p!r}: {r.usage}")
        chunks = list(c.completions.create(model="builtin", prompt=p, max_tokens=n, temperature=0,
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True}))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        check(text == want, f"streamed completion of {p!r} equals the non-streamed one")
        check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == n,
              "streamed usage chunk")
        check([ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length",
              "streamed finish_reason")

    # Chat: the prompt is the built-in template as jinja2 renders it (+ BOS).
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    rendered = jinja2.Template(BUILTIN_TEMPLATE).render(messages=msgs, add_generation_prompt=True)
    r = c.chat.completions.create(model="builtin", messages=msgs, max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True})
    check(r.usage.prompt_tokens == len(rendered.encode()) + 1,
          f"chat prompt tokens {r.usage.prompt_tokens} = rendered template + BOS")
    check(r.choices[0].message.role == "assistant", "chat message role")
    want = generate_reference(pagoda, rendered, 12)
    check(r.choices[0].message.content == want, "chat reply equals pagoda generate on the template")
    chunks = list(c.chat.completions.create(model="builtin", messages=msgs, max_tokens=12,
                                            temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}))
    check(chunks[0].choices[0].delta.role == "assistant", "first chat chunk carries the role")
    check("".join(ch.choices[0].delta.content or "" for ch in chunks) == want,
          "streamed chat equals the non-streamed one")

    # Stop strings: the text is cut before the first occurrence.
    p = "stop test"
    full = generate_reference(pagoda, p, 48)
    ascii_pairs = [i for i in range(4, len(full) - 2) if full[i:i + 2].isascii()
                   and full[i:i + 2].isprintable() and "\ufffd" not in full[:i + 2]]
    if ascii_pairs:
        check_stop_cut(c, p, full, full[ascii_pairs[len(ascii_pairs) // 2]:][:2])
    # Sampling with a seed is reproducible.
    a = c.completions.create(model="builtin", prompt="seeded", max_tokens=16, temperature=0.9,
                             top_p=0.9, seed=7, extra_body={"top_k": 40})
    b = c.completions.create(model="builtin", prompt="seeded", max_tokens=16, temperature=0.9,
                             top_p=0.9, seed=7, extra_body={"top_k": 40})
    check(a.choices[0].text == b.choices[0].text, "same seed, same sample")
    models = c.models.list()
    check([m.id for m in models.data] == ["builtin"], "GET /v1/models")


def test_concurrent(pagoda, server, rng):
    prompts = [f"client {i % 8} says hello" for i in range(64)]
    wants = {p: generate_reference(pagoda, p, 16) for p in set(prompts)}
    results = [None] * 64

    def run(i):
        c = client(server)
        try:
            if i % 2:
                r = c.completions.create(model="builtin", prompt=prompts[i], max_tokens=16,
                                         temperature=0, extra_body={"ignore_eos": True})
                results[i] = r.choices[0].text
            else:
                s = c.completions.create(model="builtin", prompt=prompts[i], max_tokens=16,
                                         temperature=0, stream=True, extra_body={"ignore_eos": True})
                results[i] = "".join(ch.choices[0].text for ch in s)
        except Exception as e:  # noqa: BLE001
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [i for i in range(64) if results[i] != wants[prompts[i]]]
    check(not bad, f"64 concurrent clients get their greedy text (wrong: {bad[:5]} "
                   f"{[results[i] for i in bad[:2]]})")


def test_abort(server):
    c = client(server)
    before = server.metric("pagoda_generation_tokens_total")
    stream = c.completions.create(model="builtin", prompt="long one", max_tokens=3000,
                                  temperature=0, stream=True, extra_body={"ignore_eos": True})
    n = 0
    for _ in stream:
        n += 1
        if n == 5:
            break
    stream.close()  # the client goes away mid-stream
    h = server.wait_idle(10)
    check(h["inflight"] == 0, f"aborted stream leaves nothing in flight: {h}")
    check(h["leaked_pages"] == 0 and h["leaked_rows"] == 0, f"no leaked pages after abort: {h}")
    generated = server.metric("pagoda_generation_tokens_total") - before
    check(5 <= generated < 3000, f"the aborted request stopped early ({generated} of 3000 tokens)")


def test_errors(server, pagoda):
    c = client(server)
    try:
        c.completions.create(model="builtin", prompt="x", max_tokens=4, temperature=5)
        check(False, "temperature 5 rejected")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "temperature" in str(e), f"400 names temperature: {e}")
    try:
        c.completions.create(model="nope", prompt="x", max_tokens=4)
        check(False, "unknown model rejected")
    except openai.NotFoundError as e:
        check(e.status_code == 404, "404 for an unknown model")
    try:
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).completions.create(
            model="builtin", prompt="x", max_tokens=4)
        check(False, "wrong key rejected")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, "401 with a wrong key")
    st, body = server.post("/v1/completions", {"prompt": "x"})
    check(st == 401 and json.loads(body)["error"]["type"] == "authentication_error", "401 without key")
    auth = {"Authorization": f"Bearer {KEY}"}
    st, body = server.post("/v1/completions", b"{not json", auth)
    check(st == 400 and json.loads(body)["error"]["param"] == "body", f"400 for bad JSON: {body[:200]}")
    st, body = server.post("/v1/chat/completions", {"messages": [{"role": "user"}]}, auth)
    check(st == 400 and json.loads(body)["error"]["param"] == "messages[0].content",
          f"400 names messages[0].content: {body[:200]}")
    st, body = server.post("/v1/completions", {"prompt": [1, 2, 99999]}, auth)
    check(st == 400 and "vocabulary" in json.loads(body)["error"]["message"], "400 for a bad token id")
    try:
        c.completions.create(model="builtin", prompt="y" * 5000, max_tokens=4)
        check(False, "prompt longer than the context rejected")
    except openai.APIStatusError as e:
        check(e.status_code == 413, f"413 for a prompt longer than the context: {e.status_code}")
    st, body = server.post("/v1/completions", json.dumps({"prompt": "z" * (9 << 20)}).encode(), auth)
    check(st == 413, f"413 for a 9 MB body: {st}")
    st, body = server.post("/v1/nothing", {}, auth)
    check(st == 404 and "error" in json.loads(body), "404 for an unknown route")
    h = server.wait_idle(10)
    check(h["leaked_pages"] == 0, "no leaks after the error paths")


def test_auto_tools(server):
    """tool_choice auto (on the main server, started with --tool-call-parser llama3): a reply
    without a call is the same text as with tool_choice none (greedy, streamed and not; the tools
    are in the prompt either way; the ids >= 0x80 but EOS are banned by logit_bias in both, as
    auto's grammar admits only valid UTF-8 text, no BOS and no padding), with no tool_calls;
    multi-turn tool messages (an assistant
    turn with tool_calls, a tool answer) are rendered by the template: the
    prompt's token count is jinja2's rendering of the built-in template (bytes + BOS)."""
    c = client(server)
    msgs = [{"role": "user", "content": "what is the weather?"}]
    tools = [{"type": "function", "function": {"name": "get_w", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    kw = dict(model="builtin", messages=msgs, tools=tools, max_tokens=24, temperature=0,
              logit_bias={str(b): -100 for b in range(128, 320) if b != 257})
    plain = c.chat.completions.create(tool_choice="none", **kw).choices[0]
    for stream in (False, True):
        for extra in ({"tool_choice": "auto"}, {}):  # no tool_choice with tools means auto
            r = c.chat.completions.create(stream=stream, **extra, **kw)
            if stream:
                chunks = [ch for ch in r if ch.choices]
                text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
                calls = [t for ch in chunks for t in ch.choices[0].delta.tool_calls or []]
                reason = chunks[-1].choices[0].finish_reason
            else:
                ch = r.choices[0]
                text, calls, reason = ch.message.content, ch.message.tool_calls, ch.finish_reason
            check(text == plain.message.content and not calls and reason == plain.finish_reason,
                  f"auto {extra} stream={stream} without a call is plain text: {text!r} {calls} "
                  f"{reason} vs {plain.message.content!r} {plain.finish_reason}")
    # The built-in template concatenates content (null would fail there, as in jinja2): "".
    turns = msgs + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_w", "arguments": json.dumps({"city": "Oslo"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    want = jinja2.Environment().from_string(BUILTIN_TEMPLATE).render(messages=turns,
                                                                      add_generation_prompt=True)
    r = c.chat.completions.create(model="builtin", messages=turns, tools=tools, max_tokens=2)
    check(r.usage.prompt_tokens == len(want.encode()) + 1,
          f"a tool conversation renders as jinja2 does: {r.usage.prompt_tokens} tokens vs "
          f"{len(want.encode()) + 1}")


def test_marker_tokens(pagoda, rng, tmp):
    """Tool-call markers that are tokens of the tokenizer, on a tiny random checkpoint whose
    byte-level tokenizer has <|python_tag|> and [TOOL_CALLS] as special tokens (which
    detokenizing skips) and <tool_call>, </tool_call> as plain added tokens; logit_bias forces
    the marker. Per parser (llama3, mistral, qwen25): tool_choice auto's lazy grammar turns the
    reply from the marker on into a call whose arguments validate (jsonschema; one call with
    parallel_tool_calls false), streamed (arguments in fragments, accumulated by the openai SDK)
    equal to non-streamed (same seed). llama3 also: the special marker's text is written
    back into auto's reply for the parser (a call cut short by max_tokens is text that starts
    with it) and not into none's (streamed and not)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tokenizer"))
    from check_against_hf import write_tiny_checkpoint
    from structured_checks import both_ways, random_schema
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    folder = pathlib.Path(tmp)
    vocab = {ch: i for i, ch in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>", "<|python_tag|>",
                            "[TOOL_CALLS]"])
    tok.add_tokens(["<tool_call>", "</tool_call>"])
    tok.save(str(folder / "tokenizer.json"))
    write_tiny_checkpoint(folder, 512, tok.token_to_id("<|begin_of_text|>"),
                          tok.token_to_id("<|end_of_text|>"), rng)
    (folder / "chat.jinja").write_text("{% for m in messages %}{{ m['role'] + ': ' + m['content'] "
                                       "+ '\n' }}{% endfor %}")
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": random_schema(rng)}}
             for i in range(2)]
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    msgs = [{"role": "user", "content": "hi"}]
    for parser, marker in (("llama3", "<|python_tag|>"), ("mistral", "[TOOL_CALLS]"),
                           ("qwen25", "<tool_call>")):
        with Server(pagoda, "--model", str(folder), "--chat-template", str(folder / "chat.jinja"),
                    "--tool-call-parser", parser, "--served-model-name", "tiny") as s:
            c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
            bias = {str(tok.token_to_id(marker)): 100,  # and against white space (NO_SPACE)
                    **{str(tok.encode(ch).ids[0]): -100 for ch in " \t\n\r"}}
            seed = rng.randrange(1 << 30)
            both_ways(check, lambda stream: c.chat.completions.create(
                model="tiny", messages=msgs, tools=tools, logit_bias=bias, max_tokens=3000,
                seed=seed, parallel_tool_calls=False, stream=stream), params,
                f"{parser} auto seed {seed}", True)
            if parser != "llama3":
                continue
            for tc, stream in (("auto", False), ("auto", True), ("none", False), ("none", True)):
                r = c.chat.completions.create(model="tiny", messages=msgs, tools=tools,
                                              tool_choice=tc, max_tokens=3, temperature=0,
                                              logit_bias=bias, stream=stream,
                                              extra_body={"ignore_eos": True})
                text = ("".join(ch.choices[0].delta.content or "" for ch in r if ch.choices)
                        if stream else r.choices[0].message.content)
                check(text.startswith(marker) if tc == "auto" else text == "",
                      f"{tc} stream={stream}: the special marker token's text "
                      f"{'is' if tc == 'auto' else 'is not'} in the reply: {text!r}")


def test_queue_full(pagoda):
    with Server(pagoda, "--max-running", "1", "--max-queue", "1") as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        # Without --tool-call-parser, tool_choice auto (also tools alone) is a 400 naming it.
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        for extra in ({"tool_choice": "auto"}, {}):
            try:
                c.chat.completions.create(model="builtin", messages=[{"role": "user",
                                                                      "content": "hi"}],
                                          tools=[tool], max_tokens=2, **extra)
                check(False, f"auto {extra} without --tool-call-parser is refused")
            except openai.BadRequestError as e:
                err = api_error(e)
                check(err.get("param") == "tool_choice" and
                      "--tool-call-parser" in err.get("message", ""),
                      f"400 names tool_choice and --tool-call-parser: {err}")
        streams = [c.completions.create(model="builtin", prompt="hold", max_tokens=4000,
                                        stream=True, extra_body={"ignore_eos": True})
                   for _ in range(2)]
        next(iter(streams[0]))  # the first runs; the second waits behind it (max-running 1)
        deadline = time.time() + 10
        while s.get_json("/health")[1]["inflight"] < 2 and time.time() < deadline:
            time.sleep(0.02)
        try:
            c.completions.create(model="builtin", prompt="third", max_tokens=4)
            check(False, "a third request is rejected when the queue is full")
        except openai.APIStatusError as e:
            check(e.status_code == 503, f"503 when the queue is full: {e.status_code}")
        for st in streams:
            st.close()
        h = s.wait_idle(10)
        check(h["inflight"] == 0 and h["leaked_pages"] == 0, f"queue drains after closes: {h}")
        r = c.completions.create(model="builtin", prompt="after", max_tokens=4)
        check(r.usage.completion_tokens >= 1, "served again once the queue has room")


def api_error(e):
    """The OpenAI error object of an openai.APIStatusError."""
    body = e.body if isinstance(e.body, dict) else {}
    return body.get("error", body)


def test_stop_on_client_text(pagoda, server):
    """A stop string containing U+FFFD (what the client sees for an invalid UTF-8 byte) cuts the
    text there, as a search of the client's own text says."""
    c = client(server)
    full, at = "", -1
    for k in range(16):
        full = generate_reference(pagoda, f"replacement {k}", 48)
        at = full.find("\ufffd", 1, len(full) - 1)
        if at > 0:
            break
    check(at > 0, "some greedy output of the built-in model contains U+FFFD")
    if at <= 0:
        return
    check_stop_cut(c, f"replacement {k}", full, full[at - 1:at + 1])


def texts_by_index(r, stream):
    """{choice index: text} of a completion (streamed chunks concatenated), the finish reasons,
    and the usage."""
    if not stream:
        return ({ch.index: ch.text for ch in r.choices},
                {ch.index: ch.finish_reason for ch in r.choices}, r.usage)
    texts, reasons, usage = {}, {}, None
    for chunk in r:
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            if ch.finish_reason:
                reasons[ch.index] = ch.finish_reason
        usage = chunk.usage or usage
    return texts, reasons, usage


def test_choices(pagoda, server):
    """A list of prompts, n > 1, echo and stop_token_ids through the openai client, against
    `pagoda generate` on each prompt."""
    c = client(server)
    prompts = ["alpha", "beta gamma", "delta"]
    want = [generate_reference(pagoda, p, 8) for p in prompts]
    for stream in (False, True):
        extra = {"stream_options": {"include_usage": True}} if stream else {}
        r = c.completions.create(model="builtin", prompt=prompts, max_tokens=8, temperature=0, n=2,
                                 stream=stream, extra_body={"ignore_eos": True}, **extra)
        texts, reasons, usage = texts_by_index(r, stream)
        check(texts == {i: want[i // 2] for i in range(6)},
              f"prompts x n=2 (stream={stream}): choice i is prompt i // 2's greedy text: {texts}")
        check(set(reasons.values()) == {"length"} and len(reasons) == 6, f"finish reasons {reasons}")
        check(usage is not None and usage.completion_tokens == 48 and
              usage.prompt_tokens == sum(len(p.encode()) + 1 for p in prompts),
              f"usage counts each prompt once and every choice's tokens: {usage}")
    # Sampled choices differ from one another and repeat with the same seed.
    a = c.completions.create(model="builtin", prompt="sample", max_tokens=16, temperature=1.0, n=4,
                             seed=11)
    b = c.completions.create(model="builtin", prompt="sample", max_tokens=16, temperature=1.0, n=4,
                             seed=11)
    ta, tb = [ch.text for ch in a.choices], [ch.text for ch in b.choices]
    check(len(set(ta)) > 1 and ta == tb, f"n=4 sampled choices differ and repeat by seed: {ta} {tb}")
    chat = c.chat.completions.create(model="builtin", messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=6, temperature=0, n=3, extra_body={"ignore_eos": True})
    check(len({ch.message.content for ch in chat.choices}) == 1 and
          [ch.index for ch in chat.choices] == [0, 1, 2], "chat n=3 greedy: three equal choices")
    # echo: the prompt's text precedes the completion (token-id prompts: their decoded bytes).
    for stream in (False, True):
        r = c.completions.create(model="builtin", prompt="echo me", max_tokens=8, temperature=0,
                                 echo=True, stream=stream, extra_body={"ignore_eos": True})
        texts, _, _ = texts_by_index(r, stream)
        check(texts == {0: "echo me" + generate_reference(pagoda, "echo me", 8)},
              f"echo (stream={stream}): {texts}")
    ids = list("ids é".encode())
    r = c.completions.create(model="builtin", prompt=ids, max_tokens=1, echo=True)
    check(r.choices[0].text.startswith("ids é"), f"echo of a token-id prompt: {r.choices[0].text!r}")
    # stop_token_ids (the byte tokenizer: token b is byte b): the text ends before the first
    # occurrence of that byte's character.
    cut = None
    for k in range(16):
        prompt = f"stop ids {k}"
        full = generate_reference(pagoda, prompt, 48)
        cut = next((i for i in range(2, len(full))
                    if full[i].isascii() and full[i].isprintable()), None)
        if cut is not None:
            break
    check(cut is not None, f"a printable ASCII character in {full!r}")
    if cut is not None:
        ch = full[cut]
        for stream in (False, True):
            r = c.completions.create(model="builtin", prompt=prompt, max_tokens=48, temperature=0,
                                     stream=stream, extra_body={"ignore_eos": True,
                                                                "stop_token_ids": [ord(ch), 300]})
            texts, reasons, _ = texts_by_index(r, stream)
            check(texts == {0: full[:full.index(ch)]} and reasons == {0: "stop"},
                  f"stop_token_ids [{ord(ch)}] (stream={stream}): {texts} {reasons}")


def repeats(text):
    return len(text) - len(set(text))


def test_penalties(server):
    """logit_bias and the penalties through the openai client (the byte tokenizer: token b is
    byte b). The exact formulas are checked against a reference in engine_tests."""
    c = client(server)
    for temperature in (0, 1.0):
        r = c.completions.create(model="builtin", prompt="bias", max_tokens=8, seed=3,
                                 temperature=temperature, logit_bias={"65": 100},
                                 extra_body={"ignore_eos": True})
        check(r.choices[0].text == "A" * 8, f"logit_bias 65: +100 (T={temperature}): {r.choices[0].text!r}")
    chat = c.chat.completions.create(model="builtin", messages=[{"role": "user", "content": "x"}],
                                     max_tokens=4, temperature=0, logit_bias={"66": 100},
                                     extra_body={"ignore_eos": True})
    check(chat.choices[0].message.content == "BBBB", f"chat logit_bias: {chat.choices[0].message}")
    plain = pen = 0
    for k in range(4):
        kw = dict(model="builtin", prompt=f"repeat {k}", max_tokens=24, temperature=0,
                  extra_body={"ignore_eos": True})
        a = c.completions.create(**kw).choices[0].text
        b = c.completions.create(presence_penalty=2.0, **kw).choices[0].text
        b2 = c.completions.create(presence_penalty=2.0, **kw).choices[0].text
        check(b == b2, f"a penalised greedy request repeats itself: {b!r} {b2!r}")
        plain, pen = plain + repeats(a.encode()), pen + repeats(b.encode())
    check(pen < plain, f"presence_penalty 2 reduces repeated tokens ({plain} -> {pen})")
    r = c.completions.create(model="builtin", prompt="rep", max_tokens=8, temperature=0,
                             frequency_penalty=1.0, extra_body={"repetition_penalty": 1.5})
    check(r.choices[0].finish_reason in ("length", "stop"), "frequency + repetition penalties run")
    for field, kw in (("logit_bias", {"logit_bias": {"999999": 1}}),
                      ("logit_bias", {"logit_bias": {"65": 200}}),
                      ("presence_penalty", {"presence_penalty": 2.5}),
                      ("repetition_penalty", {"extra_body": {"repetition_penalty": 0}})):
        try:
            c.completions.create(model="builtin", prompt="x", max_tokens=2, **kw)
            check(False, f"{field} {kw} is refused")
        except openai.BadRequestError as e:
            check(api_error(e).get("param") == field, f"400 names {field}: {api_error(e)}")


def test_logprobs(server):
    """logprobs / top_logprobs through the openai client: one entry per completion token; for a
    greedy request the sampled token's log-probability is the best of its alternatives, which
    come sorted (chat) and consistent with it; streamed equals non-streamed; exp of the top
    alternatives sums to at most 1."""
    c = client(server)
    kw = dict(model="builtin", prompt="logprobs", max_tokens=12, temperature=0, logprobs=5,
              extra_body={"ignore_eos": True})
    r = c.completions.create(**kw)
    lp, text = r.choices[0].logprobs, r.choices[0].text
    n = len(lp.tokens)
    check(n == 12 == r.usage.completion_tokens and len(lp.token_logprobs) == n and
          len(lp.top_logprobs) == n and len(lp.text_offset) == n, f"one entry per token: {lp}")
    for i in range(n):
        top = lp.top_logprobs[i]
        ok = (1 <= len(top) <= 5 and abs(lp.token_logprobs[i] - max(top.values())) < 1e-6 and
              abs(top.get(lp.tokens[i], 1.0) - lp.token_logprobs[i]) < 1e-6 and
              sum(math.exp(v) for v in top.values()) <= 1 + 1e-5 and lp.token_logprobs[i] <= 0)
        check(ok, f"greedy token {i}: its logprob is the best alternative's: {lp.tokens[i]!r} "
                  f"{lp.token_logprobs[i]} {top}")
    if text.isascii():
        check("".join(lp.tokens) == text and lp.text_offset == [len("".join(lp.tokens[:i]))
                                                                 for i in range(n)],
              f"tokens join to the text, offsets count them: {lp.tokens} {lp.text_offset}")
    chunks = list(c.completions.create(stream=True, **kw))
    toks = [t for ch in chunks if ch.choices and ch.choices[0].logprobs
            for t in ch.choices[0].logprobs.tokens]
    vals = [v for ch in chunks if ch.choices and ch.choices[0].logprobs
            for v in ch.choices[0].logprobs.token_logprobs]
    check(toks == lp.tokens and vals == lp.token_logprobs, "streamed logprobs equal non-streamed")
    msgs = [{"role": "user", "content": "logprobs"}]
    for stream in (False, True):
        r = c.chat.completions.create(model="builtin", messages=msgs, max_tokens=10, temperature=0,
                                      logprobs=True, top_logprobs=3, stream=stream,
                                      extra_body={"ignore_eos": True})
        if stream:
            content = [e for ch in r if ch.choices and ch.choices[0].logprobs
                       for e in ch.choices[0].logprobs.content]
        else:
            content = r.choices[0].logprobs.content
        ok = len(content) == 10
        for e in content:
            vals = [a.logprob for a in e.top_logprobs]
            ok = ok and len(vals) == 3 and vals == sorted(vals, reverse=True) and \
                abs(e.logprob - vals[0]) < 1e-6 and e.top_logprobs[0].token == e.token and \
                bytes(e.bytes).decode("utf-8", "replace") == e.token
        check(ok, f"chat logprobs (stream={stream}): sorted top_logprobs, greedy = the best: "
                  f"{content[:2]}")
        if not stream:
            joined = b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace")
            check(joined == r.choices[0].message.content, "chat logprobs bytes join to the content")
    r = c.completions.create(model="builtin", prompt="sampled", max_tokens=8, temperature=1.0,
                             seed=5, logprobs=2)
    lp = r.choices[0].logprobs
    check(all(v <= max(t.values()) + 1e-6 for v, t in zip(lp.token_logprobs, lp.top_logprobs)),
          f"sampled tokens' logprobs are at most the best alternative's: {lp}")
    for field, call in (("logprobs", lambda: c.completions.create(model="builtin", prompt="x",
                                                                 logprobs=2, echo=True)),
                        ("top_logprobs", lambda: c.chat.completions.create(
                            model="builtin", messages=msgs, logprobs=True, top_logprobs=21))):
        try:
            call()
            check(False, f"{field} is refused")
        except openai.BadRequestError as e:
            check(api_error(e).get("param") == field, f"400 names {field}: {api_error(e)}")


def test_tokenize(server):
    """/v1/tokenize and /v1/detokenize against the byte tokenizer's definition (BOS 256, then the
    UTF-8 bytes) and jinja2's rendering of the chat template."""
    auth = {"Authorization": f"Bearer {KEY}"}
    text = "héllo, wörld"
    st, out = server.post("/v1/tokenize", {"model": "builtin", "prompt": text}, auth)
    out = json.loads(out)
    check(st == 200 and out["tokens"] == [256] + list(text.encode()) and
          out["count"] == len(text.encode()) + 1, f"tokenize {text!r}: {out}")
    st, out = server.post("/v1/tokenize", {"prompt": text, "add_special_tokens": False}, auth)
    check(json.loads(out)["tokens"] == list(text.encode()), "tokenize without the BOS")
    msgs = [{"role": "user", "content": "hi"}]
    rendered = jinja2.Template(BUILTIN_TEMPLATE).render(messages=msgs, add_generation_prompt=True)
    st, out = server.post("/v1/tokenize", {"messages": msgs}, auth)
    check(json.loads(out)["tokens"] == [256] + list(rendered.encode()), "tokenize a chat")
    raw = bytes([104, 105, 0xC3, 0x41, 0xE2, 0x82])
    st, out = server.post("/v1/detokenize", {"tokens": list(raw)}, auth)
    check(st == 200 and json.loads(out)["prompt"] == raw.decode("utf-8", "replace"),
          f"detokenize {raw!r}: {out}")
    st, out = server.post("/v1/detokenize", {"tokens": [1, 99999]}, auth)
    check(st == 400 and json.loads(out)["error"]["param"] == "tokens", f"detokenize a bad id: {out}")
    st, out = server.post("/v1/tokenize", {"prompt": "x", "temperature": 1}, auth)
    check(st == 400 and json.loads(out)["error"]["param"] == "temperature",
          f"tokenize refuses a field it does not take: {out}")


def test_auth_keep_alive(server):
    """A request refused with 401 leaves nothing on its keep-alive connection: the next request
    on the same connection is served."""
    u = urllib.parse.urlparse(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    for size in (16, 1 << 16, 1 << 20):
        body = json.dumps({"model": "builtin", "prompt": "k" * size, "max_tokens": 2}).encode()
        conn.request("POST", "/v1/completions", body,
                     {"Content-Type": "application/json", "Authorization": "Bearer wrong"})
        r = conn.getresponse()
        err = json.loads(r.read())
        check(r.status == 401 and err["error"]["type"] == "authentication_error",
              f"401 with a wrong key ({size} B body): {r.status}")
        sock = conn.sock
        good = json.dumps({"model": "builtin", "prompt": "after 401", "max_tokens": 3,
                           "ignore_eos": True}).encode()
        conn.request("POST", "/v1/completions", good,
                     {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        r = conn.getresponse()
        data = r.read()
        check(r.status == 200 and json.loads(data)["usage"]["completion_tokens"] == 3,
              f"the request after a 401 on the same connection is served: {r.status} {data[:200]}")
        check(sock is not None and conn.sock is sock, "the 401 kept the connection open")
    conn.close()


def test_unsupported_fields(server):
    """Fields pagoda does not implement are a 400 naming them (never ignored); a body that is not
    declared JSON is a 415."""
    c = client(server)
    msgs = [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                          "properties": {}}}}
    cases = [
        ("tools", lambda: c.completions.create(model="builtin", prompt="x",
                                               extra_body={"tools": [tool]})),
        ("tool_choice", lambda: c.chat.completions.create(model="builtin", messages=msgs,
                                                          tool_choice="none")),
        ("suffix", lambda: c.completions.create(model="builtin", prompt="x", suffix="y")),
        ("frobnicate", lambda: c.completions.create(model="builtin", prompt="x",
                                                    extra_body={"frobnicate": {"a": [1]}})),
        ("messages[0].name", lambda: c.chat.completions.create(
            model="builtin", messages=[{"role": "user", "content": "hi", "name": "bob"}])),
        ("stream_options.other", lambda: c.completions.create(
            model="builtin", prompt="x", stream=True, stream_options={"other": 1})),
    ]
    for field, call in cases:
        try:
            call()
            check(False, f"{field} is refused")
        except openai.BadRequestError as e:
            check(api_error(e).get("param") == field and field in api_error(e).get("message", ""),
                  f"400 names {field}: {api_error(e)}")
    r = c.completions.create(model="builtin", prompt="x", max_tokens=2,
                             extra_body={"tools": None, "suffix": None})
    check(r.usage.completion_tokens >= 1, "a null unimplemented field counts as absent")
    auth = {"Authorization": f"Bearer {KEY}"}
    body = json.dumps({"model": "builtin", "prompt": "x", "max_tokens": 2}).encode()
    for ctype in ("text/plain", "application/x-www-form-urlencoded"):
        st, out = server.post("/v1/completions", body, {**auth, "Content-Type": ctype})
        check(st == 415 and json.loads(out)["error"]["param"] == "Content-Type",
              f"415 for Content-Type {ctype}: {st} {out[:200]}")
    st, _ = server.post("/v1/completions", body,
                        {**auth, "Content-Type": "application/json; charset=utf-8"})
    check(st == 200, f"application/json with a charset is accepted: {st}")


def test_nonstream_disconnect(server):
    """A non-streamed request whose client leaves is aborted, not run to max_tokens."""
    _, models = server.get_json("/v1/models", {"Authorization": f"Bearer {KEY}"})
    n = models["data"][0]["max_model_len"] - 64
    before = server.metric("pagoda_generation_tokens_total")
    u = urllib.parse.urlparse(server.url)
    body = json.dumps({"model": "builtin", "prompt": "leave early", "max_tokens": n,
                       "ignore_eos": True}).encode()
    with socket.create_connection((u.hostname, u.port), timeout=30) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}"
                     f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                     .encode() + body)
        time.sleep(0.5)
    h = server.wait_idle(30)
    generated = server.metric("pagoda_generation_tokens_total") - before
    check(h["inflight"] == 0 and h["leaked_pages"] == 0, f"nothing left after the disconnect: {h}")
    check(generated < n, f"the abandoned non-streamed request stopped early ({generated} of {n})")


def test_large_bodies(server):
    """30 bodies of 8 MB (serve_harness.large_bodies): each answered with the right status, and
    resident memory back within 100 MB of its size before them."""
    m = large_body_memory(server, {"Authorization": f"Bearer {KEY}"}, 8_000_000, 30)
    want = [400, 400, 400, 200]  # unimplemented field, too deep, chat over the template bound, ok
    check(m["statuses"] == [want[i % 4] for i in range(30)], f"large-body statuses {m['statuses']}")
    growth = (m["after"] - m["idle"]) / (1 << 20)
    print(f"large bodies: resident {m['idle'] >> 20} MB idle, {m['after'] >> 20} MB after 30 x 8 MB "
          f"(+{growth:.1f} MB), peak {m['peak'] >> 20} MB")
    check(growth <= 100, f"resident memory within 100 MB of idle after 30 x 8 MB bodies: +{growth:.1f}")


def test_metrics_format(server):
    """/metrics is Prometheus text 0.0.4: every sample belongs to the family its TYPE line names
    (checked on the text itself), and prometheus_client sees typed, non-empty counters."""
    text = server.get_text("/metrics")
    family, kind = None, None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()
            continue
        if not line or line.startswith("#"):
            continue
        name = line.split("{")[0].split()[0]
        allowed = {family} if kind in ("counter", "gauge") else \
            {family + "_bucket", family + "_sum", family + "_count"}
        check(name in allowed, f"/metrics sample {name} belongs to its TYPE line ({family} {kind})")
    fams = list(text_string_to_metric_families(text))
    # serve_harness.Metrics (what the other tests and the benchmarks read) sees the samples
    # prometheus_client sees, in order, without its _created ones.
    want = [(x.name, x.labels, x.value) for f in fams for x in f.samples
            if not x.name.endswith("_created")]
    got = Metrics(text).samples
    check(got == want, f"serve_harness.Metrics parses /metrics as prometheus_client: "
          f"{[(a, b) for a, b in zip(got, want) if a != b][:3]} ({len(got)} vs {len(want)})")
    check(all(f.type != "unknown" for f in fams),
          f"no untyped families: {[f.name for f in fams if f.type == 'unknown']}")
    counters = {f.name: f for f in fams if f.type == "counter"}
    for name in ["pagoda_prompt_tokens", "pagoda_generation_tokens", "pagoda_requests_finished",
                 "pagoda_http_responses"]:
        f = counters.get(name)
        check(f is not None and f.samples and all(s.name == name + "_total" for s in f.samples),
              f"counter {name} parses with its samples: {f}")


def test_metrics(server):
    m = server.metrics()
    for name in ["pagoda_requests_running", "pagoda_requests_waiting", "pagoda_kv_pages_used",
                 "pagoda_kv_pages_cached", "pagoda_prefix_hit_rate", "pagoda_prompt_tokens_total",
                 "pagoda_generation_tokens_total", "pagoda_time_to_first_token_seconds_count",
                 "pagoda_time_per_output_token_seconds_count", "pagoda_e2e_request_latency_seconds_count",
                 "process_resident_memory_bytes"]:
        check(name in m, f"/metrics has {name}")
    check(m.get("pagoda_e2e_request_latency_seconds_count") == m.get("pagoda_requests_finished_total"),
          "e2e histogram counts every finished request")
    check(m.get("pagoda_e2e_request_latency_seconds_bucket", le="+Inf") ==
          m.get("pagoda_e2e_request_latency_seconds_count"), "+Inf bucket equals the count")
    check(0.0 <= m.get("pagoda_prefix_hit_rate", -1) <= 1.0, "hit rate in [0, 1]")
    check(m.get("pagoda_kv_pages_leaked", 1) == 0, "no leaked pages in /metrics")


def test_hicache(pagoda, rng):
    """`pagoda serve --hicache-*`: a long prompt whose KV the filler requests evict from the
    device pool and then from the host tier comes back from the host tier or the storage tier
    on its second request: /metrics counts those hits, the greedy answer is the same, and
    nothing leaks in any tier."""
    import tempfile
    letters = "abcdefghijklmnopqrstuvwxyz "
    text = lambda n: "".join(rng.choice(letters) for _ in range(n))  # noqa: E731
    with tempfile.TemporaryDirectory() as d, \
            Server(pagoda, "--pool-tokens", "1024", "--page-size", "16", "--max-running", "2",
                   "--hicache-ratio", "1", "--hicache-storage", "file:" + d,
                   "--hicache-prefetch-policy", "wait_complete") as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=60)
        long = text(600)
        ask = lambda p: c.completions.create(  # noqa: E731
            model="builtin", prompt=p, max_tokens=8, temperature=0,
            extra_body={"ignore_eos": True}).choices[0].text
        first = ask(long)
        for _ in range(4):  # each one evicts the previous prompts from the device, then the host
            ask(text(600))
        again = ask(long)
        m = s.metrics()
        hits = m.by_label("pagoda_hicache_hit_tokens_total", "tier")
        print(f"hicache serve: hit tokens by tier {hits}, storage bytes "
              f"{m.by_label('pagoda_hicache_storage_bytes_total', 'direction')}")
        check(again == first, f"same greedy answer after the prefix came back: {first!r} {again!r}")
        check(hits.get("host", 0) + hits.get("storage", 0) >= 512,
              f"the second request's prefix came from the host or storage tier: {hits}")
        check(m.by_label("pagoda_hicache_storage_errors_total", "kind") ==
              {"io": 0, "put": 0, "corrupt": 0}, "no storage errors")
        check("pagoda_hicache_host_pages_used" in m and "pagoda_hicache_host_pages_free" in m,
              "host pool gauges in /metrics")
        test_metrics_format(s)
        h = s.wait_idle(10)
        check(h["leaked_pages"] == 0, f"no leaked pages: {h}")


async def soak_one(ac, url, rng, stats):
    plen = int(min(1500, rng.lognormvariate(4.0, 1.0)))
    body = {"model": "builtin", "prompt": "".join(rng.choice("abcdefgh ") for _ in range(max(1, plen))),
            "max_tokens": rng.randint(1, 24), "temperature": rng.choice([0, 0.8]),
            "ignore_eos": rng.random() < 0.5}
    stream = rng.random() < 0.6
    disconnect_after = rng.randint(1, 6) if rng.random() < 0.2 else None
    # Some requests must be rejected, with the right status.
    expect = 200
    u = rng.random()
    if u < 0.04:
        body["temperature"], expect = 3.5, 400
    elif u < 0.06:
        body["prompt"], expect = "p" * 5000, 413
    elif u < 0.07:
        body["model"], expect = "other", 404
    if expect != 200:
        disconnect_after = None
    if stream:
        body["stream"] = True
    headers = {"Authorization": f"Bearer {KEY}"}
    # A pooled keep-alive connection can be closed by the server's idle timeout just as a request
    # is sent on it, or left broken by a cancelled request (httpcore): the client then sees a
    # transport error before any response byte. Real clients retry that (the openai client does);
    # so does the soak, once, counting it ("retried" must stay rare). An error after a response
    # began is never retried.
    for attempt in range(2):
        began = [False]
        try:
            await soak_request(ac, url, body, headers, stream, disconnect_after, expect, rng, stats,
                               began)
            return
        except httpx.TransportError as e:
            if began[0] or attempt == 1:
                stats["errors"].append(repr(e))
                return
            stats["retried"].append(repr(e))
        except asyncio.TimeoutError as e:
            stats["errors"].append(repr(e))
            return


async def soak_request(ac, url, body, headers, stream, disconnect_after, expect, rng, stats, began):
    """One soak request; sets began[0] once a response (status line) has arrived."""
    if stream:
        async with ac.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
            began[0] = True
            if r.status_code != 200 or expect != 200:
                await r.aread()
                ok = r.status_code == expect and "error" in json.loads(r.content)
                key = "rejected" if ok else "wrong"
                stats[key] += 1
                if not ok:
                    stats["status"][r.status_code] = stats["status"].get(r.status_code, 0) + 1
                return
            n, done = 0, False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                n += 1
                if disconnect_after and n >= disconnect_after:
                    stats["disconnected"] += 1
                    return  # leaving the block closes the connection mid-stream
            stats["ok" if done else "truncated"] += 1
    else:
        timeout = rng.uniform(0.001, 0.05) if disconnect_after else 120
        try:
            r = await asyncio.wait_for(ac.post(url + "/v1/completions", json=body, headers=headers),
                                       timeout)
        except asyncio.TimeoutError:
            stats["disconnected"] += 1
            return
        began[0] = True
        if expect != 200 and r.status_code == expect and "error" in r.json():
            stats["rejected"] += 1
        elif expect == 200 and r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1:
            stats["ok"] += 1
        else:
            stats["wrong"] += 1
            stats["status"][r.status_code] = stats["status"].get(r.status_code, 0) + 1


async def soak(server, n, seed, concurrency=32):
    rng = random.Random(seed)
    stats = {"ok": 0, "rejected": 0, "wrong": 0, "disconnected": 0, "truncated": 0, "status": {},
             "errors": [], "retried": []}
    sem = asyncio.Semaphore(concurrency)
    rss = []
    limits = httpx.Limits(max_connections=concurrency + 8)
    async with httpx.AsyncClient(timeout=120, limits=limits) as ac:
        async def one(i):
            async with sem:
                await soak_one(ac, server.url, rng, stats)
            if i in (n // 4, n - 1):
                rss.append(server.get_json("/health")[1]["resident_bytes"])
        await asyncio.gather(*(one(i) for i in range(n)))
    return stats, rss


def test_same_as(pagoda, server, rng, *flags):
    """`pagoda serve FLAGS` (e.g. --tp 2, the in-process group on the CPU, or --overlap on): greedy
    completions, plain and streamed, 8 at once, equal those of `server` (neither flag); nothing
    leaks; exit 0 after SIGTERM."""
    t0 = time.time()
    name = " ".join(flags)
    prompts = ["".join(rng.choice("abcdefgh ") for _ in range(rng.randint(1, 120)))
               for _ in range(8)]
    lengths = [rng.randint(1, 16) for _ in prompts]

    def complete(c, i):
        stream = i % 2 == 1
        r = c.completions.create(model="builtin", prompt=prompts[i], max_tokens=lengths[i],
                                 temperature=0, stream=stream, extra_body={"ignore_eos": True})
        return "".join(ch.choices[0].text for ch in r) if stream else r.choices[0].text

    def all_at_once(c):
        out = [None] * len(prompts)
        threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, complete(c, i)))
                   for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    want = all_at_once(client(server))
    with Server(pagoda, *flags, "--max-running", "8", "--pool-tokens", "8192") as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=60)
        got = all_at_once(c)
        c.close()  # no keep-alive connection left for the drain to wait out
        h = s.wait_idle(20)
        check(h["leaked_pages"] == 0 and h["leaked_rows"] == 0, f"{name}: 0 leaked: {h}")
        check(s.stop() == 0, f"{name}: exit status 0 after SIGTERM")
    same = sum(a == b for a, b in zip(want, got))
    print(f"serve {name}: {same} of {len(prompts)} greedy completions equal the plain server's "
          f"({time.time() - t0:.1f} s)")
    check(same == len(prompts), f"serve {name} equals the plain server: {list(zip(want, got))}")


def test_drain(pagoda):
    s = Server(pagoda)
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
    st = c.completions.create(model="builtin", prompt="drain me", max_tokens=200, stream=True,
                              extra_body={"ignore_eos": True})
    it = iter(st)
    first = next(it)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    try:
        c.completions.create(model="builtin", prompt="late", max_tokens=2)
        check(False, "no new request while draining")
    except openai.APIStatusError as e:
        check(e.status_code == 503, f"503 while draining: {e.status_code}")
    except openai.APIConnectionError:
        pass  # already stopped listening: also a refusal
    rest = [first] + list(it)
    text_chunks = [ch for ch in rest if ch.choices]
    check(text_chunks[-1].choices[0].finish_reason == "length",
          "the running stream finished during the drain")
    check(s.proc.wait(30) == 0, "exit status 0 after SIGTERM")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    ap.add_argument("--soak-requests", type=int, default=2000)
    ap.add_argument("--soak-seconds", type=float, default=120.0)
    ap.add_argument("--server-log", default=None, help="the main server's stderr (default: dropped)")
    ap.add_argument("--rss-slack", type=float, default=0.10,
                    help="allowed resident growth after warm-up (sanitizer builds need more)")
    args = ap.parse_args()
    print(f"seed {args.seed}")
    rng = random.Random(args.seed)
    t0 = time.time()
    bad = subprocess.run([args.pagoda, "serve", "--tool-call-parser", "nope"],
                         capture_output=True, text=True)
    check(bad.returncode != 0 and "--tool-call-parser" in bad.stderr + bad.stdout,
          f"an unknown --tool-call-parser is refused: {bad.returncode} {bad.stderr[-300:]}")
    with Server(args.pagoda, "--api-key", KEY, "--max-running", "32", "--pool-tokens", "65536",
                "--tool-call-parser", "llama3", log=args.server_log) as s:
        test_basics(args.pagoda, s, rng)
        test_concurrent(args.pagoda, s, rng)
        test_abort(s)
        test_errors(s, args.pagoda)
        test_metrics(s)
        test_metrics_format(s)
        test_stop_on_client_text(args.pagoda, s)
        test_choices(args.pagoda, s)
        test_tokenize(s)
        test_penalties(s)
        test_logprobs(s)
        test_auth_keep_alive(s)
        test_unsupported_fields(s)
        test_auto_tools(s)
        t_so = time.time()
        test_structured_output(s, rng, client, check, api_error)
        print(f"structured output checks: {time.time() - t_so:.1f} s")
        test_nonstream_disconnect(s)
        test_large_bodies(s)
        test_same_as(args.pagoda, s, rng, "--tp", "2")
        test_same_as(args.pagoda, s, rng, "--overlap", "on")
        print(f"functional checks done ({time.time() - t0:.1f} s)")
        t1 = time.time()
        stats, rss = asyncio.run(soak(s, args.soak_requests, args.seed))
        took = time.time() - t1
        h = s.wait_idle(20)
        print(f"soak: {args.soak_requests} requests in {took:.1f} s: {stats['ok']} ok, "
              f"{stats['rejected']} rejected as expected (400/404/413), "
              f"{stats['disconnected']} disconnected by the client, wrong statuses {stats['status']}, "
              f"errors {len(stats['errors'])}, retried after a transport error before any response "
              f"{len(stats['retried'])} {stats['retried'][:3]}; health {h}; "
              f"rss after warm-up / end {rss}")
        check(took < args.soak_seconds, f"soak within {args.soak_seconds} s")
        check(stats["ok"] + stats["rejected"] + stats["disconnected"] == args.soak_requests
              and not stats["wrong"] and not stats["errors"] and not stats["truncated"],
              f"every soak request answered: {stats['status']} {stats['errors'][:3]}")
        check(len(stats["retried"]) <= args.soak_requests // 200,
              f"transport errors before a response stay rare ({len(stats['retried'])} retried)")
        check(h["inflight"] == 0 and h["leaked_pages"] == 0 and h["leaked_rows"] == 0,
              f"0 in flight and 0 leaked after the soak: {h}")
        check(h["kv_pages_free"] + h["kv_pages_cached"] == h["kv_pages_total"],
              f"every page free or cached: {h}")
        if len(rss) == 2:
            check(rss[1] <= rss[0] * (1 + args.rss_slack) + (16 << 20),
                  f"resident memory flat after warm-up: {rss}")
        test_metrics(s)
        check(s.stop() == 0, "exit status 0 after SIGTERM")
    test_queue_full(args.pagoda)
    with tempfile.TemporaryDirectory() as tmp:
        test_marker_tokens(args.pagoda, rng, tmp)
    test_drain(args.pagoda)
    test_hicache(args.pagoda, rng)
    print(f"total {time.time() - t0:.1f} s")
    if failures:
        print(f"FAIL: {len(failures)} check(s) failed (seed {args.seed})")
        return 1
    print(f"OK (seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
