// LangChain JS (@langchain/openai and @langchain/anthropic, pinned in package.json) against a
// real server on the demo model, with the integrations' default settings: ChatOpenAI on Chat
// Completions and on the Responses API (useResponsesApi), ChatAnthropic on Messages. Each
// one: invoke and stream, a tool round trip (bindTools, the tool's result sent back as a
// ToolMessage, then the answer) and withStructuredOutput with a zod schema. What is checked
// is what LangChain itself parsed; the model's own behaviour decides what it says.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { ChatOpenAI } from '@langchain/openai';
import { ChatAnthropic } from '@langchain/anthropic';
import { HumanMessage, ToolMessage } from '@langchain/core/messages';
import { tool } from '@langchain/core/tools';
import { z } from 'zod';
import { startServer } from './harness.mjs';

let srv, models;
before(async () => {
  srv = await startServer();
  const common = { model: 'moonrun-demo', apiKey: 'EMPTY', maxRetries: 0, maxTokens: 1024 };
  models = {
    chat: new ChatOpenAI({ ...common, configuration: { baseURL: srv.base + '/v1' } }),
    responses: new ChatOpenAI({ ...common, useResponsesApi: true, configuration: { baseURL: srv.base + '/v1' } }),
    messages: new ChatAnthropic({ ...common, anthropicApiUrl: srv.base }),
  };
});
after(async () => { await srv?.stop(); });

const calculate = tool(async ({ expression }) => {
  if (!/^[0-9+\-*/(). ]+$/.test(expression)) throw new Error('bad expression');
  return JSON.stringify({ result: Function(`"use strict"; return (${expression});`)() });
}, { name: 'calculate', description: 'Evaluate a basic arithmetic expression.',
     schema: z.object({ expression: z.string().describe("e.g. '47*89'") }) });

const text = (m) => (typeof m.content === 'string' ? m.content
  : m.content.filter((p) => p.type === 'text').map((p) => p.text).join(''));

for (const api of ['chat', 'responses', 'messages']) {
  test(`${api}: invoke and stream`, async () => {
    const m = await models[api].invoke('Who are you?');
    assert.ok(text(m).length > 0, JSON.stringify(m.content));
    let streamed = '', chunks = 0;
    for await (const c of await models[api].stream('Who are you?')) { streamed += text(c); chunks++; }
    assert.ok(chunks > 1 && streamed.length > 0, `${chunks} chunks: ${streamed}`);
  });

  test(`${api}: a tool round trip (bindTools, ToolMessage, answer)`, async () => {
    const model = models[api].bindTools([calculate]);
    const messages = [new HumanMessage('What is 47 * 89? Use your tools.')];
    const first = await model.invoke(messages);
    assert.ok(first.tool_calls?.length >= 1, JSON.stringify(first));
    assert.equal(first.tool_calls[0].name, 'calculate');
    messages.push(first);
    for (const call of first.tool_calls) {
      const result = await calculate.invoke(call.args);
      messages.push(new ToolMessage({ content: result, tool_call_id: call.id }));
    }
    // Streamed this time: the answer after the tool's result.
    let answer = '';
    for await (const c of await model.stream(messages)) answer += text(c);
    assert.ok(answer.length > 0, 'an answer after the tool result');
  });

  test(`${api}: withStructuredOutput follows the schema`, async () => {
    const schema = z.object({ name: z.string(), age: z.number().int() });
    const out = await models[api].withStructuredOutput(schema).invoke('Who are you?');
    assert.ok(schema.safeParse(out).success, JSON.stringify(out));
  });
}
