// Issue 15, the operator's side: the seeds' SGLang and vLLM launch lines pasted verbatim
// (model path swapped for the demo checkpoint) are accepted, with one warning naming the
// flags that have no effect; the seed's curl example works against `make demo`; the model
// answers to its path, basename and aliases; one log line per request; a startup dump;
// JSON logs; every log level real.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { basename } from 'node:path';
import { EXE, DEMO, startServer, post, sleep, generate } from './harness.mjs';

const sh = (cmd) => spawnSync('bash', ['-c', cmd], { encoding: 'utf8', env: { ...process.env, DEMO, EXE } });

// The seeds' lines, as printed there, with `sglang serve` / `vllm serve`-in-docker replaced
// by `moonrun serve` and moonshotai/Kimi-K3 by the demo checkpoint.
const SGLANG_4_NODES = `"$EXE" serve --trust-remote-code \\
  --model-path "$DEMO" \\
  --tp-size 32 \\
  --ep-size 32 \\
  --nnodes 4 \\
  --node-rank 0 \\
  --dist-init-addr 10.0.0.219:20000 \\
  --moe-runner-backend marlin \\
  --decode-attention-backend flashmla \\
  --mem-fraction-static 0.85 \\
  --dist-timeout 3600 \\
  --reasoning-parser kimi_k3 \\
  --tool-call-parser kimi_k3 \\
  --host 0.0.0.0 \\
  --port 8000`;
const SGLANG_1_NODE = `"$EXE" serve \\
  --trust-remote-code \\
  --model-path "$DEMO" \\
  --tp-size 8 \\
  --reasoning-parser kimi_k3 \\
  --tool-call-parser kimi_k3 \\
  --host 0.0.0.0 \\
  --port 30000`;
const VLLM_K3 = `"$EXE" serve "$DEMO" \\
  --trust-remote-code \\
  --gpu-memory-utilization 0.95 \\
  --tensor-parallel-size 8 \\
  --load-format fastsafetensors \\
  --disable-flashinfer-autotune \\
  --max-model-len 1048576 \\
  --kv-cache-dtype fp8 \\
  --attention-config '{"use_prefill_query_quantization":true,"mla_prefill_backend":"TOKENSPEED_MLA"}' \\
  --enable-prefix-caching \\
  --attention-backend TOKENSPEED_MLA \\
  --prefix-match-unit 128 \\
  --enable-auto-tool-choice \\
  --tool-call-parser kimi_k3 \\
  --reasoning-parser kimi_k3`;
const VLLM_K31 = `"$EXE" serve "$DEMO" \\
  --trust-remote-code \\
  --tensor-parallel-size 8 \\
  --load-format fastsafetensors \\
  --enable-auto-tool-choice \\
  --tool-call-parser kimi_k3 \\
  --reasoning-parser kimi_k3`;

function dryRun(line) {
  const r = sh(line + ' --dry-run');
  assert.equal(r.status, 0, r.stdout + r.stderr);
  return r.stdout + r.stderr;
}

test('the seed\'s 4-node SGLang line: --dry-run resolves it, names the flags without effect', () => {
  const out = dryRun(SGLANG_4_NODES);
  assert.match(out, /tp_size: 32/);
  assert.match(out, /ep_size: 32/);
  assert.match(out, /nnodes: 4/);
  assert.match(out, /dist_init_addr: 10\.0\.0\.219:20000/);
  assert.match(out, /dist_timeout: 3600 s/);
  assert.match(out, /mem_fraction_static: 0\.85/);
  const warning = out.split('\n').find((l) => l.includes('no effect'));
  for (const f of ['--trust-remote-code', '--moe-runner-backend marlin', '--decode-attention-backend flashmla'])
    assert.ok(warning.includes(f), `${f} in: ${warning}`);
  assert.doesNotMatch(out, /^note:/m);  // a complete multi-node line: nothing to object to
});

test('the seed\'s single-node SGLang line and both vLLM lines (positional model) --dry-run cleanly', () => {
  let out = dryRun(SGLANG_1_NODE);
  assert.match(out, /tp_size: 8/);
  out = dryRun(VLLM_K3);
  assert.match(out, new RegExp(`model_path: ${DEMO.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`));
  assert.match(out, /context_length: 1048576/);
  assert.match(out, /mem_fraction_static: 0\.95/);
  const warning = out.split('\n').find((l) => l.includes('no effect'));
  for (const f of ['--trust-remote-code', '--load-format fastsafetensors', '--disable-flashinfer-autotune',
                   '--attention-config', '--enable-prefix-caching', '--attention-backend TOKENSPEED_MLA',
                   '--prefix-match-unit 128'])
    assert.ok(warning.includes(f), `${f} in: ${warning}`);
  // fp8 KV is honoured (an e4m3 MLA cache), so neither ignored nor objected to.
  assert.ok(!warning.includes('--kv-cache-dtype'), warning);
  assert.match(out, /kv_cache_dtype: fp8/);
  assert.doesNotMatch(out, /note: --kv-cache-dtype/);
  assert.ok(!warning.includes('--enable-auto-tool-choice'), 'auto tool choice is what moonrun does');
  out = dryRun(VLLM_K31);
  assert.match(out, /tp_size: 8/);
});

test('the single-node SGLang line starts for real on one device, the warning in its log', async () => {
  // The same line with --tp-size 1 (one device) and a free port.
  const args = ['--trust-remote-code', '--tp-size', '1', '--reasoning-parser', 'kimi_k3', '--tool-call-parser', 'kimi_k3',
                '--moe-runner-backend', 'marlin'];
  const srv = await startServer(args);
  try {
    assert.match(srv.log(), /WARNING: These flags have no effect in moonrun and were ignored: --trust-remote-code, --moe-runner-backend marlin/);
    assert.equal((await post(srv.base, '/v1/chat/completions', { model: 'moonrun-demo', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] })).status, 200);
  } finally {
    await srv.stop();
  }
});

test('the vLLM line\'s --kv-cache-dtype fp8 keeps the MLA cache in e4m3 and serves', async () => {
  const srv = await startServer(['--kv-cache-dtype', 'fp8']);
  try {
    // A quarter of the float32 cache's bytes a token on the CPU (1 byte a value, not 4).
    assert.match(srv.log(), /KV Cache is allocated\. dtype: float8_e4m3fn/);
    const r = await post(srv.base, '/v1/chat/completions',
                         { model: 'moonrun-demo', max_tokens: 8, messages: [{ role: 'user', content: 'hi there' }] });
    assert.equal(r.status, 200);
    assert.equal(r.json.choices[0].finish_reason.length > 0, true);
  } finally {
    await srv.stop();
  }
});

test('a typo is still an error, and so are settings moonrun cannot honour', () => {
  // --kv-cache-dtype fp8_e5m2 and --dtype float16 are refused at a real start, with the reason.
  for (const [flag, why] of [['--kv-cache-dtype fp8_e5m2', /e4m3/], ['--dtype half', /not supported/]]) {
    const f = sh(`"$EXE" serve "$DEMO" --port 0 ${flag}`);
    assert.equal(f.status, 2, f.stdout + f.stderr);
    assert.match(f.stderr, why);
  }
  let r = sh(`"$EXE" serve --model-path "$DEMO" --tp-szie 8 --dry-run`);
  assert.equal(r.status, 2, r.stderr);
  r = sh(`"$EXE" serve "$DEMO" --pipeline-parallel-size 0 --dry-run`);
  assert.equal(r.status, 2);
  assert.match(r.stderr, /pipeline/);
  r = sh(`"$EXE" serve "$DEMO" --pipeline-parallel-size 2 --dry-run`);
  assert.equal(r.status, 0, r.stderr);
  r = sh(`"$EXE" serve "$DEMO" --model-path /elsewhere --dry-run`);
  assert.equal(r.status, 2);
});

test('the seed\'s curl example works as written against `make demo`', async () => {
  // The demo target's own arguments (from the Makefile), on a free port instead of 8000.
  const recipe = readFileSync(new URL('../../Makefile', import.meta.url), 'utf8').match(/^demo:.*\n\t(.*)$/m)[1];
  const tokens = recipe.split(/\s+/);
  const args = [];
  for (let i = tokens.indexOf('serve') + 1; i < tokens.length; ++i) {
    if (tokens[i] === '--host' || tokens[i] === '--port') { ++i; continue; }
    args.push(tokens[i]);
  }
  const srv = await startServer(args);
  try {
    const curl = `curl -s http://$HEAD_IP:${srv.port}/v1/chat/completions \\
  -H "Content-Type: application/json" \\
  -H "Authorization: Bearer EMPTY" \\
  -d '{
    "model": "moonshotai/Kimi-K3",
    "messages": [{"role": "user", "content": "Who are you? One sentence."}],
    "max_tokens": 256
  }'`;
    const r = spawnSync('bash', ['-c', curl], { encoding: 'utf8', env: { ...process.env, HEAD_IP: '127.0.0.1' } });
    const reply = JSON.parse(r.stdout);
    assert.equal(reply.object, 'chat.completion', r.stdout);
    assert.equal(typeof reply.choices[0].message.role, 'string');
    assert.ok('reasoning_content' in reply.choices[0].message);
    assert.ok(reply.usage.completion_tokens > 0);
    const models = JSON.parse(spawnSync('bash', ['-c', `curl -s http://127.0.0.1:${srv.port}/v1/models`], { encoding: 'utf8' }).stdout);
    assert.ok(models.data.some((m) => m.id === 'moonshotai/Kimi-K3'), JSON.stringify(models));
  } finally {
    await srv.stop();
  }
});

test('the model answers to its path, its basename and every --served-model-name', async () => {
  const srv = await startServer(['--served-model-name', 'moonrun-demo', 'kimi-k3', 'company/k3-prod']);
  try {
    for (const name of ['moonrun-demo', 'kimi-k3', 'company/k3-prod', DEMO, basename(DEMO), DEMO + '/']) {
      const r = await post(srv.base, '/v1/completions', { model: name, prompt: 'hi', max_tokens: 1 });
      assert.equal(r.status, 200, `${name}: ${r.text}`);
    }
    const r = await post(srv.base, '/v1/completions', { model: 'gpt-4o', prompt: 'hi', max_tokens: 1 });
    assert.equal(r.status, 404);
  } finally {
    await srv.stop();
  }
});

// The guides' requests name moonshotai/Kimi-K3; the demo model served by default stands in
// for that checkpoint, so it answers to it as a checkpoint answers to its path (and to its
// own name), with or without other --served-model-name values. Other names are still 404s.
test('plain `moonrun serve` (the demo model) answers to moonshotai/Kimi-K3 and moonrun-demo', async () => {
  for (const extra of [[], ['--served-model-name', 'team-model']]) {
    const srv = await startServer(extra, { plain: true });
    try {
      const names = ['moonshotai/Kimi-K3', 'Kimi-K3', extra.length ? 'team-model' : 'moonrun-demo'];
      for (const name of names) {
        const r = await post(srv.base, '/v1/chat/completions', { model: name, max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
        assert.equal(r.status, 200, `${extra.join(' ')} ${name}: ${r.text}`);
      }
      const r = await post(srv.base, '/v1/completions', { model: 'moonshotai/Kimi-K2', prompt: 'hi', max_tokens: 1 });
      assert.equal(r.status, 404, r.text);
      assert.match(srv.log(), /Serving (moonrun-demo|team-model) on/);
    } finally {
      await srv.stop();
    }
  }
  // A demo model named by its path is a checkpoint like any other: its path, not the repo id.
  const dry = spawnSync(EXE, ['serve', '--dry-run'], { encoding: 'utf8' });
  assert.equal(dry.status, 0, dry.stderr);
  assert.match(dry.stdout, /answers_to_model: moonrun-demo, moonshotai\/Kimi-K3, Kimi-K3/);
  const named = spawnSync(EXE, ['serve', '--model-path', DEMO, '--dry-run'], { encoding: 'utf8' });
  assert.doesNotMatch(named.stdout, /moonshotai\/Kimi-K3/);
});

test('one log line per request; the startup dump; trace and debug are real levels', async () => {
  const srv = await startServer(['--log-level', 'trace']);
  try {
    const r = await post(srv.base, '/v1/completions', { model: 'moonrun-demo', prompt: 'hello there', max_tokens: 3, ignore_eos: true },
                         { 'X-Request-Id': 'trace-me-42' });
    assert.equal(r.status, 200);
    await sleep(200);
    const log = srv.log();
    const line = log.split('\n').find((l) => l.includes('id=trace-me-42'));
    assert.ok(line, log.slice(-1500));
    assert.match(line, /route="POST \/v1\/completions" status=200 prompt_tokens=\d+ completion_tokens=3 queue_s=[\d.]+ ttft_s=[\d.]+ total_s=[\d.]+/);
    assert.match(log, /moonrun \d+\.\d+\.\d+ \(commit [0-9a-f]+|unknown/);
    assert.match(log, /command line: .*serve .*--log-level trace/);
    assert.match(log, /GPU( \d+)?: /);  // 'GPU 0: NVIDIA H200, 139.80 GiB' or 'GPU: none ...'
    assert.match(log, /server_args: model_path=/);
    assert.match(log, /TRACE: accepted 127\.0\.0\.1:/);
    assert.match(log, /DEBUG: request trace-me-42 POST \/v1\/completions/);
  } finally {
    await srv.stop();
  }
  const info = await startServer([]);
  try {
    await post(info.base, '/v1/completions', { model: 'moonrun-demo', prompt: 'hi', max_tokens: 1 });
    await sleep(200);
    assert.doesNotMatch(info.log(), /TRACE:|DEBUG:/);
  } finally {
    await info.stop();
  }
});

async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

test('--log-level warning and error silence info; --log-format json is one JSON object per line', async () => {
  for (const level of ['warning', 'error', 'critical']) {
    const port = await freePort();
    const r = spawnSync('bash', ['-c', `"$EXE" serve --model-path "$DEMO" --port ${port} --log-level ${level} --moe-runner-backend x & pid=$!;
      for i in $(seq 100); do curl -sf http://127.0.0.1:${port}/health >/dev/null && break; sleep 0.1; done;
      curl -s http://127.0.0.1:${port}/v1/completions -H 'Content-Type: application/json' -d '{"prompt":"hi","max_tokens":1}' >/dev/null;
      kill -TERM $pid; wait $pid`], { encoding: 'utf8', env: { ...process.env, DEMO, EXE } });
    assert.equal(r.status, 0, r.stderr);
    assert.doesNotMatch(r.stderr, /ready to roll|request id=/, `${level}: ${r.stderr}`);
    if (level === 'warning') assert.match(r.stderr, /WARNING: These flags have no effect/);
    else assert.doesNotMatch(r.stderr, /WARNING/);
  }
  const srv = await startServer(['--log-format', 'json'], {});
  try {
    await post(srv.base, '/v1/completions', { model: 'moonrun-demo', prompt: 'hi', max_tokens: 2 });
    await sleep(200);
    const lines = srv.log().trim().split('\n');
    const records = lines.map((l) => JSON.parse(l));
    assert.ok(records.every((r) => r.time && r.level && typeof r.msg === 'string'));
    const req = records.find((r) => r.msg === 'request');
    assert.equal(req.status, 200);
    assert.equal(req.route, 'POST /v1/completions');
    assert.equal(typeof req.prompt_tokens, 'number');
    assert.equal(typeof req.total_s, 'number');
  } finally {
    await srv.stop();
  }
});

test('every metric the Grafana dashboard queries is one /metrics exposes, with a model_name label', async () => {
  const dash = readFileSync(new URL('../../docs/grafana/moonrun.json', import.meta.url), 'utf8');
  const names = new Set([...dash.matchAll(/(vllm|moonrun):[a-z0-9_]+/g)].map((m) => m[0].replace(/_(bucket|sum|count)$/, '')));
  assert.ok(names.size >= 10, [...names].join(' '));
  const srv = await startServer([]);
  try {
    await post(srv.base, '/v1/completions', { model: 'moonrun-demo', prompt: 'hi', max_tokens: 2 });
    await post(srv.base, '/v1/completions', { model: 'not-this-one', prompt: 'hi' });  // a refusal
    const text = await (await fetch(srv.base + '/metrics')).text();
    for (const n of names) {
      assert.match(text, new RegExp(`^# TYPE ${n} `, 'm'), `${n} is not exposed`);
      assert.match(text, new RegExp(`^${n}(_bucket|_sum|_count)?\\{model_name="moonrun-demo"`, 'm'), `${n} has no model_name label`);
    }
  } finally {
    await srv.stop();
  }
});

// (Not for a binary carried from the machine that built it, as scripts/gpu-check.sh --prebuilt
// runs it: the source tree it was built from is not on this machine.)
const PREBUILT = process.env.MOONRUN_PREBUILT ? 'a prebuilt binary: its source tree is on the machine that built it' : false;
test('a lone binary (no demo-model/ beside it) serves the demo model from its source tree', { skip: PREBUILT }, async () => {
  const { mkdtempSync, copyFileSync, chmodSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const { join } = await import('node:path');
  const { spawn } = await import('node:child_process');
  const dir = mkdtempSync(join(tmpdir(), 'moonrun-bare-'));
  const exe = join(dir, 'moonrun');
  copyFileSync(EXE, exe);
  chmodSync(exe, 0o755);
  const proc = spawn(exe, ['serve', '--port', '0']);
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no start:\n' + log)), 60000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && log.includes('ready to roll')) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on('exit', (c) => { clearTimeout(timer); reject(new Error(`exited ${c}:\n${log}`)); });
  });
  try {
    assert.match(log, /models\/moonrun-demo/);
    const r = await post(`http://127.0.0.1:${port}`, '/v1/completions', { model: 'moonrun-demo', prompt: 'hi', max_tokens: 2 });
    assert.equal(r.status, 200, r.text);
  } finally {
    proc.removeAllListeners('exit');
    proc.kill('SIGTERM');
    await new Promise((r) => proc.on('exit', r));
  }
});

test('--tp-size 2 --ep-size 2 on the CPU: ranks as threads, the same greedy tokens as one rank', async () => {
  const srv = await startServer(['--device', 'cpu', '--tp-size', '2', '--ep-size', '2']);
  try {
    assert.match(srv.log(), /Init distributed begin\. backend=cpu, tp_size=2, ep_size=2/);
    assert.match(srv.log(), /GB per rank x 2 ranks here \(tp 2, ep 2\)/);
    for (const text of ['Parallel ranks agree', 'one two three four']) {
      const ids = (await post(srv.base, '/tokenize', { model: 'moonrun-demo', prompt: text })).json.tokens;
      const r = await post(srv.base, '/v1/completions', {
        model: 'moonrun-demo', prompt: ids, max_tokens: 12, temperature: 0, ignore_eos: true, return_token_ids: true,
      });
      assert.equal(r.status, 200, r.text);
      assert.deepEqual(r.json.choices[0].token_ids, generate(ids, 12, { device: 'cpu' }).token_ids, text);
    }
  } finally {
    await srv.stop();
  }
});
