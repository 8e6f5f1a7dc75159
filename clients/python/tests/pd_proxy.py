"""A P/D proxy and engine front ends over HTTP, for test_pd.py.

Proxy does what vLLM's toy proxy (tests/v1/kv_connector/nixl_integration/
toy_proxy_server.py) does with a completion: send it to the prefill
engine with kv_transfer_params {"do_remote_decode": true, remote_* null},
max_tokens 1 and no streaming; copy the kv_transfer_params of the answer
(when there are any) into the original request; send that to the decode
engine and return its answer. EngineServer puts a tinyengine.Engine behind
POST /v1/completions (prompt as token ids), so the parameters cross two
real JSON encodings as they do between vLLM servers. Loopback only.
"""

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np


def post(url, body, timeout=300):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class _Server:
    """A one-thread HTTP server on 127.0.0.1 (an ephemeral port) whose POST
    /v1/completions answers handle(body)."""

    def __init__(self, handle):
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                if self.path != "/v1/completions":
                    self.send_error(404)
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    out, code = json.dumps(handle(body)).encode(), 200
                except Exception as e:  # the test sees it as a 500 with the message
                    out, code = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode(), 500
                    outer.errors.append(e)
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.errors = []
        self.httpd = HTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/completions"
        self._t = threading.Thread(target=self.httpd.serve_forever, name="pd-http", daemon=True)
        self._t.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self._t.join(10)


class EngineServer(_Server):
    """engine (a tinyengine.Engine) behind HTTP. The answer carries the
    generated token ids, the kv_transfer_params request_finished returned,
    and (for the test) the logits of every position this engine computed."""

    def __init__(self, engine):
        self.engine = engine
        self._n = 0
        super().__init__(self._complete)

    def _complete(self, body):
        self._n += 1
        rid = body.get("request_id") or f"req-{self._n}"
        max_tokens = int(body.get("max_tokens", 1))
        out, gen = self.engine.serve(rid, body["prompt"], decode=max_tokens - 1,
                                     kv_transfer_params=body.get("kv_transfer_params"))
        last = max(out)
        tokens = gen + [int(np.argmax(out[last]))]
        return {"id": rid, "choices": [{"token_ids": tokens}],
                "kv_transfer_params": self.engine.transfer_params.get(rid),
                "logits": {str(p): [float(x) for x in v] for p, v in out.items()}}


class Proxy(_Server):
    """The toy proxy's two hops: prefill (max_tokens 1), then decode with
    the parameters the prefill answered."""

    def __init__(self, prefill_url, decode_url, between=None):
        """between(prefill answer), when given, runs between the two hops
        (the tests' faults)."""
        self.prefill_url, self.decode_url = prefill_url, decode_url
        self.between = between
        self.prefill_answers = []
        super().__init__(self._route)

    def _route(self, body):
        p = dict(body)
        p["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                   "remote_block_ids": None, "remote_host": None, "remote_port": None}
        p["stream"] = False
        p["max_tokens"] = 1
        answer = post(self.prefill_url, p)
        self.prefill_answers.append(answer)
        if self.between is not None:
            self.between(answer)
        d = dict(body)
        if answer.get("kv_transfer_params"):
            d["kv_transfer_params"] = answer["kv_transfer_params"]
        return post(self.decode_url, d)
