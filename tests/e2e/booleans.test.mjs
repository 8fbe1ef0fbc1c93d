// Every boolean field of every route: a value that is not true, false or null ("yes", 1,
// {}) is a 400 naming the field, on a live server, whatever the route does with the field.
// The lists are the request bodies as their owners publish them, written here apart from
// the server's own table (src/server/request_json_booleans.cpp) so that a field the table
// misses fails here:
//   chat        OpenAI chat.completions.create + vLLM's ChatCompletionRequest extras
//   completions OpenAI completions.create + vLLM's CompletionRequest extras
//   responses   OpenAI responses.create (function tools, text.format)
//   messages    Anthropic messages.create (tool_choice, tools)
//   tokenize    vLLM's TokenizeChatRequest / TokenizeCompletionRequest
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, post } from './harness.mjs';

let srv;
before(async () => { srv = await startServer(); });
after(async () => { await srv?.stop(); });

const M = 'moonrun-demo';
const user = [{ role: 'user', content: 'hi' }];
const vllmSampling = ['use_beam_search', 'watermarking', 'include_stop_str_in_output', 'ignore_eos', 'skip_special_tokens',
  'spaces_between_special_tokens', 'return_tokens_as_token_ids', 'return_token_ids', 'return_token_offsets',
  'return_mm_kwargs', 'stream_options.include_usage', 'stream_options.continuous_usage_stats',
  'stream_options.include_obfuscation'];
const templateKwargs = ['chat_template_kwargs.thinking', 'chat_template_kwargs.enable_thinking',
  'chat_template_kwargs.add_generation_prompt'];

// route -> [the smallest body that succeeds, its boolean fields; "tools[]" is each element
// of the body's tools array, which the base body then holds].
const routes = {
  '/v1/chat/completions': [
    { model: M, messages: user, max_tokens: 8,  // the JSON schema's shortest answer needs 3
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }],
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } } },
    ['stream', 'logprobs', 'parallel_tool_calls', 'store', 'include_reasoning', 'echo', 'add_generation_prompt',
      'continue_final_message', 'add_special_tokens', 'return_prompt_text', ...vllmSampling, ...templateKwargs,
      'tools[].function.strict', 'tools[].defer_loading', 'response_format.json_schema.strict']],
  '/v1/completions': [
    { model: M, prompt: 'hi', max_tokens: 1 },
    ['stream', 'echo', 'add_special_tokens', ...vllmSampling]],
  '/v1/responses': [
    { model: M, input: 'hi', max_output_tokens: 16,
      tools: [{ type: 'function', name: 'f', parameters: { type: 'object' } }],
      text: { format: { type: 'json_schema', name: 'x', schema: { type: 'object' } } } },
    ['stream', 'store', 'background', 'parallel_tool_calls', 'tools[].strict', 'text.format.strict']],
  '/v1/messages': [
    { model: M, max_tokens: 1, messages: user, tools: [{ name: 'f', input_schema: { type: 'object' } }],
      tool_choice: { type: 'auto' } },
    ['stream', 'tool_choice.disable_parallel_tool_use', 'tools[].strict']],
  '/tokenize': [
    { model: M, messages: user, tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }] },
    ['add_generation_prompt', 'continue_final_message', 'add_special_tokens', 'return_token_strs', ...templateKwargs,
      'tools[].function.strict']],
};

// The base body with `path` set to value (a copy); returns it and the path as the server
// names it (tools[0]...).
function withField(base, path, value) {
  const body = structuredClone(base);
  let at = body;
  const keys = path.split('.');
  let named = [];
  keys.forEach((k, i) => {
    const each = k.endsWith('[]');
    const key = each ? k.slice(0, -2) : k;
    named.push(each ? `${key}[0]` : key);
    if (i === keys.length - 1) { at[key] = value; return; }
    if (each) { at = at[key][0]; return; }
    if (typeof at[key] !== 'object' || at[key] === null) at[key] = {};
    at = at[key];
  });
  return [body, named.join('.')];
}

function errorMessage(r) {
  return r.json?.error?.message ?? '';
}

for (const [route, [base, fields]] of Object.entries(routes)) {
  test(`${route}: every boolean field refuses what is not a boolean, naming it`, async () => {
    const ok = await post(srv.base, route, base);
    assert.equal(ok.status, 200, `the base body succeeds: ${ok.text.slice(0, 300)}`);
    for (const field of fields) {
      for (const bad of ['yes', 1, {}]) {
        const [body, named] = withField(base, field, bad);
        const r = await post(srv.base, route, body);
        assert.equal(r.status, 400, `${route} ${field}=${JSON.stringify(bad)}: ${r.text.slice(0, 300)}`);
        assert.ok(errorMessage(r).includes(named), `${route} ${field}: the message names ${named}: ${r.text}`);
        if (route !== '/v1/messages') assert.equal(r.json.error.param, named, r.text);
        else assert.equal(r.json.type, 'error', `Anthropic's envelope on /v1/messages: ${r.text}`);
      }
    }
  });
}

test('a boolean field set to false is taken (the base bodies with each field false)', async () => {
  for (const [route, [base, fields]] of Object.entries(routes)) {
    for (const field of fields) {
      const [body, named] = withField(base, field, false);
      const r = await post(srv.base, route, body);
      assert.ok(!(r.status === 400 && errorMessage(r).includes(named)), `${route} ${field}=false: ${r.text.slice(0, 300)}`);
    }
  }
});
