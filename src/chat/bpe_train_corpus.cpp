// The demo vocabulary's training text: written for moonrun (not taken from anywhere), a
// mix of plain English, chat turns, JSON and code, so the demo model's tokens look like
// those of a real vocabulary (words with a leading space, indentation runs, punctuation).
#include "chat/bpe_train.h"

namespace moonrun::chat {

namespace {

constexpr std::string_view kCorpus = R"corpus(The server reads a checkpoint, plans where every tensor lives, and then answers requests.
A request arrives as JSON. The tokenizer turns its text into numbers, the model turns the
numbers into more numbers, and the detokenizer turns those back into text that a person can read.
When the answer is long, the server streams it: each new piece of text leaves as soon as it exists.

Hello! How are you today? I am fine, thank you. What would you like to do?
I would like to know the weather in Paris, and then the time in Tokyo.
Sure. Let me check the weather first. It is sunny and warm, about 24 degrees.
Thanks! Could you also write a short poem about the sea?
The sea is wide, the sea is deep; it sings the sailors off to sleep.
It keeps the secrets of the ships, and salt is always on its lips.

Questions people often ask:
- What is a token? A token is a short piece of text, often a word or part of a word.
- Why do models use tokens? Because a fixed list of pieces is easier to learn than every letter.
- How many tokens is a page? Usually a few hundred; it depends on the language and the text.
- Does the model remember me? No. Each request carries the whole conversation with it.

Numbers and dates: 1, 2, 3, 10, 42, 100, 256, 1024, 2048, 4096, 65536, 3.14159, 2.71828,
1999-12-31, 2024-06-15, 12:30:45, 08:00, $19.99, 50%, 7 x 8 = 56, 2^10 = 1024.

{"model": "demo", "messages": [{"role": "system", "content": "You are a helpful assistant."},
{"role": "user", "content": "What is the capital of France?"},
{"role": "assistant", "content": "The capital of France is Paris."}],
"temperature": 0.7, "max_tokens": 256, "stream": true, "tools": [{"type": "function",
"function": {"name": "get_weather", "description": "Get the current weather for a city.",
"parameters": {"type": "object", "properties": {"city": {"type": "string"}},
"required": ["city"]}}}]}

#include <cstdio>
#include <string>
#include <vector>

// Returns the sum of the values.
int sum(const std::vector<int>& values) {
    int total = 0;
    for (int v : values) {
        total += v;
    }
    return total;
}

int main(int argc, char** argv) {
    std::vector<int> values = {1, 2, 3, 4, 5};
    std::printf("sum = %d\n", sum(values));
    if (argc > 1) {
        std::printf("first argument: %s\n", argv[1]);
    }
    return 0;
}

def fibonacci(n):
    """Return the first n Fibonacci numbers."""
    result = []
    a, b = 0, 1
    for _ in range(n):
        result.append(a)
        a, b = b, a + b
    return result


class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, word):
        self.counts[word] = self.counts.get(word, 0) + 1

    def most_common(self, k=10):
        return sorted(self.counts.items(), key=lambda kv: -kv[1])[:k]


if __name__ == "__main__":
    print(fibonacci(10))
    counter = Counter()
    for word in "the quick brown fox jumps over the lazy dog".split():
        counter.add(word)
    print(counter.most_common(3))

function greet(name) {
  const message = `Hello, ${name}!`;
  console.log(message);
  return message;
}

async function fetchJson(url) {
  const response = await fetch(url);
  if (!response.ok) {
    throw new Error(`request failed: ${response.status}`);
  }
  return await response.json();
}

SELECT name, COUNT(*) AS orders FROM customers JOIN orders ON orders.customer_id = customers.id
WHERE orders.created_at >= '2024-01-01' GROUP BY name ORDER BY orders DESC LIMIT 10;

$ moonrun serve --model ./demo --port 8000
$ curl http://127.0.0.1:8000/v1/chat/completions -H "Content-Type: application/json" -d @request.json

A short story. Once upon a time there was a small robot who wanted to learn to paint. Every
morning it went to the park, set up its easel, and looked at the trees. At first its pictures
were only grey squares. But the robot kept trying, and one day a child stopped and said,
"That looks like the morning!" The robot did not know what to say, so it painted the child too.

Reasoning step by step: we have 3 apples and buy 5 more, so we have 8 apples. We give away
half of them, which leaves 4. Then we eat one, so the answer is 3 apples.

Common words: the, of, and, to, in, is, you, that, it, he, was, for, on, are, as, with, his,
they, at, be, this, have, from, or, one, had, by, word, but, not, what, all, were, we, when,
your, can, said, there, use, an, each, which, she, do, how, their, if, will, up, other, about,
out, many, then, them, these, so, some, her, would, make, like, him, into, time, has, look,
two, more, write, go, see, number, no, way, could, people, my, than, first, water, been, call,
who, oil, its, now, find, long, down, day, did, get, come, made, may, part.

Other languages: Bonjour, comment allez-vous? Guten Tag, wie geht es Ihnen? Hola, ¿cómo estás?
Привет, как дела? 你好，今天天气很好。我们去公园散步吧。こんにちは、お元気ですか？ 안녕하세요.
Emoji: 🙂 👍 🚀 ❤️ 🎉 ✅

How a request is served, in more detail. The scheduler keeps a queue of waiting requests and
a batch of running ones. At every step it asks the cache for free pages, admits as many new
requests as fit, and runs one forward pass over the whole batch. Prefill processes the prompt
in chunks; decode produces one token per running request. When a request finishes, because it
produced the end token or reached its limit, its pages go back to the pool at once.

| setting | default | meaning |
| --- | --- | --- |
| max_tokens | 256 | the most tokens one response may contain |
| temperature | 1.0 | higher values make the choice of the next token more random |
| top_p | 1.0 | only the most likely tokens whose probabilities add up to top_p are kept |
| stream | false | send the response piece by piece as server-sent events |

Frequently asked questions about the server:
Q: Why is the first token slower than the others?
A: Because the whole prompt must be read before the first new token can be produced.
Q: What happens when the queue is full?
A: The server answers with status 503 and a short message, and the client should retry later.
Q: Can I cancel a request?
A: Yes. Closing the connection stops the request and frees its memory within one step.
Q: How do I know which model is loaded?
A: Ask GET /v1/models; the answer lists the model name and its context length.

struct Request {
    std::string id;
    std::vector<int> prompt_tokens;
    int max_tokens = 256;
    float temperature = 1.0f;
    bool stream = false;
};

class Scheduler {
 public:
    explicit Scheduler(int max_batch) : max_batch_(max_batch) {}
    void submit(Request request) { waiting_.push_back(std::move(request)); }
    bool idle() const { return waiting_.empty() && running_.empty(); }

 private:
    int max_batch_;
    std::deque<Request> waiting_;
    std::vector<Request> running_;
};

import json
import sys


def load_requests(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            yield json.loads(line)


def main():
    total = 0
    for request in load_requests(sys.argv[1]):
        total += len(request.get("messages", []))
    print(f"{total} messages")


const server = http.createServer(async (req, res) => {
  if (req.method !== "POST") {
    res.writeHead(405, { "Content-Type": "application/json" });
    res.end(JSON.stringify({ error: { message: "method not allowed", type: "invalid_request_error" } }));
    return;
  }
  let body = "";
  for await (const chunk of req) body += chunk;
  const request = JSON.parse(body);
  res.writeHead(200, { "Content-Type": "text/event-stream" });
  for (const word of request.messages.at(-1).content.split(" ")) {
    res.write(`data: ${JSON.stringify({ choices: [{ delta: { content: word + " " } }] })}\n\n`);
  }
  res.end("data: [DONE]\n\n");
});

{"id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1700000000, "model": "demo",
"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hello"}, "finish_reason": null}]}
{"id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1700000000, "model": "demo",
"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
"usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}}

Another conversation. Can you help me plan a trip? Of course. Where would you like to go, and
for how many days? I want to visit the mountains for three days in the summer. Good choice.
On the first day, take the train to the valley and walk along the river. On the second day,
climb to the lake early in the morning, when the air is still cool. On the third day, rest,
visit the small museum in the village, and try the local cheese before you travel home.
Remember to bring warm clothes: even in summer, the nights in the mountains can be cold.

Writing tips: use short sentences. Prefer common words to rare ones. Put the most important
point first. Read your text aloud; if you run out of breath, the sentence is too long. Cut
every word that does not help the reader. Check names, numbers and dates twice.

Mathematics: the area of a circle is pi times the radius squared; the sum of the angles of a
triangle is 180 degrees; a prime number has exactly two divisors; the derivative of x^2 is 2x;
the integral of 1/x is ln|x| + C; e^(i*pi) + 1 = 0; sqrt(2) = 1.41421356; 17 * 23 = 391.
)corpus";

}  // namespace

std::string_view builtin_bpe_corpus() { return kCorpus; }

}  // namespace moonrun::chat
