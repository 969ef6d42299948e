#!/usr/bin/env python3
"""Prefill–decode disaggregation on loopback: `pagoda serve --disaggregation-mode prefill` and
`decode` pairs behind `pagoda router`, against colocated `pagoda serve` (docs/design/pd.md).

Checks, against references that are not the disaggregated code path:
  * a mixed workload (short and long prompts, shared prefixes, max_tokens 1 to 16, streamed and
    not, concurrent) through routers over pairs of page size 16 and 1 gives the greedy text and
    finish reason of a colocated server of the same page size; a seeded sampled request too;
  * the official `openai` client through the router (completions, streamed chat) equals the
    colocated server; prompts sharing a prefix reuse the decode server's cached pages (counted)
    and still equal it;
  * both sides count the same KV bytes and completed rooms in /metrics (serve_harness.Metrics);
  * handshake: a page-size mismatch fails the request with a 502 naming "page size"; a decode
    server without the router's headers answers 400; n = 2 is a 400 naming n;
  * rejections, counted: a duplicate room (409), an unknown room (/pd/abort, 404), a fake
    prefill server answering a short transfer, a corrupt one (checksum) and the wrong room; a
    fake prefill server that stalls past the room timeout (504, abort notice, pages freed);
  * kill -9 of the prefill server mid-prefill: the client gets an error through the router, the
    decode server frees the room (failure counted); kill -9 of the decode server mid-stream: the
    stream ends with an error event; kill -9 of the decode server mid-prefill: the prefill server
    frees its side;
  * the KV goes through pinned staging on both sides: the page size 16 prefill server's staging
    holds 4 pages, so its rooms go in chunks (and still equal the colocated server); a decode
    server whose staging is smaller than a room refuses it with a 400 naming the flag (counted);
  * after everything: every surviving server idle with 0 leaked pages and rows, every page free
    or cached, every staging page free, no room left in any state.
A missing `openai` package is a FAILURE, not a skip.
Usage: check_pd.py --pagoda build/pagoda [--seed N]
"""
import argparse
import concurrent.futures
import http.client
import json
import pathlib
import random
import signal
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from serve_harness import Server  # noqa: E402

openai = None


def import_clients():
    """Imports openai (slow: done while the servers start)."""
    global openai
    try:
        import openai as client
    except ImportError as e:
        print(f"FAIL: {e}; scripts/setup.sh installs openai")
        return False
    openai = client
    return True

failures = []
POOL = ["--pool-tokens", "16384"]
LONG = 1600  # prompt bytes of the kill tests: a prefill of ~0.5 s on the builtin CPU model


def section(t0, what):
    print(f"{time.time() - t0:6.1f} s  {what}")


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def request(url, body, headers=None, path="/v1/completions"):
    """POST `body`; returns (status, text, finish_reason, error). Streams are read event by event
    (an error event sets `error`)."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    if r.status != 200 or not body.get("stream"):
        data = json.loads(r.read() or b"{}")
        conn.close()
        if r.status != 200:
            return r.status, None, None, data.get("error", {}).get("message", "")
        c = data["choices"][0]
        return 200, c.get("text", c.get("message", {}).get("content")), c["finish_reason"], None
    text, reason, error = "", None, None
    try:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                error = ev["error"]["message"]
                continue
            for ch in ev["choices"]:
                text += ch.get("text", ch.get("delta", {}).get("content", "")) or ""
                reason = ch["finish_reason"] or reason
    except (http.client.HTTPException, OSError) as e:
        error = f"connection: {e}"
    conn.close()
    return 200, text, reason, error


def rooms_live(server):
    return server.metric("pagoda_pd_rooms")


def check_accounted(server, what, timeout=15.0):
    """Idle, no room live, 0 leaked pages / rows, every page free or cached."""
    deadline = time.time() + timeout
    while rooms_live(server) > 0 and time.time() < deadline:
        time.sleep(0.05)
    h = server.wait_idle(max(1.0, deadline - time.time()))
    check(rooms_live(server) == 0, f"{what}: no room left ({rooms_live(server)})")
    check(h.get("inflight") == 0 and h.get("leaked_pages") == 0 and h.get("leaked_rows") == 0,
          f"{what}: idle without leaks: {h}")
    check(h.get("kv_pages_free", -1) + h.get("kv_pages_cached", -1) == h.get("kv_pages_total"),
          f"{what}: every page free or cached: {h}")
    m = server.metrics()
    staging = (m.get("pagoda_pd_staging_pages", state="free"),
               m.get("pagoda_pd_staging_pages", state="total"))
    check(staging[0] == staging[1], f"{what}: every staging page free: {staging}")


def random_text(rng, n):
    return "".join(rng.choice("abcdefghij klmnopqrstuvwxyz,.") for _ in range(n))


def workload(rng, n):
    """Requests: short, long, shared-prefix prompts; max_tokens 1..16; streamed or not."""
    base = random_text(rng, 300)
    out = []
    for i in range(n):
        kind = i % 3
        prompt = (random_text(rng, rng.randint(1, 12)) if kind == 0 else
                  random_text(rng, rng.randint(300, 700)) if kind == 1 else
                  base + random_text(rng, rng.randint(1, 40)))
        out.append({"model": "builtin", "prompt": prompt, "max_tokens": rng.choice([1, 2, 7, 16]),
                    "temperature": 0, "ignore_eos": True, "stream": rng.random() < 0.5})
    return out


def test_equal_outputs(rng, router, colocated, what):
    reqs = workload(rng, 12)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda b: request(router.url, b), reqs))
        want = list(pool.map(lambda b: request(colocated.url, b), reqs))
    for b, g, w in zip(reqs, got, want):
        check(g[0] == 200 and g[3] is None, f"{what}: request answered: {g}")
        check(g[1:3] == w[1:3], f"{what}: prompt of {len(b['prompt'])} bytes, max_tokens "
              f"{b['max_tokens']}, stream {b['stream']}: {g[1:3]!r} != colocated {w[1:3]!r}")
    body = {"model": "builtin", "prompt": "Seeded sampling", "max_tokens": 12, "temperature": 0.9,
            "seed": 1234, "ignore_eos": True}
    check(request(router.url, body)[1] == request(colocated.url, body)[1],
          f"{what}: seeded sampled text equals the colocated server's")


def test_prefix_reuse(rng, router, colocated, decode):
    """Sequential prompts sharing a long prefix: the decode server reuses the prefix's pages from
    its own radix cache (counted, not transferred) and the text still equals the colocated one."""
    base = random_text(rng, 330)
    before = decode.metric("pagoda_pd_reused_pages_total")
    for suffix in ("one", "two", "three"):
        body = {"model": "builtin", "prompt": base + suffix, "max_tokens": 5, "temperature": 0,
                "ignore_eos": True}
        check(request(router.url, body)[1] == request(colocated.url, body)[1],
              f"prefix reuse: text of suffix {suffix!r} equals the colocated server's")
    reused = decode.metric("pagoda_pd_reused_pages_total") - before
    check(reused >= 2 * (330 // 16), f"prefix reuse: {reused} pages reused on the decode server")


def test_openai_client(router, colocated):
    clients = [openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=60)
               for s in (router, colocated)]
    texts = []
    for c in clients:
        r = c.completions.create(model="builtin", prompt="The quick brown fox", max_tokens=10,
                                 temperature=0, extra_body={"ignore_eos": True})
        chat = c.chat.completions.create(model="builtin", max_tokens=8, temperature=0, stream=True,
                                         messages=[{"role": "user", "content": "Hi there"}],
                                         extra_body={"ignore_eos": True})
        texts.append((r.choices[0].text, "".join(ch.choices[0].delta.content or ""
                                                 for ch in chat if ch.choices)))
    check(texts[0] == texts[1], f"openai client through the router: {texts[0]} != {texts[1]}")
    models = clients[0].models.list()
    check([m.id for m in models.data] == ["builtin"], "/v1/models through the router")


def test_handshake_errors(p16, d16, d1, router):
    s, _, _, err = request(d1.url, {"model": "builtin", "prompt": "hello", "max_tokens": 2},
                           {"X-Pagoda-Bootstrap-Room": "5", "X-Pagoda-Bootstrap-Url": p16.url})
    check(s == 502 and "page size" in err, f"page-size mismatch named: {s} {err}")
    check(p16.metric("pagoda_pd_rejected_total", reason="layout_mismatch") == 1,
          "layout mismatch counted on the prefill side")
    s, _, _, err = request(d16.url, {"model": "builtin", "prompt": "hello", "max_tokens": 2})
    check(s == 400 and "router" in err, f"decode server without the router's headers: {s} {err}")
    s, _, _, err = request(router.url, {"model": "builtin", "prompt": "hello", "max_tokens": 2,
                                        "n": 2})
    check(s == 400 and "n 1" in err, f"n = 2 through the router: {s} {err}")
    # Unknown room: an abort for a room the prefill server does not hold.
    s, _ = p16.post("/pd/abort", {"room": 4242})
    check(s == 404 and p16.metric("pagoda_pd_rejected_total", reason="unknown_room") == 1,
          f"unknown room rejected and counted ({s})")
    # Duplicate room: a second request with a live room id.
    hdr = {"X-Pagoda-Bootstrap-Room": "777", "X-Pagoda-Bootstrap-Url": p16.url}
    long_body = {"model": "builtin", "prompt": "y" * LONG, "max_tokens": 2}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(request, d16.url, long_body, hdr)
        deadline = time.time() + 10
        while rooms_live(d16) == 0 and time.time() < deadline:
            time.sleep(0.01)
        s, _, _, err = request(d16.url, {"model": "builtin", "prompt": "z", "max_tokens": 2}, hdr)
        check(s == 409 and d16.metric("pagoda_pd_rejected_total", reason="duplicate_room") == 1,
              f"duplicate room rejected and counted: {s} {err}")
        check(first.result()[0] == 200, "the first request of the room still completes")


class FakePrefill(BaseHTTPRequestHandler):
    """A prefill server that writes nothing and answers per `mode`: short, corrupt, room, or
    stall (answers after 1.5 s); it records the rooms of the /pd/abort notices it gets."""
    mode = "short"
    aborted = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/pd/abort":
            FakePrefill.aborted.append(body["room"])
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if FakePrefill.mode == "stall":
            time.sleep(1.5)
        lay = body["layout"]
        per_page = 2 * lay["num_layers"] * lay["page_size"] * lay["num_kv_heads"] * lay["head_dim"] * 4
        full = per_page * len(body["pages"])  # the staging pages of prompt pages start_page...
        ans = {"room": body["room"] + (1 if FakePrefill.mode == "room" else 0), "first_token": 65,
               "bytes": full - (per_page if FakePrefill.mode == "short" else 0), "checksum": 12345}
        data = json.dumps(ans).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the decode server gave up on a stalled room
            pass

    def log_message(self, *args):
        pass


def test_bad_transfers(d16, d_quick, p16):
    fake = ThreadingHTTPServer(("127.0.0.1", 0), FakePrefill)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{fake.server_address[1]}"
    for i, (mode, reason) in enumerate([("short", "short_transfer"), ("corrupt", "corrupt_transfer"),
                                        ("room", "unknown_room")]):
        FakePrefill.mode = mode
        s, _, _, err = request(d16.url, {"model": "builtin", "prompt": "x" * (40 + i), "max_tokens": 3},
                               {"X-Pagoda-Bootstrap-Room": str(900 + i), "X-Pagoda-Bootstrap-Url": url})
        check(s == 502 and d16.metric("pagoda_pd_rejected_total", reason=reason) == 1,
              f"{mode} transfer rejected and counted: {s} {err}")
    # A prefill server that stalls past the room timeout (1 s on d_quick): 504, the pages freed,
    # the failure counted and an abort notice sent for the room.
    FakePrefill.mode = "stall"
    s, _, _, err = request(d_quick.url, {"model": "builtin", "prompt": "stall", "max_tokens": 3},
                           {"X-Pagoda-Bootstrap-Room": "31337", "X-Pagoda-Bootstrap-Url": url})
    check(s == 504 and d_quick.metric("pagoda_pd_room_failures_total", reason="timeout") == 1,
          f"stalled prefill: the room times out: {s} {err}")
    check(wait_for(lambda: FakePrefill.aborted == [31337], 2), "stalled prefill: abort notice sent")
    check_accounted(d_quick, "decode server after a stalled prefill")
    fake.shutdown()
    # A room larger than the decode server's staging (16 pages on d_quick): refused, counted.
    s, _, _, err = request(d_quick.url, {"model": "builtin", "prompt": "s" * 600, "max_tokens": 2},
                           {"X-Pagoda-Bootstrap-Room": "31338", "X-Pagoda-Bootstrap-Url": p16.url})
    check(s == 400 and "--disaggregation-staging-tokens" in err and
          d_quick.metric("pagoda_pd_room_failures_total", reason="staging_too_small") == 1,
          f"room larger than the decode staging refused: {s} {err}")
    check_accounted(d_quick, "decode server after a room larger than its staging")


def wait_for(cond, timeout=10.0):
    deadline = time.time() + timeout
    while not cond() and time.time() < deadline:
        time.sleep(0.01)
    return cond()


def test_kills(pagoda, pk, dk, pk2, dk3):
    """pk, dk, pk2, dk3: started prefill, decode, prefill, decode servers (killed here)."""
    rk, rk2, rk3 = [Server(pagoda, "--prefill", p.url, "--decode", d.url, command="router",
                           wait=False) for p, d in ((pk, dk), (pk2, dk), (pk2, dk3))]
    for s in (rk, rk2, rk3):
        s.started()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        # 1. The prefill server dies mid-prefill.
        f = pool.submit(request, rk.url, {"model": "builtin", "prompt": "p" * LONG, "max_tokens": 4})
        check(wait_for(lambda: pk.metric("pagoda_pd_rooms", state="prefilling") == 1),
              "prefill kill: the room reached the prefill server")
        pk.proc.send_signal(signal.SIGKILL)
        s, _, _, err = f.result()
        check(s == 502, f"prefill killed: the client gets an error ({s} {err})")
        check(dk.metric("pagoda_pd_room_failures_total", reason="prefill_lost") >= 1,
              "prefill killed: the decode server counts the lost room")
        check_accounted(dk, "decode server after the prefill server died")
        # 2. The decode server dies mid-stream.
        events = []
        body = {"model": "builtin", "prompt": "d", "max_tokens": 3000, "ignore_eos": True,
                "stream": True}
        f = pool.submit(request, rk2.url, body)
        check(wait_for(lambda: dk.metric("pagoda_pd_rooms_completed_total") >= 1),
              "decode kill: the stream started")
        time.sleep(0.2)
        dk.proc.send_signal(signal.SIGKILL)
        s, text, _, err = f.result()
        events.append(err)
        check(s == 200 and text and err and "failed mid-stream" in err,
              f"decode killed mid-stream: the stream ends with an error event ({s} {err})")
        check_accounted(pk2, "prefill server after the decode server died mid-stream")
        # 3. The decode server dies while the prefill server prefills its room.
        f = pool.submit(request, rk3.url, {"model": "builtin", "prompt": "q" * LONG, "max_tokens": 4})
        check(wait_for(lambda: pk2.metric("pagoda_pd_rooms", state="prefilling") == 1),
              "decode kill mid-prefill: the room reached the prefill server")
        dk3.proc.send_signal(signal.SIGKILL)
        s, _, _, err = f.result()
        check(s == 502, f"decode killed mid-prefill: the client gets an error ({s} {err})")
        check_accounted(pk2, "prefill server after the decode server died mid-prefill")
        check(pk2.metric("pagoda_pd_room_failures_total") >= 1,
              "decode killed mid-prefill: the prefill server counts the failed room")
    stop_all([rk, rk2, rk3, pk2])


def stop_all(servers):
    """SIGTERM to every server, then wait for each (they drain in parallel)."""
    for s in servers:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGTERM)
    for s in servers:
        s.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    args = ap.parse_args()
    print(f"seed {args.seed}")
    rng = random.Random(args.seed)
    t0 = time.time()
    servers = {}
    for ps in ("16", "1"):
        for mode in ("null", "prefill", "decode"):
            # The page size 16 prefill server sends in chunks of a 4-page staging.
            staging = ["--disaggregation-staging-tokens", "64"] if (ps, mode) == ("16", "prefill") else []
            servers[(ps, mode)] = Server(args.pagoda, *POOL, "--page-size", ps,
                                         "--disaggregation-mode", mode, *staging, wait=False)
    servers[("16", "quick")] = Server(args.pagoda, *POOL, "--disaggregation-mode", "decode",
                                      "--disaggregation-timeout", "1",
                                      "--disaggregation-staging-tokens", "256", wait=False)
    doomed = [Server(args.pagoda, *POOL, "--disaggregation-mode", m, wait=False)
              for m in ("prefill", "decode", "prefill", "decode")]
    if not import_clients():
        stop_all(list(servers.values()) + doomed)
        return 1
    for s in list(servers.values()) + doomed:
        s.started()
    routers = {ps: Server(args.pagoda, "--prefill", servers[(ps, "prefill")].url, "--decode",
                          servers[(ps, "decode")].url, "--policy",
                          "least_load" if ps == "1" else "round_robin", command="router")
               for ps in ("16", "1")}
    section(t0, "started")
    try:
        for ps in ("16", "1"):
            test_equal_outputs(rng, routers[ps], servers[(ps, "null")], f"page size {ps}")
            section(t0, f"page size {ps} workload")
        test_openai_client(routers["16"], servers[("16", "null")])
        test_prefix_reuse(rng, routers["16"], servers[("16", "null")], servers[("16", "decode")])
        p16, d16 = servers[("16", "prefill")], servers[("16", "decode")]
        for name in ("pagoda_pd_transfer_bytes_total", "pagoda_pd_rooms_completed_total"):
            check(p16.metric(name) == d16.metric(name) and p16.metric(name) > 0,
                  f"{name}: prefill {p16.metric(name)} == decode {d16.metric(name)}")
        test_handshake_errors(p16, d16, servers[("1", "decode")], routers["16"])
        test_bad_transfers(d16, servers[("16", "quick")], p16)
        section(t0, "errors")
        test_kills(args.pagoda, *doomed)
        section(t0, "kills")
        for key, s in servers.items():
            check_accounted(s, f"page size {key[0]}, {key[1]} server at the end")
    finally:
        stop_all(list(routers.values()) + list(servers.values()) + doomed)
    print(f"{len(failures)} failure(s) in {time.time() - t0:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
