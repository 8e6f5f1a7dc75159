"""A real pegad for the tests and the bench: built from this repository with
go build, started on a temp socket with ephemeral ports, stopped at the end.
"""

import json
import os
import signal
import subprocess
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def build(out_dir):
    """bin paths of pegad, pegactl and the Go client helper, built into
    out_dir (PEGAD_BIN_DIR: use the binaries there, except goclient)."""
    go = os.environ.get("GO", "go")
    bins = {}
    pre = os.environ.get("PEGAD_BIN_DIR")
    for name, pkg in (("pegad", "./cmd/pegad"), ("pegactl", "./cmd/pegactl"),
                      ("goclient", "./clients/python/tests/goclient")):
        path = os.path.join(out_dir, name)
        if pre and name != "goclient" and os.path.exists(os.path.join(pre, name)):
            bins[name] = os.path.join(pre, name)
            continue
        subprocess.run([go, "build", "-o", path, pkg], cwd=ROOT, check=True)
        bins[name] = path
    return bins


class Daemon:
    """One pegad process on a socket under its own temp dir."""

    def __init__(self, bins, name="pytest", pool_size="64MiB", extra=()):
        self.bins = bins
        self.dir = tempfile.mkdtemp(prefix=f"pegad-py-{name}-")
        self.socket = os.path.join(self.dir, "p.sock")
        self.log_path = os.path.join(self.dir, "pegad.log")
        self._args = [bins["pegad"], "--node-id", name, "--transport", "tcp", "--socket", self.socket,
                      "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                      "--tcp-data-listen", "127.0.0.1:0", "--pool-size", pool_size,
                      "--log-format", "json", *extra]
        self._log = open(self.log_path, "wb")
        self._start()

    def _start(self):
        self.proc = subprocess.Popen(self._args, stdout=self._log, stderr=subprocess.STDOUT)
        self.listen = self._wait_ready(60)

    def restart(self):
        """Stop pegad (SIGTERM, as systemctl restart does) and start a new
        one on the same socket: an empty pool, new ports."""
        self._terminate()
        self._log.truncate(0)  # _wait_ready looks for the new process's ready line
        self._log.seek(0)
        self._start()

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pegad exited {self.proc.returncode}: {self.log()}")
            for line in self.log().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("message") == "pegad ready" and os.path.exists(self.socket + ".data"):
                    return rec["listen"]
            time.sleep(0.05)
        raise RuntimeError(f"pegad not ready after {timeout}s: {self.log()}")

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def ctl(self, *args, check=True):
        """pegactl against this daemon; the CompletedProcess."""
        return subprocess.run([self.bins["pegactl"], "--socket", self.socket, "--timeout", "30s", *args],
                              capture_output=True, check=check)

    def stats(self):
        return json.loads(self.ctl("stats", "-o", "json").stdout)

    def _terminate(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stop(self):
        self._terminate()
        self._log.close()
        subprocess.run(["rm", "-rf", self.dir], check=False)


def wait_until(what, cond, timeout=20.0):
    """Poll cond until it returns true; fail with what after timeout (generous:
    the machine may be loaded)."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
