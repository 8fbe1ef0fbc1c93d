// Every error case of the API, over raw HTTP: status, OpenAI envelope, and the server keeps serving.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, post } from './harness.mjs';

let srv;
const KEY = 'sk-test-123';
const auth = { Authorization: `Bearer ${KEY}` };
before(async () => {
  srv = await startServer(['--api-key', KEY, '--max-request-bytes', '20000', '--context-length', '512']);
});
after(async () => { await srv?.stop(); });

function envelope(r, status, code) {
  assert.equal(r.status, status, r.text);
  assert.ok(r.json && r.json.error, 'an OpenAI error envelope: ' + r.text);
  const e = r.json.error;
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 0);
  assert.equal(typeof e.type, 'string');
  assert.ok('param' in e && 'code' in e);
  if (code !== undefined) assert.equal(e.code, code);
  return e;
}

const chat = (extra = {}) => ({ model: 'moonrun-demo', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }], ...extra });

test('401 without or with a wrong key; /health needs none', async () => {
  envelope(await post(srv.base, '/v1/chat/completions', chat()), 401);
  envelope(await post(srv.base, '/v1/chat/completions', chat(), { Authorization: 'Bearer nope' }), 401);
  assert.equal((await fetch(srv.base + '/v1/models')).status, 401);
  assert.equal((await fetch(srv.base + '/metrics')).status, 200, 'Prometheus scrapers carry no key (--protect-metrics closes it)');
  assert.equal((await fetch(srv.base + '/health')).status, 200);
  assert.equal((await fetch(srv.base + '/v1/models', { headers: auth })).status, 200);
});

test('400 for malformed JSON, wrong types, max_tokens < 1, unknown roles', async () => {
  envelope(await post(srv.base, '/v1/chat/completions', '{"model": "moonrun-demo", "messages": [', auth), 400);
  envelope(await post(srv.base, '/v1/chat/completions', '[1, 2]', auth), 400);
  let e = envelope(await post(srv.base, '/v1/chat/completions', chat({ temperature: 'hot' }), auth), 400);
  assert.match(e.message, /temperature/);
  e = envelope(await post(srv.base, '/v1/chat/completions', chat({ max_tokens: 0 }), auth), 400);
  assert.match(e.message, /max_tokens/);
  e = envelope(await post(srv.base, '/v1/chat/completions', chat({ messages: [{ role: 'robot', content: 'hi' }] }), auth), 400);
  assert.match(e.message, /role/);
  envelope(await post(srv.base, '/v1/chat/completions', chat({ messages: 'hi' }), auth), 400);
  envelope(await post(srv.base, '/v1/chat/completions', chat({ stream: 'yes' }), auth), 400);
  envelope(await post(srv.base, '/v1/completions', { model: 'moonrun-demo', prompt: [1, -5] }, auth), 400);
  envelope(await post(srv.base, '/v1/completions', { model: 'moonrun-demo' }, auth), 400);
});

test('400 context_length_exceeded when prompt + max_tokens exceed the context', async () => {
  envelope(await post(srv.base, '/v1/chat/completions', chat({ max_tokens: 600 }), auth), 400, 'context_length_exceeded');
  const long = 'word '.repeat(700);
  envelope(await post(srv.base, '/v1/completions', { model: 'moonrun-demo', prompt: long, max_tokens: 1 }, auth), 400, 'context_length_exceeded');
});

test('404 for an unknown model and an unknown route', async () => {
  envelope(await post(srv.base, '/v1/chat/completions', chat({ model: 'gpt-9' }), auth), 404, 'model_not_found');
  const r = await fetch(srv.base + '/v1/nothing', { headers: auth });
  assert.equal(r.status, 404);
  assert.ok((await r.json()).error);
});

test('413 over --max-request-bytes', async () => {
  envelope(await post(srv.base, '/v1/chat/completions', chat({ messages: [{ role: 'user', content: 'x'.repeat(30000) }] }), auth), 413);
});

test('the server keeps serving after all of that', async () => {
  const r = await post(srv.base, '/v1/chat/completions', chat(), auth);
  assert.equal(r.status, 200, r.text);
  assert.equal((await fetch(srv.base + '/health')).status, 200);
});

test('503 when the waiting queue is full', async () => {
  const busy = await startServer(['--max-running-requests', '1', '--max-queued-requests', '1']);
  try {
    const body = { model: 'moonrun-demo', prompt: 'a b c', max_tokens: 200, ignore_eos: true };
    const results = await Promise.all(Array.from({ length: 6 }, () => post(busy.base, '/v1/completions', body)));
    const codes = results.map((r) => r.status);
    assert.ok(codes.includes(503), 'some were refused: ' + codes);
    assert.ok(codes.includes(200), 'some were served: ' + codes);
    for (const r of results.filter((r) => r.status === 503)) envelope(r, 503);
  } finally {
    await busy.stop();
  }
});
