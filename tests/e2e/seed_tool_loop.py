#!/usr/bin/env python3
"""The seed's agentic tool-calling loop (../shared/seeds, "Agentic tool calling with the
kimi_k3 parser"), in its own code shape: urllib, the AST calculator, the weather stub, the
standard OpenAI tools schema, and the loop that echoes each assistant turn back with its
reasoning_content and tool_calls. Run against a live server by demo_model.test.mjs:

  python3 seed_tool_loop.py BASE_URL "TASK" [SEED]

Prints the turns as the seed does, then one JSON line {"turns": [...], "answer": ...}
for the test to check. The request seed (top-level `seed`) only makes the sampled run
repeatable in CI; everything else is the seed's request.
"""
import ast
import json
import operator
import sys
import time
import urllib.request

BASE = sys.argv[1].rstrip("/") + "/v1"
MODEL = "moonrun-demo"
KEY = "EMPTY"
SEED = int(sys.argv[3]) if len(sys.argv) > 3 else None


def post(body, timeout=1800):
    if SEED is not None:
        body = dict(body, seed=SEED)
    req = urllib.request.Request(
        BASE + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": "Bearer " + KEY})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r), time.time() - t0


ops = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
}


def calculate(expression: str):
    def ev(n):
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.BinOp):
            return ops[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp):
            return ops[type(n.op)](ev(n.operand))
        raise ValueError("bad expr")

    return {"result": ev(ast.parse(expression, mode="eval").body)}


def get_weather(city: str):
    fake = {"Tokyo": "22C, clear", "London": "14C, rain", "Cairo": "35C, sunny"}
    return {"city": city, "weather": fake.get(city, "18C, partly cloudy")}


IMPL = {"calculate": calculate, "get_weather": get_weather}

CALCULATE_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate a basic arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "e.g. '47*89'"},
            },
            "required": ["expression"],
        },
    },
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

TOOLS = [CALCULATE_TOOL, WEATHER_TOOL]

task = sys.argv[2] if len(sys.argv) > 2 else (
    "What is 47 * 89? Also, what's the weather in Tokyo? "
    "Use your tools, then give me one combined answer.")
messages = [{"role": "system", "content": "You are a helpful assistant with tools."},
            {"role": "user", "content": task}]

record = {"turns": [], "answer": None}
for turn in range(6):
    resp, dt = post({"model": MODEL, "messages": messages, "tools": TOOLS,
                     "max_tokens": 1024, "temperature": 0.7, "reasoning_effort": "high"})
    m = resp["choices"][0]["message"]
    tcs = m.get("tool_calls") or []
    print(f"[turn {turn}] tool_calls={len(tcs)} "
          f"reasoning={len(m.get('reasoning_content') or '')} chars")
    record["turns"].append({"tool_calls": [], "reasoning": m.get("reasoning_content") or ""})

    if not tcs:
        print(m.get("content", ""))
        record["answer"] = m.get("content", "")
        break

    # echo the assistant message back AS-IS (content + reasoning_content + tool_calls)
    at = {"role": "assistant", "content": m.get("content") or "", "tool_calls": tcs}
    if m.get("reasoning_content"):
        at["reasoning_content"] = m["reasoning_content"]
    messages.append(at)

    for tc in tcs:
        fn = tc["function"]["name"]
        try:
            args = json.loads(tc["function"].get("arguments") or "{}")
            result = IMPL[fn](**args)
        except Exception as e:
            args, result = {}, {"error": str(e)}

        print(f"    -> {fn}({args}) = {result}")
        record["turns"][-1]["tool_calls"].append({"name": fn, "args": args, "result": result})
        messages.append({"role": "tool", "tool_call_id": tc.get("id", fn),
                         "name": fn, "content": json.dumps(result)})

print(json.dumps(record))
