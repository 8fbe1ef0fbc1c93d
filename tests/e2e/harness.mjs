// Starts a real `moonrun serve` on the embedded demo model and tears it down.
import { spawn, execFileSync } from 'node:child_process';

export const EXE = process.env.MOONRUN_EXE;
export const DEMO = process.env.MOONRUN_DEMO_MODEL;
if (!EXE || !DEMO) throw new Error('set MOONRUN_EXE and MOONRUN_DEMO_MODEL (CTest does)');

// plain: `moonrun serve` without --model-path and --served-model-name (the demo model as
// it is served by default).
export async function startServer(extraArgs = [], { timeoutMs = 120000, env = process.env, plain = false } = {}) {
  const args = ['serve', ...(plain ? [] : ['--model-path', DEMO, '--served-model-name', 'moonrun-demo']),
                '--host', '127.0.0.1', '--port', '0', ...extraArgs];
  const proc = spawn(EXE, args, { stdio: ['ignore', 'pipe', 'pipe'], env });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + log)), timeoutMs);
    const onData = (d) => {
      log += d.toString();
      const m = log.match(/on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && log.includes('ready to roll')) { clearTimeout(timer); resolve(Number(m[1])); }
    };
    proc.stderr.on('data', onData);
    proc.stdout.on('data', (d) => { log += d.toString(); });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited ${code}:\n${log}`)); });
  });
  proc.removeAllListeners('exit');
  const exited = new Promise((resolve) => proc.on('exit', (code, sig) => resolve({ code, sig })));
  return {
    proc, port, base: `http://127.0.0.1:${port}`, exited,
    log: () => log,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
      const r = await Promise.race([exited, new Promise((res) => setTimeout(() => res(null), 20000))]);
      if (r === null) { proc.kill('SIGKILL'); await exited; }
      return r;
    },
  };
}

export async function post(base, path, body, headers = {}) {
  const res = await fetch(base + path, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, json, text };
}

// `moonrun generate` on the demo model: greedy unless sampling flags are given
// ({ temperature, top_p, top_k, seed }), a device ({ device: 'cpu' }) and a dtype.
export function generate(tokenIds, maxTokens, sampling = {}) {
  const args = ['generate', '--model', DEMO, '--token-ids', tokenIds.join(','), '--max-tokens', String(maxTokens),
                '--temperature', String(sampling.temperature ?? 0)];
  if (sampling.top_p !== undefined) args.push('--top-p', String(sampling.top_p));
  if (sampling.top_k !== undefined) args.push('--top-k', String(sampling.top_k));
  if (sampling.seed !== undefined) args.push('--seed', String(sampling.seed));
  if (sampling.device !== undefined) args.push('--device', sampling.device);
  if (sampling.dtype !== undefined) args.push('--dtype', sampling.dtype);
  const out = execFileSync(EXE, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  return JSON.parse(out.trim().split('\n').pop());
}

// Parses a raw SSE body into its data payloads (strings), checking the framing.
export function sseEvents(text) {
  const events = [];
  for (const block of text.split('\n\n')) {
    if (!block.trim()) continue;
    if (!block.startsWith('data: ')) throw new Error('bad SSE block: ' + JSON.stringify(block));
    events.push(block.slice(6));
  }
  return events;
}

// One sample of /metrics. `name` may carry labels to match ('vllm:request_success_total{finished_reason="abort"}');
// the sample may have more labels (model_name) than asked for.
export async function metric(base, name, headers = {}) {
  const text = await (await fetch(base + '/metrics', { headers })).text();
  return metricIn(text, name);
}

export function metricIn(text, name) {
  const labels = (s) => Object.fromEntries([...(s ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((m) => [m[1], m[2]]));
  const want = name.match(/^([^{]+)(\{.*\})?$/);
  for (const line of text.split('\n')) {
    const m = line.match(/^([^{ ]+)(\{.*\})? (\S+)$/);
    if (!m || m[1] !== want[1]) continue;
    const have = labels(m[2]);
    if (Object.entries(labels(want[2])).every(([k, v]) => have[k] === v)) return Number(m[3]);
  }
  return undefined;
}

// Runs a command to its end (killed after 8 minutes): { status, stdout, stderr }.
export function runProcess(cmd, args, env, { input = null, timeoutMs = 480000 } = {}) {
  return new Promise((resolve) => {
    const p = spawn(cmd, args, { env, stdio: [input === null ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
    let stdout = '', stderr = '';
    p.stdout.on('data', (d) => { stdout += d; });
    p.stderr.on('data', (d) => { stderr += d; });
    if (input !== null) p.stdin.end(input);
    const timer = setTimeout(() => p.kill('SIGKILL'), timeoutMs);
    p.on('close', (status, signal) => { clearTimeout(timer); resolve({ status, signal, stdout, stderr }); });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
