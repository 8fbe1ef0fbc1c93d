// logit_bias, min_tokens, stop_token_ids, ignore_eos and n > 1, as vLLM defines them,
// through the official openai client on the demo model. A +100 bias makes a token certain
// and -100 makes it impossible, whatever the random weights say, so each effect is exact.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, post, generate } from './harness.mjs';

let srv, client, X, EOS;
before(async () => {
  srv = await startServer();
  client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'EMPTY', maxRetries: 0, timeout: 120000 });
  const x = await post(srv.base, '/tokenize', { model: 'moonrun-demo', prompt: 'x' });
  assert.equal(x.json.tokens.length, 1);
  X = x.json.tokens[0];
  const eos = await post(srv.base, '/tokenize', { model: 'moonrun-demo', prompt: '<|end_of_msg|>', add_special_tokens: true });
  assert.equal(eos.json.tokens.length, 1);
  EOS = eos.json.tokens[0];
});
after(async () => { await srv?.stop(); });

const prompt = 'Count: one two three';

test('logit_bias +100 forces a token, -100 forbids it', async () => {
  const y = (await post(srv.base, '/tokenize', { model: 'moonrun-demo', prompt: 'y' })).json.tokens;
  assert.equal(y.length, 1);
  const r = await client.completions.create({
    model: 'moonrun-demo', prompt, max_tokens: 6, temperature: 1, logit_bias: { [X]: 100, [y[0]]: 90 },
  });
  assert.equal(r.choices[0].text, 'xxxxxx');
  const banned = await client.completions.create({
    model: 'moonrun-demo', prompt, max_tokens: 6, temperature: 1, logit_bias: { [X]: -100, [y[0]]: 90 },
  });
  assert.equal(banned.choices[0].text, 'yyyyyy');
});

test('min_tokens holds EOS back; without it EOS ends at once', async () => {
  const eager = await client.completions.create({
    model: 'moonrun-demo', prompt, max_tokens: 20, temperature: 1, logit_bias: { [EOS]: 100 },
  });
  assert.equal(eager.usage.completion_tokens, 1);
  assert.equal(eager.choices[0].finish_reason, 'stop');
  const held = await client.completions.create({
    model: 'moonrun-demo', prompt, max_tokens: 20, temperature: 1, logit_bias: { [EOS]: 100 }, min_tokens: 5,
  });
  assert.equal(held.usage.completion_tokens, 6);  // 5 tokens, then the EOS
  assert.equal(held.choices[0].finish_reason, 'stop');
});

test('stop_token_ids end the text without appearing in it; ignore_eos runs to max_tokens', async () => {
  const r = await client.completions.create({
    model: 'moonrun-demo', prompt, max_tokens: 20, temperature: 1, logit_bias: { [X]: 100 }, stop_token_ids: [X],
  });
  assert.equal(r.choices[0].text, '');
  assert.equal(r.choices[0].finish_reason, 'stop');
  const ig = await client.completions.create({
    model: 'moonrun-demo', prompt, max_tokens: 7, temperature: 1, logit_bias: { [EOS]: 100 }, ignore_eos: true,
  });
  assert.equal(ig.usage.completion_tokens, 7);
  assert.equal(ig.choices[0].finish_reason, 'length');
});

test('include_stop_str_in_output keeps the matched stop string at the end of the text (vLLM\'s)', async () => {
  // +100 on "x" makes every token "x": the stop "xx" matches after two tokens.
  const body = { model: 'moonrun-demo', prompt, max_tokens: 8, temperature: 1, logit_bias: { [X]: 100 }, stop: ['xx'] };
  for (const [include, text] of [[false, ''], [true, 'xx']]) {
    const r = await post(srv.base, '/v1/completions', { ...body, include_stop_str_in_output: include });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].text, text, `include_stop_str_in_output ${include}: ${r.text}`);
    assert.equal(r.json.choices[0].finish_reason, 'stop');
  }
});

test('chat: n = 3 distinct choices, logit_bias and min_tokens honoured', async () => {
  const r = await client.chat.completions.create({
    model: 'moonrun-demo', n: 3, max_tokens: 8, temperature: 1, seed: 7,
    messages: [{ role: 'user', content: 'hi' }], reasoning_effort: 'none',
  });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  const biased = await client.chat.completions.create({
    model: 'moonrun-demo', max_tokens: 5, temperature: 1, reasoning_effort: 'none',
    messages: [{ role: 'user', content: 'hi' }], logit_bias: { [X]: 100 },
  });
  assert.equal(biased.choices[0].message.content, 'xxxxx');
  const held = await client.chat.completions.create({
    model: 'moonrun-demo', max_tokens: 9, temperature: 1, reasoning_effort: 'none', min_tokens: 4,
    messages: [{ role: 'user', content: 'hi' }], logit_bias: { [EOS]: 100 },
  });
  assert.equal(held.usage.completion_tokens, 5);
  assert.equal(held.choices[0].finish_reason, 'stop');
});

test('bad values are 400s naming the field, and the server keeps serving', async () => {
  for (const [body, field] of [
    [{ logit_bias: { abc: 1 } }, 'logit_bias'],
    [{ logit_bias: { [X]: 1000 } }, 'logit_bias'],
    [{ logit_bias: { 99999999: 1 } }, 'logit_bias'],
    [{ min_tokens: -1 }, 'min_tokens'],
    [{ min_tokens: 9, max_tokens: 3 }, 'min_tokens'],
    [{ stop_token_ids: [-4] }, 'stop_token_ids'],
    [{ reasoning_effort: 'medium' }, 'reasoning_effort'],
    [{ chat_template_kwargs: { thinking_effort: 'extreme' } }, 'chat_template_kwargs.thinking_effort'],
  ]) {
    const r = await post(srv.base, '/v1/chat/completions', {
      model: 'moonrun-demo', max_tokens: 4, messages: [{ role: 'user', content: 'x' }], ...body,
    });
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.ok(r.json.error.message.startsWith(field), `${JSON.stringify(body)}: ${r.json.error.message}`);
  }
  const ok = await post(srv.base, '/v1/chat/completions', { model: 'moonrun-demo', max_tokens: 2, messages: [{ role: 'user', content: 'x' }] });
  assert.equal(ok.status, 200);
});

test('a seed gives the same tokens from `moonrun generate` and from the server', async () => {
  // Both run the one runtime (runtime/generate.h and the engine) and seed a request's
  // sampler the same way; the server is told to ignore EOS because generate does.
  const ids = (await post(srv.base, '/tokenize', { model: 'moonrun-demo', prompt: 'The seeds of the same tree' })).json.tokens;
  assert.ok(ids.length > 3);
  const settings = [
    // The demo model is trained and sure of itself: high temperatures make the draws differ.
    { temperature: 0 },
    { temperature: 0.7, seed: 1 },
    { temperature: 1.6, top_p: 0.95, seed: 42 },
    { temperature: 2.0, top_k: 50, seed: 123456789 },
    { temperature: 1.8, top_p: 0.9, top_k: 100, seed: 7 },
  ];
  const seen = new Set();
  for (const s of settings) {
    const want = generate(ids, 16, s).token_ids;
    const r = await post(srv.base, '/v1/completions', {
      model: 'moonrun-demo', prompt: ids, max_tokens: 16, ignore_eos: true, return_token_ids: true, ...s,
    });
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(r.json.choices[0].prompt_token_ids, ids);
    assert.deepEqual(r.json.choices[0].token_ids, want, JSON.stringify(s));
    seen.add(want.join(','));
    // Streamed, the chunks' ids add up to the same sequence.
    const st = await post(srv.base, '/v1/completions', {
      model: 'moonrun-demo', prompt: ids, max_tokens: 16, ignore_eos: true, return_token_ids: true, stream: true, ...s,
    });
    const streamed = [];
    for (const e of st.text.split('\n\n').filter((b) => b.startsWith('data: {')))
      streamed.push(...(JSON.parse(e.slice(6)).choices[0]?.token_ids ?? []));
    assert.deepEqual(streamed, want, 'streamed ' + JSON.stringify(s));
  }
  // The settings differ enough that the sequences are not all one (the comparison is not vacuous).
  assert.ok(seen.size >= 3, [...seen].join(' | '));
});

test('chat: return_token_ids gives the rendered prompt, and generate continues it the same way', async () => {
  const messages = [{ role: 'user', content: 'Name three rivers.' }];
  const rendered = (await post(srv.base, '/tokenize', { model: 'moonrun-demo', messages })).json.tokens;
  const s = { temperature: 0.9, top_p: 0.95, seed: 2024 };
  const r = await post(srv.base, '/v1/chat/completions', {
    model: 'moonrun-demo', messages, max_tokens: 12, ignore_eos: true, return_token_ids: true, ...s,
  });
  assert.equal(r.status, 200, r.text);
  assert.deepEqual(r.json.prompt_token_ids, rendered);
  assert.deepEqual(r.json.choices[0].token_ids, generate(rendered, 12, s).token_ids);
  const bad = await post(srv.base, '/v1/chat/completions', { model: 'moonrun-demo', messages, return_token_ids: 'yes' });
  assert.equal(bad.status, 400);
});
