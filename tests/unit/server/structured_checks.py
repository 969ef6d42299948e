"""Structured output (response_format) and tool calls (tool_choice required / named / auto,
parallel_tool_calls) through `pagoda serve`, with the official `openai` client (check_serve.py
runs it on its builtin-model server). The builtin model has random weights: its
text is valid JSON, and matches the schema, only because the grammar constrains every token; the
`jsonschema` package (an independent validator) checks it."""
import json
import string
import time

import openai
from openai.lib.streaming.chat import ChatCompletionStreamState

try:
    import jsonschema
except ImportError:  # scripts/setup.sh installs it; without it the checks cannot run
    jsonschema = None


# logit_bias against white space: the random model would fill the room JSON allows between
# tokens with it; a grammar never needs it, so replies stay short.
NO_SPACE = {str(b): -100 for b in b" \t\n\r"}


def random_schema(rng, depth=0):
    """A random object schema of bounded size (string lengths, integer ranges, array lengths and
    enums bounded; no additional properties), so a random model finishes it in a few hundred
    tokens."""
    props = {}
    for i in range(rng.randint(1, 4)):
        name = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 6))) + str(i)
        kind = rng.choice(["integer", "string", "boolean", "enum", "array"] +
                          (["object"] if depth == 0 else []))
        if kind == "integer":
            lo = rng.randint(-1000, 1000)
            props[name] = {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 5000)}
        elif kind == "string":
            props[name] = {"type": "string", "maxLength": rng.randint(1, 12)}
        elif kind == "boolean":
            props[name] = {"type": "boolean"}
        elif kind == "enum":
            props[name] = {"enum": rng.sample(["red", "green", "blue", "cyan", 7, None], 3)}
        elif kind == "array":
            props[name] = {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                      "maximum": 99},
                           "maxItems": rng.randint(0, 4)}
        else:
            props[name] = random_schema(rng, depth + 1)
    required = sorted(rng.sample(sorted(props), rng.randint(1, len(props))))
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


def content_of(r, chat, stream):
    """(text, finish_reason) of choice 0 of a response or of a stream's chunks."""
    if stream:
        chunks = list(r)
        parts = [(ch.choices[0].delta.content if chat else ch.choices[0].text) or ""
                 for ch in chunks if ch.choices]
        reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
        return "".join(parts), reasons[-1]
    c = r.choices[0]
    return (c.message.content if chat else c.text), c.finish_reason


def test_structured_output(server, rng, client, check, api_error):
    c = client(server)
    msgs = [{"role": "user", "content": "answer in JSON"}]
    probe = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "integer"}}}
    try:
        c.chat.completions.create(model="builtin", messages=msgs, max_tokens=8,
                                  response_format=probe)
    except openai.BadRequestError as e:
        err = api_error(e)
        check(err.get("param") == "response_format" and "llguidance" in err.get("message", ""),
              f"without llguidance response_format is a 400 saying so: {err}")
        print(f"SKIP structured output: llguidance is not available ({err.get('message')})")
        return
    if jsonschema is None:
        check(False, "the jsonschema package is installed (scripts/setup.sh)")
        return
    # json_schema: random schemas and seeds, chat and completions, streamed and not.
    for i in range(5):
        schema = random_schema(rng)
        seed, chat, stream = rng.randrange(1 << 30), i % 2 == 0, i % 3 == 0
        fmt = {"type": "json_schema",
               "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
        kw = dict(model="builtin", max_tokens=3000, seed=seed, temperature=1.0, stream=stream)
        r = (c.chat.completions.create(messages=msgs, response_format=fmt, **kw) if chat
             else c.completions.create(prompt="{", extra_body={"response_format": fmt}, **kw))
        text, reason = content_of(r, chat, stream)
        what = f"json_schema {json.dumps(schema)} seed {seed} chat={chat} stream={stream}"
        try:
            value = json.loads(text)
            jsonschema.validate(value, schema)
            ok = reason == "stop"
        except (ValueError, jsonschema.ValidationError) as e:
            ok = False
            what += f": {e}"
        check(ok, f"{what} gives matching JSON, finish stop: {reason} {text[:300]!r}")
    # json_object: any JSON object. The grammar bounds no string, so a random model sampling at
    # temperature 1 may still be inside one at max_tokens ("length"): that seed proves nothing
    # and the next is tried; every reply that stops must be an object, and one in four must stop.
    for _ in range(2):
        tried = []
        for _attempt in range(4):
            seed = rng.randrange(1 << 30)
            r = c.chat.completions.create(model="builtin", messages=msgs, max_tokens=3000,
                                          seed=seed, response_format={"type": "json_object"})
            text, reason = content_of(r, True, False)
            tried.append((seed, reason))
            if reason != "length":
                break
        try:
            ok = isinstance(json.loads(text), dict) and reason == "stop"
        except ValueError:
            ok = False
        check(ok, f"json_object seeds {tried} give a JSON object: {reason} {text[:300]!r}")
    test_tool_calls(c, rng, msgs, check, api_error)
    # Bad formats: 400 naming the field, nothing generated.
    bad = [
        ({"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "frob"}}},
         "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": "b"}}, "response_format.json_schema.schema"),
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_object", "schema": {}}, "response_format.schema"),
    ]
    for fmt, field in bad:
        try:
            c.chat.completions.create(model="builtin", messages=msgs, max_tokens=4,
                                      response_format=fmt)
            check(False, f"response_format {fmt} is refused")
        except openai.BadRequestError as e:
            check(api_error(e).get("param") == field, f"400 names {field}: {api_error(e)}")


def tool_call_of(r, stream):
    """(tool_calls as [(id, name, arguments text)], finish_reason, content, pieces) of choice 0;
    a stream is accumulated by the `openai` SDK's own accumulator (ChatCompletionStreamState),
    which merges tool-call deltas by index as OpenAI streams them; `pieces`: the number of
    tool-call deltas it had (0 when not streamed)."""
    pieces = 0
    if stream:
        state = ChatCompletionStreamState()
        for ch in r:
            pieces += sum(len(c.delta.tool_calls or []) for c in ch.choices)
            state.handle_chunk(ch)
        r = state.current_completion_snapshot
    m = r.choices[0].message
    calls = [(t.id, t.function.name, t.function.arguments) for t in (m.tool_calls or [])]
    return calls, r.choices[0].finish_reason, m.content, pieces


def both_ways(check, create, params, what, one, only=None):
    """`create(stream)` (the same seeded request) non-streamed and streamed: each gives valid
    calls (check_calls), the accumulated stream equals the reply (ids aside), and the stream
    sent arguments in fragments (more deltas than calls; best of up to 4 streams of the same
    request, as a starved reader may take the whole reply at once). Returns the number of
    calls."""
    got = [tool_call_of(create(stream), stream) for stream in (False, True)]
    for stream, g in zip((False, True), got):
        n = check_calls(check, g, params, f"{what} stream={stream}", one, only)
    same = [([(name, args) for _, name, args in calls], reason, content or "")
            for calls, reason, content, _ in got]
    check(same[0] == same[1], f"{what}: streamed equals non-streamed: {same}")
    # A reader that gets the CPU only after the last token (a loaded machine) sends the whole
    # reply in one event: the same seeded request is streamed again, up to 3 more times, and
    # one of the streams must carry the arguments in fragments.
    pieces = got[1][3]
    for _ in range(3):
        if pieces > len(got[1][0]):
            break
        pieces = max(pieces, tool_call_of(create(True), True)[3])
    check(pieces > len(got[1][0]), f"{what}: arguments streamed in fragments ({pieces} "
                                   f"deltas for {len(got[1][0])} calls, best of 4 streams)")
    return n


def check_calls(check, got, params, what, one, only=None):
    """`got` (tool_call_of) is one call (`one`) or more, each with an id, to a function of
    `params` (only `only` when given) with arguments valid for its schema (jsonschema), no content
    and finish_reason tool_calls. Returns the number of calls."""
    calls, reason, content = got[:3]
    ok = len(calls) >= 1 and (len(calls) == 1 or not one) and reason == "tool_calls" and \
        not content and all(cid for cid, _, _ in calls)
    for _, name, args in calls if ok else []:
        ok = ok and name in params and (only is None or name == only)
        try:
            jsonschema.validate(json.loads(args), params.get(name, {}))
        except (ValueError, jsonschema.ValidationError) as e:
            ok = False
            what += f": {e}"
    check(ok, f"{what} gives {'one' if one else 'some'} valid call(s): {calls} {reason} {content!r}")
    return len(calls)


def test_tool_calls(c, rng, msgs, check, api_error):
    """tool_choice "required" / a named function: the reply is one or more tool calls (one with
    parallel_tool_calls false), to functions of the request (the named one), whose arguments
    validate against their parameters (jsonschema); streamed (arguments in fragments, the SDK's
    accumulation) equal to non-streamed for the same seed."""
    tools = [{"type": "function", "function": {"name": f"fn_{i}", "description": "a function",
                                               "parameters": random_schema(rng)}}
             for i in range(3)]
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for choice, parallel in [("required", None), ("fn_1", False), ("fn_2", True)]:
        seed = rng.randrange(1 << 30)
        tc = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
        extra = {} if parallel is None else {"parallel_tool_calls": parallel}
        both_ways(check, lambda stream: c.chat.completions.create(
            model="builtin", messages=msgs, tools=tools, tool_choice=tc, max_tokens=3000,
            seed=seed, stream=stream, logit_bias=NO_SPACE, **extra), params,
            f"tool_choice {choice} parallel={parallel} seed {seed}", parallel is False,
            None if choice == "required" else choice)
    test_parallel_calls(c, rng, msgs, tools, params, check)
    for tc, field, extra in [("sometimes", "tool_choice", {}),
                             ({"type": "function", "function": {"name": "nope"}},
                              "tool_choice.function.name", {}),
                             ("required", "parallel_tool_calls", {"parallel_tool_calls": 1})]:
        try:
            c.chat.completions.create(model="builtin", messages=msgs, tools=tools,
                                      tool_choice=tc, max_tokens=4, **extra)
            check(False, f"tool_choice {tc} {extra} is refused")
        except openai.BadRequestError as e:
            check(api_error(e).get("param") == field, f"400 names {field}: {api_error(e)}")
    try:
        c.chat.completions.create(model="builtin", messages=msgs, max_tokens=4,
                                  parallel_tool_calls=False)
        check(False, "parallel_tool_calls without tools is refused")
    except openai.BadRequestError as e:
        check(api_error(e).get("param") == "parallel_tool_calls", f"400 names it: {api_error(e)}")
    r = c.chat.completions.create(model="builtin", messages=msgs, tools=tools, tool_choice="none",
                                  max_tokens=4)
    check(not r.choices[0].message.tool_calls and r.choices[0].finish_reason in ("stop", "length"),
          f"tool_choice none answers text: {r.choices[0]}")
    t0 = time.time()
    test_auto_calls(c, rng, msgs, tools, check, api_error)
    print(f"tool_choice auto checks: {time.time() - t0:.1f} s")


def test_parallel_calls(c, rng, msgs, tools, params, check):
    """parallel_tool_calls on the same seeded tool_choice "required" request: true may give
    several calls (logit_bias +2 on ',' makes it likely; up to 6 seeds until one does), false
    exactly one, the first of true's (the same tokens until maxItems 1 closes the array)."""
    calls = {}
    for _ in range(6):
        seed = rng.randrange(1 << 30)
        for parallel in (True, False):
            r = c.chat.completions.create(model="builtin", messages=msgs, tools=tools,
                                          tool_choice="required", max_tokens=3000, seed=seed,
                                          logit_bias={**NO_SPACE, "44": 2},
                                          parallel_tool_calls=parallel)
            got = tool_call_of(r, False)
            check_calls(check, got, params, f"required parallel={parallel} seed {seed}",
                        not parallel)
            calls[parallel] = [(name, args) for _, name, args in got[0]]
        check(calls[False] == calls[True][:1],
              f"seed {seed}: parallel false's call is parallel true's first: {calls}")
        if len(calls[True]) > 1:
            break
    check(len(calls[True]) > 1, f"parallel_tool_calls true gave several calls: {calls}")


def test_auto_calls(c, rng, msgs, tools, check, api_error):
    """tool_choice auto on a server with --tool-call-parser llama3, where a reply that opens with
    '{' is calls: logit_bias on '{' (the byte tokenizer: token 123) makes the random model open
    with it, and from there the lazy grammar keeps it to calls of the request's functions
    separated by ';', whose arguments validate (jsonschema); streamed (arguments in fragments,
    the SDK's accumulation) equal to non-streamed for the same seed; one with
    parallel_tool_calls false. response_format with auto is a 400 naming it."""
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    counts = []
    for parallel in (None, False):
        seed = rng.randrange(1 << 30)
        extra = {} if parallel is None else {"parallel_tool_calls": parallel}
        counts.append(both_ways(check, lambda stream: c.chat.completions.create(
            model="builtin", messages=msgs, tools=tools, tool_choice="auto",
            logit_bias={"123": 100, **NO_SPACE}, max_tokens=3000, seed=seed, stream=stream,
            **extra), params, f"auto parallel={parallel} seed {seed}", parallel is False))
    print(f"auto: calls per reply {counts}")
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    for extra in ({"tool_choice": "auto"}, {}):
        try:
            c.chat.completions.create(model="builtin", messages=msgs, tools=tools, max_tokens=4,
                                      response_format=fmt, **extra)
            check(False, f"response_format with auto {extra} is refused")
        except openai.BadRequestError as e:
            check(api_error(e).get("param") == "response_format", f"400 names it: {api_error(e)}")
