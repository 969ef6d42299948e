#!/usr/bin/env python3
"""pagoda's chat-template renderer against Python's jinja2 (the oracle), configured as
transformers' apply_chat_template configures it (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, raise_exception, a tojson without key sorting).

For every template in chat_templates/ (Llama-3, Qwen2, Mistral v0.2 / v0.3, a features template
and a tool-use template) it renders random conversations made from a printed seed: random roles (sometimes
breaking the alternation a template requires, sometimes unknown roles), contents with white
space at both ends, newlines, quotes, braces, Jinja delimiters, Unicode; with and without
add_generation_prompt. pagoda must give the same text, or an error exactly when jinja2 raises.
For the tool-use template it also renders random chat requests with tool turns (tools,
assistant tool_calls, tool answers) parsed by the server's request parser, against the context
transformers / vLLM / SGLang build from the same request (template_view).
A missing jinja2 is a FAILURE, not a skip.
Usage: check_chat_templates.py --tool build/.../template_render_tool [--seed N] [--cases N]
"""
import argparse
import json
import pathlib
import random
import subprocess
import sys

try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:
    print(f"FAIL: jinja2 cannot be imported ({e}); scripts/setup.sh installs it")
    sys.exit(1)

HERE = pathlib.Path(__file__).resolve().parent
PIECES = ["hello", "a", " ", "  ", "\n", "\t", "'", '"', "{{ x }}", "{% if %}", "[INST]", "<|im_end|>",
          "é", "日本語", "🙂", "\u00a0", "\u3000", "\x1f", "\\n", "}", "{", "#", "a b  c", "world", "0", "-", "%"]
ROLES = ["system", "user", "assistant"]


def hf_env():
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def random_content(rng):
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 8)))


def random_conversation(rng):
    n = rng.randint(1, 7)
    msgs = []
    if rng.random() < 0.4:
        msgs.append({"role": "system", "content": random_content(rng)})
    for i in range(n):
        if rng.random() < 0.85:  # usually alternating user / assistant
            role = "user" if i % 2 == 0 else "assistant"
        else:
            role = rng.choice(ROLES + ["tool", "critic"])
        msgs.append({"role": role, "content": random_content(rng)})
    return msgs


def random_tool_chat(rng):
    """A random chat request with tool turns (OpenAI's shape): tools, assistant turns with
    tool_calls (content null, absent or text; arguments JSON text of an object, or not JSON),
    tool answers with tool_call_id."""
    def tool(i):
        fn = {"name": f"fn_{i}", "description": random_content(rng)}
        if rng.random() < 0.7:  # keys in a random order: the template sees the client's order
            fn["parameters"] = {"type": "object", "properties": {"z": {"type": "string"},
                                                                 "a": {"type": "integer"}}}
        items = list(fn.items())
        rng.shuffle(items)
        return {"type": "function", "function": dict(items)}

    def call(k):
        if rng.random() < 0.8:
            args = {rng.choice(["city", "z", "a", "日"]): rng.choice([random_content(rng), 3, [1, None]])
                    for _ in range(rng.randint(0, 3))}
            text = json.dumps(args, ensure_ascii=rng.random() < 0.5)
        else:
            text = rng.choice(["not json", "[1, 2]", "{\"a\": 1"])
        return {"id": f"call_{k}", "type": "function",
                "function": {"name": f"fn_{rng.randint(0, 2)}", "arguments": text}}

    msgs = [{"role": "user", "content": random_content(rng)}]
    for k in range(rng.randint(1, 4)):
        turn = {"role": "assistant", "tool_calls": [call(f"{k}_{j}") for j in range(rng.randint(1, 2))]}
        r = rng.random()
        if r < 0.4:
            turn["content"] = None
        elif r < 0.7:
            turn["content"] = random_content(rng)
        msgs.append(turn)
        for c in turn["tool_calls"]:
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": random_content(rng)})
    body = {"messages": msgs}
    if rng.random() < 0.8:
        body["tools"] = [tool(i) for i in range(rng.randint(1, 3))]
    return body


def template_view(body):
    """The template context's messages and tools for a chat request, as transformers / vLLM /
    SGLang build it: tool_calls' arguments parsed into an object when they are a JSON object,
    null content kept, absent content null when there are tool_calls."""
    msgs = []
    for m in body["messages"]:
        out = {"role": m["role"], "content": m.get("content")}
        if "tool_calls" in m:
            out["tool_calls"] = json.loads(json.dumps(m["tool_calls"]))
            for c in out["tool_calls"]:
                try:
                    args = json.loads(c["function"]["arguments"])
                except ValueError:
                    args = None
                if isinstance(args, dict):
                    c["function"]["arguments"] = args
        if "tool_call_id" in m:
            out["tool_call_id"] = m["tool_call_id"]
        msgs.append(out)
    view = {"messages": msgs}
    if "tools" in body:
        view["tools"] = body["tools"]
    return view


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    ap.add_argument("--cases", type=int, default=300)
    args = ap.parse_args()
    print(f"seed {args.seed}")
    rng = random.Random(args.seed)
    env = hf_env()
    templates = sorted((HERE / "chat_templates").glob("*.jinja"))
    assert len(templates) >= 4, templates
    inputs, expected = [], []
    for path in templates:
        tmpl = env.from_string(path.read_text())
        for _ in range(args.cases):
            ctx = {"messages": random_conversation(rng),
                   "bos_token": rng.choice(["<s>", "<|begin_of_text|>", ""]),
                   "eos_token": rng.choice(["</s>", "<|eot_id|>"]),
                   "add_generation_prompt": rng.random() < 0.5}
            try:
                want = {"ok": True, "text": tmpl.render(**ctx)}
            except jinja2.exceptions.TemplateError as e:  # raise_exception: same message
                want = {"ok": False, "error": str(e), "raised": True}
            except Exception as e:  # a type error etc.: any error will do
                want = {"ok": False, "error": str(e), "raised": False}
            inputs.append({"template": str(path), "context": ctx})
            expected.append(want)
        if path.name != "tools.jinja":
            continue
        for _ in range(args.cases):  # chat requests with tool turns, through the request parser
            body = random_tool_chat(rng)
            ctx = {"bos_token": "<s>", "eos_token": "</s>",
                   "add_generation_prompt": rng.random() < 0.5}
            want = {"ok": True, "text": tmpl.render(**ctx, **template_view(body))}
            inputs.append({"template": str(path), "chat": body, "context": ctx})
            expected.append(want)
    out = subprocess.run([args.tool], input="\n".join(json.dumps(x) for x in inputs) + "\n",
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(out) == len(inputs), (len(out), len(inputs))
    failures = 0
    stats = {}
    for inp, want, line in zip(inputs, expected, out):
        got = json.loads(line)
        name = pathlib.Path(inp["template"]).name
        s = stats.setdefault(name, [0, 0])
        s[0 if want["ok"] else 1] += 1
        same = got["ok"] == want["ok"] and (not want["ok"] or got["text"] == want["text"])
        if same and not want["ok"] and want["raised"]:
            same = got["error"] == want["error"]
        if not same:
            failures += 1
            if failures <= 5:
                print(f"MISMATCH {name}\n context: {json.dumps(inp['context'], ensure_ascii=False)}\n"
                      f" jinja2: {want!r}\n pagoda: {got!r}")
    for name, (ok, err) in sorted(stats.items()):
        print(f"{name}: {ok} rendered, {err} raised")
    if failures:
        print(f"FAIL: {failures} of {len(inputs)} renders differ (seed {args.seed})")
        return 1
    print(f"OK: {len(inputs)} renders identical to jinja2 (seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
