// The OpenAI Responses API (POST /v1/responses) through the official openai client:
// responses.create streamed and not, the client's own stream accumulator
// (responses.stream().finalResponse()), a function-call round trip, structured output, the
// reasoning as summaries, Codex's namespace and hosted tools, and the response store
// (previous_response_id, item_reference).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Ajv from 'ajv';
import { startServer, post } from './harness.mjs';
import { makePng, dataUri } from './png.mjs';

let srv, client;
before(async () => {
  srv = await startServer();
  client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'EMPTY', maxRetries: 0, timeout: 120000 });
});
after(async () => { await srv?.stop(); });

function checkUsage(u) {
  assert.ok(Number.isInteger(u.input_tokens) && u.input_tokens > 0);
  assert.ok(Number.isInteger(u.output_tokens) && u.output_tokens > 0);
  assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
  assert.ok(u.output_tokens_details.reasoning_tokens <= u.output_tokens);
}

test('responses.create, not streamed: reasoning item, message, output_text, usage', async () => {
  const r = await client.responses.create({
    model: 'moonrun-demo', input: 'Who are you?', instructions: 'Be brief.', max_output_tokens: 24, temperature: 0,
  });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp-/);
  assert.ok(['completed', 'incomplete'].includes(r.status));
  if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(r.instructions, 'Be brief.');
  const kinds = r.output.map((o) => o.type);
  assert.ok(kinds.includes('message'), JSON.stringify(kinds));
  const msg = r.output.find((o) => o.type === 'message');
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.content[0].type, 'output_text');
  assert.equal(r.output_text, msg.content[0].text);  // the client's own convenience field
  const reasoning = r.output.find((o) => o.type === 'reasoning');
  // The reasoning is the item's summary: what the Responses clients read and show.
  if (reasoning) assert.equal(reasoning.summary[0].type, 'summary_text');
  checkUsage(r.usage);
  assert.ok(r.usage.output_tokens <= 24);
});

test('responses.create, streamed: the event sequence a client accumulates', async () => {
  const stream = await client.responses.create({
    model: 'moonrun-demo', stream: true, max_output_tokens: 20, temperature: 0.8,
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'Tell me about MoE.' }] }],
  });
  const events = [];
  for await (const e of stream) events.push(e);
  assert.equal(events[0].type, 'response.created');
  assert.equal(events[1].type, 'response.in_progress');
  const last = events.at(-1);
  assert.ok(['response.completed', 'response.incomplete'].includes(last.type), last.type);
  events.forEach((e, i) => assert.equal(e.sequence_number, i));
  // Deltas add up to the final items.
  let reasoning = '', text = '';
  for (const e of events) {
    if (e.type === 'response.reasoning_summary_text.delta') reasoning += e.delta;
    if (e.type === 'response.output_text.delta') text += e.delta;
  }
  const final = last.response;
  assert.equal(final.output.find((o) => o.type === 'message').content[0].text, text);
  const r = final.output.find((o) => o.type === 'reasoning');
  assert.equal(r ? r.summary[0].text : '', reasoning);
  checkUsage(final.usage);
  // Items open and close in order.
  const added = events.filter((e) => e.type === 'response.output_item.added').map((e) => e.output_index);
  const done = events.filter((e) => e.type === 'response.output_item.done').map((e) => e.output_index);
  assert.deepEqual(added, done);
  assert.deepEqual(added, [...added.keys()]);
});

test('responses.stream() accumulates to the same response the events describe', async () => {
  const runner = client.responses.stream({
    model: 'moonrun-demo', input: 'Hello there', max_output_tokens: 16, temperature: 0,
  });
  const final = await runner.finalResponse();
  const direct = await client.responses.create({
    model: 'moonrun-demo', input: 'Hello there', max_output_tokens: 16, temperature: 0,
  });
  assert.equal(final.output_text, direct.output_text);  // greedy: streamed == whole
  assert.deepEqual(final.output.map((o) => o.type), direct.output.map((o) => o.type));
});

const TOOLS = [{
  type: 'function', name: 'get_weather', description: 'Weather for a city',
  parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 16 }, unit: { enum: ['c', 'f'] } },
                required: ['city', 'unit'], additionalProperties: false },
}];
const ajv = new Ajv({ strict: true });
const validateArgs = ajv.compile(TOOLS[0].parameters);

test('function-call round trip, streamed and not', async () => {
  for (const stream of [false, true]) {
    const input = [{ role: 'user', content: 'Weather in Oslo?' }];
    const params = { model: 'moonrun-demo', input, tools: TOOLS, max_output_tokens: 200, temperature: 1,
                     tool_choice: { type: 'function', name: 'get_weather' } };
    const first = stream ? await client.responses.stream(params).finalResponse() : await client.responses.create(params);
    const calls = first.output.filter((o) => o.type === 'function_call');
    assert.equal(calls.length, 1, JSON.stringify(first.output));
    assert.equal(calls[0].name, 'get_weather');
    assert.ok(validateArgs(JSON.parse(calls[0].arguments)), calls[0].arguments);
    // Hand the items back with the tool's output, as agent loops do.
    const second = await client.responses.create({
      model: 'moonrun-demo', tools: TOOLS, max_output_tokens: 16, temperature: 0,
      input: [...input, ...first.output, { type: 'function_call_output', call_id: calls[0].call_id, output: '{"temp": 4}' }],
    });
    assert.ok(['completed', 'incomplete'].includes(second.status));
    assert.ok(second.output.some((o) => o.type === 'message'));
  }
});

test('text.format json_schema gives JSON that validates', async () => {
  const schema = { type: 'object', properties: { ok: { type: 'boolean' }, n: { type: 'integer', minimum: 1, maximum: 9 } },
                   required: ['ok', 'n'], additionalProperties: false };
  const validate = ajv.compile(schema);
  for (let i = 0; i < 5; ++i) {
    const r = await client.responses.create({
      model: 'moonrun-demo', input: 'json please', max_output_tokens: 120, temperature: 1,
      text: { format: { type: 'json_schema', name: 'out', schema, strict: true } },
    });
    const v = JSON.parse(r.output_text);
    assert.ok(validate(v), r.output_text);
  }
});

test('unsupported parts are 400s naming the field', async () => {
  for (const [body, field] of [
    [{ input: 'x', previous_response_id: 'resp_1' }, 'previous_response_id'],  // never stored
    [{ input: 'x', tools: [{ type: 'custom', name: 'x' }] }, 'tools[0].type'],
    [{ input: 'x', tools: [{ type: 'no_such_tool' }] }, 'tools[0].type'],
    [{ input: [{ type: 'item_reference', id: 'x' }] }, 'input[0].id'],  // never stored
    [{ input: 'x', background: true }, 'background'],
    [{ input: 'x', store: 'yes' }, 'store'],
    [{}, 'input'],
    [{ input: 'x', reasoning: { effort: 'medium' } }, 'reasoning_effort'],
  ]) {
    const r = await post(srv.base, '/v1/responses', { model: 'moonrun-demo', max_output_tokens: 4, ...body });
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.ok(r.json.error.message.startsWith(field), r.json.error.message);
  }
});

test('input_image parts: the seed\'s PNG is read and billed; a bad image or a file_id is a 400', async () => {
  const question = 'What do you see in this image?';
  const withImage = await client.responses.create({
    model: 'moonrun-demo', max_output_tokens: 4, reasoning: { effort: 'low' },
    input: [{ role: 'user', content: [{ type: 'input_text', text: question },
      { type: 'input_image', image_url: dataUri(makePng()) }] }],
  });
  assert.equal(withImage.status === 'completed' || withImage.status === 'incomplete', true, withImage.status);
  const textOnly = await client.responses.create({
    model: 'moonrun-demo', max_output_tokens: 4, reasoning: { effort: 'low' },
    input: [{ role: 'user', content: [{ type: 'input_text', text: question }] }],
  });
  // 25 image rows plus the image's frame tokens.
  assert.ok(withImage.usage.input_tokens - textOnly.usage.input_tokens > 25,
    `${withImage.usage.input_tokens} vs ${textOnly.usage.input_tokens}`);
  for (const [part, want] of [
    [{ type: 'input_image', image_url: 'data:image/png;base64,' + makePng().subarray(0, 60).toString('base64') }, /truncated/],
    [{ type: 'input_image', file_id: 'file_1' }, /^input\[0\]\.content\[0\]\.file_id/],
  ]) {
    const r = await post(srv.base, '/v1/responses', { model: 'moonrun-demo', max_output_tokens: 4,
      input: [{ role: 'user', content: [part] }] });
    assert.equal(r.status, 400, JSON.stringify(r.json));
    assert.match(r.json.error.message, want);
  }
  // An image in an assistant message is refused by name.
  const r = await post(srv.base, '/v1/responses', { model: 'moonrun-demo', max_output_tokens: 4, input: [
    { role: 'assistant', content: [{ type: 'input_image', image_url: dataUri(makePng()) }] }, { role: 'user', content: 'x' }] });
  assert.equal(r.status, 400);
  assert.match(r.json.error.message, /^input\[0\]\.content\[0\]: input_image parts are taken in user messages only/);
});

const CALC = { type: 'function', name: 'calculate', description: 'Evaluate a basic arithmetic expression.',
  parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] } };

test("Codex's tools: a namespace is flattened, calls name it; hosted tools are dropped with a warning", async () => {
  const r = await post(srv.base, '/v1/responses', {
    model: 'moonrun-demo', input: 'What is 47 * 89? Use your tools.', max_output_tokens: 300, temperature: 0, store: false,
    tools: [{ type: 'namespace', name: 'mcp__seed', description: 'seed tools', tools: [CALC] },
            { type: 'web_search', external_web_access: false }] });
  assert.equal(r.status, 200, r.text);
  const res = await fetch(srv.base + '/v1/responses', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'moonrun-demo', input: 'x', max_output_tokens: 2, tools: [{ type: 'web_search' }] }) });
  assert.match(res.headers.get('x-moonrun-warning'), /tools\[0\] \(web_search\)/);
  const call = r.json.output.find((o) => o.type === 'function_call');
  if (call) {  // the model's choice; when it calls, the call names the namespace
    assert.equal(call.name, 'calculate');
    assert.equal(call.namespace, 'mcp__seed');
  }
  const dup = await post(srv.base, '/v1/responses', { model: 'moonrun-demo', input: 'x', max_output_tokens: 2,
    tools: [CALC, { type: 'namespace', name: 'n', tools: [CALC] }] });
  assert.equal(dup.status, 400);
  assert.match(dup.json.error.message, /^tools\[1\]\.tools\[0\]\.name/);
});

test('store: previous_response_id and item_reference build on a stored response', async () => {
  const first = await client.responses.create({ model: 'moonrun-demo', input: 'Who are you?', max_output_tokens: 40 });
  assert.equal(first.store, true);
  const second = await client.responses.create({ model: 'moonrun-demo', previous_response_id: first.id,
                                                  input: 'And again?', max_output_tokens: 8 });
  assert.equal(second.previous_response_id, first.id);
  // The follow-up's prompt holds the first exchange: more input tokens than the bare question.
  const bare = await client.responses.create({ model: 'moonrun-demo', input: 'And again?', max_output_tokens: 8 });
  assert.ok(second.usage.input_tokens > bare.usage.input_tokens);
  // item_reference to the first response's items: the same prompt as sending them inline.
  const refs = first.output.map((o) => ({ type: 'item_reference', id: o.id }));
  const byRef = await client.responses.create({ model: 'moonrun-demo', max_output_tokens: 8,
    input: [{ role: 'user', content: 'Who are you?' }, ...refs, { role: 'user', content: 'And again?' }] });
  const inline = await client.responses.create({ model: 'moonrun-demo', max_output_tokens: 8, store: false,
    input: [{ role: 'user', content: 'Who are you?' }, ...first.output, { role: 'user', content: 'And again?' }] });
  assert.equal(byRef.usage.input_tokens, inline.usage.input_tokens);
  assert.equal(inline.store, false);
  const missing = await post(srv.base, '/v1/responses', { model: 'moonrun-demo', previous_response_id: inline.id, input: 'x' });
  assert.equal(missing.status, 400);  // store: false keeps nothing
  assert.match(missing.json.error.message, /not found/);
});
