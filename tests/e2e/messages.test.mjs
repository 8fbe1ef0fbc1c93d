// The Anthropic Messages API (POST /v1/messages) through the official @anthropic-ai/sdk
// client: messages.create streamed and not, the client's stream accumulator
// (messages.stream().finalMessage()), thinking blocks, and a tool_use / tool_result round
// trip whose input validates against the tool's input_schema (ajv); what Claude Code sends
// (system turns in messages, adaptive thinking, effort, context_management, deferred
// tools), output_config.format, count_tokens, Anthropic's usage and error envelopes.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import Ajv from 'ajv';
import { startServer, post } from './harness.mjs';
import { makePng } from './png.mjs';

let srv, client;
before(async () => {
  srv = await startServer();
  client = new Anthropic({ baseURL: srv.base, apiKey: 'EMPTY', maxRetries: 0, timeout: 120000 });
});
after(async () => { await srv?.stop(); });

function checkMessage(m, maxTokens) {
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg-/);
  assert.ok(['end_turn', 'max_tokens', 'stop_sequence', 'tool_use'].includes(m.stop_reason), m.stop_reason);
  assert.ok(Number.isInteger(m.usage.input_tokens) && m.usage.input_tokens > 0);
  assert.ok(m.usage.output_tokens > 0 && m.usage.output_tokens <= maxTokens);
  for (const b of m.content) assert.ok(['thinking', 'text', 'tool_use'].includes(b.type), b.type);
}

test('messages.create, not streamed: thinking and text blocks, usage', async () => {
  const m = await client.messages.create({
    model: 'moonrun-demo', max_tokens: 24, temperature: 0, system: 'Be brief.',
    messages: [{ role: 'user', content: 'Who are you?' }],
  });
  checkMessage(m, 24);
  const kinds = m.content.map((b) => b.type);
  assert.ok(kinds.includes('text'), JSON.stringify(kinds));
  const thinking = m.content.find((b) => b.type === 'thinking');
  if (thinking) assert.equal(typeof thinking.thinking, 'string');
  const off = await client.messages.create({
    model: 'moonrun-demo', max_tokens: 8, temperature: 0, thinking: { type: 'disabled' },
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Hi' }] }],
  });
  assert.ok(!off.content.some((b) => b.type === 'thinking'), JSON.stringify(off.content));
});

test('messages.create, streamed: Anthropic events in order; the stream accumulator agrees', async () => {
  const params = { model: 'moonrun-demo', max_tokens: 20, temperature: 0,
                   messages: [{ role: 'user', content: 'Explain attention.' }] };
  const events = [];
  for await (const e of await client.messages.create({ ...params, stream: true })) events.push(e);
  assert.equal(events[0].type, 'message_start');
  assert.equal(events.at(-1).type, 'message_stop');
  assert.equal(events.at(-2).type, 'message_delta');
  // Blocks start, take deltas and stop in index order, never interleaved.
  let open = -1;
  for (const e of events) {
    if (e.type === 'content_block_start') { assert.equal(e.index, open + 1); open = e.index; }
    if (e.type === 'content_block_delta') assert.equal(e.index, open);
    if (e.type === 'content_block_stop') assert.equal(e.index, open);
  }
  const final = await client.messages.stream(params).finalMessage();
  const whole = await client.messages.create(params);
  checkMessage(final, 20);
  assert.deepEqual(final.content, whole.content);  // greedy: streamed == whole
  assert.equal(final.stop_reason, whole.stop_reason);
});

const WEATHER = {
  name: 'get_weather', description: 'Weather for a city',
  input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 16 }, days: { type: 'integer', minimum: 1, maximum: 5 } },
                  required: ['city', 'days'], additionalProperties: false },
};
const validateInput = new Ajv({ strict: true }).compile(WEATHER.input_schema);

test('tool_use / tool_result round trip, streamed and not', async () => {
  for (const stream of [false, true]) {
    const messages = [{ role: 'user', content: 'Weather in Oslo for 2 days?' }];
    const params = { model: 'moonrun-demo', max_tokens: 200, temperature: 1, tools: [WEATHER],
                     tool_choice: { type: 'tool', name: 'get_weather' }, messages };
    const first = stream ? await client.messages.stream(params).finalMessage() : await client.messages.create(params);
    checkMessage(first, 200);
    assert.equal(first.stop_reason, 'tool_use');
    const uses = first.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1, JSON.stringify(first.content));
    assert.equal(uses[0].name, 'get_weather');
    assert.ok(validateInput(uses[0].input), JSON.stringify(uses[0].input));
    const second = await client.messages.create({
      model: 'moonrun-demo', max_tokens: 16, temperature: 0, tools: [WEATHER],
      messages: [...messages, { role: 'assistant', content: first.content },
                 { role: 'user', content: [{ type: 'tool_result', tool_use_id: uses[0].id, content: '4 degrees' }] }],
    });
    checkMessage(second, 16);
  }
});

test('tool_choice any with several tools; disable_parallel_tool_use gives one call', async () => {
  const TIME = { name: 'get_time', input_schema: { type: 'object', properties: { tz: { type: 'string' } }, required: ['tz'] } };
  const m = await client.messages.create({
    model: 'moonrun-demo', max_tokens: 200, temperature: 1, tools: [WEATHER, TIME],
    tool_choice: { type: 'any', disable_parallel_tool_use: true },
    messages: [{ role: 'user', content: 'Anything.' }],
  });
  assert.equal(m.stop_reason, 'tool_use');
  assert.equal(m.content.filter((b) => b.type === 'tool_use').length, 1);
});

test('bad requests are Anthropic-shaped 400s and the server keeps serving', async () => {
  await assert.rejects(
    client.messages.create({ model: 'moonrun-demo', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status === 400 && /max_tokens/.test(e.message));
  const r = await post(srv.base, '/v1/messages', {
    model: 'moonrun-demo', max_tokens: 4,
    messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: '' } }] }],
  });
  assert.equal(r.status, 400);
  assert.equal(r.json.type, 'error');
  assert.equal(r.json.error.type, 'invalid_request_error');
  // An empty image: the chat pipeline's image check answers, naming the block.
  assert.match(r.json.error.message, /^messages\[0\]\.content\[0\]/);
  const ok = await client.messages.create({ model: 'moonrun-demo', max_tokens: 2, messages: [{ role: 'user', content: 'x' }] });
  checkMessage(ok, 2);
});

test('image blocks: base64 sources are read and billed; an image in an assistant turn is a 400', async () => {
  const question = 'What do you see in this image?';
  const image = { type: 'image', source: { type: 'base64', media_type: 'image/png', data: makePng().toString('base64') } };
  const withImage = await client.messages.create({
    model: 'moonrun-demo', max_tokens: 4, temperature: 0,
    messages: [{ role: 'user', content: [image, { type: 'text', text: question }] }],
  });
  checkMessage(withImage, 4);
  const textOnly = await client.messages.create({
    model: 'moonrun-demo', max_tokens: 4, temperature: 0,
    messages: [{ role: 'user', content: [{ type: 'text', text: question }] }],
  });
  // 25 image rows plus the image's frame tokens.
  assert.ok(withImage.usage.input_tokens - textOnly.usage.input_tokens > 25,
    `${withImage.usage.input_tokens} vs ${textOnly.usage.input_tokens}`);
  const r = await post(srv.base, '/v1/messages', { model: 'moonrun-demo', max_tokens: 4, messages: [
    { role: 'user', content: 'x' }, { role: 'assistant', content: [image] }, { role: 'user', content: 'y' }] });
  assert.equal(r.status, 400);
  assert.match(r.json.error.message, /^messages\[1\]\.content\[0\]: image blocks are taken in user messages only/);
});

// What Claude Code 2.1 sends (seen on the wire from claude -p): a system turn inside messages,
// adaptive thinking with display, output_config.effort, context_management, cache_control,
// a defer_loading tool, metadata, max_tokens that the client sizes itself.
const SEED_TOOL = { name: 'calculate', description: 'Evaluate a basic arithmetic expression.',
  input_schema: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] } };
function claudeCodeBody(extra = {}) {
  return {
    model: 'moonrun-demo', max_tokens: 200, stream: false, metadata: { user_id: 'u' },
    system: [{ type: 'text', text: 'You are a helpful assistant with tools.', cache_control: { type: 'ephemeral' } }],
    messages: [
      { role: 'user', content: [{ type: 'text', text: 'What is 47 * 89? Use your tools.' }] },
      { role: 'system', content: [{ type: 'text', text: '# Environment\n - Platform: linux', cache_control: { type: 'ephemeral' } }] },
    ],
    tools: [SEED_TOOL, { name: 'Placeholder', description: 'never call this tool',
                         input_schema: { type: 'object', properties: {} }, defer_loading: true }],
    thinking: { type: 'adaptive', display: 'summarized' }, output_config: { effort: 'high' },
    context_management: { edits: [{ type: 'clear_thinking_20251015', keep: 'all' }] },
    ...extra,
  };
}

test("Claude Code's request shape is served; context_management says no edit was applied", async () => {
  const m = await client.messages.create(claudeCodeBody());
  checkMessage(m, 200);
  assert.deepEqual(m.context_management, { applied_edits: [] });
  // The deferred tool is not shown to the model: the rendered prompt is the same without it.
  const counted = async (tools) => (await post(srv.base, '/v1/messages/count_tokens',
    { ...claudeCodeBody(), max_tokens: undefined, tools })).json.input_tokens;
  assert.equal(await counted(claudeCodeBody().tools), await counted([SEED_TOOL]));
  assert.ok(await counted([SEED_TOOL]) > await counted(undefined));
});

test('display omitted: the thinking comes back through its signature', async () => {
  const m = await client.messages.create(claudeCodeBody({ thinking: { type: 'adaptive', display: 'omitted' } }));
  const t = m.content.find((b) => b.type === 'thinking');
  if (!t) return;  // the model did not think: nothing to check
  assert.equal(t.thinking, '');
  assert.ok(t.signature.length > 0);
  // Sent back without its text, the block counts the same as with it.
  const count = async (thinking) => (await post(srv.base, '/v1/messages/count_tokens', {
    model: 'moonrun-demo', messages: [{ role: 'user', content: 'hi' },
      { role: 'assistant', content: [{ type: 'thinking', thinking, signature: t.signature }, { type: 'text', text: 'ok' }] },
      { role: 'user', content: 'go on' }] })).json.input_tokens;
  const full = Buffer.from(t.signature.split('.')[1], 'base64').toString('utf8');
  assert.equal(await count(''), await count(full));
});

test('output_config.format: the reply is JSON that validates against the schema', async () => {
  const schema = { type: 'object', properties: { city: { type: 'string' }, n: { type: 'integer' } },
                   required: ['city', 'n'], additionalProperties: false };
  const m = await client.messages.create({ model: 'moonrun-demo', max_tokens: 300,
    messages: [{ role: 'user', content: 'Name a city.' }], output_config: { format: { type: 'json_schema', schema } } });
  const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  assert.ok(new Ajv().validate(schema, JSON.parse(text)), text);
});

test("usage as Anthropic counts it: input_tokens is the uncached part; message_start has the cached count", async () => {
  const long = 'You are a careful assistant. '.repeat(60);
  const body = { model: 'moonrun-demo', max_tokens: 8, system: long, messages: [{ role: 'user', content: 'Who are you?' }] };
  const total = (await post(srv.base, '/v1/messages/count_tokens', body)).json.input_tokens;
  await client.messages.create(body);  // fills the prefix cache
  const m = await client.messages.create(body);
  assert.ok(m.usage.cache_read_input_tokens > 0, JSON.stringify(m.usage));
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, total);
  const events = [];
  for await (const e of await client.messages.create({ ...body, stream: true })) events.push(e);
  const start = events.find((e) => e.type === 'message_start').message.usage;
  assert.ok(start.cache_read_input_tokens > 0, JSON.stringify(start));
  assert.equal(start.input_tokens + start.cache_read_input_tokens, total);
});

test("errors under /v1/messages are Anthropic's: 404s, the context limit Claude Code reads", async () => {
  const r = await post(srv.base, '/v1/messages/batches', {});
  assert.equal(r.status, 404);
  assert.equal(r.json.type, 'error');
  assert.equal(r.json.error.type, 'not_found_error');
  const big = await post(srv.base, '/v1/messages', { model: 'moonrun-demo', max_tokens: 32000,
                                                     messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(big.status, 400);
  assert.equal(big.json.error.type, 'invalid_request_error');
  // Claude Code's own pattern for this error, from its source.
  assert.match(big.json.error.message, /input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)/);
  const ct = await post(srv.base, '/v1/messages/count_tokens', { model: 'moonrun-demo', messages: 'x' });
  assert.equal(ct.status, 400);
  assert.equal(ct.json.error.type, 'invalid_request_error');
  assert.match(ct.json.error.message, /^messages/);
});
