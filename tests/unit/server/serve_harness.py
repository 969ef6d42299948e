"""Starting and stopping `pagoda serve` for the tests and the benchmark (loopback only)."""
import json
import os
import re
import signal
import subprocess
import time
import urllib.request


class Server:
    """`pagoda serve --port 0 ...` in a child process; .url is its base URL."""

    def __init__(self, pagoda, *args, log=None):
        self.log = open(log, "w") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen([pagoda, "serve", "--port", "0", *args], stdout=subprocess.PIPE,
                                     stderr=self.log, text=True)
        deadline = time.time() + 600  # a large checkpoint loads (and captures graphs) first
        line = ""
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"pagoda serve exited with {self.proc.returncode}")
            m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
            if m:
                self.url = m.group(1)
                return
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
