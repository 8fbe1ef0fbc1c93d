#!/usr/bin/env python3
"""How often the demo model gets the seed's checks right on cases drawn at random (the
figures in docs/demo-model.md). Standard library only; against a running server:

  build/moonrun serve --port 8000 &   # the demo model
  python3 training/eval_demo.py http://127.0.0.1:8000 --n 40 --seed 7

  - tool loop (the seed's shape, temperature 0.7, effort high): both tools in one turn with
    the right arguments, and an answer holding the calculator's number and the weather;
    tool results sent back as Python's json.dumps writes them and as JavaScript's compact
    JSON.stringify does, alternately;
  - images: two-colour halves (side by side / stacked) of random colours: both colours named,
    in the right order;
  - effort: reasoning tokens at low < at high, on the same prompt.
"""
import argparse
import base64
import json
import os
import random
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from make_data import CALCULATE_TOOL, COLOURS as TRAIN_COLOURS, WEATHER_TOOL, calculate, get_weather, make_png  # noqa: E402,E501

TOOLS = [CALCULATE_TOOL, WEATHER_TOOL]
CITIES = ["Tokyo", "London", "Cairo", "Paris", "Madrid", "Oslo", "Lima", "Nairobi", "Seoul", "Denver", "Toronto",
          "Sydney", "Berlin", "Mumbai", "Istanbul", "Dublin", "Quito", "Hanoi", "Zurich", "Accra"]
COLOURS = {k: TRAIN_COLOURS[k] for k in ("red", "blue", "green", "yellow", "black", "white", "orange", "purple")}


def post(base, body):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def tool_loop(base, task, seed, compact):
    messages = [{"role": "system", "content": "You are a helpful assistant with tools."},
                {"role": "user", "content": task}]
    turns = []
    for _ in range(4):
        m = post(base, {"model": "moonrun-demo", "messages": messages, "tools": TOOLS, "max_tokens": 1024,
                        "temperature": 0.7, "reasoning_effort": "high", "seed": seed})["choices"][0]["message"]
        tcs = m.get("tool_calls") or []
        turns.append([])
        if not tcs:
            return turns, m.get("content") or ""
        at = {"role": "assistant", "content": m.get("content") or "", "tool_calls": tcs}
        if m.get("reasoning_content"):
            at["reasoning_content"] = m["reasoning_content"]
        messages.append(at)
        for tc in tcs:
            fn = tc["function"]["name"]
            try:
                args = json.loads(tc["function"].get("arguments") or "{}")
                result = {"calculate": calculate, "get_weather": get_weather}[fn](**args)
            except Exception as e:  # noqa: BLE001 - a wrong call is a failed case, not a crash
                args, result = {}, {"error": str(e)}
            turns[-1].append((fn, args, result))
            text = json.dumps(result, separators=(",", ":")) if compact else json.dumps(result)
            messages.append({"role": "tool", "tool_call_id": tc.get("id", fn), "name": fn, "content": text})
    return turns, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    base = args.base.rstrip("/")

    ok = 0
    failures = []
    for i in range(args.n):
        a, b = rng.randint(2, 9999), rng.randint(2, 999)
        op = rng.choice(["*", "+", "-"])
        city = rng.choice(CITIES)
        phr = rng.choice(["What is {e}? Also, what's the weather in {c}? Use your tools, then give me one combined answer.",
                          "Calculate {e} and tell me the weather in {c}.",
                          "What's the weather in {c}? Also, what is {e}? Use your tools."])
        task = phr.format(e=f"{a} {op} {b}", c=city)
        want = calculate(f"{a}{op}{b}")["result"]
        turns, answer = tool_loop(base, task, 1000 + i, compact=bool(i % 2))
        calls = turns[0] if turns else []
        good = (answer is not None and len(turns) == 2 and len(calls) == 2
                and any(fn == "calculate" and res.get("result") == want for fn, _, res in calls)
                and any(fn == "get_weather" and args_.get("city") == city for fn, args_, _ in calls)
                and str(want) in answer.replace(",", "") and get_weather(city)["weather"] in answer)
        ok += good
        if not good:
            failures.append({"task": task, "calls": calls, "answer": answer})
    print(f"tool loop: {ok}/{args.n} correct (two calls in one turn, right arguments, right numbers in the answer)")
    for f in failures[:5]:
        print("  failed:", json.dumps(f)[:400])

    ok_img = n_img = 0
    for x, y in [(p, q) for p in COLOURS for q in COLOURS if p != q]:
        if rng.random() > 0.35:
            continue
        stacked = rng.random() < 0.5
        im = make_png(128, 128, (lambda u, v: COLOURS[x] if v < 64 else COLOURS[y]) if stacked
                 else (lambda u, v: COLOURS[x] if u < 64 else COLOURS[y]))
        r = post(base, {"model": "moonrun-demo", "max_tokens": 400, "reasoning_effort": "low", "temperature": 0,
                        "messages": [{"role": "user", "content": [
                            {"type": "text", "text": "What do you see in this image? Name the colours and how they are arranged."},
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(im).decode()}}]}]})
        ans = (r["choices"][0]["message"].get("content") or "").lower()
        n_img += 1
        good = x in ans and y in ans and ans.index(x) < ans.index(y) and (("top" in ans) == stacked)
        ok_img += good
        if not good:
            print(f"  image {'top/bottom' if stacked else 'left/right'} {x}/{y}: {ans[:160]}")
    print(f"images: {ok_img}/{n_img} name both colours in order and the arrangement")

    prompts = ["Three friends split a bill. Ana pays twice what Ben pays, and Ben pays 3 more than Cara. The total is 43. How much does each pay?",
               "Explain what a mixture-of-experts model is, simply, in 2 sentences.", "Tell me three random numbers.",
               "What is the capital of Italy?", "Why is the sea blue?", "Write a haiku about the sea.", "Hello!",
               "What is a GPU?"]
    ok_eff = 0
    for p in prompts:
        t = {}
        for effort in ("low", "high"):
            r = post(base, {"model": "moonrun-demo", "max_tokens": 1024, "temperature": 0, "reasoning_effort": effort,
                            "messages": [{"role": "user", "content": p}]})
            t[effort] = r["usage"]["reasoning_tokens"]
        ok_eff += t["low"] < t["high"]
        print(f"  effort low {t['low']:4d} vs high {t['high']:4d} reasoning tokens: {p[:60]}")
    print(f"effort: {ok_eff}/{len(prompts)} prompts think less at low than at high")
    return 0


if __name__ == "__main__":
    sys.exit(main())
