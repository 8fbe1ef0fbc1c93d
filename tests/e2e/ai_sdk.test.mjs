// The Vercel AI SDK (ai 7 with @ai-sdk/openai and @ai-sdk/anthropic, pinned in package.json)
// against a real server on the demo model, with each provider's default settings:
//   - OpenAI Responses (openai.responses: its default store: true, so from the second step
//     on it refers back to the previous reasoning and message items with item_reference),
//     OpenAI Chat Completions (openai.chat) and Anthropic Messages (anthropic(...));
//   - a multi-step tool loop (the seed's two tools, run by the SDK), streamed and not;
//   - structured output (Output.object with a zod schema, which the SDK validates).
// What is checked is what the SDK itself reports (its steps, tool results, parsed output);
// the model's own behaviour decides what it says.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { generateText, streamText, tool, stepCountIs, Output } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createAnthropic } from '@ai-sdk/anthropic';
import { z } from 'zod';
import { startServer } from './harness.mjs';

let srv, providers;
const sent = [];  // the Responses provider's request bodies, as it sent them
before(async () => {
  srv = await startServer();
  const recording = (url, init) => {
    if (String(url).endsWith('/responses') && typeof init?.body === 'string') sent.push(JSON.parse(init.body));
    return fetch(url, init);
  };
  const openai = createOpenAI({ baseURL: srv.base + '/v1', apiKey: 'EMPTY', fetch: recording });
  const anthropic = createAnthropic({ baseURL: srv.base + '/v1', apiKey: 'EMPTY' });
  providers = { responses: openai.responses('moonrun-demo'), chat: openai.chat('moonrun-demo'),
                messages: anthropic('moonrun-demo') };
});
after(async () => { await srv?.stop(); });

// The seed's tools, executed by the SDK.
const tools = {
  calculate: tool({ description: 'Evaluate a basic arithmetic expression.',
    inputSchema: z.object({ expression: z.string().describe("e.g. '47*89'") }),
    execute: async ({ expression }) => {
      if (!/^[0-9+\-*/(). ]+$/.test(expression)) throw new Error('bad expression');
      return { result: Function(`"use strict"; return (${expression});`)() };
    } }),
  get_weather: tool({ description: 'Get current weather for a city.', inputSchema: z.object({ city: z.string() }),
    execute: async ({ city }) => ({ city, weather: { Tokyo: '22C, clear' }[city] ?? '18C, partly cloudy' }) }),
};
const TASK = "What is 47 * 89? Also, what's the weather in Tokyo? Use your tools, then give me one combined answer.";

// A loop that ran a tool and went on to a step that saw its result.
function checkLoop(label, steps, text) {
  const trace = JSON.stringify(steps.map((s) => ({ calls: s.toolCalls, results: s.toolResults, text: s.text })), null, 1);
  assert.ok(steps.length >= 2, `${label}: a step after the tool results\n${trace}`);
  assert.ok(steps[0].toolCalls.length >= 1, `${label}: tool calls in step 1\n${trace}`);
  assert.equal(steps[0].toolResults.length, steps[0].toolCalls.length, `${label}: every call ran\n${trace}`);
  for (const c of steps[0].toolCalls) assert.ok(c.toolName in tools, `${label}: ${c.toolName} is a declared tool`);
  assert.equal(steps.at(-1).finishReason, 'stop', `${label}: the loop ended with an answer\n${trace}`);
  assert.ok(text.length > 0, `${label}: a final answer\n${trace}`);
}

for (const api of ['responses', 'chat', 'messages']) {
  test(`${api}: generateText runs a multi-step tool loop`, async () => {
    sent.length = 0;
    const r = await generateText({ model: providers[api], tools, prompt: TASK, stopWhen: stepCountIs(5), maxOutputTokens: 1024 });
    checkLoop(api, r.steps, r.text);
    if (api === 'responses') {
      // The provider's default store: the second request names the first response's items.
      assert.ok(sent.length >= 2 && sent[0].store === undefined, 'the provider left store at its default');
      assert.ok(sent[1].input.some((i) => i.type === 'item_reference'), JSON.stringify(sent[1].input));
      assert.ok(r.reasoningText?.length > 0, 'reasoning summaries reach the SDK');
    }
    if (api === 'messages') assert.ok(r.reasoningText?.length > 0, 'thinking blocks reach the SDK');
  });

  test(`${api}: streamText runs the same loop, streamed`, async () => {
    const s = streamText({ model: providers[api], tools, prompt: TASK, stopWhen: stepCountIs(5), maxOutputTokens: 1024 });
    let text = '';
    for await (const delta of s.textStream) text += delta;
    checkLoop(`${api} streamed`, await s.steps, text);
    assert.equal(text, await s.text);
  });

  test(`${api}: structured output follows the schema`, async () => {
    const schema = z.object({ name: z.string(), age: z.number().int() });
    const r = await generateText({ model: providers[api], prompt: 'Who are you?', maxOutputTokens: 400,
                                   output: Output.object({ schema }) });
    assert.deepEqual(Object.keys(r.output).sort(), ['age', 'name']);  // the SDK parsed and validated it
    assert.ok(Number.isInteger(r.output.age));
    const s = streamText({ model: providers[api], prompt: 'Who are you?', maxOutputTokens: 400,
                           output: Output.object({ schema }) });
    for await (const _ of s.textStream) { /* drain */ }
    assert.ok(schema.safeParse(await s.output).success);
  });
}
