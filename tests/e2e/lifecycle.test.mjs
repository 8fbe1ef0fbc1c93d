// SIGTERM drains: running requests finish, new ones are refused, the process exits 0.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, post, sleep } from './harness.mjs';

test('SIGTERM lets a running request finish, then exits 0', async () => {
  const srv = await startServer(['--shutdown-timeout', '60']);
  const running = post(srv.base, '/v1/completions', { model: 'moonrun-demo', prompt: 'a', max_tokens: 40, ignore_eos: true });
  await sleep(300);
  srv.proc.kill('SIGTERM');
  const r = await running;
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.usage.completion_tokens, 40);
  const exit = await srv.exited;
  assert.equal(exit.code, 0, srv.log());
  assert.match(srv.log(), /draining/);
});

test('a backend failure: streams get an SSE error event, pending requests 500, /health 503', async () => {
  const srv = await startServer(['--debug-fail-after-steps', '3']);
  try {
    const body = { model: 'moonrun-demo', prompt: 'a b c', max_tokens: 50, ignore_eos: true };
    const [streamed, plain] = await Promise.all([
      post(srv.base, '/v1/completions', { ...body, stream: true }),
      post(srv.base, '/v1/completions', body)]);
    assert.equal(streamed.status, 200, 'the stream had started');
    const events = streamed.text.split('\n\n').filter((b) => b.trim()).map((b) => b.slice(6));
    assert.equal(events.at(-1), '[DONE]');
    const err = JSON.parse(events.at(-2));
    assert.ok(err.error && /injected backend failure/.test(err.error.message), events.at(-2));
    assert.equal(plain.status, 500, plain.text);
    assert.ok(plain.json.error);
    assert.equal((await fetch(srv.base + '/health')).status, 503);
    const after = await post(srv.base, '/v1/completions', body);
    assert.equal(after.status, 503);
    assert.ok(after.json.error);
  } finally {
    await srv.stop();
  }
});
