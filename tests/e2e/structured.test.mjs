// Structured output through the official openai client on the demo model, whose weights
// are random: nothing but the token mask makes its output valid. Every reply is checked
// with ajv (a real JSON Schema validator) against the schema the request sent.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Ajv from 'ajv';
import { startServer, post } from './harness.mjs';

let srv, client;
before(async () => {
  srv = await startServer();
  client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'EMPTY', maxRetries: 0, timeout: 300000 });
});
after(async () => { await srv?.stop(); });

// Nested: objects in objects, arrays of objects, $defs/$ref, enums, bounds, a pattern,
// anyOf with null, optional and required properties, no extra keys.
const PERSON = {
  type: 'object',
  $defs: {
    address: {
      type: 'object',
      properties: {
        city: { type: 'string', maxLength: 24 },
        zip: { type: 'string', pattern: '^[0-9]{5}$' },
        geo: { type: 'array', items: { type: 'number' }, minItems: 2, maxItems: 2 },
      },
      required: ['city', 'zip'],
      additionalProperties: false,
    },
  },
  properties: {
    name: { type: 'string' },
    age: { type: 'integer', minimum: 0, maximum: 130 },
    role: { enum: ['admin', 'user', 'guest'] },
    home: { $ref: '#/$defs/address' },
    pets: {
      type: 'array', maxItems: 3,
      items: {
        type: 'object',
        properties: { kind: { enum: ['cat', 'dog'] }, legs: { type: 'integer', minimum: 0, maximum: 4 } },
        required: ['kind', 'legs'], additionalProperties: false,
      },
    },
    nickname: { anyOf: [{ type: 'string', maxLength: 8 }, { type: 'null' }] },
    verified: { type: 'boolean' },
  },
  required: ['name', 'age', 'role', 'home', 'pets', 'nickname', 'verified'],
  additionalProperties: false,
};

const ajv = new Ajv({ strict: true, allErrors: true });
const validatePerson = ajv.compile(PERSON);

async function content(params) {
  if (!params.stream) {
    const r = await client.chat.completions.create(params);
    return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason };
  }
  let text = '';
  let finish = null;
  for await (const chunk of await client.chat.completions.create(params)) {
    for (const c of chunk.choices) {
      if (c.delta?.content) text += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish };
}

test('response_format json_schema: 50 sampled replies at temperature 1 all validate', async () => {
  for (let i = 0; i < 50; ++i) {
    const params = {
      model: 'moonrun-demo', temperature: 1, max_tokens: 200 + 10 * (i % 7), seed: 1000 + i,
      messages: [{ role: 'user', content: `Describe person number ${i} as JSON.` }],
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON, strict: true } },
      stream: i % 2 === 1,
    };
    if (i % 3 === 0) params.reasoning_effort = 'none';  // the whole budget goes to the JSON
    const { text, finish } = await content(params);
    let value;
    try { value = JSON.parse(text); } catch (e) { assert.fail(`request ${i}: not JSON (${e.message}): ${text}`); }
    assert.ok(validatePerson(value), `request ${i}: ${ajv.errorsText(validatePerson.errors)}\n${text}`);
    assert.ok(['stop', 'length'].includes(finish), `request ${i}: finish ${finish}`);
  }
});

test('response_format json_object: any JSON object, n = 3 samples each valid', async () => {
  const r = await client.chat.completions.create({
    model: 'moonrun-demo', temperature: 1, max_tokens: 80, n: 3, reasoning_effort: 'none',
    messages: [{ role: 'user', content: 'Reply with a JSON object.' }],
    response_format: { type: 'json_object' },
  });
  assert.equal(r.choices.length, 3);
  for (const c of r.choices) {
    const v = JSON.parse(c.message.content);
    assert.equal(typeof v, 'object');
    assert.ok(v !== null && !Array.isArray(v));
  }
});

const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'Weather in a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 20 }, unit: { enum: ['c', 'f'] }, days: { type: 'integer', minimum: 1, maximum: 7 } },
      required: ['city', 'unit'], additionalProperties: false,
    },
  },
};
const TIME = {
  type: 'function',
  function: { name: 'get_time', parameters: { type: 'object', properties: { tz: { type: 'string' } }, required: ['tz'] } },
};
const validateWeather = ajv.compile(WEATHER.function.parameters);
const validateTime = ajv.compile(TIME.function.parameters);

test('tool_choice required and named: a call whose arguments validate', async () => {
  for (let i = 0; i < 8; ++i) {
    const named = i % 2 === 0;
    const r = await client.chat.completions.create({
      model: 'moonrun-demo', temperature: 1, max_tokens: 240, seed: i,
      messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
      tools: [WEATHER, TIME],
      tool_choice: named ? { type: 'function', function: { name: 'get_weather' } } : 'required',
      parallel_tool_calls: i % 3 === 0 ? false : undefined,
    });
    const c = r.choices[0];
    assert.ok(c.message.tool_calls?.length >= 1, `request ${i}: no tool call: ${JSON.stringify(c.message)}`);
    if (named || i % 3 === 0) assert.equal(c.message.tool_calls.length, 1);
    assert.equal(c.finish_reason, 'tool_calls');
    for (const call of c.message.tool_calls) {
      const args = JSON.parse(call.function.arguments);
      if (named) assert.equal(call.function.name, 'get_weather');
      const v = call.function.name === 'get_weather' ? validateWeather : validateTime;
      assert.ok(v(args), `request ${i}: ${ajv.errorsText(v.errors)} in ${call.function.arguments}`);
    }
  }
});

test('a schema that cannot be compiled is a 400 naming the part', async () => {
  const bad = { type: 'object', properties: { tags: { type: 'array', items: { type: 'string' }, uniqueItems: true } } };
  const r = await post(srv.base, '/v1/chat/completions', {
    model: 'moonrun-demo', max_tokens: 8, messages: [{ role: 'user', content: 'x' }],
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: bad } },
  });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.message, 'response_format.json_schema.schema.properties.tags.uniqueItems: not supported');
  const tool = await post(srv.base, '/v1/chat/completions', {
    model: 'moonrun-demo', max_tokens: 8, messages: [{ role: 'user', content: 'x' }], tool_choice: 'required',
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { p: { not: {} } } } } }],
  });
  assert.equal(tool.status, 400);
  assert.match(tool.json.error.message, /^tools\[0\]\.function\.parameters\.properties\.p\.not: not supported/);
  const small = await post(srv.base, '/v1/chat/completions', {
    model: 'moonrun-demo', max_tokens: 3, messages: [{ role: 'user', content: 'x' }],
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON } },
  });
  assert.equal(small.status, 400);
  assert.match(small.json.error.message, /^max_tokens: 3 is too small/);
  // The server still serves.
  const ok = await post(srv.base, '/v1/chat/completions', {
    model: 'moonrun-demo', max_tokens: 4, messages: [{ role: 'user', content: 'x' }],
  });
  assert.equal(ok.status, 200);
});
