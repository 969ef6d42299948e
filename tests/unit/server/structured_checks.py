"""Structured output (response_format) through `pagoda serve`, with the official `openai` client
(check_serve.py runs it on its builtin-model server). The builtin model has random weights: its
text is valid JSON, and matches the schema, only because the grammar constrains every token; the
`jsonschema` package (an independent validator) checks it."""
import json
import string
import time

import openai

try:
    import jsonschema
except ImportError:  # scripts/setup.sh installs it; without it the checks cannot run
    jsonschema = None


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
    # json_object: any JSON object.
    for _ in range(2):
        seed = rng.randrange(1 << 30)
        r = c.chat.completions.create(model="builtin", messages=msgs, max_tokens=3000, seed=seed,
                                      response_format={"type": "json_object"})
        text, reason = content_of(r, True, False)
        try:
            ok = isinstance(json.loads(text), dict) and reason == "stop"
        except ValueError:
            ok = False
        check(ok, f"json_object seed {seed} gives a JSON object: {reason} {text[:300]!r}")
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
    """(tool_calls as [(id, name, arguments text)], finish_reason) of choice 0."""
    if not stream:
        m = r.choices[0].message
        calls = [(t.id, t.function.name, t.function.arguments) for t in (m.tool_calls or [])]
        return calls, r.choices[0].finish_reason, m.content
    calls, reason, content = [], None, ""
    for ch in r:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for t in d.tool_calls or []:
            calls.append((t.id, t.function.name, t.function.arguments))
        reason = ch.choices[0].finish_reason or reason
    return calls, reason, content


def test_tool_calls(c, rng, msgs, check, api_error):
    """tool_choice "required" / a named function: the reply is one tool call, to a function of
    the request, whose arguments validate against its parameters (jsonschema)."""
    tools = [{"type": "function", "function": {"name": f"fn_{i}", "description": "a function",
                                               "parameters": random_schema(rng)}}
             for i in range(3)]
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for i, (choice, stream) in enumerate([("required", False), ("required", True),
                                          ("fn_1", False), ("fn_2", True)]):
        seed = rng.randrange(1 << 30)
        tc = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
        r = c.chat.completions.create(model="builtin", messages=msgs, tools=tools, tool_choice=tc,
                                      max_tokens=3000, seed=seed, stream=stream)
        calls, reason, content = tool_call_of(r, stream)
        what = f"tool_choice {choice} stream={stream} seed {seed}"
        ok = len(calls) == 1 and reason == "tool_calls" and not content and calls[0][0]
        if ok:
            _, name, args = calls[0]
            ok = name in params and (choice == "required" or name == choice)
            try:
                jsonschema.validate(json.loads(args), params.get(name, {}))
            except (ValueError, jsonschema.ValidationError) as e:
                ok = False
                what += f": {e}"
        check(ok, f"{what} gives one valid call: {calls} {reason} {content!r}")
    for tc, field in [("sometimes", "tool_choice"),
                      ({"type": "function", "function": {"name": "nope"}},
                       "tool_choice.function.name")]:
        try:
            c.chat.completions.create(model="builtin", messages=msgs, tools=tools,
                                      tool_choice=tc, max_tokens=4)
            check(False, f"tool_choice {tc} is refused")
        except openai.BadRequestError as e:
            check(api_error(e).get("param") == field, f"400 names {field}: {api_error(e)}")
    r = c.chat.completions.create(model="builtin", messages=msgs, tools=tools, tool_choice="none",
                                  max_tokens=4)
    check(not r.choices[0].message.tool_calls and r.choices[0].finish_reason in ("stop", "length"),
          f"tool_choice none answers text: {r.choices[0]}")
    t0 = time.time()
    test_auto_calls(c, rng, msgs, tools, check)
    print(f"tool_choice auto checks: {time.time() - t0:.1f} s")


def test_auto_calls(c, rng, msgs, tools, check):
    """tool_choice auto on a server with --tool-call-parser llama3, whose calls are a JSON object
    {"name", "parameters"}: response_format constrains the random model's reply to such an object
    (naming a function of `tools`, arguments from its schema), so the reply is a call that the
    parser must find: one tool call, arguments valid (jsonschema), no content, finish_reason
    tool_calls, streamed and not. The same object naming no function of `tools` stays text."""
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for i, (name, stream) in enumerate([("fn_0", False), ("fn_1", True), ("absent", False),
                                        ("absent", True)]):
        seed = rng.randrange(1 << 30)
        schema = {"type": "object", "properties": {"name": {"const": name},
                                                   "parameters": params.get(name, params["fn_2"])},
                  "required": ["name", "parameters"], "additionalProperties": False}
        fmt = {"type": "json_schema", "json_schema": {"name": f"call{i}", "schema": schema}}
        r = c.chat.completions.create(model="builtin", messages=msgs, tools=tools,
                                      tool_choice="auto", response_format=fmt, max_tokens=3000,
                                      seed=seed, stream=stream)
        calls, reason, content = tool_call_of(r, stream)
        what = f"auto with a {name} call object, stream={stream} seed {seed}"
        if name == "absent":
            try:
                ok = json.loads(content)["name"] == "absent" and not calls and reason == "stop"
            except (ValueError, KeyError, TypeError):
                ok = False
            check(ok, f"{what} is text: {calls} {reason} {content!r}")
            continue
        ok = len(calls) == 1 and reason == "tool_calls" and not content and calls[0][0]
        if ok:
            ok = calls[0][1] == name
            try:
                jsonschema.validate(json.loads(calls[0][2]), params[name])
            except (ValueError, jsonschema.ValidationError) as e:
                ok = False
                what += f": {e}"
        check(ok, f"{what} gives that call: {calls} {reason} {content!r}")
