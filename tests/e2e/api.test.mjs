// The official openai client against a real server: what users' code sees.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, post, sseEvents } from './harness.mjs';

let srv, client;
before(async () => {
  srv = await startServer();
  client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'EMPTY', maxRetries: 0, timeout: 120000 });
});
after(async () => { await srv?.stop(); });

function checkUsage(u, { chat = true } = {}) {
  assert.ok(u, 'usage present');
  assert.ok(Number.isInteger(u.prompt_tokens) && u.prompt_tokens > 0);
  assert.ok(Number.isInteger(u.completion_tokens) && u.completion_tokens > 0);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  assert.equal(u.prompt_tokens_details.cached_tokens, 0);
  if (chat) {
    assert.ok(Number.isInteger(u.reasoning_tokens));
    assert.equal(u.completion_tokens_details.reasoning_tokens, u.reasoning_tokens);
    assert.ok(u.reasoning_tokens <= u.completion_tokens);
  }
}

test('health and models list the served model with max_model_len', async () => {
  assert.equal((await fetch(srv.base + '/health')).status, 200);
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  assert.equal(models.data[0].id, 'moonrun-demo');
  assert.equal(models.data[0].max_model_len, 8192);
});

test('chat, not streamed: message, reasoning fields and usage', async () => {
  const r = await client.chat.completions.create({
    model: 'moonrun-demo', max_tokens: 12, temperature: 0,
    messages: [{ role: 'system', content: 'You are a helpful assistant.' },
               { role: 'user', content: 'Who are you? One sentence.' }],
  });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason));
  assert.ok(c.message.content === null || typeof c.message.content === 'string');
  assert.ok('reasoning_content' in c.message);
  assert.deepEqual(c.message.reasoning, c.message.reasoning_content);
  checkUsage(r.usage);
  assert.ok(r.usage.completion_tokens <= 12);
});

test('chat, streamed with include_usage: role first, one finish, usage last', async () => {
  const stream = await client.chat.completions.create({
    model: 'moonrun-demo', max_tokens: 10, temperature: 0.7, top_p: 0.9, stream: true,
    stream_options: { include_usage: true }, reasoning_effort: 'high',
    messages: [{ role: 'user', content: 'Explain mixture-of-experts simply.' }],
  });
  const chunks = [];
  for await (const ch of stream) chunks.push(ch);
  assert.ok(chunks.length >= 2);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const finishes = chunks.flatMap((c) => c.choices).filter((c) => c.finish_reason);
  assert.equal(finishes.length, 1);
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  checkUsage(last.usage);
  const ids = new Set(chunks.map((c) => c.id));
  assert.equal(ids.size, 1, 'one id per stream');
});

test('the raw stream ends with data: [DONE]', async () => {
  const r = await post(srv.base, '/v1/chat/completions', {
    model: 'moonrun-demo', max_tokens: 4, stream: true,
    messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(r.status, 200);
  const events = sseEvents(r.text);
  assert.equal(events.at(-1), '[DONE]');
  for (const e of events.slice(0, -1)) JSON.parse(e);
});

test('completions, streamed and not, with a text prompt and with token ids', async () => {
  const r = await client.completions.create({ model: 'moonrun-demo', prompt: 'Once upon a time', max_tokens: 6, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  checkUsage(r.usage, { chat: false });
  const ids = await post(srv.base, '/tokenize', { model: 'moonrun-demo', prompt: 'Once upon a time' });
  const r2 = await client.completions.create({ model: 'moonrun-demo', prompt: ids.json.tokens, max_tokens: 6, temperature: 0 });
  assert.equal(r2.choices[0].text, r.choices[0].text, 'text and ids give the same greedy text');
  const stream = await client.completions.create({ model: 'moonrun-demo', prompt: 'Once upon a time', max_tokens: 6, temperature: 0, stream: true });
  let text = '';
  for await (const ch of stream) text += ch.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text, 'streamed text equals the non-streamed one');
});

test('n, seed and logprobs', async () => {
  const body = { model: 'moonrun-demo', max_tokens: 5, temperature: 1.0, seed: 1234, n: 3, logprobs: true, top_logprobs: 2,
                 messages: [{ role: 'user', content: 'Tell me three random numbers.' }] };
  const a = await client.chat.completions.create(body);
  const b = await client.chat.completions.create(body);
  assert.equal(a.choices.length, 3);
  assert.deepEqual(a.choices.map((c) => c.message.content), b.choices.map((c) => c.message.content), 'seeded sampling repeats');
  const lp = a.choices[0].logprobs.content;
  assert.ok(lp.length > 0);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 2);
    assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
  }
});

test('tools and tool_choice reach the prompt; the tool loop request shapes are accepted', async () => {
  const TOOLS = [{ type: 'function', function: { name: 'calculate', description: 'Evaluate a basic arithmetic expression.',
                    parameters: { type: 'object', properties: { expression: { type: 'string', description: "e.g. '47*89'" } }, required: ['expression'] } } },
                 { type: 'function', function: { name: 'get_weather', description: 'Get current weather for a city.',
                    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const messages = [{ role: 'system', content: 'You are a helpful assistant with tools.' },
                    { role: 'user', content: "What is 47 * 89? Also, what's the weather in Tokyo?" }];
  const plain = await post(srv.base, '/tokenize', { model: 'moonrun-demo', messages });
  const withTools = await post(srv.base, '/tokenize', { model: 'moonrun-demo', messages, tools: TOOLS });
  assert.ok(withTools.json.count > plain.json.count + 20, 'the tool declarations are rendered');
  for (const tool_choice of ['auto', 'required', 'none', { type: 'function', function: { name: 'calculate' } }]) {
    // required / named are enforced (a whole call must fit): they get room for one.
    const max_tokens = typeof tool_choice === 'string' && tool_choice !== 'required' ? 4 : 200;
    const r = await client.chat.completions.create({ model: 'moonrun-demo', messages, tools: TOOLS, tool_choice, max_tokens });
    assert.ok(r.choices[0].finish_reason);
    if (max_tokens === 200) assert.equal(r.choices[0].finish_reason, 'tool_calls');
    if (tool_choice === 'none') assert.equal(r.choices[0].message.tool_calls, undefined);
  }
  // The seed's tool loop: the assistant turn goes back with reasoning and tool_calls, then tool results.
  const loop = [...messages,
    { role: 'assistant', content: '', reasoning_content: 'I should call both tools.',
      tool_calls: [{ id: 'call_0', type: 'function', function: { name: 'calculate', arguments: '{"expression": "47*89"}' } },
                   { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Tokyo"}' } }] },
    { role: 'tool', tool_call_id: 'call_0', name: 'calculate', content: '{"result": 4183}' },
    { role: 'tool', tool_call_id: 'call_1', name: 'get_weather', content: '{"city": "Tokyo", "weather": "22C, clear"}' }];
  const r = await client.chat.completions.create({ model: 'moonrun-demo', messages: loop, tools: TOOLS, max_tokens: 4, temperature: 0.7 });
  assert.ok(r.choices[0].message);
  const t = await post(srv.base, '/tokenize', { model: 'moonrun-demo', messages: loop, tools: TOOLS });
  const text = (await post(srv.base, '/detokenize', { model: 'moonrun-demo', tokens: t.json.tokens })).json.prompt;
  for (const s of ['I should call both tools.', '47*89', '4183', '22C, clear', 'get_weather'])
    assert.ok(text.includes(s), `prompt keeps ${s}`);
});

test('preserved reasoning round trip: reasoning_content sent back is rendered', async () => {
  const msgs = [{ role: 'user', content: 'Tell me three random numbers.' }];
  const r1 = await client.chat.completions.create({ model: 'moonrun-demo', messages: msgs, max_tokens: 8, temperature: 0.8, reasoning_effort: 'high' });
  const m1 = r1.choices[0].message;
  const turn = { role: 'assistant', content: m1.content ?? '', reasoning_content: 'I thought of 17, 482 and 96.' };
  const msgs2 = [...msgs, turn, { role: 'user', content: 'What other numbers did you have in mind while thinking?' }];
  const r2 = await client.chat.completions.create({ model: 'moonrun-demo', messages: msgs2, max_tokens: 8, reasoning_effort: 'max' });
  assert.ok(r2.choices[0].message);
  const t = await post(srv.base, '/tokenize', { model: 'moonrun-demo', messages: msgs2 });
  const text = (await post(srv.base, '/detokenize', { model: 'moonrun-demo', tokens: t.json.tokens })).json.prompt;
  assert.ok(text.includes('I thought of 17, 482 and 96.'));
  // The newer vLLM spelling, `reasoning`, is accepted too.
  const msgs3 = [...msgs, { role: 'assistant', content: 'x', reasoning: 'kept as well' }, { role: 'user', content: 'ok' }];
  const t3 = await post(srv.base, '/tokenize', { model: 'moonrun-demo', messages: msgs3 });
  const text3 = (await post(srv.base, '/detokenize', { model: 'moonrun-demo', tokens: t3.json.tokens })).json.prompt;
  assert.ok(text3.includes('kept as well'));
});

test("the seed's helper post(): reasoning_effort low/high/max, and an effort K3 does not know", async () => {
  for (const effort of ['low', 'high', 'max']) {
    const r = await post(srv.base, '/v1/chat/completions', {
      model: 'moonrun-demo', max_tokens: 6, temperature: 0.8, top_p: 1.0, reasoning_effort: effort,
      messages: [{ role: 'user', content: 'Three friends split a bill.' }] }, { Authorization: 'Bearer EMPTY' });
    assert.equal(r.status, 200, r.text);
    assert.ok(Number.isInteger(r.json.usage.reasoning_tokens));
  }
  // K3's encoder refuses any other effort (issue 14: no more silent "max"); vLLM answers 400.
  for (const effort of ['no_think', 'medium']) {
    const r = await post(srv.base, '/v1/chat/completions', {
      model: 'moonrun-demo', max_tokens: 6, reasoning_effort: effort,
      messages: [{ role: 'user', content: 'Three friends split a bill.' }] }, { Authorization: 'Bearer EMPTY' });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /^reasoning_effort: Kimi K3 supports thinking_effort values low, high, max/);
  }
});
