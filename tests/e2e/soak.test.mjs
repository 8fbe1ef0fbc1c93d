// Issue 15's soak: 200 slow clients (trickling headers, reconnecting whenever the server
// closes them) and 64 normal streaming clients for 60 s on loopback. Every normal request
// is answered in full, and the server's RSS stays flat. ~75 s; part of the default run
// (CI's 90-minute budget holds it).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startServer, sseEvents, sleep } from './harness.mjs';
import { trickle, rssMiB } from './raw.mjs';

const SECONDS = Number(process.env.MOONRUN_SOAK_SECONDS ?? 60);

function stream(base, i, agent) {
  const body = JSON.stringify({ model: 'moonrun-demo', max_tokens: 12, temperature: 0.8, stream: true,
                                messages: [{ role: 'user', content: `soak request ${i}` }] });
  return new Promise((resolve) => {
    const t0 = performance.now();
    const req = http.request(base + '/v1/chat/completions', { method: 'POST', agent, headers: { 'Content-Type': 'application/json' } }, (res) => {
      let text = '';
      res.on('data', (d) => { text += d; });
      res.on('end', () => resolve({ status: res.statusCode, text, ms: performance.now() - t0 }));
      res.on('error', (e) => resolve({ status: res.statusCode, text, error: String(e), ms: performance.now() - t0 }));
    });
    req.setTimeout(30000, () => req.destroy(new Error('no answer in 30 s')));
    req.on('error', (e) => resolve({ status: 0, text: '', error: String(e), ms: performance.now() - t0 }));
    req.end(body);
  });
}

test(`soak: 200 slow clients + 64 streams for ${SECONDS} s, every stream answered, RSS flat`, { timeout: (SECONDS + 120) * 1000 }, async () => {
  const srv = await startServer(['--max-running-requests', '64']);
  const pid = srv.proc.pid;
  const end = Date.now() + SECONDS * 1000;
  const head = 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n';
  let slowConnections = 0;
  const slow = new Set();
  const openSlow = () => {
    const s = trickle(srv.port, head, 400);
    ++slowConnections;
    slow.add(s);
    s.sock.on('close', () => { slow.delete(s); if (Date.now() < end) setTimeout(openSlow, 50); });
  };
  for (let i = 0; i < 200; ++i) openSlow();

  const rss = [];
  const sampler = setInterval(() => rss.push({ t: Date.now(), mib: rssMiB(pid) }), 2000);
  const results = [];
  const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
  const worker = async (w) => {
    for (let i = 0; Date.now() < end; ++i) results.push(await stream(srv.base, `${w}.${i}`, agent));
  };
  try {
    await Promise.all(Array.from({ length: 64 }, (_, w) => worker(w)));
  } finally {
    clearInterval(sampler);
    for (const s of slow) s.stop();
    agent.destroy();
  }
  const wellFormed = (r) => {
    try {
      const events = sseEvents(r.text);
      return events.at(-1) === '[DONE]' && events.slice(0, -1).every((e) => !('error' in JSON.parse(e)));
    } catch { return false; }
  };
  const failed = results.filter((r) => r.status !== 200 || !wellFormed(r));
  const ms = results.map((r) => r.ms).sort((a, b) => a - b);
  const summary = `${results.length} streams, ${failed.length} failed, p50 ${ms[Math.floor(ms.length / 2)]?.toFixed(0)} ms, ` +
                  `p99 ${ms[Math.floor(ms.length * 0.99)]?.toFixed(0)} ms, ${slowConnections} slow connections opened`;
  console.log('# ' + summary);
  await srv.stop();
  assert.equal(failed.length, 0, summary + '; first failure: ' + JSON.stringify(failed[0])?.slice(-600));
  assert.ok(results.length >= 64 * 2, summary);  // every worker got answers throughout
  assert.ok(slowConnections > 200, 'the server closed slow clients and they came back: ' + summary);
  // RSS flat: the last third of the run holds no more than the middle third plus slack.
  const third = (k) => rss.filter((s, i) => i >= Math.floor(rss.length * k / 3) && i < Math.floor(rss.length * (k + 1) / 3)).map((s) => s.mib);
  const mid = Math.max(...third(1)), last = Math.max(...third(2));
  console.log(`# RSS MiB: ${rss.map((s) => s.mib.toFixed(0)).join(' ')}`);
  assert.ok(last - mid < 24, `RSS grew from ${mid.toFixed(1)} to ${last.toFixed(1)} MiB over the run`);
});
