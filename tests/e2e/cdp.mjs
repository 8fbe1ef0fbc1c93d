// A headless Chromium driven over the Chrome DevTools Protocol through a pipe
// (--remote-debugging-pipe: NUL-terminated JSON on fds 3 and 4), as puppeteer's pipe
// transport does: no WebSocket client and no npm package needed. Debian's chromium.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const CHROMIUM = process.env.CHROMIUM ?? ['/usr/bin/chromium', '/usr/bin/chromium-browser']
  .find((p) => fs.existsSync(p));

export async function launchBrowser({ width = 1280, height = 900 } = {}) {
  if (!CHROMIUM) throw new Error('no chromium: apt-get install chromium (scripts/bootstrap does), or set CHROMIUM');
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'moonrun-chromium-'));
  const proc = spawn(CHROMIUM, [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
    '--no-default-browser-check', '--disable-extensions', '--disable-background-networking',
    '--remote-debugging-pipe', `--user-data-dir=${profile}`, `--window-size=${width},${height}`, 'about:blank',
  ], { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr = (stderr + d).slice(-20000); });
  const toBrowser = proc.stdio[3];
  const fromBrowser = proc.stdio[4];
  let nextId = 1;
  const waiting = new Map();
  const listeners = [];
  let buffer = '';
  fromBrowser.on('data', (d) => {
    buffer += d.toString('utf8');
    let cut;
    while ((cut = buffer.indexOf('\0')) >= 0) {
      const msg = JSON.parse(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 1);
      if (msg.id && waiting.has(msg.id)) {
        const { resolve, reject, method } = waiting.get(msg.id);
        waiting.delete(msg.id);
        if (msg.error) reject(new Error(`${method}: ${msg.error.message}`));
        else resolve(msg.result);
      } else {
        for (const l of listeners) l(msg);
      }
    }
  });
  const exited = new Promise((resolve) => proc.on('exit', resolve));
  exited.then(() => { for (const w of waiting.values()) w.reject(new Error('chromium exited:\n' + stderr)); });

  function send(method, params = {}, sessionId) {
    const id = nextId++;
    const p = new Promise((resolve, reject) => waiting.set(id, { resolve, reject, method }));
    toBrowser.write(JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) }) + '\0');
    return p;
  }

  const { targetInfos } = await send('Target.getTargets');
  const target = targetInfos.find((t) => t.type === 'page');
  const { sessionId } = await send('Target.attachToTarget', { targetId: target.targetId, flatten: true });
  const page = {
    consoleErrors: [],
    send: (method, params) => send(method, params, sessionId),
    // The value of an expression (awaited when it is a promise); a thrown error rethrown here.
    async evaluate(expression) {
      const r = await page.send('Runtime.evaluate', { expression, awaitPromise: true, returnByValue: true });
      if (r.exceptionDetails) throw new Error('in the page: ' + (r.exceptionDetails.exception?.description ?? r.exceptionDetails.text));
      return r.result.value;
    },
    async waitFor(expression, { timeoutMs = 60000, what = expression } = {}) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const v = await page.evaluate(expression).catch(() => undefined);
        if (v) return v;
        if (Date.now() > deadline) throw new Error('timed out waiting for ' + what);
        await new Promise((r) => setTimeout(r, 100));
      }
    },
    async goto(url) {
      await page.send('Page.navigate', { url });
      await page.waitFor("document.readyState === 'complete'");
    },
    async reload() {
      await page.send('Page.reload', {});
      await new Promise((r) => setTimeout(r, 200));
      await page.waitFor("document.readyState === 'complete'");
    },
    // Calls fn(params) on each event of this page named method (Fetch.requestPaused, ...).
    on(method, fn) {
      listeners.push((msg) => { if (msg.sessionId === sessionId && msg.method === method) fn(msg.params); });
    },
    async screenshot(file) {
      const { data } = await page.send('Page.captureScreenshot', { format: 'png' });
      fs.mkdirSync(path.dirname(file), { recursive: true });
      fs.writeFileSync(file, Buffer.from(data, 'base64'));
    },
  };
  listeners.push((msg) => {
    if (msg.sessionId !== sessionId) return;
    if (msg.method === 'Runtime.exceptionThrown') page.consoleErrors.push(msg.params.exceptionDetails.exception?.description ?? msg.params.exceptionDetails.text);
    if (msg.method === 'Runtime.consoleAPICalled' && msg.params.type === 'error')
      page.consoleErrors.push(msg.params.args.map((a) => a.value ?? a.description).join(' '));
    if (msg.method === 'Log.entryAdded' && msg.params.entry.level === 'error') page.consoleErrors.push(msg.params.entry.text);
  });
  await page.send('Page.enable');
  await page.send('Runtime.enable');
  await page.send('Log.enable');
  await page.send('DOM.enable');
  return {
    page,
    async close() {
      try { await send('Browser.close'); } catch { /* already gone */ }
      const timer = setTimeout(() => proc.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
      fs.rmSync(profile, { recursive: true, force: true });
    },
  };
}
