// A non-streaming client that goes away mid-generation is aborted and its cache freed within
// about one engine step (not when its answer would have been written, max_tokens later);
// keep-alive and pipelined connections, which also have bytes or idle time on the socket,
// are not mistaken for a disconnect.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import OpenAI from 'openai';
import { startServer, post, metric, sleep } from './harness.mjs';

let srv;
before(async () => { srv = await startServer(); });
after(async () => { await srv?.stop(); });

const RUNNING = 'vllm:num_requests_running';
const TOKENS = 'vllm:generation_tokens_total';
const ABORTED = 'vllm:request_success_total{finished_reason="abort"}';
const MAX_TOKENS = 4000;

async function waitFor(pred, ms, what) {
  const t0 = Date.now();
  for (;;) {
    if (await pred()) return;
    if (Date.now() - t0 > ms) throw new Error('timed out waiting for ' + what);
    await sleep(10);
  }
}

const idle = async () => (await metric(srv.base, RUNNING)) === 0 && (await metric(srv.base, 'vllm:num_requests_waiting')) === 0;

// Starts a raw, non-streaming request with a large max_tokens, waits until it is generating,
// destroys its socket and measures how long the engine keeps it.
async function abandonMidGeneration(path, body) {
  await waitFor(idle, 30000, 'an idle server');
  const kvBefore = await metric(srv.base, 'vllm:kv_cache_usage_perc');
  const abortedBefore = (await metric(srv.base, ABORTED)) ?? 0;
  const tokensBefore = await metric(srv.base, TOKENS);
  const req = http.request(srv.base + path, { method: 'POST', agent: false, headers: { 'Content-Type': 'application/json' } });
  let answered = false;
  req.on('response', () => { answered = true; });
  req.on('error', () => {});
  req.end(JSON.stringify({ model: 'moonrun-demo', max_tokens: MAX_TOKENS, ignore_eos: true, temperature: 0, ...body }));
  // Mid-generation: in the batch, and a few dozen tokens out.
  await waitFor(async () => (await metric(srv.base, RUNNING)) === 1 &&
                            (await metric(srv.base, TOKENS)) >= tokensBefore + 30, 60000, 'the request to generate');
  const t0 = performance.now();
  const tokensAtKill = await metric(srv.base, TOKENS) - tokensBefore;
  req.destroy();
  await waitFor(async () => (await metric(srv.base, RUNNING)) === 0, 5000, 'the request to leave the batch');
  const goneMs = performance.now() - t0;
  const tokensAtGone = await metric(srv.base, TOKENS) - tokensBefore;
  await sleep(300);
  const tokensLater = await metric(srv.base, TOKENS) - tokensBefore;
  assert.equal(answered, false, 'the client went away before any answer');
  return { goneMs, tokensAtKill, tokensAtGone, tokensLater, kvBefore, abortedBefore };
}

async function checkAbandoned(path, body) {
  const tokensPerSecond = await decodeRate();
  const r = await abandonMidGeneration(path, body);
  const finishMs = (MAX_TOKENS - r.tokensAtKill) / tokensPerSecond * 1000;
  console.log(`${path}: gone ${r.goneMs.toFixed(0)} ms after the socket was destroyed; ` +
              `${r.tokensAtKill} tokens then, ${r.tokensAtGone} when gone, ${r.tokensLater} 300 ms later; ` +
              `decode ${tokensPerSecond.toFixed(0)} tok/s, so ~${finishMs.toFixed(0)} ms from finishing`);
  // Noticed within ~10 ms, aborted at the next step; 1 s leaves room for a loaded CI box and
  // is still far short of the time max_tokens would have taken.
  assert.ok(r.goneMs < 1000, `took ${r.goneMs} ms`);
  assert.ok(r.goneMs < finishMs / 4, `took ${r.goneMs} ms, finishing would take ${finishMs} ms`);
  assert.equal(r.tokensLater, r.tokensAtGone, 'no tokens generated after the abort');
  assert.ok(r.tokensAtGone < MAX_TOKENS / 2);
  assert.equal(await metric(srv.base, 'moonrun:kda_state_slots_used'), 0);
  assert.equal(await metric(srv.base, 'vllm:kv_cache_usage_perc'), r.kvBefore);
  assert.equal(await metric(srv.base, ABORTED), r.abortedBefore + 1);
  // And the server goes on serving.
  const after = await post(srv.base, '/v1/completions', { model: 'moonrun-demo', prompt: 'hello', max_tokens: 5, ignore_eos: true });
  assert.equal(after.status, 200, after.text);
  assert.equal(after.json.usage.completion_tokens, 5);
}

// Tokens per second of one request on this machine: how long MAX_TOKENS would have taken.
let rateCache;
async function decodeRate() {
  if (rateCache) return rateCache;
  const t0 = performance.now();
  const r = await post(srv.base, '/v1/completions', { model: 'moonrun-demo', prompt: 'rate', max_tokens: 200, ignore_eos: true });
  assert.equal(r.status, 200, r.text);
  rateCache = 200 / ((performance.now() - t0) / 1000);
  return rateCache;
}

test('a non-streaming completion whose client disconnects is aborted within a step', async () => {
  await checkAbandoned('/v1/completions', { prompt: 'The deep ocean' });
});

test('a non-streaming chat completion whose client disconnects is aborted within a step', async () => {
  await checkAbandoned('/v1/chat/completions', { messages: [{ role: 'user', content: 'Tell me about the deep ocean.' }] });
});

test('keep-alive: sequential requests on one connection all run to the end', async () => {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const ports = [];
  for (let i = 0; i < 3; ++i) {
    const { status, json, port } = await new Promise((resolve, reject) => {
      const req = http.request(srv.base + '/v1/completions', { method: 'POST', agent, headers: { 'Content-Type': 'application/json' } }, (res) => {
        let text = '';
        res.on('data', (d) => { text += d; });
        res.on('end', () => resolve({ status: res.statusCode, json: JSON.parse(text), port: req.socket.localPort }));
      });
      req.on('error', reject);
      req.end(JSON.stringify({ model: 'moonrun-demo', prompt: `keep alive ${i}`, max_tokens: 40, ignore_eos: true }));
    });
    assert.equal(status, 200);
    assert.equal(json.usage.completion_tokens, 40);
    assert.equal(json.choices[0].finish_reason, 'length');
    ports.push(port);
    await sleep(50);  // idle between requests, as a real client is
  }
  agent.destroy();
  assert.equal(new Set(ports).size, 1, 'one connection served all three');
});

test('keep-alive through the openai client: non-streaming requests are unaffected', async () => {
  const client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'EMPTY', maxRetries: 0, timeout: 120000 });
  for (let i = 0; i < 3; ++i) {
    const r = await client.chat.completions.create({
      model: 'moonrun-demo', max_tokens: 30, temperature: 0, ignore_eos: true,
      messages: [{ role: 'user', content: `Question ${i}: why is the sea blue?` }] });
    assert.equal(r.usage.completion_tokens, 30);
    assert.equal(r.choices[0].finish_reason, 'length');
  }
  const c = await client.completions.create({ model: 'moonrun-demo', prompt: 'once', max_tokens: 30, ignore_eos: true });
  assert.equal(c.usage.completion_tokens, 30);
});

test('keep-alive: a next request sent before the answer is not a disconnect', async () => {
  // Bytes waiting on the socket while the first request generates; httplib reads them after.
  const body = JSON.stringify({ model: 'moonrun-demo', prompt: 'early bird', max_tokens: 60, ignore_eos: true });
  const head = (close) => `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
                          `Content-Length: ${Buffer.byteLength(body)}\r\n${close ? 'Connection: close\r\n' : ''}\r\n`;
  const text = await new Promise((resolve, reject) => {
    const sock = net.connect(srv.port, '127.0.0.1');
    let out = '';
    sock.on('data', (d) => { out += d; });
    sock.on('end', () => resolve(out));
    sock.on('error', reject);
    sock.write(head(false) + body);
    setTimeout(() => sock.write(head(true) + body), 100);  // while the first one generates
  });
  const answers = text.split('HTTP/1.1 ').slice(1);
  assert.equal(answers.length, 2, text);
  for (const a of answers) {
    assert.match(a, /^200 /);
    assert.equal(JSON.parse(a.slice(a.indexOf('\r\n\r\n') + 4)).usage.completion_tokens, 60);
  }
});

test('a client that only half-closes (FIN, still reading) counts as gone: aborted at once', async () => {
  await waitFor(idle, 30000, 'an idle server');
  const abortedBefore = (await metric(srv.base, ABORTED)) ?? 0;
  const body = JSON.stringify({ model: 'moonrun-demo', prompt: 'half', max_tokens: MAX_TOKENS, ignore_eos: true });
  let t0;
  await new Promise((resolve, reject) => {
    const sock = net.connect({ port: srv.port, host: '127.0.0.1', allowHalfOpen: true });
    sock.on('data', () => {});
    sock.on('end', () => { sock.destroy(); resolve(); });
    sock.on('error', reject);
    sock.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
               `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
    setTimeout(() => { t0 = performance.now(); sock.end(); }, 300);  // FIN while generating
  });
  await waitFor(idle, 5000, 'the request to leave');
  console.log(`half-close: gone ${(performance.now() - t0).toFixed(0)} ms after the FIN`);
  assert.ok(performance.now() - t0 < 1000);
  assert.equal(await metric(srv.base, ABORTED), abortedBefore + 1);
});
