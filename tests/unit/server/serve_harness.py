"""Starting and stopping `pagoda serve` for the tests and the benchmark (loopback only)."""
import json
import os
import re
import signal
import subprocess
import time
import urllib.request


def large_bodies(size, count):
    """`count` request bodies of about `size` bytes each, cycling through the shapes that cost a
    JSON parser the most memory: a wide object under a field the server does not implement, a
    deep nesting inside a known field, a chat of many tiny messages (a large tree, then a prompt
    longer than the context) and one large string in a known field. Returns (path, body) pairs."""
    n_keys = size // 15
    wide = json.dumps({"model": "builtin", "prompt": "x", "max_tokens": 1,
                       "metadata": {f"k{i}": 1 for i in range(n_keys)}}).encode()
    depth = (size - 100) // 2
    deep = (b'{"model":"builtin","messages":[{"role":"user","content":' + b"[" * depth +
            b"]" * depth + b"}]}")
    n_msgs = size // 37
    chat = json.dumps({"model": "builtin", "max_tokens": 1,
                       "messages": [{"role": "user", "content": "hi"}] * n_msgs}).encode()
    string = json.dumps({"model": "builtin", "prompt": "x", "max_tokens": 1,
                         "user": "u" * (size - 100)}).encode()
    shapes = [("/v1/completions", wide), ("/v1/chat/completions", deep),
              ("/v1/chat/completions", chat), ("/v1/completions", string)]
    return [shapes[i % len(shapes)] for i in range(count)]


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


class Metrics:
    """The samples of a Prometheus text-format (0.0.4) page such as /metrics serves, for the
    tests and the benchmarks without a client library (check_serve.py checks this parser
    against prometheus_client's on the server's page). Comments and blank lines are skipped."""

    def __init__(self, text):
        self.samples = []  # (name, {label: value}, value)
        for line in text.splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            m = _SAMPLE.match(line)
            if m is None:
                raise ValueError(f"not a Prometheus sample line: {line!r}")
            labels = {k: re.sub(r"\\(.)", lambda e: "\n" if e[1] == "n" else e[1], v)
                      for k, v in _LABEL.findall(m[2] or "")}
            self.samples.append((m[1], labels, float(m[3])))

    def get(self, name, default=0.0, **labels):
        """The sum of the samples `name` whose labels include `labels` (a counter over all its
        label values, one bucket with le="+Inf", ...); `default` when there is none."""
        values = [v for n, ls, v in self.samples
                  if n == name and all(ls.get(k) == w for k, w in labels.items())]
        return sum(values) if values else default

    def __contains__(self, name):
        return any(n == name for n, _, _ in self.samples)

    def by_label(self, name, label):
        """{value of `label`: sample value} over the samples `name` that have `label`."""
        return {ls[label]: v for n, ls, v in self.samples if n == name and label in ls}


def proc_memory(pid):
    """(resident bytes, peak resident bytes) of process `pid` from /proc/PID/status."""
    fields = {}
    for line in open(f"/proc/{pid}/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def large_body_memory(server, headers, size=8_000_000, count=30, concurrency=1):
    """Sends large_bodies(size, count) to `server` (a Server), `concurrency` at a time, and returns
    {"idle", "after", "peak" (bytes), "statuses"}: resident memory before and after (once the
    server is idle again) and the process's peak."""
    from concurrent.futures import ThreadPoolExecutor
    idle, _ = proc_memory(server.proc.pid)
    bodies = large_bodies(size, count)
    with ThreadPoolExecutor(concurrency) as pool:
        statuses = list(pool.map(lambda pb: server.post(pb[0], pb[1], headers)[0], bodies))
    server.wait_idle(30)
    after, peak = proc_memory(server.proc.pid)
    return {"idle": idle, "after": after, "peak": peak, "statuses": statuses}


class Server:
    """`pagoda serve --port 0 ...` (or another listening command, e.g. `router`) in a child
    process; .url is its base URL. With wait=False, call started() before using it (several
    servers then start in parallel)."""

    def __init__(self, pagoda, *args, log=None, command="serve", wait=True):
        self.log = open(log, "w") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen([pagoda, command, "--port", "0", *args], stdout=subprocess.PIPE,
                                     stderr=self.log, text=True)
        if wait:
            self.started()

    def started(self):
        """Waits for the "listening on" line; returns self."""
        deadline = time.time() + 600  # a large checkpoint loads (and captures graphs) first
        line = ""
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"pagoda serve exited with {self.proc.returncode}")
            m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
            if m:
                self.url = m.group(1)
                return self
        raise RuntimeError(f"pagoda serve did not start: {line!r}")

    def get_json(self, path, headers=None):
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def get_text(self, path):
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return r.read().decode()

    def metrics(self):
        """/metrics now, parsed (Metrics)."""
        return Metrics(self.get_text("/metrics"))

    def metric(self, name, **labels):
        """The sum of the /metrics samples `name` whose labels include `labels` (0 when none)."""
        return self.metrics().get(name, **labels)

    def post(self, path, body, headers=None):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def wait_idle(self, timeout=20.0):
        """Polls /health until nothing is in flight; returns the last health object."""
        deadline = time.time() + timeout
        while True:
            _, h = self.get_json("/health")
            if h.get("inflight") == 0 and h.get("running") == 0 and h.get("waiting") == 0:
                return h
            if time.time() > deadline:
                return h
            time.sleep(0.05)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
