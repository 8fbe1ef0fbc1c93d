// The built-in chat page (GET /, docs/chat-page.md) in a real headless Chromium (Debian's,
// over the DevTools protocol: cdp.mjs) against `moonrun serve` on the demo model: a turn
// streams its thinking apart from its answer, markup in an answer stays text, a reload keeps
// the conversation, the seed's tool task runs its round trip in the page, a tool result typed
// by the user continues the loop, stop and regenerate work, the seed's red|blue image (picked,
// pasted or dropped) is named and a too-large one is a readable 400. Screenshots go to
// $MOONRUN_E2E_ARTIFACTS/chat_page/ (CTest: build/e2e-artifacts/).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer } from './harness.mjs';
import { launchBrowser } from './cdp.mjs';
import { makePng, makeRegionsPng } from './png.mjs';

const KEY = 'chat-page-test-key';
const ARTIFACTS = path.join(process.env.MOONRUN_E2E_ARTIFACTS ?? path.join(os.tmpdir(), 'moonrun-e2e-artifacts'), 'chat_page');
const MAX_IMAGE_BYTES = 20000;
let srv, browser, page;
// The bodies of the page's POST /v1/chat/completions, as the browser sent them (Network domain).
const sentBodies = [];
// The handler of requests paused by Fetch.enable (the streamed-markup and stop tests).
let onPaused = null;
const CHAT_URL = [{ urlPattern: '*/v1/chat/completions', requestStage: 'Request' }];

before(async () => {
  srv = await startServer(['--api-key', KEY, '--max-image-bytes', String(MAX_IMAGE_BYTES)]);
  browser = await launchBrowser();
  page = browser.page;
  page.on('Network.requestWillBeSent', ({ request }) => {
    // Large bodies (images) come without postData: null stands in for them.
    if (request.method === 'POST' && request.url.endsWith('/v1/chat/completions'))
      sentBodies.push(request.postData ? JSON.parse(request.postData) : null);
  });
  page.on('Fetch.requestPaused', (p) => onPaused?.(p));
  await page.send('Network.enable');
  fs.mkdirSync(ARTIFACTS, { recursive: true });
});
after(async () => {
  await browser?.close();
  await srv?.stop();
});

const shot = (name) => page.screenshot(path.join(ARTIFACTS, name + '.png'));
const idle = () => page.waitFor("!document.getElementById('send').disabled && document.getElementById('stop').disabled",
                                { timeoutMs: 300000, what: 'the answer to finish' });
const set = (id, value) => page.evaluate(`(() => { const e = document.getElementById(${JSON.stringify(id)});
  e.value = ${JSON.stringify(String(value))}; e.dispatchEvent(new Event('change')); })()`);
async function say(text) {
  await set('input', text);
  await page.evaluate("document.getElementById('send').click()");
  await page.waitFor("document.getElementById('stop').disabled === false || document.querySelector('#error:not([hidden])')",
                     { what: 'the request to start' }).catch(() => {});
  await idle();
}
// The rendered conversation, as the page shows it.
const transcript = () => page.evaluate(`[...document.querySelectorAll('#messages .msg')].map((m) => ({
  role: m.dataset.role,
  reasoning: m.querySelector('.thinking .reasoning')?.textContent ?? null,
  summary: m.querySelector('.thinking summary')?.textContent ?? null,
  answer: m.querySelector('.answer')?.textContent ?? null,
  text: m.querySelector('.body')?.textContent ?? null,
  usage: m.querySelector('.usage')?.textContent ?? null,
  toolCalls: [...m.querySelectorAll('.tool-call')].map((t) => ({ name: t.querySelector('.name').textContent,
                                                                 args: t.querySelector('.arguments').textContent })),
}))`);
const errorText = () => page.evaluate("document.getElementById('error').hidden ? '' : document.getElementById('error').textContent");

test('the page is served at / and /chat without a key, under a strict content security policy', async () => {
  for (const p of ['/', '/chat']) {
    const res = await fetch(srv.base + p);
    assert.equal(res.status, 200, p);
    assert.match(res.headers.get('content-type'), /^text\/html/);
    assert.match(res.headers.get('content-security-policy'), /script-src 'self'/);
    assert.match(await res.text(), /<script type="module" src="\/chat\/chat.js">/);
  }
  const js = await fetch(srv.base + '/chat/chat.js');
  assert.equal(js.status, 200);
  assert.match(js.headers.get('content-type'), /^text\/javascript/);
  assert.equal((await fetch(srv.base + '/v1/models')).status, 401, 'the API itself still needs the key');
  assert.equal((await fetch(srv.base + '/chat/nothing.js')).status, 401, 'no file: routed as any unknown path');
});

test('--disable-web-ui: no page, / is an unknown path', async () => {
  const off = await startServer(['--disable-web-ui']);
  try {
    for (const p of ['/', '/chat', '/chat/chat.js']) assert.equal((await fetch(off.base + p)).status, 404, p);
    assert.equal((await fetch(off.base + '/health')).status, 200);
  } finally {
    await off.stop();
  }
});

test('a turn streams its thinking apart from its answer, at low and at high effort', async () => {
  await page.goto(srv.base + '/');
  await page.waitFor("document.getElementById('model-name').textContent.includes('API key')", { what: 'the key prompt' });
  await set('api-key', KEY);
  await page.waitFor("document.getElementById('model-name').textContent === 'moonrun-demo'", { what: 'the model name' });
  await set('temperature', 0);
  await set('max-tokens', 400);
  const reasoningTokens = {};
  // The same question at each effort, each in its own conversation: the demo model thinks one
  // line at low, a restatement and a plan at high (docs/demo-model.md).
  for (const effort of ['low', 'high']) {
    if (effort !== 'low') await page.evaluate("document.getElementById('new-chat').click()");
    await set('reasoning-effort', effort);
    await say('What is the capital of Japan?');
    assert.equal(await errorText(), '');
    const last = (await transcript()).at(-1);
    assert.equal(last.role, 'assistant');
    assert.ok(last.reasoning?.length > 0, `${effort}: thinking in its own block: ${JSON.stringify(last)}`);
    assert.match(last.summary, /^Thought · \d+ reasoning tokens$/);
    reasoningTokens[effort] = Number(last.summary.match(/\d+/)[0]);
    assert.equal(sentBodies.at(-1).reasoning_effort, effort, 'the chooser goes into the request');
    assert.ok(last.answer.trim().length > 0, `${effort}: an answer beside it`);
    assert.ok(!last.answer.includes(last.reasoning.trim().slice(0, 40)) || last.reasoning.trim().length < 10,
              'the thinking is not in the answer');
    assert.match(last.usage, /prompt \d+ · completion \d+ · reasoning \d+ · [\d.]+ tok\/s/);
    // The thinking block opened, as a user's click does, so the screenshot shows it.
    await page.evaluate("document.querySelectorAll('#messages .thinking').forEach((d) => { d.open = true; })");
    await shot(`turn-${effort}`);
  }
  assert.ok(reasoningTokens.high > reasoningTokens.low, `the demo model thinks longer at high: ${JSON.stringify(reasoningTokens)}`);
  // The first /v1/models, before the key is typed, is a 401 by design.
  assert.deepEqual(page.consoleErrors.filter((e) => !/status of 401/.test(e)), []);
});

test('a reload keeps the conversation and the settings', async () => {
  const before = await transcript();
  await page.reload();
  await page.waitFor("document.querySelectorAll('#messages .msg').length > 0", { what: 'the stored conversation' });
  assert.deepEqual(await transcript(), before);
  assert.equal(await page.evaluate("document.getElementById('api-key').value"), KEY);
  await shot('after-reload');
});

test('markup in an answer is shown as text, never run', async () => {
  // An answer as a model might write it: stored as the page stores answers, then shown.
  const hostile = 'Here: <script>window.__pwned = 1</script> <img src=x onerror="window.__pwned = 2">\n\n' +
    '```html\n<script>window.__pwned = 3</script>\n```\n\n[click](javascript:window.__pwned=4) **bold** `<b>x</b>`';
  await page.evaluate(`(() => {
    const store = JSON.parse(localStorage.getItem('moonrun.chat.conversations.v1'));
    store.conversations.unshift({ id: 'hostile', title: 'hostile', created: Date.now(), messages: [
      { role: 'user', content: 'say something nasty' },
      { role: 'assistant', content: ${JSON.stringify(hostile)}, reasoning_content: '<script>window.__pwned = 5</script>' }] });
    store.current = 'hostile';
    localStorage.setItem('moonrun.chat.conversations.v1', JSON.stringify(store));
  })()`);
  await page.reload();
  await page.waitFor("document.querySelector('#messages .msg.assistant')", { what: 'the stored answer' });
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(await page.evaluate('window.__pwned'), undefined);
  assert.equal(await page.evaluate("document.querySelectorAll('#messages script, #messages img, #messages a[href^=javascript]').length"), 0);
  const last = (await transcript()).at(-1);
  assert.ok(last.answer.includes('<script>window.__pwned = 1</script>'), last.answer);
  assert.ok(last.answer.includes('<img src=x onerror="window.__pwned = 2">'), last.answer);
  assert.equal(last.reasoning, '<script>window.__pwned = 5</script>');
  assert.equal(await page.evaluate("document.querySelector('#messages .answer pre code').textContent"),
               '<script>window.__pwned = 3</script>');
  assert.equal(await page.evaluate("document.querySelector('#messages .answer strong').textContent"), 'bold');
  // The renderer on its own, in the page.
  const rendered = await page.evaluate(`import('/chat/markdown.js').then(({ renderMarkdown }) => {
    const div = document.createElement('div');
    div.appendChild(renderMarkdown('<svg onload=alert(1)></svg> [x](https://example.com) # not a heading'));
    return { html: div.innerHTML, links: [...div.querySelectorAll('a')].map((a) => a.rel) };
  })`);
  assert.ok(rendered.html.includes('&lt;svg onload=alert(1)&gt;'), rendered.html);
  assert.deepEqual(rendered.links, ['noopener noreferrer']);
  await shot('markup-as-text');
});

test('markup in a streamed answer is shown as text, never run', async () => {
  // The demo model writes no HTML, so this answer is served by the browser itself (CDP Fetch
  // fulfils the page's request with the SSE the server would send) and goes through the page's
  // own stream reader and renderer, with tags cut across chunks.
  const reasoning = '<img src=x onerror="window.__pwned = 6">';
  const content = 'Sure: <script>window.__pwned = 7</script>\n\n```\n<iframe src="javascript:window.__pwned = 8"></iframe>\n```';
  const chunk = (delta, usage) => 'data: ' + JSON.stringify({ id: 'chatcmpl-markup', object: 'chat.completion.chunk', created: 0,
    model: 'moonrun-demo', choices: usage ? [] : [{ index: 0, delta, finish_reason: null }], ...(usage ? { usage } : {}) }) + '\n\n';
  const sse = chunk({ role: 'assistant', reasoning_content: reasoning.slice(0, 7) }) + chunk({ reasoning_content: reasoning.slice(7) }) +
    chunk({ content: content.slice(0, 10) }) + chunk({ content: content.slice(10, 40) }) + chunk({ content: content.slice(40) }) +
    chunk(null, { prompt_tokens: 9, completion_tokens: 30, total_tokens: 39, completion_tokens_details: { reasoning_tokens: 12 } }) +
    'data: [DONE]\n\n';
  let request = null;
  onPaused = (p) => {
    request = JSON.parse(p.request.postData);
    page.send('Fetch.fulfillRequest', { requestId: p.requestId, responseCode: 200, body: Buffer.from(sse).toString('base64'),
      responseHeaders: [{ name: 'Content-Type', value: 'text/event-stream' }] });
  };
  await page.send('Fetch.enable', { patterns: CHAT_URL });
  try {
    await page.evaluate("document.getElementById('new-chat').click()");
    await say('Write some HTML.');
  } finally {
    await page.send('Fetch.disable');
    onPaused = null;
  }
  assert.equal(request?.stream, true);
  assert.equal(await errorText(), '');
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(await page.evaluate('window.__pwned'), undefined);
  assert.equal(await page.evaluate("document.querySelectorAll('#messages script, #messages img, #messages iframe').length"), 0);
  const last = (await transcript()).at(-1);
  assert.equal(last.reasoning, reasoning);
  assert.equal(last.summary, 'Thought · 12 reasoning tokens');
  assert.equal(last.usage, 'prompt 9 · completion 30 · reasoning 12', 'no tok/s from chunks that came in one burst');
  assert.ok(last.answer.includes('Sure: <script>window.__pwned = 7</script>'), last.answer);
  assert.equal(await page.evaluate("document.querySelector('#messages .answer pre code').textContent"),
               '<iframe src="javascript:window.__pwned = 8"></iframe>');
  await page.evaluate("document.querySelector('#messages .thinking').open = true");
  await shot('streamed-markup-as-text');
});

test('stop ends the request in flight and keeps the turn as stopped', async () => {
  // The request is held in the browser (CDP Fetch) so that Stop always comes first.
  let held = null;
  onPaused = (p) => { held = p; };
  await page.send('Fetch.enable', { patterns: CHAT_URL });
  try {
    await page.evaluate("document.getElementById('new-chat').click()");
    await set('input', 'Hello! Tell me about the moon.');
    await page.evaluate("document.getElementById('send').click()");
    await page.waitFor("!document.getElementById('stop').disabled", { what: 'the request to start' });
    for (let i = 0; !held && i < 100; i++) await new Promise((r) => setTimeout(r, 100));
    assert.ok(held, 'the request reached the network');
    await page.evaluate("document.getElementById('stop').click()");
    await idle();
  } finally {
    if (held) await page.send('Fetch.failRequest', { requestId: held.requestId, errorReason: 'Aborted' }).catch(() => {});
    await page.send('Fetch.disable');
    onPaused = null;
  }
  assert.equal(await errorText(), '');
  const t = await transcript();
  assert.equal(t.length, 2);
  assert.equal(t[1].usage, 'stopped');
  await shot('stopped');
});

test("the seed's tool task: two calls in one turn run in the page, then one combined answer", async () => {
  await page.evaluate("document.getElementById('new-chat').click()");
  await page.evaluate("document.getElementById('tools-preset').click()");
  await set('reasoning-effort', 'high');
  await set('temperature', 0);
  await set('max-tokens', 1024);
  await set('system-prompt', 'You are a helpful assistant with tools.');
  await say("What is 47 * 89? Also, what's the weather in Tokyo? Use your tools, then give me one combined answer.");
  // The tool results go back and the loop goes on by itself: wait for the final answer.
  await page.waitFor(`(() => { const m = [...document.querySelectorAll('#messages .msg')];
    return m.length >= 5 && m.at(-1).dataset.role === 'assistant' && !m.at(-1).querySelector('.tool-call')
      && !document.getElementById('send').disabled; })()`, { timeoutMs: 300000, what: 'the combined answer' });
  const t = await transcript();
  await shot('tool-round-trip');
  const trace = JSON.stringify(t, null, 1);
  assert.equal(await errorText(), '', trace);
  const first = t.find((m) => m.role === 'assistant');
  assert.equal(first.toolCalls.length, 2, trace);
  assert.deepEqual(first.toolCalls.map((c) => c.name).sort(), ['calculate', 'get_weather'], trace);
  assert.ok(first.reasoning?.length > 0, 'thinking before the calls');
  const results = t.filter((m) => m.role === 'tool').map((m) => m.text);
  assert.ok(results.includes('{"result":4183}'), trace);
  assert.ok(results.includes('{"city":"Tokyo","weather":"22C, clear"}'), trace);
  const answer = t.at(-1).answer.replace(/(\d),(\d{3})/g, '$1$2');
  assert.ok(answer.includes('4183') && answer.includes('22C, clear'), answer);
  // What went back on the second turn: the whole assistant message, thinking included.
  const sent = await page.evaluate(`JSON.parse(localStorage.getItem('moonrun.chat.conversations.v1'))
    .conversations.find((c) => c.messages.some((m) => m.role === 'tool')).messages`);
  const turn = sent.find((m) => m.role === 'assistant');
  assert.ok(turn.reasoning_content && turn.tool_calls.length === 2);
  // Export JSON: the download's blob, caught on its way to the link.
  const exported = JSON.parse(await page.evaluate(`new Promise((resolve) => {
    const create = URL.createObjectURL;
    URL.createObjectURL = (blob) => { URL.createObjectURL = create; blob.text().then(resolve); return create(blob); };
    document.getElementById('export').click();
  })`));
  assert.equal(exported.model, 'moonrun-demo');
  assert.deepEqual(exported.messages.map((m) => m.role), ['system', 'user', 'assistant', 'tool', 'tool', 'assistant']);
  assert.ok(exported.messages.every((m) => Object.keys(m).every((k) => !k.startsWith('_'))), 'no page-only fields');
  assert.equal(exported.messages[2].tool_calls.length, 2);
  assert.equal(exported.usage.length, 2);
});

test('a tool result typed by the user: the loop goes on with the whole assistant turn; regenerate asks again', async () => {
  await page.evaluate("document.getElementById('new-chat').click()");
  await page.evaluate("document.getElementById('tools-preset').click()");
  await page.evaluate("(() => { const e = document.getElementById('auto-run'); e.checked = false; e.dispatchEvent(new Event('change')); })()");
  await set('reasoning-effort', 'low');
  await set('system-prompt', '');
  await set('max-tokens', 400);
  await say("What's the weather in Tokyo?");
  let t = await transcript();
  let trace = JSON.stringify(t, null, 1);
  assert.equal(await errorText(), '', trace);
  assert.deepEqual(t.at(-1).toolCalls.map((c) => c.name), ['get_weather'], trace);
  assert.deepEqual(JSON.parse(t.at(-1).toolCalls[0].args), { city: 'Tokyo' });
  assert.equal(await page.evaluate("document.querySelectorAll('#messages .tool-call textarea.tool-result').length"), 1,
               'a box for the result');
  await page.evaluate(`document.querySelector('#messages .tool-result').value = ${JSON.stringify('{"city":"Tokyo","weather":"5C, snow"}')}`);
  await shot('tool-result-typed');
  const sentBefore = sentBodies.length;
  await page.evaluate("document.querySelector('#messages .tool-send').click()");
  await page.waitFor(`(() => { const m = [...document.querySelectorAll('#messages .msg')];
    return m.length === 4 && m.at(-1).dataset.role === 'assistant' && !document.getElementById('send').disabled; })()`,
  { timeoutMs: 300000, what: 'the answer after the typed result' });
  t = await transcript();
  trace = JSON.stringify(t, null, 1);
  assert.equal(await errorText(), '', trace);
  assert.ok(t.at(-1).answer.includes('5C, snow'), trace);
  await shot('tool-result-answered');
  // On the wire: the whole assistant turn (thinking and calls), then the typed result; no page-only fields.
  assert.equal(sentBodies.length, sentBefore + 1);
  const [user, assistant, tool] = sentBodies.at(-1).messages;
  assert.equal(user.role, 'user');
  assert.equal(assistant.role, 'assistant');
  assert.ok(assistant.reasoning_content?.length > 0, JSON.stringify(assistant));
  assert.equal(assistant.tool_calls.length, 1);
  assert.ok(Object.keys(assistant).every((k) => !k.startsWith('_')), JSON.stringify(assistant));
  assert.deepEqual(tool, { role: 'tool', tool_call_id: assistant.tool_calls[0].id, name: 'get_weather',
                           content: '{"city":"Tokyo","weather":"5C, snow"}' });
  // Regenerate drops the answer and its tool round trip and asks again from the question.
  await page.evaluate("document.getElementById('regenerate').click()");
  await page.waitFor("document.getElementById('stop').disabled === false", { what: 'the request to start' }).catch(() => {});
  await idle();
  t = await transcript();
  assert.equal(t.length, 2, JSON.stringify(t, null, 1));
  assert.deepEqual(t[1].toolCalls.map((c) => c.name), ['get_weather']);
  assert.deepEqual(sentBodies.at(-1).messages.map((m) => m.role), ['user']);
  await page.evaluate("(() => { const e = document.getElementById('auto-run'); e.checked = true; e.dispatchEvent(new Event('change')); })()");
});

async function attach(file) {
  const { result } = await page.send('Runtime.evaluate', { expression: "document.getElementById('file')" });
  await page.send('DOM.setFileInputFiles', { files: [file], objectId: result.objectId });
  await page.waitFor("document.querySelectorAll('#attachments img').length === 1", { what: 'the attachment' });
}

test("images: the seed's red|blue image is named; a too-large one is a readable 400", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moonrun-chat-page-'));
  const redBlue = path.join(dir, 'red_blue.png');
  fs.writeFileSync(redBlue, makePng());
  await page.evaluate("document.getElementById('new-chat').click()");
  await set('tools', '');
  await set('system-prompt', '');
  await set('reasoning-effort', 'low');
  await set('max-tokens', 400);
  // Paste and drop attach too (a File built in the page: the same events a user's make).
  await page.evaluate(`(() => {
    const bytes = Uint8Array.from(atob(${JSON.stringify(makePng().toString('base64'))}), (c) => c.charCodeAt(0));
    const files = () => { const d = new DataTransfer(); d.items.add(new File([bytes], 'red_blue.png', { type: 'image/png' })); return d; };
    document.getElementById('input').dispatchEvent(new ClipboardEvent('paste', { clipboardData: files(), bubbles: true, cancelable: true }));
    document.getElementById('composer').dispatchEvent(new DragEvent('drop', { dataTransfer: files(), bubbles: true, cancelable: true }));
  })()`);
  await page.waitFor("document.querySelectorAll('#attachments img').length === 2", { what: 'the pasted and the dropped image' });
  await page.evaluate("document.querySelector('#attachments button').click(); document.querySelector('#attachments button').click()");
  assert.equal(await page.evaluate("document.querySelectorAll('#attachments img').length"), 0);
  await attach(redBlue);
  await say('What do you see in this image? Name the colours and how they are arranged.');
  let t = await transcript();
  assert.equal(await errorText(), '');
  const ans = t.at(-1).answer.toLowerCase();
  assert.ok(ans.includes('red') && ans.includes('blue'), ans);
  assert.match(t.at(-1).usage, /image 25/);
  assert.equal(await page.evaluate("document.querySelectorAll('#messages .msg.user img').length"), 1);
  await shot('image-red-blue');

  // Noise does not compress: well over --max-image-bytes.
  const noisy = path.join(dir, 'noise.png');
  const bytes = crypto.randomBytes(3 * 128 * 128);
  fs.writeFileSync(noisy, makeRegionsPng(128, 128, (x, y) => bytes.subarray(3 * (y * 128 + x), 3 * (y * 128 + x) + 3)));
  assert.ok(fs.statSync(noisy).size > MAX_IMAGE_BYTES);
  const count = t.length;
  await attach(noisy);
  await say('And this one?');
  const err = await errorText();
  assert.match(err, new RegExp(`^The server answered 400 Bad Request: .*limit of ${MAX_IMAGE_BYTES} bytes \\(--max-image-bytes\\)`), err);
  t = await transcript();
  assert.equal(t.length, count + 1, 'the question stays; no empty answer is kept');
  await shot('image-too-large');
  fs.rmSync(dir, { recursive: true, force: true });
});
