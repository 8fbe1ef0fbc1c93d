// The embedded demo model talks (issue #17): the seed's checks, for real, through the
// official openai client on the CPU.
//   - the seed's tool loop: two tool calls in one turn, then one combined answer holding
//     the calculator's number and the weather (the seed's task, and tasks drawn at random
//     here, so the numbers and cities are ones the model was not trained on);
//   - reasoning that follows the effort: fewer reasoning tokens at low than at high;
//   - an image of coloured regions described by its colours;
//   - the seed's own Python loop (seed_tool_loop.py, urllib) against the same server.
// Each check is what the seed's reader would look at; none compares against text of our
// own making beyond "the answer contains the tool's result".
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import OpenAI from 'openai';
import { startServer } from './harness.mjs';
import { makePng, makeRegionsPng, dataUri } from './png.mjs';

let srv, client;
before(async () => {
  srv = await startServer();
  client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'EMPTY', maxRetries: 0, timeout: 300000 });
});
after(async () => { await srv?.stop(); });

// The seed's two tools and their implementations (calculator over + - * / **, weather stub).
const TOOLS = [
  { type: 'function', function: { name: 'calculate', description: 'Evaluate a basic arithmetic expression.',
    parameters: { type: 'object', properties: { expression: { type: 'string', description: "e.g. '47*89'" } },
      required: ['expression'] } } },
  { type: 'function', function: { name: 'get_weather', description: 'Get current weather for a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } },
];
function calculate({ expression }) {
  if (!/^[0-9+\-*/(). ]+$/.test(expression)) throw new Error('bad expr');
  // Only digits, operators and parentheses reach here; ** is JavaScript's power too.
  return { result: Function(`"use strict"; return (${expression});`)() };
}
function getWeather({ city }) {
  const fake = { Tokyo: '22C, clear', London: '14C, rain', Cairo: '35C, sunny' };
  return { city, weather: fake[city] ?? '18C, partly cloudy' };
}
const IMPL = { calculate, get_weather: getWeather };

// The seed's loop: ask, run every tool call, echo the assistant turn back with its
// reasoning_content and tool_calls, stop at the first reply without tool calls.
async function toolLoop(task, seed) {
  const messages = [{ role: 'system', content: 'You are a helpful assistant with tools.' },
                    { role: 'user', content: task }];
  const turns = [];
  for (let turn = 0; turn < 6; turn++) {
    const resp = await client.chat.completions.create({
      model: 'moonrun-demo', messages, tools: TOOLS, max_tokens: 1024, temperature: 0.7,
      reasoning_effort: 'high', seed });
    const m = resp.choices[0].message;
    const tcs = m.tool_calls ?? [];
    turns.push({ m, results: [] });
    if (tcs.length === 0) return { turns, answer: m.content ?? '' };
    const at = { role: 'assistant', content: m.content ?? '', tool_calls: tcs };
    if (m.reasoning_content) at.reasoning_content = m.reasoning_content;
    messages.push(at);
    for (const tc of tcs) {
      let result;
      try { result = IMPL[tc.function.name](JSON.parse(tc.function.arguments || '{}')); }
      catch (e) { result = { error: String(e) }; }
      turns.at(-1).results.push({ name: tc.function.name, args: tc.function.arguments, result });
      messages.push({ role: 'tool', tool_call_id: tc.id, name: tc.function.name, content: JSON.stringify(result) });
    }
  }
  return { turns, answer: null };
}

// "4183" may be written 4,183 in an answer.
const hasNumber = (text, n) => text.replace(/(\d),(\d{3})/g, '$1$2').includes(String(n));

function checkLoop(label, { turns, answer }, a, b, city) {
  const trace = JSON.stringify(turns.map((t) => ({ reasoning: t.m.reasoning_content, content: t.m.content,
    results: t.results })), null, 1);
  assert.ok(answer !== null, `${label}: no final answer in 6 turns\n${trace}`);
  assert.equal(turns.length, 2, `${label}: both tools in one turn, then the answer\n${trace}`);
  const calls = turns[0].results;
  assert.equal(calls.length, 2, `${label}: two tool calls in turn 0\n${trace}`);
  const calc = calls.find((c) => c.name === 'calculate');
  const weather = calls.find((c) => c.name === 'get_weather');
  assert.ok(calc && weather, `${label}: one calculate and one get_weather\n${trace}`);
  assert.equal(calc.result.result, a * b, `${label}: the expression the model sent\n${trace}`);
  assert.equal(JSON.parse(weather.args).city, city, `${label}: the city the model sent\n${trace}`);
  assert.ok(turns[0].m.reasoning_content?.length > 0, `${label}: reasoning before the calls`);
  assert.ok(hasNumber(answer, a * b), `${label}: the answer holds ${a * b}: ${answer}`);
  assert.ok(answer.includes(weather.result.weather), `${label}: the answer holds the weather: ${answer}`);
}

test("the seed's tool loop: two calls in one turn, then one combined answer", async () => {
  const task = "What is 47 * 89? Also, what's the weather in Tokyo? Use your tools, then give me one combined answer.";
  checkLoop('seed task', await toolLoop(task, 7), 47, 89, 'Tokyo');
});

test('the tool loop on numbers and cities drawn now', async () => {
  const cities = ['London', 'Cairo', 'Paris', 'Oslo', 'Lima', 'Nairobi', 'Seoul', 'Denver'];
  // A fixed seed for the draw keeps CI repeatable; change it to try other cases.
  let s = 20261202;
  const rand = (n) => { s = (s * 1103515245 + 12345) % 2147483648; return s % n; };
  for (let i = 0; i < 3; i++) {
    const a = 10 + rand(990), b = 2 + rand(98), city = cities[rand(cities.length)];
    const task = `What is ${a} * ${b}? Also, what's the weather in ${city}? Use your tools, then give me one combined answer.`;
    checkLoop(task, await toolLoop(task, 100 + i), a, b, city);
  }
});

test("the seed's Python loop (urllib, its code shape) completes", async () => {
  const { stdout } = await promisify(execFile)('python3',
    [new URL('./seed_tool_loop.py', import.meta.url).pathname, srv.base,
     "What is 47 * 89? Also, what's the weather in Tokyo? Use your tools, then give me one combined answer.", '11'],
    { timeout: 600000 });
  const record = JSON.parse(stdout.trim().split('\n').pop());
  assert.match(stdout, /\[turn 0\] tool_calls=2 /, stdout);
  assert.match(stdout, /\[turn 1\] tool_calls=0 /, stdout);
  assert.ok(hasNumber(record.answer, 4183), stdout);
  assert.ok(record.answer.includes('22C, clear'), stdout);
});

test('effort low thinks less than effort high on the same prompt', async () => {
  const prompts = [
    'Three friends split a bill. Ana pays twice what Ben pays, and Ben pays 3 more than Cara. ' +
      'The total is 43. How much does each pay?',
    'Explain what a mixture-of-experts model is, simply, in 2 sentences.',
    'What is the capital of Japan?',
  ];
  for (const prompt of prompts) {
    const usage = {};
    for (const effort of ['low', 'high']) {
      const resp = await client.chat.completions.create({
        model: 'moonrun-demo', max_tokens: 1024, temperature: 0, reasoning_effort: effort,
        messages: [{ role: 'user', content: prompt }] });
      assert.equal(resp.choices[0].finish_reason, 'stop', `${effort}: ${JSON.stringify(resp.choices[0])}`);
      assert.ok(resp.choices[0].message.content.length > 0, `${effort}: an answer after the thinking`);
      usage[effort] = resp.usage.reasoning_tokens;
    }
    assert.ok(usage.low < usage.high, `${prompt}: low ${usage.low} vs high ${usage.high} reasoning tokens`);
  }
});

test('a plain chat answer lands in content, its thinking in reasoning_content', async () => {
  const resp = await client.chat.completions.create({
    model: 'moonrun-demo', max_tokens: 400, temperature: 0, reasoning_effort: 'high',
    messages: [{ role: 'system', content: 'You are a helpful assistant.' },
               { role: 'user', content: 'What is the capital of France?' }] });
  const m = resp.choices[0].message;
  assert.match(m.content, /Paris/, JSON.stringify(m));
  assert.ok(m.reasoning_content.length > 0);
  assert.ok(!m.content.includes('<|'), 'no markers in the answer');
});

const COLOURS = { red: [255, 0, 0], blue: [0, 0, 255], green: [0, 160, 0], yellow: [255, 230, 0] };
async function describe(png) {
  const resp = await client.chat.completions.create({
    model: 'moonrun-demo', max_tokens: 400, reasoning_effort: 'low', temperature: 0,
    messages: [{ role: 'user', content: [
      { type: 'text', text: 'What do you see in this image? Name the colours and how they are arranged.' },
      { type: 'image_url', image_url: { url: dataUri(png) } }] }] });
  return (resp.choices[0].message.content ?? '').toLowerCase();
}

test("the seed's red|blue image is described by its colours", async () => {
  const ans = await describe(makePng());
  assert.ok(ans.includes('red') && ans.includes('blue'), ans);
  assert.ok(ans.indexOf('left') < ans.indexOf('right') && ans.indexOf('red') < ans.indexOf('blue'),
    `red on the left, blue on the right: ${ans}`);
});

test('other colours and a stacked layout', async () => {
  const top = COLOURS.green, bottom = COLOURS.yellow;
  const ans = await describe(makeRegionsPng(128, 128, (x, y) => (y < 64 ? top : bottom)));
  assert.ok(ans.includes('green') && ans.includes('yellow'), ans);
  assert.ok(ans.includes('top') && ans.indexOf('green') < ans.indexOf('yellow'), ans);
});
