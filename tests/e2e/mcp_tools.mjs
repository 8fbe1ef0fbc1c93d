#!/usr/bin/env node
// A Model Context Protocol server over stdio (newline-delimited JSON-RPC 2.0, as the MCP
// spec's stdio transport says) that offers the seed's two tools, `calculate` and
// `get_weather`: the tools the demo model was trained to call. Claude Code and Codex load it
// from their own MCP configuration, so their tool round trips run a real tool through the
// agents' own MCP clients. Each call is appended as one JSON line to $MCP_CALL_LOG, so a test
// can see what the agent ran and what the tool answered.
import { appendFileSync } from 'node:fs';
import { createInterface } from 'node:readline';

const TOOLS = [
  { name: 'calculate', description: 'Evaluate a basic arithmetic expression.',
    inputSchema: { type: 'object', properties: { expression: { type: 'string', description: "e.g. '47*89'" } },
      required: ['expression'] } },
  { name: 'get_weather', description: 'Get current weather for a city.',
    inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
];

// The seed's implementations: a calculator over + - * / ** and parentheses, a weather stub.
function calculate({ expression }) {
  if (typeof expression !== 'string' || !/^[0-9+\-*/(). ]+$/.test(expression)) throw new Error('bad expression');
  return { result: Function(`"use strict"; return (${expression});`)() };
}
function getWeather({ city }) {
  const fake = { Tokyo: '22C, clear', London: '14C, rain', Cairo: '35C, sunny' };
  return { city, weather: fake[city] ?? '18C, partly cloudy' };
}
const IMPL = { calculate, get_weather: getWeather };

const send = (msg) => process.stdout.write(JSON.stringify({ jsonrpc: '2.0', ...msg }) + '\n');

function handle(req) {
  switch (req.method) {
    case 'initialize':
      return { protocolVersion: req.params?.protocolVersion ?? '2025-06-18', capabilities: { tools: {} },
               serverInfo: { name: 'seed-tools', version: '1.0.0' } };
    case 'ping': return {};
    case 'tools/list': return { tools: TOOLS };
    case 'tools/call': {
      const { name, arguments: args = {} } = req.params ?? {};
      let result, isError = false;
      try {
        if (!IMPL[name]) throw new Error(`unknown tool ${name}`);
        result = IMPL[name](args);
      } catch (e) {
        result = { error: String(e.message ?? e) };
        isError = true;
      }
      if (process.env.MCP_CALL_LOG) appendFileSync(process.env.MCP_CALL_LOG, JSON.stringify({ name, args, result }) + '\n');
      return { content: [{ type: 'text', text: JSON.stringify(result) }], isError };
    }
    default: return undefined;
  }
}

createInterface({ input: process.stdin }).on('line', (line) => {
  if (!line.trim()) return;
  let req;
  try { req = JSON.parse(line); } catch { return send({ id: null, error: { code: -32700, message: 'parse error' } }); }
  if (req.id === undefined || req.id === null) return;  // a notification (notifications/initialized, ...)
  const result = handle(req);
  if (result === undefined) send({ id: req.id, error: { code: -32601, message: `method not found: ${req.method}` } });
  else send({ id: req.id, result });
});
