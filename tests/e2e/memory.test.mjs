// Issue 15, item 8: non-streaming requests with logprobs (tens of MB of JSON while the
// answer is built) leave no memory behind: RSS comes back to where it was.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, post, sleep } from './harness.mjs';
import { rssMiB } from './raw.mjs';

test('item 8: large logprobs answers leave no memory behind: RSS stays flat from round to round', async () => {
  const srv = await startServer(['--max-running-requests', '4']);
  try {
    const pid = srv.proc.pid;
    const chat = { model: 'moonrun-demo', max_tokens: 1200, ignore_eos: true, logprobs: true, top_logprobs: 20,
                   messages: [{ role: 'user', content: 'hi' }] };
    const completion = { model: 'moonrun-demo', prompt: 'hi', max_tokens: 1200, ignore_eos: true, logprobs: 20 };
    // Warm up: thread stacks, the tokenizer's caches, the first arena.
    await post(srv.base, '/v1/completions', { model: 'moonrun-demo', prompt: 'hi', max_tokens: 4 });
    await sleep(300);
    const base = rssMiB(pid);
    let peakBody = 0;
    const round = async () => {
      const rs = await Promise.all([post(srv.base, '/v1/chat/completions', chat), post(srv.base, '/v1/chat/completions', chat),
                                    post(srv.base, '/v1/completions', completion), post(srv.base, '/v1/completions', completion)]);
      for (const r of rs) {
        assert.equal(r.status, 200, r.text.slice(0, 200));
        peakBody = Math.max(peakBody, r.text.length);
      }
      await sleep(500);  // the worker threads trim their arenas after answering
      return rssMiB(pid);
    };
    const first = await round();  // each worker thread's arena now exists
    const later = [];
    for (let i = 0; i < 3; ++i) later.push(await round());
    assert.ok(peakBody > 1.5e6, `the answers are large (${peakBody} bytes)`);
    const rss = [base, first, ...later].map((x) => x.toFixed(1)).join(' -> ');
    assert.ok(first - base < 64, `the first round of 4 answers kept ${(first - base).toFixed(1)} MiB (${rss})`);
    assert.ok(Math.max(...later) - first < 16, `RSS grows from round to round: ${rss} MiB`);
  } finally {
    await srv.stop();
  }
});
