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
