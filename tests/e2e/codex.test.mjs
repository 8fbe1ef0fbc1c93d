// OpenAI's Codex CLI itself (@openai/codex, pinned in package.json) against a real server on
// the demo model: `codex exec`, offline and non-interactive, on the Responses API with
// Codex's default request (its namespace tools, store: false with the whole history resent,
// include: reasoning.encrypted_content, reasoning summaries). Its configuration (a
// temporary CODEX_HOME) points it at the server and gives it the seed's tools through its
// own MCP client (mcp_tools.mjs), which Codex offers the model as the namespace
// `mcp__seed`: the server flattens it, so the model sees `calculate`, the tool it knows.
// Codex's long built-in prompt is replaced (model_instructions_file) and its optional tool
// groups are off, as its configuration allows: the demo model has 8,192 tokens of context
// and knows only short conversations.
// Passes when `codex exec` exits 0 after a function-call round trip: the model called a
// tool, Codex ran it through MCP and sent its output back, and the model answered.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, writeFileSync, readFileSync, existsSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, runProcess } from './harness.mjs';

const CODEX = new URL('./node_modules/.bin/codex', import.meta.url).pathname;
const MCP = new URL('./mcp_tools.mjs', import.meta.url).pathname;
let srv, home;
before(async () => {
  srv = await startServer();
  home = mkdtempSync(join(tmpdir(), 'moonrun-codex-'));
});
after(async () => {
  await srv?.stop();
  if (home) rmSync(home, { recursive: true, force: true });
});

function writeConfig(dir, callLog) {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'instructions.md'), 'You are a helpful assistant with tools.\n');
  writeFileSync(join(dir, 'config.toml'), `
model = "moonrun-demo"
model_provider = "moonrun"
model_context_window = 8192
model_instructions_file = ${JSON.stringify(join(dir, 'instructions.md'))}
include_permissions_instructions = false
include_apps_instructions = false
include_collaboration_mode_instructions = false
include_environment_context = false
check_for_update_on_startup = false

[features]
goals = false

[agents]
enabled = false

[skills]
include_instructions = false

[model_providers.moonrun]
name = "moonrun"
base_url = "${srv.base}/v1"
wire_api = "responses"

[mcp_servers.seed]
command = ${JSON.stringify(process.execPath)}
args = [${JSON.stringify(MCP)}]
env = { MCP_CALL_LOG = ${JSON.stringify(callLog)} }
default_tools_approval_mode = "approve"
`);
}

test('codex exec: a function-call round trip through its MCP client, exit 0', async () => {
  const codexHome = join(home, 'codex'), work = join(home, 'work'), callLog = join(home, 'calls.jsonl');
  mkdirSync(work, { recursive: true });
  writeConfig(codexHome, callLog);
  const requestsBefore = (srv.log().match(/route="POST \/v1\/responses" status=200/g) ?? []).length;
  // Asynchronously: the server's own output must keep being read meanwhile.
  const run = await runProcess(CODEX, ['exec', '--json', '--skip-git-repo-check', '-C', work,
                                       'What is 47 * 89? Use your tools.'], {
    PATH: process.env.PATH, HOME: home, CODEX_HOME: codexHome, RUST_LOG: 'error', NO_COLOR: '1' });
  const trace = `exit ${run.status}\nstdout:\n${run.stdout}\nstderr:\n${run.stderr}\nserver:\n${srv.log().slice(-4000)}`;
  assert.equal(run.status, 0, trace);
  const events = run.stdout.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
  const items = events.filter((e) => e.type === 'item.completed').map((e) => e.item);
  // The tool call: Codex ran it through its MCP client and it completed.
  const calls = items.filter((i) => i.type === 'mcp_tool_call');
  assert.ok(calls.length >= 1, `a tool call\n${trace}`);
  assert.ok(calls.every((c) => c.server === 'seed' && ['calculate', 'get_weather'].includes(c.tool)), trace);
  // Completed, or failed with the tool's own error for arguments it could not run.
  assert.ok(calls.some((c) => c.result?.content?.length > 0 || c.error), trace);
  assert.ok(existsSync(callLog), `the MCP server ran the tool\n${trace}`);
  const ran = readFileSync(callLog, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  assert.ok(ran.length >= 1, trace);
  // Then the answer, from a request that carried the tool's output.
  const lastCall = items.findLastIndex((i) => i.type === 'mcp_tool_call');
  assert.ok(items.slice(lastCall + 1).some((i) => i.type === 'agent_message' && i.text.length > 0), `an answer after it\n${trace}`);
  const requests = (srv.log().match(/route="POST \/v1\/responses" status=200/g) ?? []).length - requestsBefore;
  assert.ok(requests >= 2, `${requests} Responses requests\n${trace}`);
  // The reasoning reached Codex as summaries.
  assert.ok(items.some((i) => i.type === 'reasoning' && i.text.length > 0), `reasoning shown\n${trace}`);
});
