// Concurrency: 64 streams, a client killed mid-stream, and batching that changes nothing.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startServer, post, sseEvents, metric, generate, sleep } from './harness.mjs';

let srv;
before(async () => { srv = await startServer(['--max-running-requests', '64']); });
after(async () => { await srv?.stop(); });

test('64 concurrent streaming clients all finish with well-formed streams', async () => {
  const one = (i) => post(srv.base, '/v1/chat/completions', {
    model: 'moonrun-demo', max_tokens: 8, temperature: 0.9, stream: true, stream_options: { include_usage: true },
    messages: [{ role: 'user', content: `Write one interesting paragraph about topic #${i}: the deep ocean.` }] });
  const results = await Promise.all(Array.from({ length: 64 }, (_, i) => one(i)));
  for (const r of results) {
    assert.equal(r.status, 200, r.text);
    const events = sseEvents(r.text);
    assert.equal(events.at(-1), '[DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');
    assert.equal(chunks.flatMap((c) => c.choices).filter((c) => c.finish_reason).length, 1);
    assert.ok(chunks.at(-1).usage.completion_tokens >= 1);
  }
});

test('a client killed mid-stream is aborted and frees its slot (visible in /metrics)', async () => {
  const body = JSON.stringify({ model: 'moonrun-demo', prompt: 'The deep ocean', max_tokens: 4000, ignore_eos: true, stream: true });
  await new Promise((resolve, reject) => {
    const req = http.request(srv.base + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' } }, (res) => {
      let n = 0;
      res.on('data', () => { if (++n === 3) { req.destroy(); resolve(); } });
      res.on('error', () => {});
    });
    req.on('error', () => {});
    req.end(body);
    setTimeout(() => reject(new Error('no data')), 60000);
  });
  let running = -1;
  for (let i = 0; i < 100; ++i) {
    running = await metric(srv.base, 'vllm:num_requests_running');
    if (running === 0) break;
    await sleep(100);
  }
  assert.equal(running, 0, 'the aborted request left the batch');
  assert.equal(await metric(srv.base, 'moonrun:kda_state_slots_used'), 0);
  assert.equal(await metric(srv.base, 'vllm:kv_cache_usage_perc'), 0);
});

test('greedy outputs in a concurrent batch equal moonrun generate', async () => {
  const prompts = [[1, 2, 3], [40, 41, 42, 43, 44, 45, 46], Array.from({ length: 70 }, (_, i) => (i * 7) % 200 + 5), [9]];
  const expected = prompts.map((p) => generate(p, 8).token_ids);
  const results = await Promise.all(prompts.map((p) => post(srv.base, '/v1/completions', {
    model: 'moonrun-demo', prompt: p, max_tokens: 8, temperature: 0, ignore_eos: true, skip_special_tokens: false })));
  for (let i = 0; i < prompts.length; ++i) {
    assert.equal(results[i].status, 200, results[i].text);
    const text = results[i].json.choices[0].text;
    const want = await post(srv.base, '/detokenize', { model: 'moonrun-demo', tokens: expected[i] });
    assert.equal(text, want.json.prompt, `prompt ${i}`);
  }
});
