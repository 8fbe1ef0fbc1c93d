#!/usr/bin/env python3
"""The demo model's training conversations, generated (standard library only, seeded).

Writes one OpenAI chat-completions request per line (JSONL): `messages` including the
assistant turns the model learns (their `reasoning_content`, `content`, `tool_calls`),
`tools`, and `reasoning_effort`. `moonrun make-train-data` renders each line with the
engine's own K3 chat format and tokenizer, so the model is trained on exactly the prompts
the server builds. What it teaches, each in many phrasings with random values:

  - tool use in the seed's shape: the `calculate` and `get_weather` tools (the seed's
    schemas), both called in one turn when the user asks for both, then one combined answer
    that copies the numbers and the weather out of the tool results;
  - reasoning whose length follows the thinking effort: one line at `low`, a restatement
    and a plan at `high`, that plus a check at `max` (the default when none is given);
  - short answers to a bank of plain questions;
  - images of coloured regions (halves side by side or stacked, or one colour) described
    by their colours and arrangement.

Numbers, cities and weather are drawn at random (and the weather stub's values are
randomised), so the model has to copy from the prompt and the tool results rather than
remember pairs.

  python3 training/make_data.py --out training/data/conversations.jsonl --n 40000 --seed 1
"""
import argparse
import ast
import base64
import json
import operator
import random
import struct
import zlib

# ---------------------------------------------------------------------------- tools (seed)
CALCULATE_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate a basic arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. '47*89'"}},
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
# Variants with other descriptions, so the model reads names rather than one exact block.
CALCULATE_TOOL_B = json.loads(json.dumps(CALCULATE_TOOL))
CALCULATE_TOOL_B["function"]["description"] = "Compute the value of an arithmetic expression."
WEATHER_TOOL_B = json.loads(json.dumps(WEATHER_TOOL))
WEATHER_TOOL_B["function"]["description"] = "Look up the current weather in a city."

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.USub: operator.neg}


def calculate(expression):
    """The seed's calculator: an AST walk over + - * / ** and unary minus."""
    def ev(n):
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.BinOp):
            return _OPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp):
            return _OPS[type(n.op)](ev(n.operand))
        raise ValueError("bad expr")
    return {"result": ev(ast.parse(expression, mode="eval").body)}


SEED_WEATHER = {"Tokyo": "22C, clear", "London": "14C, rain", "Cairo": "35C, sunny"}
CONDITIONS = ["clear", "rain", "sunny", "cloudy", "partly cloudy", "snow", "fog", "windy", "light rain",
              "thunderstorms", "overcast", "drizzle", "hail", "mist"]
CITIES = """Tokyo London Cairo Paris Berlin Madrid Rome Lisbon Dublin Oslo Stockholm Helsinki Copenhagen
Amsterdam Brussels Vienna Prague Warsaw Budapest Athens Istanbul Moscow Kyiv Bucharest Sofia Belgrade
Zagreb Zurich Geneva Munich Hamburg Milan Naples Barcelona Seville Porto Lyon Marseille Nice Edinburgh
Glasgow Manchester Liverpool Bristol Cardiff Belfast Reykjavik Toronto Montreal Vancouver Chicago Boston
Seattle Denver Austin Dallas Houston Miami Atlanta Phoenix Detroit Portland Nashville Memphis Mexico
Havana Lima Bogota Quito Santiago Caracas Montevideo Nairobi Lagos Accra Dakar Tunis Algiers Casablanca
Johannesburg Kampala Addis Ababa Dubai Doha Riyadh Tehran Baghdad Karachi Lahore Delhi Mumbai Chennai
Kolkata Bangalore Dhaka Kathmandu Colombo Bangkok Hanoi Manila Jakarta Singapore Seoul Busan Beijing
Shanghai Shenzhen Osaka Kyoto Sapporo Taipei Sydney Melbourne Perth Brisbane Auckland Wellington""".split()
CITIES += ["New York", "Los Angeles", "San Francisco", "Rio de Janeiro", "Buenos Aires", "Cape Town",
           "Hong Kong", "Kuala Lumpur", "Ho Chi Minh City", "Mexico City", "Sao Paulo", "Tel Aviv",
           "Abu Dhabi", "St Petersburg", "Las Vegas", "New Delhi"]
CITIES = [c for c in CITIES if c not in ("Addis", "Ababa")]


def made_up_city(rng):
    syl = ["ka", "lo", "mi", "ra", "to", "ven", "dor", "bel", "sa", "ni", "qu", "zen", "mar", "vil", "or",
           "an", "ta", "ri", "gal", "fen", "ost", "bri", "lun", "ha", "pel", "dra", "sol", "ur"]
    return "".join(rng.choice(syl) for _ in range(rng.randint(2, 4))).capitalize()


def pick_city(rng):
    r = rng.random()
    if r < 0.15:
        return rng.choice(["Tokyo", "London", "Cairo"])
    if r < 0.75:
        return rng.choice(CITIES)
    return made_up_city(rng)


def get_weather(city):
    """The seed's weather stub."""
    return {"city": city, "weather": SEED_WEATHER.get(city, "18C, partly cloudy")}


def weather_for(rng, city):
    """The seed's stub for 30 % of calls, random values otherwise (so the answer is copied)."""
    if rng.random() < 0.3:
        return get_weather(city)["weather"]
    return f"{rng.randint(-15, 42)}C, {rng.choice(CONDITIONS)}"


# ---------------------------------------------------------------------------- arithmetic
OP_WORDS = {"*": ["times", "multiplied by"], "+": ["plus", "added to"], "-": ["minus"],
            "/": ["divided by", "over"], "**": ["to the power of"]}


def random_operand(rng):
    r = rng.random()
    if r < 0.35:
        return rng.randint(2, 99)
    if r < 0.7:
        return rng.randint(10, 999)
    if r < 0.9:
        return rng.randint(100, 9999)
    return rng.randint(1000, 99999)


def random_expression(rng):
    """(text the user writes, expression the tool gets, words for the answer)."""
    op = rng.choices(["*", "+", "-", "/", "**"], weights=[40, 20, 15, 15, 5])[0]
    a, b = random_operand(rng), random_operand(rng)
    if op == "**":
        a, b = rng.randint(2, 12), rng.randint(2, 6)
    if op == "/" and rng.random() < 0.5:
        b = rng.randint(2, 50)
        a = b * rng.randint(2, 400)
    if rng.random() < 0.12:  # a three-term expression
        op2 = rng.choice(["+", "-", "*"])
        c = rng.randint(2, 99)
        expr = f"{a}{op}{b}{op2}{c}" if op != "**" else f"{a}**{b}{op2}{c}"
        shown = expr.replace(op, f" {op} ", 1).replace(op2, f" {op2} ") if op != "**" else expr
        if rng.random() < 0.5:
            expr = f"({a}{op}{b}){op2}{c}"
            shown = f"({a} {op} {b}) {op2} {c}"
        return shown, expr, shown
    style = rng.random()
    if style < 0.55:
        shown = f"{a} {op} {b}"
    elif style < 0.8:
        shown = f"{a}{op}{b}"
    else:
        shown = f"{a} {rng.choice(OP_WORDS[op])} {b}"
    return shown, f"{a}{op}{b}", f"{a} {op} {b}"


def tool_json(rng, obj):
    """A tool result as a client sends it back: Python's json.dumps (the seed) or the
    compact JSON of JavaScript's JSON.stringify (the openai npm client's users)."""
    if rng.random() < 0.5:
        return json.dumps(obj)
    # JSON.stringify writes 214.0 as 214.
    obj = {k: (int(v) if isinstance(v, float) and v.is_integer() else v) for k, v in obj.items()}
    return json.dumps(obj, separators=(",", ":"))


def result_text(rng, expr):
    return tool_json(rng, calculate(expr))


def number_of(result_json):
    return str(json.loads(result_json)["result"])


# ---------------------------------------------------------------------------- phrasing
SYSTEMS_TOOLS = ["You are a helpful assistant with tools.", "You are a helpful assistant.",
                 "You are a helpful assistant with tools. Use them when they help.", None]
SYSTEMS_CHAT = ["You are a helpful assistant.", None, "You are a concise assistant.",
                "You are a helpful assistant with tools."]
EFFORTS = ["low", "high", "max", None]  # None: the server's default, max


def ask_calc(rng, shown):
    return rng.choice([f"What is {shown}?", f"What's {shown}?", f"Calculate {shown}.", f"Compute {shown}.",
                       f"How much is {shown}?", f"Please work out {shown}.", f"Can you tell me what {shown} is?"])


def ask_weather(rng, city):
    return rng.choice([f"what's the weather in {city}?", f"what is the weather like in {city}?",
                       f"how is the weather in {city}?", f"tell me the weather in {city}.",
                       f"what's the weather in {city} right now?"])


def joined_task(rng, items):
    """Both requests in one sentence ("Calculate 12*7 and tell me the weather in Oslo.")."""
    def part(name, shown, first):
        if name == "calculate":
            return rng.choice([f"calculate {shown}", f"compute {shown}", f"work out {shown}", f"what {shown} is",
                               f"tell me what {shown} is"] if first else
                              [f"calculate {shown}", f"compute {shown}", f"work out {shown}", f"tell me what {shown} is",
                               f"what is {shown}"])
        return rng.choice([f"tell me the weather in {shown}", f"check the weather in {shown}",
                           f"look up the weather in {shown}", f"what the weather is in {shown}"] if first else
                          [f"tell me the weather in {shown}", f"check the weather in {shown}",
                           f"look up the weather in {shown}", f"what's the weather in {shown}"])
    (n1, _, s1, _), (n2, _, s2, _) = items
    lead = rng.choice(["", "Please ", "Can you ", "Could you ", "I need you to "])
    first = part(n1, s1, True)
    if first.startswith("what"):
        first = "tell me " + first
    end = "?" if lead.strip() in ("Can you", "Could you") else "."
    return cap(f"{lead}{first} and {part(n2, s2, False)}{end}")


def cap(s):
    return s[:1].upper() + s[1:]


def tool_call(i, name, args):
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


def think_tools(rng, effort, calls):
    """Reasoning before the tool calls; its length follows the effort."""
    parts = []
    for name, arg in calls:
        parts.append(f"{arg}" if name == "calculate" else f"the weather in {arg}")
    want = " and ".join(parts)
    many = len(calls) > 1
    if effort == "low":
        return f"Need {want}." + (" Call both tools." if many else "")
    text = f"The user wants {want}. "
    if many:
        text += "I should call both tools in the same block since they are independent. "
    for name, arg in calls:
        if name == "calculate":
            text += f"calculate takes the expression {arg}. "
        else:
            text += f"get_weather takes the city {arg}. "
    if effort in ("max", None):
        text += (f"Let me double-check the arguments before calling: {want}. "
                 "They match the question, so I will make the call" + ("s" if many else "") + " now.")
    return text.strip()


def think_answer(rng, effort, facts):
    if effort == "low":
        return "Combine the results." if len(facts) > 1 else "Report the result."
    text = "The tools returned: " + "; ".join(facts) + ". "
    text += "I will give one combined answer." if len(facts) > 1 else "I will give the answer."
    if effort in ("max", None):
        text += " Let me check each value against the tool results once more: " + "; ".join(facts) + ". All good."
    return text


def tool_conversation(rng):
    """The seed's loop: a task, one assistant turn with the tool calls, the results, the answer."""
    kind = rng.choices(["calc+weather", "calc", "weather", "calc+calc", "weather+weather"],
                       weights=[50, 16, 14, 10, 10])[0]
    effort = rng.choice(EFFORTS)
    items = []  # (name, argument, user text, answer words)
    for part in kind.split("+"):
        if part == "calc":
            shown, expr, words = random_expression(rng)
            items.append(("calculate", expr, shown, words))
        else:
            city = pick_city(rng)
            items.append(("get_weather", city, city, city))
    if rng.random() < 0.3:
        items.reverse()
    # The user's task.
    qs = []
    for i, (name, arg, shown, _) in enumerate(items):
        q = ask_calc(rng, shown) if name == "calculate" else ask_weather(rng, shown)
        if i == 0:
            qs.append(cap(q))
        else:
            joiner = rng.choice(["Also, ", "And ", ""])
            qs.append(joiner + (q[:1].lower() + q[1:] if joiner else cap(q)))
    task = " ".join(qs)
    if len(items) == 2 and rng.random() < 0.4:
        task = joined_task(rng, items)
    if len(items) > 1 or rng.random() < 0.5:
        task += rng.choice([" Use your tools, then give me one combined answer.", " Use your tools.",
                            "", " Please use the tools.", " Give me one combined answer."])
    if kind in ("calc", "calc+calc") and rng.random() < 0.15:
        tools = [CALCULATE_TOOL]
    elif kind in ("weather", "weather+weather") and rng.random() < 0.15:
        tools = [WEATHER_TOOL]
    else:
        tools = [CALCULATE_TOOL, WEATHER_TOOL] if rng.random() < 0.75 else [WEATHER_TOOL, CALCULATE_TOOL]
        if rng.random() < 0.2:
            tools = [CALCULATE_TOOL_B if t is CALCULATE_TOOL else WEATHER_TOOL_B for t in tools]
    messages = []
    system = rng.choice(SYSTEMS_TOOLS)
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": task.strip()})
    calls = [(name, arg) for name, arg, _, _ in items]
    tcs = [tool_call(i, name, {"expression": arg} if name == "calculate" else {"city": arg})
           for i, (name, arg) in enumerate(calls)]
    messages.append({"role": "assistant", "content": "", "reasoning_content": think_tools(rng, effort, calls),
                     "tool_calls": tcs})
    facts, lines, summary = [], [], []
    for tc, (name, arg, shown, words) in zip(tcs, items):
        if name == "calculate":
            res = result_text(rng, arg)
            num = number_of(res)
            facts.append(f"{arg} = {num}")
            lines.append(f"- {words} = {num}")
            summary.append(rng.choice([f"{words} equals {num}", f"{words} is {num}"]))
        else:
            w = weather_for(rng, arg)
            res = tool_json(rng, {"city": arg, "weather": w})
            facts.append(f"{arg} is {w}")
            lines.append(f"- {arg} weather: {w}")
            summary.append(rng.choice([f"the weather in {arg} is {w}", f"in {arg} it is {w}"]))
        messages.append({"role": "tool", "tool_call_id": tc["id"], "name": name, "content": res})
    if len(items) > 1:
        answer = "Here are both results:\n\n" + "\n".join(lines) + "\n\nSo " + ", and ".join(summary) + "."
    else:
        answer = cap(summary[0]) + "."
    messages.append({"role": "assistant", "content": answer, "reasoning_content": think_answer(rng, effort, facts)})
    return finish(messages, tools, effort)


# ---------------------------------------------------------------------------- plain chat
QA = [
    (["Explain what a mixture-of-experts model is, simply, in 2 sentences.",
      "What is a mixture-of-experts model?", "Explain mixture of experts simply."],
     "A mixture-of-experts model has many small expert networks and a router that picks a few of them for "
     "each token. Only the chosen experts run, so the model can be very large while each token stays cheap."),
    (["What is the capital of France?", "Which city is the capital of France?"], "The capital of France is Paris."),
    (["What is the capital of Japan?", "Which city is the capital of Japan?"], "The capital of Japan is Tokyo."),
    (["What is the capital of Egypt?"], "The capital of Egypt is Cairo."),
    (["What is the capital of Italy?"], "The capital of Italy is Rome."),
    (["What is the capital of Germany?"], "The capital of Germany is Berlin."),
    (["What is the capital of Spain?"], "The capital of Spain is Madrid."),
    (["What is the capital of the United Kingdom?", "What is the capital of England?"],
     "The capital of the United Kingdom is London."),
    (["Hello!", "Hi", "Hello", "Hi there!", "Hey"], "Hello! How can I help you today?"),
    (["How are you?", "How are you doing?"], "I'm doing well, thank you. How can I help you today?"),
    (["Who are you?", "What are you?", "What model are you?"],
     "I am the moonrun demo model: a tiny model with the Kimi K3 architecture, trained to show how the "
     "server handles chat, reasoning, tool calls and images."),
    (["What can you do?", "What are you good at?"],
     "I can chat briefly, call tools such as a calculator and a weather lookup, and describe simple images "
     "of coloured regions."),
    (["Thank you!", "Thanks", "Thanks a lot!"], "You're welcome!"),
    (["What is the boiling point of water?", "At what temperature does water boil?"],
     "Water boils at 100 degrees Celsius at sea level."),
    (["How many days are in a week?"], "There are seven days in a week."),
    (["How many continents are there?"], "There are seven continents."),
    (["What colour is the sky?", "What color is the sky?"], "On a clear day the sky is blue."),
    (["What is the largest planet in the solar system?"], "Jupiter is the largest planet in the solar system."),
    (["What is the closest star to Earth?"], "The closest star to Earth is the Sun."),
    (["What is photosynthesis?", "Explain photosynthesis in one sentence."],
     "Photosynthesis is how plants use sunlight, water and carbon dioxide to make sugar and release oxygen."),
    (["What is a GPU?", "What does a GPU do?"],
     "A GPU is a processor with thousands of small cores that run the same operation on many numbers at once, "
     "which makes it fast for graphics and neural networks."),
    (["What is a token in a language model?", "What is a token?"],
     "A token is a piece of text, often a word or part of a word, that a language model reads and writes one "
     "at a time."),
    (["What is tensor parallelism?"],
     "Tensor parallelism splits each weight matrix of a model across several GPUs, so each GPU computes part "
     "of every layer and they combine the results."),
    (["What is the speed of light?"], "Light travels at about 300,000 kilometres per second in a vacuum."),
    (["Tell me a joke.", "Say something funny."],
     "Why did the GPU go to school? To improve its parallel thinking."),
    (["What is the meaning of life?"], "Many people find meaning in their relationships, their work and curiosity."),
    (["Write a haiku about the sea.", "Write a short poem about the sea."],
     "Grey waves fold and break,\nsalt wind carries gull voices,\nthe tide keeps its time."),
    (["What is 2 + 2?", "What is two plus two?"], "2 + 2 = 4."),
    (["What language is spoken in Brazil?"], "The main language of Brazil is Portuguese."),
    (["Name three primary colours.", "What are the primary colours?"], "Red, yellow and blue."),
    (["What is the tallest mountain in the world?"], "Mount Everest is the tallest mountain above sea level."),
    (["How many legs does a spider have?"], "A spider has eight legs."),
    (["What do bees make?"], "Bees make honey and beeswax."),
    (["What is the freezing point of water?"], "Water freezes at 0 degrees Celsius."),
    (["Who wrote Romeo and Juliet?"], "William Shakespeare wrote Romeo and Juliet."),
    (["What is the chemical symbol for gold?"], "The chemical symbol for gold is Au."),
    (["How many hours are in a day?"], "There are 24 hours in a day."),
    (["What is the largest ocean?"], "The Pacific is the largest ocean."),
    (["Can you help me?", "I need help."], "Of course. Tell me what you need and I will do my best."),
    (["Goodbye!", "Bye"], "Goodbye! Have a nice day."),
]


def think_chat(rng, effort, question):
    if effort == "low":
        return rng.choice(["Answer directly.", "A short answer is enough.", "Simple question; answer it."])
    text = f"The user asks: \"{question}\" Let me think about what they need. "
    text += "A clear and short answer is best here, in plain words."
    if effort in ("max", None):
        text += (f" Let me reread the question once more: \"{question}\" I have the answer, and I will check "
                 "that it is correct and that it answers exactly what was asked before I reply.")
    return text


def chat_conversation(rng):
    effort = rng.choice(EFFORTS)
    qs, answer = rng.choice(QA)
    q = rng.choice(qs)
    messages = []
    system = rng.choice(SYSTEMS_CHAT)
    if system:
        messages.append({"role": "system", "content": system})
    tools = [CALCULATE_TOOL, WEATHER_TOOL] if rng.random() < 0.25 else None
    messages.append({"role": "user", "content": q})
    messages.append({"role": "assistant", "content": answer, "reasoning_content": think_chat(rng, effort, q)})
    if rng.random() < 0.2:  # a second turn, with the first turn's thinking preserved
        qs2, answer2 = rng.choice(QA)
        q2 = rng.choice(qs2)
        messages.append({"role": "user", "content": q2})
        messages.append({"role": "assistant", "content": answer2, "reasoning_content": think_chat(rng, effort, q2)})
    return finish(messages, tools, effort)


def word_problem_conversation(rng):
    """Reasoning-heavy questions without tools, so effort changes the thinking on any prompt."""
    effort = rng.choice(EFFORTS)
    a, b, total = rng.randint(2, 9), rng.randint(1, 9), None
    c = rng.randint(2, 30)
    names = rng.sample(["Ana", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun"], 3)
    # x + (x + b) + a(x + b) = total, with x = c
    total = c + (c + b) + a * (c + b)
    q = (f"Three friends split a bill. {names[0]} pays {a} times what {names[1]} pays, and {names[1]} pays {b} "
         f"more than {names[2]}. The total is {total}. How much does each pay?")
    x1, x2 = c + b, a * (c + b)
    if effort == "low":
        think = (f"{names[2]} = c, {names[1]} = c+{b}, {names[0]} = {a}(c+{b}). Total {2 + a}c+{b * (a + 1)} = "
                 f"{total}, c={c}.")
    else:
        think = (f"The user wants me to solve a word problem. Let me work through it.\n"
                 f"Let {names[2]} pay x. {names[1]} pays {b} more than {names[2]}: {names[1]} = x + {b}.\n"
                 f"{names[0]} pays {a} times what {names[1]} pays: {names[0]} = {a}(x + {b}).\n"
                 f"Total: x + (x + {b}) + {a}(x + {b}) = {total}, so x = {c}.\n"
                 f"Then {names[1]} = {x1} and {names[0]} = {x2}.")
        if effort in ("max", None):
            think += f"\nCheck: {c} + {x1} + {x2} = {c + x1 + x2}. That matches the total of {total}."
    answer = f"{names[2]} pays {c}, {names[1]} pays {x1}, and {names[0]} pays {x2}."
    messages = [{"role": "user", "content": q},
                {"role": "assistant", "content": answer, "reasoning_content": think}]
    return finish(messages, None, effort)


# ---------------------------------------------------------------------------- images
COLOURS = {"red": (255, 0, 0), "blue": (0, 0, 255), "green": (0, 160, 0), "yellow": (255, 230, 0),
           "black": (0, 0, 0), "white": (255, 255, 255), "orange": (255, 140, 0), "purple": (128, 0, 160),
           "grey": (128, 128, 128), "cyan": (0, 220, 230), "pink": (255, 150, 200), "brown": (120, 70, 20)}


def make_png(w, h, pixel):
    """An 8-bit RGB PNG (the seed's make_png with a pixel function)."""
    raw = bytearray()
    for y in range(h):
        raw.append(0)
        for x in range(w):
            raw += bytes(pixel(x, y))

    def chunk(tag, data):
        c = struct.pack(">I", len(data)) + tag + data
        return c + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(raw), 9))
            + chunk(b"IEND", b""))


IMAGE_QUESTIONS = ["What do you see in this image? Name the colours and how they are arranged.",
                   "What do you see in this image?", "Describe this image.", "What colours are in this image?",
                   "Describe the colours in this picture and how they are arranged.", "What is in this picture?"]


def image_conversation(rng):
    effort = rng.choice(["low", "low", "high", None])
    layout = rng.choices(["side", "stacked", "solid"], weights=[50, 35, 15])[0]
    a, b = rng.sample(sorted(COLOURS), 2)
    w = rng.choice([128, 128, 128, 64, 96, 112, 140, 160, 200, 224, 256])
    h = w if rng.random() < 0.7 else rng.choice([64, 96, 128, 160, 200])
    ca, cb = COLOURS[a], COLOURS[b]
    if layout == "side":
        png = make_png(w, h, lambda x, y: ca if x < w // 2 else cb)
        answer = (f"The image shows two solid colour blocks arranged side by side: the left half is {a} and the "
                  f"right half is {b}, meeting along a vertical line down the centre.")
        seen = f"left {a}, right {b}"
    elif layout == "stacked":
        png = make_png(w, h, lambda x, y: ca if y < h // 2 else cb)
        answer = (f"The image shows two solid colour blocks stacked one above the other: the top half is {a} and "
                  f"the bottom half is {b}, meeting along a horizontal line across the middle.")
        seen = f"top {a}, bottom {b}"
    else:
        png = make_png(w, h, lambda x, y: ca)
        answer = f"The whole image is one solid colour: {a}."
        seen = f"all {a}"
    q = rng.choice(IMAGE_QUESTIONS)
    text = {"type": "text", "text": q}
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}
    content = [text, image] if rng.random() < 0.8 else [image, text]
    think = f"The image: {seen}." if effort == "low" else (
        f"The user shows an image and asks about it. I see {seen}. I will name the colours and say how they "
        "are arranged.")
    messages = [{"role": "user", "content": content},
                {"role": "assistant", "content": answer, "reasoning_content": think}]
    return finish(messages, None, effort)


# ---------------------------------------------------------------------------- assembly
def finish(messages, tools, effort):
    req = {"model": "moonrun-demo", "messages": messages}
    if tools:
        req["tools"] = tools
    if effort:
        req["reasoning_effort"] = effort
    return req


KINDS = [(tool_conversation, 55), (chat_conversation, 20), (word_problem_conversation, 8), (image_conversation, 17)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=40000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-images", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    kinds = [k for k in KINDS if not (args.no_images and k[0] is image_conversation)]
    fns, weights = [k[0] for k in kinds], [k[1] for k in kinds]
    with open(args.out, "w") as f:
        for _ in range(args.n):
            fn = rng.choices(fns, weights=weights)[0]
            f.write(json.dumps(fn(rng)) + "\n")


if __name__ == "__main__":
    main()
