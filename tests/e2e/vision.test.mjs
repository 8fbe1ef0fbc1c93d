// Images on the chat API: the seed's request (its make_png 128x128 red|blue PNG as a data:
// URI) through the official openai client, on the demo model (K3 layout with a small
// MoonViT-V2 tower), and every kind of bad image as a 400 while the server keeps serving.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import zlib from 'node:zlib';
import OpenAI from 'openai';
import { startServer, post } from './harness.mjs';
import { makePng, bombPng, dataUri } from './png.mjs';

let srv, client;
before(async () => {
  srv = await startServer(['--context-length', '1024']);
  client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'EMPTY', maxRetries: 0, timeout: 120000 });
});
after(async () => { await srv?.stop(); });

const QUESTION = 'What do you see in this image? Name the colours and how they are arranged.';
const imageMessage = (url) => [{ role: 'user', content: [
  { type: 'text', text: QUESTION }, { type: 'image_url', image_url: { url } }] }];

test("the seed's image request returns usage with 25 image tokens", async () => {
  if (typeof zlib.crc32 !== 'function') throw new Error('node >= 20.15 needed for zlib.crc32');
  const resp = await client.chat.completions.create({
    model: 'moonrun-demo', max_tokens: 8, reasoning_effort: 'low', temperature: 0,
    messages: imageMessage(dataUri(makePng())),
  });
  const u = resp.usage;
  assert.equal(u.prompt_tokens_details.image_tokens, 25, JSON.stringify(u));
  assert.equal(u.image_tokens, 25);
  assert.equal(u.prompt_tokens_details.cached_tokens, 0);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  assert.ok(u.completion_tokens > 0);
  // The same question without the image: the image costs its 25 rows plus its frame
  // (<|media_begin|>image 128x128<|media_content|>...<|media_end|>), minus nothing else.
  const text = await client.chat.completions.create({
    model: 'moonrun-demo', max_tokens: 1, reasoning_effort: 'low',
    messages: [{ role: 'user', content: [{ type: 'text', text: QUESTION }] }],
  });
  assert.equal(text.usage.prompt_tokens_details.image_tokens, undefined, 'text-only usage keeps its shape');
  assert.ok(u.prompt_tokens - text.usage.prompt_tokens > 25, `${u.prompt_tokens} vs ${text.usage.prompt_tokens}`);
  // Greedy and deterministic: the same image gives the same answer.
  const again = await client.chat.completions.create({
    model: 'moonrun-demo', max_tokens: 8, reasoning_effort: 'low', temperature: 0,
    messages: imageMessage(dataUri(makePng())),
  });
  assert.equal(again.choices[0].message.content, resp.choices[0].message.content);
  assert.equal(again.choices[0].message.reasoning_content, resp.choices[0].message.reasoning_content);
});

test('streaming: the usage chunk carries the image tokens', async () => {
  const stream = await client.chat.completions.create({
    model: 'moonrun-demo', max_tokens: 4, stream: true, stream_options: { include_usage: true },
    messages: imageMessage(dataUri(makePng())),
  });
  let usage = null;
  for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
  assert.ok(usage, 'a usage chunk');
  assert.equal(usage.prompt_tokens_details.image_tokens, 25);
  // /tokenize counts the prompt as the chat endpoint bills it: the image's 25 rows included.
  const tok = await post(srv.base, '/tokenize', { model: 'moonrun-demo', messages: imageMessage(dataUri(makePng())) });
  assert.equal(tok.status, 200, tok.text);
  assert.equal(tok.json.count, usage.prompt_tokens);
});

test('bad images are 400s naming the problem, and the server keeps serving', async () => {
  const png = makePng();
  const cases = [
    ['truncated PNG', dataUri(png.subarray(0, png.length - 40)), /corrupt or truncated/],
    ['wrong MIME type', dataUri(png, 'text/plain'), /not an image type/],
    ['PNG labelled JPEG', dataUri(png, 'image/jpeg'), /says image\/jpeg but the data is a png image/],
    ['20000x20000 declared', dataUri(bombPng()), /20000x20000 .*--max-image-pixels/],
    ['not base64', 'data:image/png;base64,iVBORw0KGgo*AAAA', /not valid base64/],
    ['not base64 at all', 'data:image/png,rawbytes', /not base64/],
    ['URL while URLs are off', 'https://example.com/cat.png', /--allow-image-urls/],
    ['URL of another scheme', 'file:///etc/passwd', /data: URI/],
  ];
  for (const [what, url, pattern] of cases) {
    const r = await post(srv.base, '/v1/chat/completions',
      { model: 'moonrun-demo', max_tokens: 2, messages: imageMessage(url) });
    assert.equal(r.status, 400, `${what}: ${r.text}`);
    assert.equal(r.json.error.type, 'invalid_request_error', r.text);
    assert.match(r.json.error.message, /^messages\[0\]\.content\[1\]\.image_url: /, what);
    assert.match(r.json.error.message, pattern, what);
    // Still serving, images included.
    const ok = await post(srv.base, '/v1/chat/completions',
      { model: 'moonrun-demo', max_tokens: 2, messages: imageMessage(dataUri(png)) });
    assert.equal(ok.status, 200, `after ${what}: ${ok.text}`);
    assert.equal(ok.json.usage.prompt_tokens_details.image_tokens, 25);
  }
  assert.equal((await fetch(srv.base + '/health')).status, 200);
});

test('operator limits: URLs allowed but never fetched, patch budget, images per request', async () => {
  const small = await startServer(['--allow-image-urls', '--chunked-prefill-size', '16', '--max-images-per-request', '1']);
  try {
    const ask = (messages) => post(small.base, '/v1/chat/completions',
      { model: 'moonrun-demo', max_tokens: 2, temperature: 0, messages });
    let r = await ask(imageMessage('https://example.com/cat.png'));
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /fetching image URLs is not supported/);
    // 100 patches (10 x 10) over 4 x 16.
    r = await ask(imageMessage(dataUri(makePng())));
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /100 patches .* over the 64 .*--chunked-prefill-size/);
    const tiny = dataUri(makePng(28, 28));  // 2 x 2 patches, 1 token
    r = await ask([{ role: 'user', content: [{ type: 'image_url', image_url: { url: tiny } },
                                             { type: 'image_url', image_url: { url: tiny } }] }]);
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /more than 1 images .*--max-images-per-request/);
    // 112 x 112: 8 x 8 = 64 patches, 16 rows: prefilled in chunks of 16 tokens, so the
    // image's rows cross chunk boundaries. Same prompt as the one-chunk server; on the CPU
    // the same greedy answer too (tests/model/vision_fixture_test.cpp holds the strict
    // check against the reference; a bf16 GPU run may round the two chunkings apart).
    const mid = imageMessage(dataUri(makePng(112, 112)));
    r = await ask(mid);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.usage.prompt_tokens_details.image_tokens, 16);
    const whole = await post(srv.base, '/v1/chat/completions',
      { model: 'moonrun-demo', max_tokens: 2, temperature: 0, messages: mid });
    assert.equal(whole.status, 200, whole.text);
    assert.equal(whole.json.usage.prompt_tokens, r.json.usage.prompt_tokens);
    assert.equal(whole.json.usage.prompt_tokens_details.image_tokens, 16);
    const cpu = /Backend: cpu|backend=cpu/.test(small.log());
    if (cpu) assert.deepEqual(whole.json.choices[0].message, r.json.choices[0].message);
  } finally {
    await small.stop();
  }
});
