// Anthropic's Claude Code itself (@anthropic-ai/claude-code, pinned in package.json) against
// a real server on the demo model: `claude -p`, offline and non-interactive, on the Messages
// API with Claude Code's default request (adaptive thinking, output_config.effort,
// context_management, a system turn inside messages, a defer_loading tool, cache_control,
// max_tokens 32000; the server's "input length and `max_tokens` exceed context limit" 400,
// which Claude Code reads to retry with a max_tokens that fits the demo model's 8,192 tokens).
//
// The tool round trip: the demo model knows the seed's `calculate` and `get_weather` by
// those names, and Claude Code names the tools of an MCP server `mcp__<server>__<tool>`,
// except for the in-process MCP servers of an Agent SDK host when the host sets
// CLAUDE_AGENT_SDK_MCP_NO_PREFIX. So this test is such a host: it runs `claude -p` the way
// the Agent SDK does (--input-format/--output-format stream-json, its control protocol),
// declares one SDK MCP server with the seed's tools and answers Claude Code's MCP messages
// by running them. Claude Code decides everything else: it calls the server, checks the
// model's tool_use against its tools, asks the host to run it, sends the tool_result back
// and exits when the model answers. Claude Code's long built-in prompt and tools are left
// out (--system-prompt, --tools ""), as its options allow: the demo model has 8,192 tokens
// of context and knows only short conversations.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, runProcess } from './harness.mjs';

const CLAUDE = new URL('./node_modules/.bin/claude', import.meta.url).pathname;
const MCP = new URL('./mcp_tools.mjs', import.meta.url).pathname;
let srv, home;
before(async () => {
  srv = await startServer();
  home = mkdtempSync(join(tmpdir(), 'moonrun-claude-'));
});
after(async () => {
  await srv?.stop();
  if (home) rmSync(home, { recursive: true, force: true });
});

// Offline and quiet: no telemetry, update checks or other calls beyond the API.
const env = () => ({
  PATH: process.env.PATH, HOME: home, ANTHROPIC_BASE_URL: srv.base, ANTHROPIC_API_KEY: 'sk-moonrun-test',
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1', DISABLE_AUTOUPDATER: '1', DISABLE_TELEMETRY: '1',
  DISABLE_ERROR_REPORTING: '1', CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY: '1',
});
const COMMON = ['--model', 'moonrun-demo', '--system-prompt', 'You are a helpful assistant with tools.', '--tools', ''];

// The seed's tools as the host's SDK MCP server serves them (the same as mcp_tools.mjs).
const TOOLS = [
  { name: 'calculate', description: 'Evaluate a basic arithmetic expression.',
    inputSchema: { type: 'object', properties: { expression: { type: 'string', description: "e.g. '47*89'" } },
      required: ['expression'] } },
  { name: 'get_weather', description: 'Get current weather for a city.',
    inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
];
function runTool(name, args) {
  try {
    if (name === 'calculate') {
      if (!/^[0-9+\-*/(). ]+$/.test(args.expression ?? '')) throw new Error('bad expression');
      return { result: Function(`"use strict"; return (${args.expression});`)() };
    }
    return { city: args.city, weather: { Tokyo: '22C, clear' }[args.city] ?? '18C, partly cloudy' };
  } catch (e) {
    return { error: String(e.message ?? e) };  // the tool's answer to arguments it cannot run
  }
}
function mcpResult(msg, ran) {
  switch (msg.method) {
    case 'initialize': return { protocolVersion: msg.params.protocolVersion, capabilities: { tools: {} },
                                serverInfo: { name: 'seed', version: '1.0.0' } };
    case 'tools/list': return { tools: TOOLS };
    case 'tools/call': {
      const result = runTool(msg.params.name, msg.params.arguments ?? {});
      ran.push({ name: msg.params.name, args: msg.params.arguments, result });
      return { content: [{ type: 'text', text: JSON.stringify(result) }], isError: 'error' in result };
    }
    default: return {};
  }
}

// One `claude -p` session as an Agent SDK host: the prompt, then the control protocol
// until Claude Code's result; stdin closes then and Claude Code exits.
function hostSession(prompt) {
  const args = ['-p', '--input-format', 'stream-json', '--output-format', 'stream-json', '--verbose', ...COMMON,
                '--strict-mcp-config', '--mcp-config', JSON.stringify({ mcpServers: { seed: { type: 'sdk', name: 'seed' } } }),
                '--allowedTools', 'mcp__seed'];
  const proc = spawn(CLAUDE, args, { env: { ...env(), CLAUDE_AGENT_SDK_MCP_NO_PREFIX: '1' }, stdio: ['pipe', 'pipe', 'pipe'] });
  const send = (m) => proc.stdin.write(JSON.stringify(m) + '\n');
  const messages = [], ran = [];
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  send({ type: 'control_request', request_id: 'init-1', request: { subtype: 'initialize', sdkMcpServers: ['seed'] } });
  createInterface({ input: proc.stdout }).on('line', (line) => {
    if (!line.trim()) return;
    const m = JSON.parse(line);
    messages.push(m);
    if (m.type === 'control_response' && m.response?.request_id === 'init-1') {
      send({ type: 'user', message: { role: 'user', content: prompt }, parent_tool_use_id: null, session_id: '' });
    } else if (m.type === 'control_request') {
      const r = m.request;
      let response = {};
      if (r.subtype === 'mcp_message') {
        const msg = r.message;
        response = { mcp_response: 'id' in msg ? { jsonrpc: '2.0', id: msg.id, result: mcpResult(msg, ran) }
                                               : { jsonrpc: '2.0', result: {}, id: 0 } };
      }
      send({ type: 'control_response', response: { subtype: 'success', request_id: m.request_id, response } });
    } else if (m.type === 'result') {
      proc.stdin.end();
    }
  });
  const timer = setTimeout(() => proc.kill('SIGKILL'), 480000);
  return new Promise((resolve) => proc.on('close', (status) => {
    clearTimeout(timer);
    resolve({ status, messages, ran, stderr });
  }));
}

test('claude -p: a tool call and its result, then the answer; exit 0', async () => {
  const before = (srv.log().match(/route="POST \/v1\/messages" status=200/g) ?? []).length;
  const { status, messages, ran, stderr } = await hostSession('What is 47 * 89? Use your tools.');
  const trace = `exit ${status}\n${stderr}\n` + messages.filter((m) => m.type === 'assistant' || m.type === 'user' ||
    m.type === 'result').map((m) => JSON.stringify(m.message?.content ?? m.result).slice(0, 400)).join('\n') +
    '\nserver:\n' + srv.log().slice(-3000);
  assert.equal(status, 0, trace);
  const init = messages.find((m) => m.type === 'system' && m.subtype === 'init');
  assert.deepEqual(init.tools.sort(), ['calculate', 'get_weather'], trace);
  // Claude Code sent the model's tool_use to the tool and its result back to the model.
  const uses = messages.filter((m) => m.type === 'assistant').flatMap((m) => m.message.content)
    .filter((b) => b.type === 'tool_use');
  const results = messages.filter((m) => m.type === 'user' && Array.isArray(m.message.content))
    .flatMap((m) => m.message.content).filter((b) => b.type === 'tool_result');
  assert.ok(uses.length >= 1, `a tool_use\n${trace}`);
  assert.ok(ran.length >= 1, `the tool ran\n${trace}`);
  // A result from the tool itself (is_error only when the tool refused the model's arguments),
  // not Claude Code's refusal of an unknown or unpermitted tool.
  const answered = results.filter((r) => uses.some((u) => u.id === r.tool_use_id));
  assert.ok(answered.length >= 1, `its tool_result\n${trace}`);
  const ranText = ran.map((r) => JSON.stringify(r.result));
  assert.ok(answered.some((r) => ranText.includes(typeof r.content === 'string' ? r.content
    : r.content.map((c) => c.text).join(''))), `the tool's own output went back\n${trace}`);
  const result = messages.find((m) => m.type === 'result');
  assert.equal(result.subtype, 'success', trace);
  assert.equal(result.is_error, false, trace);
  assert.ok(result.num_turns >= 2, trace);
  const requests = (srv.log().match(/route="POST \/v1\/messages" status=200/g) ?? []).length - before;
  assert.ok(requests >= 2, `${requests} Messages requests: the one after the tool_result included\n${trace}`);
});

test('claude -p "..." (plain print mode, JSON out): exit 0 with a reply', async () => {
  // Claude Code's default way to the tools of an MCP server: `mcp__seed__calculate`. The
  // demo model says `calculate`, which Claude Code refuses as it should; it must still end well.
  const config = JSON.stringify({ mcpServers: { seed: { type: 'stdio', command: process.execPath, args: [MCP] } } });
  const run = await runProcess(CLAUDE, ['-p', 'Who are you?', ...COMMON, '--strict-mcp-config', '--mcp-config', config,
                                        '--output-format', 'json'], env());
  const trace = `exit ${run.status}\n${run.stdout}\n${run.stderr}\nserver:\n${srv.log().slice(-2000)}`;
  assert.equal(run.status, 0, trace);
  const out = JSON.parse(run.stdout);
  assert.equal(out.is_error, false, trace);
  assert.ok(out.usage.input_tokens > 0, trace);
});
