// Issue 15, items 5 and 6: SIGTERM with --shutdown-timeout stops accepting, lets running
// requests go on until the deadline, then cuts them with a proper final answer and exits in
// time; a full queue is a 503 with Retry-After (counted in /metrics), never a 200 whose
// stream carries an error.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startServer, post, sseEvents, metric, sleep } from './harness.mjs';

// A request whose answer is read as it comes; resolves with status, headers and the body.
function request(base, path, body) {
  return new Promise((resolve) => {
    const req = http.request(base + path, { method: 'POST', agent: false, headers: { 'Content-Type': 'application/json' } }, (res) => {
      let text = '';
      res.on('data', (d) => { text += d; });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, text, complete: true }));
      res.on('error', () => resolve({ status: res.statusCode, headers: res.headers, text, complete: false }));
    });
    req.on('error', (e) => resolve({ status: 0, error: e.code, text: '' }));
    req.end(JSON.stringify(body));
  });
}

test('item 5: SIGTERM with --shutdown-timeout 3 cuts what still runs, with a final event, and exits in time', async () => {
  const srv = await startServer(['--shutdown-timeout', '3', '--max-running-requests', '8']);
  const long = { model: 'moonrun-demo', max_tokens: 8000, ignore_eos: true, temperature: 0 };
  const streams = Array.from({ length: 3 }, () => request(srv.base, '/v1/chat/completions',
    { ...long, stream: true, messages: [{ role: 'user', content: 'tell me everything' }] }));
  const plain = Array.from({ length: 2 }, () => request(srv.base, '/v1/completions', { ...long, prompt: 'the deep ocean' }));
  for (let i = 0; i < 100 && (await metric(srv.base, 'vllm:num_requests_running')) < 5; ++i) await sleep(20);
  await sleep(300);
  const t0 = Date.now();
  srv.proc.kill('SIGTERM');
  await sleep(300);
  // Stopped accepting: a new request is refused (connection refused, or 503 on a late accept).
  const late = await request(srv.base, '/v1/completions', { ...long, prompt: 'late', max_tokens: 2 });
  assert.ok(late.status === 0 || late.status === 503, 'after SIGTERM: ' + JSON.stringify(late).slice(0, 200));
  const exit = await srv.exited;
  const exitMs = Date.now() - t0;
  assert.equal(exit.code, 0, srv.log().slice(-2000));
  assert.ok(exitMs < 3000 + 2500, `exited ${exitMs} ms after SIGTERM with --shutdown-timeout 3`);
  for (const s of await Promise.all(streams)) {
    assert.equal(s.status, 200);
    assert.ok(s.complete, 'the chunked stream was terminated properly');
    const events = sseEvents(s.text);
    assert.equal(events.at(-1), '[DONE]', 'the stream ends with [DONE]');
    const last = JSON.parse(events.at(-2));
    assert.equal(last.error?.code, 'server_shutting_down', events.at(-2));
  }
  for (const p of await Promise.all(plain)) {
    assert.equal(p.status, 503, p.text);
    assert.equal(JSON.parse(p.text).error.code, 'server_shutting_down');
    assert.ok(p.headers['retry-after'], 'Retry-After');
  }
  assert.match(srv.log(), /cut/);
});

test('item 5: requests that finish before the deadline are answered in full', async () => {
  const srv = await startServer(['--shutdown-timeout', '20']);
  const short = request(srv.base, '/v1/completions', { model: 'moonrun-demo', prompt: 'a', max_tokens: 40, ignore_eos: true });
  await sleep(100);
  const t0 = Date.now();
  srv.proc.kill('SIGTERM');
  const r = await short;
  assert.equal(r.status, 200, r.text);
  assert.equal(JSON.parse(r.text).usage.completion_tokens, 40);
  await srv.exited;
  assert.ok(Date.now() - t0 < 10000, 'exits once nothing runs, not at the deadline');
});

test('item 6: a full queue answers 503 + Retry-After, counted in /metrics; no 200 carries an error', async () => {
  const srv = await startServer(['--max-running-requests', '1', '--max-queued-requests', '2']);
  try {
    let refused = 0;
    for (let round = 0; round < 3; ++round) {
      const body = (i) => ({ model: 'moonrun-demo', max_tokens: 24, ignore_eos: true, stream: i % 4 !== 0,
                             messages: [{ role: 'user', content: `request ${i}` }] });
      const rs = await Promise.all(Array.from({ length: 40 }, (_, i) => request(srv.base, '/v1/chat/completions', body(i))));
      for (const r of rs) {
        if (r.status === 503) {
          ++refused;
          assert.ok(r.headers['retry-after'], 'a 503 says when to retry');
          assert.ok(JSON.parse(r.text).error, r.text);
          continue;
        }
        assert.equal(r.status, 200, r.text.slice(0, 300));
        // An error envelope or SSE error event is `"error":{`; generated text may say "error"
        // (escaped inside a string, so never an unescaped quote before it).
        assert.doesNotMatch(r.text, /(?<!\\)"error":\s*\{/, 'an admitted request never turns into an error: ' + r.text.slice(-300));
      }
    }
    assert.ok(refused > 0, 'the queue did fill');
    assert.equal(await metric(srv.base, 'moonrun:request_rejected_total{status="503"}'), refused);
    assert.equal(await metric(srv.base, 'moonrun:http_responses_total{status="503"}'), refused);
  } finally {
    await srv.stop();
  }
});
