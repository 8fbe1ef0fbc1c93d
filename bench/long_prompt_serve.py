#!/usr/bin/env python3
"""A long prompt through `moonrun serve` while other streams decode (issue #35).

Starts the server on a model and first sends one prompt of --prompt-tokens token ids alone
(nothing else running) and times its first token: the TTFT alone (--no-ttft-alone skips it).
Then it opens --streams streaming completions (short prompts, long outputs) and records when
each of their tokens arrives; after --alone-s seconds it sends another prompt of as many
(different) token ids and times its first token (TTFT), printed beside the TTFT alone.
While that prompt prefills, the streams keep decoding: their inter-token latency during the
prefill is printed beside their latency alone (p50 / p99 / max). Then a short request checks
that the server still serves, and everything is written to --json-out.

    python3 bench/long_prompt_serve.py --exe build/moonrun --model /tmp/k3-slice \\
        --prompt-tokens 1048576 --streams 8 --json-out long.json \\
        --server-arg=--max-prefill-step-ms --server-arg=30

Standard library only (runs on the GPU machine as it is).
"""
import argparse
import http.client
import socket
import json
import random
import subprocess
import sys
import threading
import time


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


MODEL = None  # the served name, from /v1/models


def post(port, path, body, timeout):
    body = dict(body, model=MODEL)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


class Stream(threading.Thread):
    """One streaming completion: the arrival time of every token event."""

    def __init__(self, port, prompt, max_tokens, stop):
        super().__init__(daemon=True)
        self.port, self.prompt, self.max_tokens, self.stop = port, prompt, max_tokens, stop
        self.times, self.error = [], None

    def run(self):
        try:
            conn, resp = post(self.port, "/v1/completions",
                              {"prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0,
                               "ignore_eos": True, "stream": True, "return_token_ids": True}, timeout=3600)
            if resp.status != 200:
                self.error = "HTTP %d: %s" % (resp.status, resp.read()[:300])
                return
            while not self.stop.is_set():
                line = resp.readline()
                if not line:
                    break
                if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                    self.times.append(time.monotonic())
            conn.close()
        except Exception as e:  # noqa: BLE001 - reported in the table
            self.error = repr(e)


def gaps(times, t0, t1):
    """Inter-token gaps of the tokens that arrived in [t0, t1)."""
    ts = [t for t in times if t0 <= t < t1]
    return [b - a for a, b in zip(ts, ts[1:])]


def long_prompt(port, prompt, timeout=3600):
    """Sends one long prompt (two tokens out, streamed): (HTTP status, TTFT s, done time).
    Waits at most `timeout` seconds for a byte of the answer: past that the status is
    "timeout" and the TTFT None (a stalled prefill still leaves the streams' gaps measured)."""
    t_send = time.monotonic()
    ttft = None
    try:
        conn, resp = post(port, "/v1/completions",
                          {"prompt": prompt, "max_tokens": 2, "temperature": 0, "stream": True}, timeout=timeout)
        while True:
            line = resp.readline()
            if not line:
                break
            if ttft is None and line.startswith(b"data: ") and b'"text"' in line:
                ttft = time.monotonic() - t_send
        conn.close()
    except (socket.timeout, TimeoutError):
        return "timeout", None, time.monotonic()
    return resp.status, ttft, time.monotonic()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, default=30777)
    ap.add_argument("--prompt-tokens", type=int, default=1048576)
    ap.add_argument("--context-length", type=int, default=1048576 + 1024)
    ap.add_argument("--chunked-prefill-size", type=int, default=8192)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--alone-s", type=float, default=6.0)
    ap.add_argument("--vocab", type=int, default=163840)
    ap.add_argument("--json-out")
    ap.add_argument("--log", default="/tmp/long-prompt-serve.log")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="one more argument for `moonrun serve` (repeat; use --server-arg=--flag)")
    ap.add_argument("--no-ttft-alone", action="store_true", help="skip the long prompt alone first")
    ap.add_argument("--ttft-timeout", type=float, default=3600,
                    help="seconds to wait for the long prompt's first byte beside the streams; past it the run "
                         "reports a stall (ttft_s null) with the streams' gaps over the wait")
    a = ap.parse_args()

    log = open(a.log, "w")
    server = subprocess.Popen([a.exe, "serve", "--model-path", a.model, "--port", str(a.port),
                               "--context-length", str(a.context_length),
                               "--chunked-prefill-size", str(a.chunked_prefill_size),
                               "--max-running-requests", str(a.streams + 2),
                               "--max-request-bytes", str(64 << 20)] + a.server_arg,
                              stdout=log, stderr=subprocess.STDOUT)
    result = {"prompt_tokens": a.prompt_tokens, "streams": a.streams,
              "chunked_prefill_size": a.chunked_prefill_size, "server_args": a.server_arg}
    try:
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None:
                log.flush()
                sys.stdout.write(open(a.log).read()[-3000:])
                raise SystemExit("server exited with %s: see %s" % (server.returncode, a.log))
            time.sleep(1)
        global MODEL
        c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=10)
        c.request("GET", "/v1/models")
        MODEL = json.loads(c.getresponse().read())["data"][0]["id"]
        rng = random.Random(7)
        if not a.no_ttft_alone:
            # Its own random ids: the prompt below shares no prefix with it (no cache hit).
            status, ttft_alone, _ = long_prompt(a.port, [rng.randrange(a.vocab) for _ in range(a.prompt_tokens)])
            result.update({"ttft_alone_s": ttft_alone, "status_alone": status})
            print("long prompt alone: TTFT %s s (status %s)" % (ttft_alone, status), flush=True)
        stop = threading.Event()
        streams = [Stream(a.port, [rng.randrange(a.vocab) for _ in range(64)], 100000, stop)
                   for _ in range(a.streams)]
        for s in streams:
            s.start()
        time.sleep(a.alone_s)
        prompt = [rng.randrange(a.vocab) for _ in range(a.prompt_tokens)]
        t_send = time.monotonic()
        print("streams running; long prompt sent beside them", flush=True)
        status, ttft, t_done = long_prompt(a.port, prompt, a.ttft_timeout)
        print("long prompt beside the streams: TTFT %s s (status %s)" % (ttft, status), flush=True)
        stop.set()
        # The server still answers a short request.
        c2, r2 = post(a.port, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 4}, timeout=120)
        alive = r2.status == 200 and len(json.loads(r2.read())["choices"][0]["text"]) >= 0
        c2.close()
        alone = [g for s in streams for g in gaps(s.times, t_send - a.alone_s + 1.0, t_send)]
        # During the prefill: until its first token, or over the whole wait of a stalled one.
        during = [g for s in streams for g in gaps(s.times, t_send, t_send + (ttft or (t_done - t_send)))]
        result.update({
            "status": status, "ttft_s": ttft, "long_request_s": t_done - t_send, "server_alive_after": alive,
            "stream_errors": [s.error for s in streams if s.error],
            "itl_alone_ms": {"p50": 1e3 * percentile(alone, 50), "p99": 1e3 * percentile(alone, 99),
                             "max": 1e3 * max(alone) if alone else None, "n": len(alone)},
            "itl_during_prefill_ms": {"p50": 1e3 * percentile(during, 50), "p99": 1e3 * percentile(during, 99),
                                      "max": 1e3 * max(during) if during else None, "n": len(during)},
            "tokens_per_stream_during_prefill": len(during) / max(1, a.streams),
        })
        if result.get("ttft_alone_s") and ttft:
            result["ttft_vs_alone"] = ttft / result["ttft_alone_s"]
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    print("| prompt tokens | TTFT (s) | TTFT alone (s) | TTFT / alone | prefill tok/s | streams | "
          "ITL alone p50 / p99 (ms) | ITL during prefill p50 / p99 / max (ms) | server serves after |")
    print("|---:|---:|---:|---:|---:|---:|---|---|---|")
    ia, idp = result.get("itl_alone_ms", {}), result.get("itl_during_prefill_ms", {})
    ttft = result.get("ttft_s") or float("nan")
    if result.get("status") == "timeout":
        print("the long prompt had no first token within --ttft-timeout %g s beside the streams" % a.ttft_timeout)
    print("| %d | %.1f | %.1f | %.2f | %.0f | %d | %.1f / %.1f | %.1f / %.1f / %.1f | %s |" % (
        a.prompt_tokens, ttft, result.get("ttft_alone_s") or float("nan"), result.get("ttft_vs_alone") or float("nan"),
        a.prompt_tokens / ttft, a.streams, ia.get("p50", float("nan")),
        ia.get("p99", float("nan")), idp.get("p50", float("nan")), idp.get("p99", float("nan")),
        idp.get("max") or float("nan"), result.get("server_alive_after")))
    if result.get("stream_errors"):
        print("stream errors:", result["stream_errors"])
    if a.json_out:
        json.dump(result, open(a.json_out, "w"), indent=2)
    return 0 if result.get("status") == 200 and result.get("server_alive_after") else 1


if __name__ == "__main__":
    sys.exit(main())
