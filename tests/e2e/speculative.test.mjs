// Speculative decoding through `moonrun serve` (issue #37): a server with n-gram drafts
// (vLLM's --speculative-config), one with SGLang's flags and one with suffix decoding
// (vLLM's `suffix`, its defaults) answer exactly what a server without speculation
// answers, greedy, through the official openai client, whole and streamed: 200 demo-model prompts (the seed's tool loop among them, each turn of it),
// with the drafts both accepted and rejected; the spec metrics and the request log line
// report what happened.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './harness.mjs';

const TOOLS = [
  { type: 'function', function: { name: 'calculate', description: 'Evaluate a basic arithmetic expression.',
    parameters: { type: 'object', properties: { expression: { type: 'string', description: "e.g. '47*89'" } },
      required: ['expression'] } } },
  { type: 'function', function: { name: 'get_weather', description: 'Get current weather for a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } },
];

let plain, ngram, sglang, suffix;
const clientOf = (srv) => new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'EMPTY', maxRetries: 0, timeout: 600000 });
before(async () => {
  [plain, ngram, sglang, suffix] = await Promise.all([
    startServer(['--max-running-requests', '8']),
    startServer(['--max-running-requests', '8', '--speculative-config',
                 '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}']),
    startServer(['--max-running-requests', '8', '--speculative-algorithm', 'NGRAM',
                 '--speculative-num-draft-tokens', '3', '--speculative-ngram-min-match-window-size', '1']),
    startServer(['--max-running-requests', '8', '--speculative-config', '{"method": "suffix"}']),
  ]);
});
after(async () => { await Promise.all([plain?.stop(), ngram?.stop(), sglang?.stop(), suffix?.stop()]); });

// 200 prompts: the seed's tool task and its drawn variants (with tools), questions,
// prompts that ask to repeat or continue text (where lookups find drafts in the prompt), and
// structured output (a JSON schema, tool_choice "required").
function prompts() {
  const out = [];
  const cities = ['Tokyo', 'London', 'Cairo', 'Paris', 'Oslo', 'Lima', 'Nairobi', 'Seoul', 'Denver'];
  let s = 37;
  const rand = (n) => { s = (s * 1103515245 + 12345) % 2147483648; return s % n; };
  out.push({ tools: true, messages: [{ role: 'user', content:
    "What is 47 * 89? Also, what's the weather in Tokyo? Use your tools, then give me one combined answer." }] });
  // The seed's second turn: the tool results back, the combined answer next.
  out.push({ tools: true, messages: [
    { role: 'user', content: "What is 47 * 89? Also, what's the weather in Tokyo? Use your tools, then give me one combined answer." },
    { role: 'assistant', content: '', reasoning_content: 'I need the calculator and the weather tool.',
      tool_calls: [{ id: 'functions.calculate:0', type: 'function', function: { name: 'calculate', arguments: '{"expression": "47 * 89"}' } },
                   { id: 'functions.get_weather:1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Tokyo"}' } }] },
    { role: 'tool', tool_call_id: 'functions.calculate:0', content: '{"result": 4183}' },
    { role: 'tool', tool_call_id: 'functions.get_weather:1', content: '{"city": "Tokyo", "weather": "22C, clear"}' }] });
  while (out.length < 200) {
    const i = out.length, a = 10 + rand(990), b = 2 + rand(98), city = cities[rand(cities.length)];
    const kind = i % 4;
    // Every tenth: structured output (drafts masked by the constraint advanced over them).
    if (i % 10 === 9) out.push(i % 20 === 9
      ? { tools: true, extra: { tool_choice: 'required' }, messages: [{ role: 'user', content:
          `What's the weather in ${city}, and what is ${a} * ${b}?` }] }
      : { extra: { response_format: { type: 'json_schema', json_schema: { name: 'reading', schema: {
            type: 'object', properties: { city: { type: 'string' }, degrees: { type: 'integer' } },
            required: ['city', 'degrees'], additionalProperties: false } } } },
          messages: [{ role: 'user', content: `Repeat as JSON: the weather in ${city} is ${a} degrees, ${city} ${a}.` }] });
    else if (kind === 0) out.push({ tools: true, messages: [{ role: 'user', content:
      `What is ${a} * ${b}? Also, what's the weather in ${city}? Use your tools, then give me one combined answer.` }] });
    else if (kind === 1) out.push({ messages: [{ role: 'user', content: `Repeat this line twice: the weather in ${city} is ${a} degrees.` }] });
    else if (kind === 2) out.push({ messages: [{ role: 'user', content: `What is ${a} plus ${b}? Answer briefly.` }] });
    else out.push({ messages: [{ role: 'system', content: 'You are a helpful assistant.' },
                               { role: 'user', content: `Tell me about ${city} in two sentences.` }] });
  }
  return out;
}

async function answer(client, p, stream) {
  const body = { model: 'moonrun-demo', messages: p.messages, max_tokens: 40, temperature: 0,
                 ...(p.tools ? { tools: TOOLS } : {}), ...(p.extra ?? {}) };
  if (!stream) {
    const r = await client.chat.completions.create(body);
    const m = r.choices[0].message;
    return { content: m.content ?? '', reasoning: m.reasoning_content ?? '',
             calls: (m.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]),
             finish: r.choices[0].finish_reason, tokens: r.usage.completion_tokens };
  }
  const st = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  const a = { content: '', reasoning: '', calls: [], finish: null, tokens: 0 };
  for await (const ch of st) {
    if (ch.usage) a.tokens = ch.usage.completion_tokens;
    const c = ch.choices?.[0];
    if (!c) continue;
    if (c.finish_reason) a.finish = c.finish_reason;
    a.content += c.delta?.content ?? '';
    a.reasoning += c.delta?.reasoning_content ?? '';
    for (const tc of c.delta?.tool_calls ?? []) {
      if (!a.calls[tc.index]) a.calls[tc.index] = ['', ''];
      a.calls[tc.index][0] += tc.function?.name ?? '';
      a.calls[tc.index][1] += tc.function?.arguments ?? '';
    }
  }
  return a;
}

// n at a time, in order.
async function all(items, n, fn) {
  const out = new Array(items.length);
  let next = 0;
  await Promise.all(Array.from({ length: n }, async () => {
    while (next < items.length) { const i = next++; out[i] = await fn(items[i], i); }
  }));
  return out;
}

async function specCounters(srv) {
  const text = await (await fetch(srv.base + '/metrics')).text();
  const get = (name) => Number((text.match(new RegExp(`^${name}\\{[^}]*\\} (\\d+)`, 'm')) ?? [])[1] ?? NaN);
  return { drafts: get('vllm:spec_decode_num_draft_tokens_total'), accepted: get('vllm:spec_decode_num_accepted_tokens_total'),
           steps: get('vllm:spec_decode_num_drafts_total'), text };
}

test('n-gram and suffix drafts change no greedy answer: 200 prompts, whole and streamed', async () => {
  const ps = prompts();
  const want = await all(ps, 8, (p) => answer(clientOf(plain), p, false));
  // Each source whole and streamed (n-gram's two passes through its two flag styles): the CI
  // box has two cores.
  const runs = [['ngram, --speculative-config', ngram, [false]], ['ngram, --speculative-algorithm NGRAM', sglang, [true]],
                ['suffix, --speculative-config', suffix, [false, true]]];
  for (const [name, srv, streams] of runs) {
    for (const stream of streams) {
      const got = await all(ps, 8, (p) => answer(clientOf(srv), p, stream));
      for (let i = 0; i < ps.length; i++)
        assert.deepEqual(got[i], want[i], `${name}, ${stream ? 'streamed' : 'whole'}, prompt ${i}: ${JSON.stringify(ps[i].messages.at(-1))}`);
    }
    const c = await specCounters(srv);
    // Both verdicts, many times over: the comparison covered kept drafts and rollbacks.
    assert.ok(c.accepted > 50, `${name}: accepted ${c.accepted} of ${c.drafts} drafts`);
    assert.ok(c.drafts - c.accepted > 50, `${name}: rejected ${c.drafts - c.accepted} of ${c.drafts} drafts`);
    assert.match(c.text, /vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="0"\} \d+/);
    assert.match(srv.log(), /spec_accept_len=\d+\.\d+/, 'the request log line reports the acceptance length');
    console.log(`${name}: ${c.accepted} of ${c.drafts} drafts accepted over ${c.steps} verify steps ` +
                `(${(1 + c.accepted / c.steps).toFixed(2)} tokens a step)`);
  }
  const none = await specCounters(plain);
  assert.equal(none.drafts, 0, 'no drafts without speculation');
});

test('a method moonrun lacks is refused at startup, naming what exists', async () => {
  await assert.rejects(startServer(['--speculative-config', '{"method": "eagle3", "num_speculative_tokens": 3}'], { timeoutMs: 60000 }),
    /speculative decoding method 'eagle3' is not available; moonrun has: ngram, suffix/);
  await assert.rejects(startServer(['--speculative-config', '{"method": "suffix", "suffix_decoding_min_token_prob": 2}'], { timeoutMs: 60000 }),
    /suffix_decoding_min_token_prob must be in \[0, 1\]/);
  await assert.rejects(startServer(['--speculative-config', '{"method": "ngram", "num_speculative_tokens": 3, "lookahead": 1}'], { timeoutMs: 60000 }),
    /unknown field 'lookahead'/);
});
