// Issue 15, items 1-4, 7, 9, 10: what an attacker or a careless client sends, over raw TCP
// and real clients. Each answer is a clear error and the server keeps serving everyone else.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { startServer, post, sleep } from './harness.mjs';
import { rawExchange, statuses, trickle, rssMiB } from './raw.mjs';

let srv;
const LIMIT = 100000;
// MOONRUN_E2E_LEGACY=1 leaves out the flags older builds lack: how these tests were checked
// to fail on the code before issue 15 (each for its own reason, not a refused flag).
const LEGACY = process.env.MOONRUN_E2E_LEGACY === '1';
before(async () => {
  srv = await startServer(['--max-request-bytes', String(LIMIT),
                           ...(LEGACY ? [] : ['--http-header-timeout', '3', '--http-idle-timeout', '5', '--http-body-timeout', '4'])]);
});
after(async () => { await srv?.stop(); });

const chat = (extra = {}) => ({ model: 'moonrun-demo', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }], ...extra });
const deep = (n) => '['.repeat(n) + ']'.repeat(n);
async function stillServing() {
  assert.equal((await fetch(srv.base + '/health')).status, 200, 'the server is alive');
  const r = await post(srv.base, '/v1/chat/completions', chat());
  assert.equal(r.status, 200, r.text);
}

test('item 1: 20,000-level nested JSON anywhere in the body is a 400, and the server lives', async () => {
  const bodies = [
    // The shape that killed the process before (SIGSEGV in a recursive copy), first.
    `{"model":"moonrun-demo","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"schema":${deep(20000)}}}}`,
    `{"model":"moonrun-demo","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":${'{"a":'.repeat(12000)}1${'}'.repeat(12000)}}}]}`,
    `{"model":"moonrun-demo","messages":[{"role":"user","content":"hi"}],"tools":${deep(20000)}}`,
    `{"model":"moonrun-demo","messages":[{"role":"user","content":${deep(20000)}}]}`,
  ];
  for (const b of bodies) {
    const r = await post(srv.base, '/v1/chat/completions', b);
    assert.equal(r.status, 400, r.text.slice(0, 300));
    assert.match(r.json.error.message, /nested deeper than/);
  }
  for (const path of ['/v1/completions', '/tokenize', '/detokenize']) {
    const r = await post(srv.base, path, `{"prompt":${deep(20000)}}`);
    assert.equal(r.status, 400, path + ': ' + r.text.slice(0, 300));
  }
  await stillServing();
});

test('item 2: 130 clients trickling one byte at a time neither starve others nor stay connected', async () => {
  const head = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n';
  const slow = Array.from({ length: 130 }, () => trickle(srv.port, head, 250));
  const slowBody = Array.from({ length: 20 }, () => trickle(srv.port, '{"prompt":"a","max_tokens":1}'.padEnd(40), 200, { prefix: head }));
  try {
    await sleep(800);  // all connected and trickling
    const t0 = Date.now();
    const r = await post(srv.base, '/v1/completions', { model: 'moonrun-demo', prompt: 'hello', max_tokens: 4 });
    assert.equal(r.status, 200, r.text);
    assert.ok(Date.now() - t0 < 5000, `a normal request took ${Date.now() - t0} ms under 150 slow clients`);
    // The header deadline (3 s here) is for the whole header block, however it trickles in.
    await sleep(4500);
    const open = slow.filter((s) => s.closedAt === null).length;
    assert.equal(open, 0, `${open} slow-header connections still open after the deadline`);
    assert.ok(slow.every((s) => s.received.startsWith('HTTP/1.1 408')), 'each was told why: ' + slow[0].received.slice(0, 80));
    // Headers at once, then the body at 5 bytes/s: 8 s for 40 bytes, past the 4 s body
    // deadline, which does not restart per byte either.
    await sleep(1000);
    assert.equal(slowBody.filter((s) => s.closedAt === null).length, 0);
    assert.ok(slowBody.every((s) => s.received.startsWith('HTTP/1.1 408')), slowBody[0].received.slice(0, 80));
  } finally {
    for (const s of [...slow, ...slowBody]) s.stop();
  }
  await stillServing();
});

test('item 2: idle connections are closed after --http-idle-timeout', async () => {
  const idle = Array.from({ length: 50 }, () => trickle(srv.port, '', 1000));
  try {
    await sleep(6500);
    assert.equal(idle.filter((s) => s.closedAt === null).length, 0);
  } finally {
    for (const s of idle) s.stop();
  }
});

test('item 3: chunked and gzip bodies are held to --max-request-bytes after decoding', async () => {
  const pid = srv.proc.pid;
  const rssBefore = rssMiB(pid);
  // Chunked: 200 KB in 1 KB chunks.
  const chunk = 'x'.repeat(1024);
  let chunked = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n';
  for (let i = 0; i < 200; ++i) chunked += `400\r\n${chunk}\r\n`;
  chunked += '0\r\n\r\n';
  let r = await rawExchange(srv.port, chunked);
  assert.deepEqual(statuses(r.text), [413], r.text.slice(0, 200));
  // A small chunked body is fine.
  const small = JSON.stringify({ model: 'moonrun-demo', prompt: 'hi', max_tokens: 2 });
  r = await rawExchange(srv.port, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n' +
                        `${small.length.toString(16)}\r\n${small}\r\n0\r\n\r\n`);
  assert.deepEqual(statuses(r.text), [200], r.text.slice(0, 300));
  // gzip: a 60 KB body that inflates to 60 MB.
  const bomb = gzipSync(Buffer.from(JSON.stringify({ model: 'moonrun-demo', prompt: '0'.repeat(60 << 20) })), { level: 9 });
  assert.ok(bomb.length < LIMIT, `the bomb is ${bomb.length} bytes`);
  for (let i = 0; i < 5; ++i) {
    const res = await fetch(srv.base + '/v1/completions', { method: 'POST', body: bomb,
      headers: { 'Content-Type': 'application/json', 'Content-Encoding': 'gzip' } });
    assert.equal(res.status, 413, await res.text());
  }
  assert.ok(rssMiB(pid) - rssBefore < 40, `RSS grew from ${rssBefore} to ${rssMiB(pid)} MiB`);
  // A gzip body within the limit is decoded and served; an unknown encoding is a 415.
  const ok = await fetch(srv.base + '/v1/completions', { method: 'POST', body: gzipSync(small),
    headers: { 'Content-Type': 'application/json', 'Content-Encoding': 'gzip' } });
  assert.equal(ok.status, 200, await ok.text());
  const br = await fetch(srv.base + '/v1/completions', { method: 'POST', body: small,
    headers: { 'Content-Type': 'application/json', 'Content-Encoding': 'br' } });
  assert.equal(br.status, 415);
  await stillServing();
});

test('item 4: a real listen backlog', async (t) => {
  let out;
  try { out = execFileSync('ss', ['-ltnH', `sport = :${srv.port}`], { encoding: 'utf8' }); } catch { return t.skip('no ss'); }
  const sendQ = Number(out.trim().split(/\s+/)[2]);
  assert.ok(sendQ >= 128, `listen backlog ${sendQ}: ${out}`);
});

test('item 4: pipelined requests on one connection are all answered, in order', async () => {
  const body = JSON.stringify({ model: 'moonrun-demo', prompt: 'hi', max_tokens: 2 });
  const bytes = 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n' +
    `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}` +
    'GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n' +
    'GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n';
  const r = await rawExchange(srv.port, bytes);
  assert.deepEqual(statuses(r.text), [200, 200, 200, 404], r.text);
  assert.equal(r.how, 'closed');
  assert.ok(r.text.indexOf('"text_completion"') < r.text.indexOf('"object":"list"'), 'in order');
});

test('item 4: odd, duplicated or conflicting Content-Length is a 400 at once, never a hang', async () => {
  const body = '{"a":1}';
  const cases = [
    `Content-Length: ${body.length}\r\nContent-Length: ${body.length}`,
    `Content-Length: +${body.length}`,
    `Content-Length: ${body.length}, ${body.length}`,
    `Content-Length: -7`,
    `Content-Length: 0x7`,
    `Content-Length: 7 7`,
    `Content-Length: ${body.length}\r\nTransfer-Encoding: chunked`,
    `Transfer-Encoding: gzip, chunked`,
    `Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked`,
  ];
  for (const c of cases) {
    const r = await rawExchange(srv.port, `POST /tokenize HTTP/1.1\r\nHost: x\r\n${c}\r\n\r\n${body}`);
    const s = statuses(r.text);
    assert.ok(s.length >= 1 && (s[0] === 400 || s[0] === 501), `${JSON.stringify(c)} -> ${r.text.slice(0, 120)}`);
    assert.ok(r.ms < 2000, `${JSON.stringify(c)} took ${r.ms} ms`);
    assert.equal(r.how, 'closed', 'the connection is closed: its framing cannot be trusted');
  }
  await stillServing();
});

test('item 7: a wrong type for any boolean field is a 400 naming it, never a 500', async () => {
  const cases = [
    ['/v1/chat/completions', chat({ stream: 'yes' }), 'stream'],
    ['/v1/chat/completions', chat({ logprobs: 'true' }), 'logprobs'],
    ['/v1/chat/completions', chat({ ignore_eos: 1 }), 'ignore_eos'],
    ['/v1/chat/completions', chat({ skip_special_tokens: 'no' }), 'skip_special_tokens'],
    ['/v1/chat/completions', chat({ stream: true, stream_options: { include_usage: 'yes' } }), 'include_usage'],
    ['/v1/completions', { model: 'moonrun-demo', prompt: 'hi', echo: 'yes' }, 'echo'],
    ['/v1/completions', { model: 'moonrun-demo', prompt: 'hi', stream: 1 }, 'stream'],
    ['/v1/completions', { model: 'moonrun-demo', prompt: 'hi', stream: true, stream_options: { include_usage: 1 } }, 'include_usage'],
    ['/v1/completions', { model: 'moonrun-demo', prompt: 'hi', ignore_eos: 'true' }, 'ignore_eos'],
    ['/tokenize', { model: 'moonrun-demo', prompt: 'hi', add_special_tokens: 'yes' }, 'add_special_tokens'],
    ['/tokenize', { model: 'moonrun-demo', messages: [{ role: 'user', content: 'hi' }], add_generation_prompt: 'no' }, 'add_generation_prompt'],
  ];
  // Wrong types deeper in the body, read by the chat layer: 400 too, never a library message.
  const nested = [
    chat({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 5 } }] }] }),
    chat({ tools: [{ type: 'function', function: { name: 7 } }] }),
    chat({ messages: [{ role: 'user', content: [{ type: 'text', text: ['a'] }] }] }),
    chat({ chat_template_kwargs: { thinking: 'yes' } }),
  ];
  for (const body of nested) {
    const r = await post(srv.base, '/v1/chat/completions', body);
    assert.equal(r.status, 400, JSON.stringify(body) + ': ' + r.text);
    assert.doesNotMatch(r.json.error.message, /json\.exception/);
  }
  for (const [path, body, field] of cases) {
    const r = await post(srv.base, path, body);
    assert.equal(r.status, 400, `${path} ${field}: ${r.text}`);
    assert.match(r.json.error.message, new RegExp(field), r.text);
    assert.doesNotMatch(r.json.error.message, /json\.exception/);
  }
  await stillServing();
});

test('item 9: a newline in a request field cannot forge a log line', async () => {
  const forged = '[2099-01-01 00:00:00] FORGED admin logged in';
  await post(srv.base, '/v1/chat/completions', chat({ reasoning_effort: `no_think\n${forged}` }));
  await post(srv.base, '/v1/chat/completions', chat({ reasoning_effort: `no_think\r${forged}\u2028${forged}` }));
  await post(srv.base, '/v1/chat/completions', chat({ model: `gpt\n${forged}` }));
  await sleep(200);
  const lines = srv.log().split(/\n/);
  assert.ok(!lines.some((l) => l.startsWith('[2099')), 'a forged line: ' + lines.filter((l) => l.includes('FORGED')).join(' | '));
  assert.ok(lines.some((l) => l.includes('no_think\\n[2099')), 'the value is logged, escaped');
});

test('item 10: /metrics, /health and CORS preflights are open; keys come from a file or the environment', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'moonrun-keys-'));
  writeFileSync(join(dir, 'keys'), '# operators\nsk-file-1\n\nsk-file-2\n');
  const keyed = await startServer(['--api-key-file', join(dir, 'keys'), '--allowed-origins', '["https://app.example"]'],
                                  { env: { ...process.env, MOONRUN_API_KEY: 'sk-env' } });
  try {
    assert.equal((await fetch(keyed.base + '/metrics')).status, 200);
    assert.equal((await fetch(keyed.base + '/health')).status, 200);
    assert.equal((await fetch(keyed.base + '/v1/models')).status, 401);
    for (const key of ['sk-file-1', 'sk-file-2', 'sk-env'])
      assert.equal((await fetch(keyed.base + '/v1/models', { headers: { Authorization: `Bearer ${key}` } })).status, 200, key);
    const pre = await fetch(keyed.base + '/v1/chat/completions', { method: 'OPTIONS', headers: {
      Origin: 'https://app.example', 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization, content-type' } });
    assert.ok(pre.status === 204 || pre.status === 200, String(pre.status));
    assert.equal(pre.headers.get('access-control-allow-origin'), 'https://app.example');
    assert.match(pre.headers.get('access-control-allow-headers'), /authorization/i);
    const other = await fetch(keyed.base + '/v1/models', { headers: { Origin: 'https://evil.example', Authorization: 'Bearer sk-env' } });
    assert.equal(other.headers.get('access-control-allow-origin'), null);
    const mine = await fetch(keyed.base + '/v1/models', { headers: { Origin: 'https://app.example', Authorization: 'Bearer sk-env' } });
    assert.equal(mine.headers.get('access-control-allow-origin'), 'https://app.example');
  } finally {
    await keyed.stop();
  }
  const locked = await startServer(['--api-key', 'sk-x', '--protect-metrics']);
  try {
    assert.equal((await fetch(locked.base + '/metrics')).status, 401);
    assert.equal((await fetch(locked.base + '/metrics', { headers: { Authorization: 'Bearer sk-x' } })).status, 200);
  } finally {
    await locked.stop();
  }
});
