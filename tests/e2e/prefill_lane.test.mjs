// The prefill lane through `moonrun serve` (issue #47, --prefill-lane-min-tokens): a server
// that prefills long prompts' chunks on a second lane, beside the steps that decode the others,
// answers exactly what a server without it answers (greedy, the official openai client,
// whole and streamed, long and short prompts at once); a client that walks away while its long
// prompt is on the lane leaves a server that still serves; a second request with the same long
// prefix is served from the prefix cache the lane filled; beside a DSpark draft and under
// --tp-size 2 it answers the same.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { fileURLToPath } from 'node:url';
import { startServer } from './harness.mjs';

// Chunks of 32 tokens: a prompt of a few hundred tokens is many chunks, most on the lane.
const COMMON = ['--max-running-requests', '8', '--chunked-prefill-size', '32'];
let plain, lane;
const clientOf = (srv) => new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'EMPTY', maxRetries: 0, timeout: 600000 });
before(async () => {
  [plain, lane] = await Promise.all([
    startServer(COMMON),
    startServer([...COMMON, '--prefill-lane-min-tokens', '64']),
  ]);
});
after(async () => { await Promise.all([plain?.stop(), lane?.stop()]); });

const CITIES = ['Tokyo', 'London', 'Cairo', 'Paris', 'Oslo', 'Lima', 'Nairobi', 'Seoul'];
// Long prompts (a report of many lines, 150-600 tokens) between short questions.
function prompts() {
  const out = [];
  for (let i = 0; i < 16; ++i) {
    const city = CITIES[i % CITIES.length];
    if (i % 2 === 0) {
      const lines = [];
      for (let l = 0; l < 6 + 5 * (i % 5); ++l) lines.push(`Day ${l + 1} in ${CITIES[(i + l) % 8]}: ${10 + ((l * 7 + i) % 25)} degrees, wind ${l % 4} m/s.`);
      out.push([{ role: 'user', content: `Here is a weather log.\n${lines.join('\n')}\nWhat was the weather in ${city}? Answer briefly.` }]);
    } else {
      out.push([{ role: 'user', content: `Tell me about ${city} in two sentences.` }]);
    }
  }
  return out;
}

async function answer(client, messages, stream) {
  const body = { model: 'moonrun-demo', messages, max_tokens: 24, temperature: 0 };
  if (!stream) return (await client.chat.completions.create(body)).choices[0].message.content ?? '';
  let text = '';
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) text += chunk.choices[0]?.delta?.content ?? '';
  return text;
}

test('long and short prompts at once: the lane answers what the plain server answers', async () => {
  const ps = prompts();
  for (const stream of [false, true]) {
    const [want, got] = await Promise.all([plain, lane].map((srv) => {
      const client = clientOf(srv);
      return Promise.all(ps.map((m) => answer(client, m, stream)));
    }));
    for (let i = 0; i < ps.length; ++i) assert.equal(got[i], want[i], `prompt ${i}, stream ${stream}`);
  }
  const usage = await clientOf(lane).chat.completions.create({ model: 'moonrun-demo', messages: ps[8], max_tokens: 4, temperature: 0 });
  assert.ok(usage.usage.prompt_tokens >= 64, `the long prompts reach the lane (${usage.usage.prompt_tokens} tokens)`);
  assert.match(lane.log(), /prefill_lane_min_tokens[^\n]*64/);
});

test('a client gone while its prompt is on the lane; the same prefix again comes from the cache', async () => {
  const client = clientOf(lane);
  const lines = [];
  for (let l = 0; l < 60; ++l) lines.push(`Entry ${l}: ${CITIES[l % 8]} reported ${l % 31} degrees and light rain.`);
  const long = [{ role: 'user', content: `A long log.\n${lines.join('\n')}\nSummarise it.` }];
  const ctl = new AbortController();
  const gone = client.chat.completions.create({ model: 'moonrun-demo', messages: long, max_tokens: 200, temperature: 0, stream: true },
                                              { signal: ctl.signal }).catch(() => null);
  await new Promise((r) => setTimeout(r, 150));
  ctl.abort();
  await gone;
  // Served after: the same long prompt twice, the second from the prefix cache.
  const first = await client.chat.completions.create({ model: 'moonrun-demo', messages: long, max_tokens: 8, temperature: 0 });
  const again = await client.chat.completions.create({ model: 'moonrun-demo', messages: long, max_tokens: 8, temperature: 0 });
  const want = await clientOf(plain).chat.completions.create({ model: 'moonrun-demo', messages: long, max_tokens: 8, temperature: 0 });
  assert.equal(first.choices[0].message.content, want.choices[0].message.content);
  assert.equal(again.choices[0].message.content, want.choices[0].message.content);
  assert.ok((again.usage.prompt_tokens_details?.cached_tokens ?? 0) > 0,
            `cached tokens: ${JSON.stringify(again.usage)}`);
});

const DRAFT = fileURLToPath(new URL('../../models/moonrun-demo-dspark', import.meta.url));

// The lane beside a DSpark draft (its chunks write the draft's context rows) and in a
// tensor-parallel group of two CPU ranks (the lanes' collectives in a group of their own):
// the same answers as the plain server.
test('with a DSpark draft, and under --tp-size 2, the lane answers what the plain server answers', async () => {
  const ps = prompts().slice(0, 6);
  const want = await Promise.all(ps.map((m) => answer(clientOf(plain), m, false)));
  for (const extra of [['--speculative-algorithm', 'DSPARK', '--speculative-draft-model-path', DRAFT,
                        '--speculative-num-draft-tokens', '4'],
                       ['--tp-size', '2']]) {
    const srv = await startServer([...COMMON, '--prefill-lane-min-tokens', '64', ...extra]);
    try {
      const got = await Promise.all(ps.map((m) => answer(clientOf(srv), m, false)));
      for (let i = 0; i < ps.length; ++i) assert.equal(got[i], want[i], `prompt ${i}, ${extra.join(' ')}`);
    } finally {
      await srv.stop();
    }
  }
});
