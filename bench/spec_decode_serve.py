#!/usr/bin/env python3
"""Speculative decoding through `moonrun serve` (issue #37): one stream, then 32.

For each configuration (no speculation, then each draft source of --methods with each --k) starts the server,
runs the seed's tool loop (both turns) and chat prompts one at a time, greedy and streamed,
and times each answer from its first token to its last (decode tokens per second: the figure
speculation changes); then the same prompts 32 at a time (aggregate tokens per second). The
acceptance length (tokens a verify step yields) comes from the server's /metrics. Prints a
table ending in ratios against no speculation, measured in the same run, and writes --json-out.

    python3 bench/spec_decode_serve.py --exe build/moonrun --device cuda --methods ngram suffix --k 4 8 --json-out spec.json

Standard library only (runs on the GPU machine as it is).
"""
import argparse
import os
import http.client
import json
import re
import subprocess
import sys
import threading
import time

TOOLS = [
    {"type": "function", "function": {"name": "calculate", "description": "Evaluate a basic arithmetic expression.",
     "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. '47*89'"}},
                    "required": ["expression"]}}},
    {"type": "function", "function": {"name": "get_weather", "description": "Get current weather for a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]
SEED_TASK = "What is 47 * 89? Also, what's the weather in Tokyo? Use your tools, then give me one combined answer."


def prompts():
    """The seed's tool loop (turn 1 and, with the tool results, turn 2), drawn tool tasks, chat."""
    out = [{"tools": True, "messages": [{"role": "user", "content": SEED_TASK}]},
           {"tools": True, "messages": [
               {"role": "user", "content": SEED_TASK},
               {"role": "assistant", "content": "", "reasoning_content": "I need the calculator and the weather tool.",
                "tool_calls": [{"id": "functions.calculate:0", "type": "function",
                                "function": {"name": "calculate", "arguments": "{\"expression\": \"47 * 89\"}"}},
                               {"id": "functions.get_weather:1", "type": "function",
                                "function": {"name": "get_weather", "arguments": "{\"city\": \"Tokyo\"}"}}]},
               {"role": "tool", "tool_call_id": "functions.calculate:0", "content": "{\"result\": 4183}"},
               {"role": "tool", "tool_call_id": "functions.get_weather:1",
                "content": "{\"city\": \"Tokyo\", \"weather\": \"22C, clear\"}"}]}]
    cities = ["London", "Cairo", "Paris", "Oslo", "Lima", "Seoul"]
    for i, city in enumerate(cities):
        a, b = 13 + 71 * i, 7 + 9 * i
        out.append({"tools": True, "messages": [{"role": "user", "content":
                    "What is %d * %d? Also, what's the weather in %s? Use your tools, then give me one combined answer."
                    % (a, b, city)}]})
    for q in ["What is the capital of Japan?", "Explain what a mixture-of-experts model is, simply, in 2 sentences.",
              "Three friends split a bill. Ana pays twice what Ben pays, and Ben pays 3 more than Cara. "
              "The total is 43. How much does each pay?", "Tell me about Paris in two sentences.",
              "Write a haiku about the sea.", "List three uses of a hash map."]:
        out.append({"messages": [{"role": "user", "content": q}]})
    return out


def stream_answer(port, p, max_tokens):
    """(completion tokens, seconds from the first token to the last) of one streamed answer."""
    body = {"model": "moonrun-demo", "messages": p["messages"], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if p.get("tools"):
        body["tools"] = TOOLS
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError("HTTP %d: %s" % (resp.status, resp.read()[:300]))
    first = last = None
    tokens = 0
    while True:
        line = resp.readline()
        if not line or line.startswith(b"data: [DONE]"):
            break
        if not line.startswith(b"data: "):
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
        if ev.get("choices"):
            now = time.monotonic()
            first = first or now
            last = now
    conn.close()
    return tokens, (last - first) if first else 0.0


def metrics(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    def get(name):
        m = re.search(r"^%s\{[^}]*\} (\d+)" % re.escape(name), text, re.M)
        return int(m.group(1)) if m else 0
    return {"verify_steps": get("vllm:spec_decode_num_drafts_total"),
            "drafts": get("vllm:spec_decode_num_draft_tokens_total"),
            "accepted": get("vllm:spec_decode_num_accepted_tokens_total"),
            "stand_aside_steps": get("moonrun:spec_decode_stand_aside_steps_total"),
            "steps_without_drafts": get("moonrun:spec_decode_steps_without_drafts_total")}


def start(exe, device, extra, log_path=None):
    cmd = [exe, "serve", "--served-model-name", "moonrun-demo", "--host", "127.0.0.1", "--port", "0",
           "--device", device, "--max-running-requests", "32", "--disable-log-requests"] + extra
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log, port, t0 = "", None, time.time()
    while time.time() - t0 < 300:
        line = proc.stdout.readline()
        if not line:
            break
        log += line
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", log)
        if m and "ready to roll" in log:
            port = int(m.group(1))
            break
    if port is None:
        proc.kill()
        raise RuntimeError("server did not start:\n" + log[-3000:])
    if log_path:
        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    sink = open(log_path, "w") if log_path else None
    if sink:
        sink.write(log)
    # Keep the pipe drained (into --server-logs when given, for MOONRUN_DEBUG_STEP_PHASES and the like).
    threading.Thread(target=lambda: [sink.write(l) if sink else None for l in proc.stdout], daemon=True).start()
    return proc, port


def run_config(exe, device, name, extra, ps, max_tokens, repeats, bursts, log_dir=None):
    log_path = os.path.join(log_dir, re.sub(r"[^A-Za-z0-9]+", "_", name) + ".log") if log_dir else None
    proc, port = start(exe, device, extra, log_path)
    try:
        stream_answer(port, ps[0], 32)  # warm-up: graphs, allocations
        before = metrics(port)
        tokens = seconds = 0.0
        for _ in range(repeats):
            for p in ps:
                n, s = stream_answer(port, p, max_tokens)
                tokens += n
                seconds += s
        after = metrics(port)
        single = tokens / seconds if seconds else 0.0
        d = {k: after[k] - before[k] for k in after}
        accept_len = 1 + d["accepted"] / d["verify_steps"] if d["verify_steps"] else 1.0
        # 32 streams at once: aggregate tokens over the wall time, summed over `bursts` bursts
        # (one burst of a few hundred steps moved 35 % between runs on the same kind of GPU).
        batch = [ps[i % len(ps)] for i in range(32)]
        agg_tokens = agg_wall = 0.0
        for _ in range(bursts):
            results = [None] * len(batch)
            def one(i):
                results[i] = stream_answer(port, batch[i], max_tokens)
            t0 = time.monotonic()
            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(batch))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            agg_wall += time.monotonic() - t0
            agg_tokens += sum(r[0] for r in results)
        agg = agg_tokens / agg_wall if agg_wall else 0.0  # --bursts 0: one stream only
        return {"config": name, "single_stream_tok_s": single, "single_stream_tokens": tokens,
                "accept_len": accept_len, "drafts": d["drafts"], "accepted": d["accepted"],
                "verify_steps": d["verify_steps"], "stand_aside_steps": d["stand_aside_steps"],
                "steps_without_drafts": d["steps_without_drafts"], "streams32_tok_s": agg}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--k", type=int, nargs="+", default=[4])
    ap.add_argument("--methods", nargs="+", default=["ngram", "suffix"], help="draft sources, each run with every --k")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--bursts", type=int, default=3, help="32-stream bursts, their tokens and times summed (0: none)")
    ap.add_argument("--json-out")
    ap.add_argument("--server-logs", help="a folder for each config's server log")
    ap.add_argument("--spec-extra", action="append", default=[], metavar="JSON",
                    help="more speculative-config keys, e.g. '{\"disable_by_batch_size\": 2}': each runs every method and k once more")
    ap.add_argument("--draft-model", default="models/moonrun-demo-dspark", help="the DSpark draft (method dspark)")
    a = ap.parse_args()
    ps = prompts()

    def spec(m, k, extra=None):
        c = {"method": m, "num_speculative_tokens": k}
        c.update(extra or {})
        if m == "dspark":
            c["model"] = a.draft_model
        return ["--speculative-config", json.dumps(c)]

    configs = [("off", [])] + [("%s k=%d" % (m, k), spec(m, k)) for m in a.methods for k in a.k]
    for e in a.spec_extra:
        configs += [("%s k=%d %s" % (m, k, e), spec(m, k, json.loads(e))) for m in a.methods for k in a.k]
    rows = []
    for name, extra in configs:
        rows.append(run_config(a.exe, a.device, name, extra, ps, a.max_tokens, a.repeats, a.bursts, a.server_logs))
        print("done: %s" % json.dumps(rows[-1]), file=sys.stderr)
    base = rows[0]
    print("| config | 1 stream tok/s | accept len | drafts accepted | verify / stood aside / no draft steps | 32 streams tok/s | 1 stream / off | 32 streams / off |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        r["single_vs_off"] = r["single_stream_tok_s"] / base["single_stream_tok_s"] if base["single_stream_tok_s"] else 0
        r["streams32_vs_off"] = r["streams32_tok_s"] / base["streams32_tok_s"] if base["streams32_tok_s"] else 0
        print("| %s | %.1f | %.2f | %d / %d | %d / %d / %d | %.1f | %.2f | %.2f |" % (
            r["config"], r["single_stream_tok_s"], r["accept_len"], r["accepted"], r["drafts"], r["verify_steps"],
            r["stand_aside_steps"], r["steps_without_drafts"], r["streams32_tok_s"],
            r["single_vs_off"], r["streams32_vs_off"]))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"bench": "spec_decode_serve", "device": a.device, "max_tokens": a.max_tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
