// moonrun's chat page: plain modern JavaScript, no build step, no network beyond this
// server. It speaks only the public API (GET /v1/models, POST /v1/chat/completions with
// stream: true), so it doubles as a worked example of it (docs/chat-page.md).
import { renderMarkdown } from './markdown.js';
import { PRESET_TOOLS, PRESET_IMPL } from './tools.js';

const $ = (id) => document.getElementById(id);
const STORE_KEY = 'moonrun.chat.conversations.v1';
const SETTINGS_KEY = 'moonrun.chat.settings.v1';

// ---- state ------------------------------------------------------------------------------
// A conversation keeps the API's messages as sent (the whole assistant turn: content,
// reasoning_content, tool_calls), plus page-only fields whose names start with '_' (usage,
// timing), stripped before a request.
let store = loadJSON(STORE_KEY, { conversations: [], current: null });
let settings = loadJSON(SETTINGS_KEY, {});
let modelId = null;
let controller = null;  // the AbortController of the request in flight
let attachments = [];   // data: URIs waiting to go with the next user message

function loadJSON(key, fallback) {
  try { return JSON.parse(localStorage.getItem(key)) ?? fallback; } catch { return fallback; }
}
function save() {
  try { localStorage.setItem(STORE_KEY, JSON.stringify(store)); }
  catch (e) { showError('The browser refused to store the conversation (' + e.message + '); images take a lot of room.'); }
}
// crypto.randomUUID exists only in secure contexts: http://127.0.0.1 is one, http://node7:8000 not.
function newId() {
  return Date.now().toString(36) + '-' + Math.random().toString(36).slice(2, 10);
}
function current() {
  let c = store.conversations.find((x) => x.id === store.current);
  if (!c) {
    c = { id: newId(), title: 'New chat', created: Date.now(), messages: [] };
    store.conversations.unshift(c);
    store.current = c.id;
  }
  return c;
}

// ---- settings ---------------------------------------------------------------------------
const SETTING_FIELDS = ['api-key', 'reasoning-effort', 'temperature', 'max-tokens', 'system-prompt', 'tools'];
function loadSettings() {
  for (const id of SETTING_FIELDS) if (settings[id] !== undefined) $(id).value = settings[id];
  if (settings['auto-run'] !== undefined) $('auto-run').checked = settings['auto-run'];
  checkTools();
}
function saveSettings() {
  for (const id of SETTING_FIELDS) settings[id] = $(id).value;
  settings['auto-run'] = $('auto-run').checked;
  localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings));
}
function parsedTools() {
  const text = $('tools').value.trim();
  if (!text) return null;
  const tools = JSON.parse(text);
  if (!Array.isArray(tools)) throw new Error('tools: expected a JSON array');
  return tools;
}
function checkTools() {
  try {
    const t = parsedTools();
    $('tools-status').textContent = t ? `${t.length} tool(s)` : '';
  } catch (e) {
    $('tools-status').textContent = 'not valid JSON: ' + e.message;
  }
}
function headers() {
  const h = { 'Content-Type': 'application/json' };
  const key = $('api-key').value.trim();
  if (key) h.Authorization = 'Bearer ' + key;
  return h;
}

async function loadModel() {
  try {
    const res = await fetch('/v1/models', { headers: headers() });
    if (res.status === 401) { $('model-name').textContent = '(API key needed: Settings)'; return; }
    const body = await res.json();
    modelId = body.data?.[0]?.id ?? null;
    $('model-name').textContent = modelId ?? '';
  } catch { /* the server is away; the send will say so */ }
}

// ---- rendering --------------------------------------------------------------------------
function node(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function renderSidebar() {
  const ul = $('conversations');
  ul.replaceChildren();
  for (const c of store.conversations) {
    const li = node('li', c.id === store.current ? 'current' : '', c.title);
    li.title = new Date(c.created).toLocaleString();
    li.addEventListener('click', () => { if (!controller) { store.current = c.id; save(); renderAll(); } });
    ul.appendChild(li);
  }
}

function renderAll() {
  renderSidebar();
  const box = $('messages');
  box.replaceChildren();
  const conv = current();
  conv.messages.forEach((m, i) => box.appendChild(renderMessage(m, i, conv)));
  box.scrollTop = box.scrollHeight;
}

function userParts(m) {
  if (typeof m.content === 'string') return { text: m.content, images: [] };
  const parts = m.content ?? [];
  return {
    text: parts.filter((p) => p.type === 'text').map((p) => p.text).join('\n'),
    images: parts.filter((p) => p.type === 'image_url').map((p) => p.image_url.url),
  };
}

function renderMessage(m, index, conv) {
  const div = node('div', 'msg ' + m.role);
  div.dataset.role = m.role;
  div.dataset.index = index;
  div.appendChild(node('div', 'who', m.role === 'tool' ? `tool result (${m.name ?? m.tool_call_id})` : m.role));
  if (m.role === 'user') {
    const { text, images } = userParts(m);
    const body = node('div', 'body', text);
    for (const url of images) {
      const img = node('img');
      img.src = url;  // a data: URI the user chose; CSP allows data: images only
      img.alt = 'attached image';
      body.appendChild(img);
    }
    div.appendChild(body);
  } else if (m.role === 'tool') {
    div.appendChild(node('div', 'body', m.content));
  } else if (m.role === 'assistant') {
    fillAssistant(div, m, conv);
  }
  return div;
}

// The assistant turn: thinking (collapsible, with its token count), the answer (markdown),
// the tool calls (each with its arguments, and a box for its result until it has one), usage.
function fillAssistant(div, m, conv) {
  div.querySelectorAll(':scope > :not(.who)').forEach((e) => e.remove());
  if (m.reasoning_content) {
    const details = node('details', 'thinking');
    details.open = !!m._streaming && !m.content;
    const tokens = m._usage?.completion_tokens_details?.reasoning_tokens;
    const label = m._streaming && !m.content ? 'Thinking…' : 'Thought';
    details.appendChild(node('summary', '', tokens !== undefined ? `${label} · ${tokens} reasoning tokens` : label));
    details.appendChild(node('div', 'reasoning', m.reasoning_content));
    div.appendChild(details);
  }
  const answer = node('div', 'answer');
  answer.appendChild(renderMarkdown(m.content ?? ''));
  div.appendChild(answer);
  for (const tc of m.tool_calls ?? []) div.appendChild(renderToolCall(tc, conv));
  if (m._stopped) div.appendChild(node('div', 'usage', 'stopped'));
  if (m._usage) div.appendChild(node('div', 'usage', usageLine(m._usage, m._seconds)));
}

function usageLine(u, seconds) {
  const parts = [`prompt ${u.prompt_tokens}`];
  const cached = u.prompt_tokens_details?.cached_tokens;
  if (cached) parts.push(`cached ${cached}`);
  const images = u.prompt_tokens_details?.image_tokens;
  if (images) parts.push(`image ${images}`);
  parts.push(`completion ${u.completion_tokens}`);
  parts.push(`reasoning ${u.completion_tokens_details?.reasoning_tokens ?? 0}`);
  // Under 50 ms from the first token to the last, the chunks came in one burst (a buffering
  // proxy, a one-token answer): that is no decode speed, so none is shown.
  if (seconds >= 0.05) parts.push(`${(u.completion_tokens / seconds).toFixed(1)} tok/s`);
  return parts.join(' · ');
}

function renderToolCall(tc, conv) {
  const box = node('div', 'tool-call');
  box.dataset.toolCallId = tc.id;
  box.appendChild(node('span', 'name', tc.function?.name ?? '?'));
  let args = tc.function?.arguments ?? '';
  try { args = JSON.stringify(JSON.parse(args), null, 2); } catch { /* shown as sent */ }
  box.appendChild(node('pre', 'arguments', args));
  const answered = conv.messages.some((x) => x.role === 'tool' && x.tool_call_id === tc.id);
  if (!answered && !controller) {
    const input = node('textarea', 'tool-result');
    input.rows = 2;
    input.placeholder = 'The result (JSON or text) to send back';
    const send = node('button', 'tool-send', 'Send result');
    send.type = 'button';
    send.addEventListener('click', () => submitToolResult(tc, input.value));
    box.append(input, send);
  }
  return box;
}

function showError(text) {
  $('error').textContent = text;
  $('error').hidden = !text;
}

function setBusy(busy) {
  $('send').disabled = busy;
  $('regenerate').disabled = busy;
  $('stop').disabled = !busy;
}

// ---- the request --------------------------------------------------------------------------
function apiMessages(conv) {
  const out = [];
  const system = $('system-prompt').value.trim();
  if (system) out.push({ role: 'system', content: system });
  for (const m of conv.messages) {
    const clean = {};
    for (const [k, v] of Object.entries(m)) if (!k.startsWith('_')) clean[k] = v;
    out.push(clean);
  }
  return out;
}

// One streamed completion into a new assistant message; then the tool loop, if any.
async function complete() {
  const conv = current();
  let tools;
  try { tools = parsedTools(); } catch (e) { return showError('Tools: ' + e.message); }
  const body = {
    messages: apiMessages(conv),
    stream: true,
    stream_options: { include_usage: true },
    reasoning_effort: $('reasoning-effort').value,
  };
  if (modelId) body.model = modelId;
  const temperature = parseFloat($('temperature').value);
  if (!Number.isNaN(temperature)) body.temperature = temperature;
  const maxTokens = parseInt($('max-tokens').value, 10);
  if (maxTokens > 0) body.max_tokens = maxTokens;
  if (tools) body.tools = tools;

  showError('');
  const msg = { role: 'assistant', content: '', _streaming: true };
  conv.messages.push(msg);
  const div = renderMessage(msg, conv.messages.length - 1, conv);
  $('messages').appendChild(div);
  controller = new AbortController();
  setBusy(true);
  const started = performance.now();
  let firstToken = null;
  let pending = false;
  const redraw = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      fillAssistant(div, msg, conv);
      $('messages').scrollTop = $('messages').scrollHeight;
    });
  };
  try {
    const res = await fetch('/v1/chat/completions', {
      method: 'POST', headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!res.ok) throw new Error(await errorText(res));
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf('\n\n')) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split('\n')) {
          if (!line.startsWith('data:')) continue;
          const data = line.slice(5).trim();
          if (data === '[DONE]') continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message ?? JSON.stringify(chunk.error));
          if (chunk.usage) msg._usage = chunk.usage;
          const delta = chunk.choices?.[0]?.delta;
          if (!delta) continue;
          if (firstToken === null && (delta.content || delta.reasoning_content || delta.tool_calls)) firstToken = performance.now();
          if (delta.reasoning_content) msg.reasoning_content = (msg.reasoning_content ?? '') + delta.reasoning_content;
          if (delta.content) msg.content += delta.content;
          for (const d of delta.tool_calls ?? []) mergeToolCall(msg, d);
          redraw();
        }
      }
    }
  } catch (e) {
    if (e.name === 'AbortError') msg._stopped = true;
    else showError(e.message);
  }
  // Decode speed: completion tokens over the time from the first token to the last.
  msg._seconds = firstToken === null ? 0 : (performance.now() - firstToken) / 1000;
  msg._total_seconds = (performance.now() - started) / 1000;
  delete msg._streaming;
  controller = null;
  setBusy(false);
  const failed = !msg.content && !msg.reasoning_content && !msg.tool_calls && !msg._stopped;
  if (failed) conv.messages.pop();  // nothing came: the error box says why
  if (conv.title === 'New chat') conv.title = titleOf(conv);
  save();
  renderAll();
  if (!failed && !msg._stopped && msg.tool_calls?.length) runPresetTools(msg, conv);
}

function mergeToolCall(msg, d) {
  msg.tool_calls ??= [];
  const i = d.index ?? msg.tool_calls.length;
  const tc = (msg.tool_calls[i] ??= { id: '', type: 'function', function: { name: '', arguments: '' } });
  if (d.id) tc.id = d.id;
  if (d.type) tc.type = d.type;
  if (d.function?.name) tc.function.name += d.function.name;
  if (d.function?.arguments) tc.function.arguments += d.function.arguments;
}

// The server's error envelope as a sentence: "400 Bad Request: messages[0]...: image too large".
async function errorText(res) {
  const text = await res.text();
  let message = text;
  try {
    const body = JSON.parse(text);
    const e = body.error ?? body;
    message = e.message ?? text;
    if (e.param) message += ` (${e.param})`;
  } catch { /* not JSON */ }
  return `The server answered ${res.status} ${res.statusText}: ${message}`;
}

function titleOf(conv) {
  const first = conv.messages.find((m) => m.role === 'user');
  const text = first ? userParts(first).text.trim() : '';
  return text ? text.slice(0, 48) : 'New chat';
}

// ---- tools --------------------------------------------------------------------------------
// With "run the preset's tools" on, calls to calculate and get_weather are answered here;
// any other call waits for the user's result in its box.
function runPresetTools(msg, conv) {
  if (!$('auto-run').checked) return;
  for (const tc of msg.tool_calls) {
    const impl = PRESET_IMPL[tc.function.name];
    if (!impl) continue;
    let result;
    try { result = impl(JSON.parse(tc.function.arguments || '{}')); } catch (e) { result = { error: e.message }; }
    addToolResult(tc, JSON.stringify(result), conv);
  }
  continueIfAnswered(msg, conv);
}

function addToolResult(tc, content, conv) {
  conv.messages.push({ role: 'tool', tool_call_id: tc.id, name: tc.function.name, content });
}

function submitToolResult(tc, content) {
  const conv = current();
  addToolResult(tc, content, conv);
  const owner = [...conv.messages].reverse().find((m) => m.role === 'assistant');
  save();
  renderAll();
  continueIfAnswered(owner, conv);
}

// The loop goes on once every call of the turn has its result.
function continueIfAnswered(msg, conv) {
  const answered = (id) => conv.messages.some((m) => m.role === 'tool' && m.tool_call_id === id);
  save();
  renderAll();
  if (msg?.tool_calls?.every((tc) => answered(tc.id))) complete();
}

// ---- composer ------------------------------------------------------------------------------
function send() {
  if (controller) return;
  const text = $('input').value;
  if (!text.trim() && !attachments.length) return;
  const conv = current();
  const content = attachments.length
    ? [{ type: 'text', text }, ...attachments.map((url) => ({ type: 'image_url', image_url: { url } }))]
    : text;
  conv.messages.push({ role: 'user', content });
  $('input').value = '';
  attachments = [];
  renderAttachments();
  save();
  renderAll();
  complete();
}

function regenerate() {
  if (controller) return;
  const conv = current();
  const lastUser = conv.messages.map((m) => m.role).lastIndexOf('user');
  if (lastUser < 0) return;
  conv.messages.length = lastUser + 1;  // drops the answer and its tool round trips
  save();
  renderAll();
  complete();
}

function addFiles(files) {
  for (const f of files) {
    if (!f.type.startsWith('image/')) continue;
    const reader = new FileReader();
    reader.onload = () => { attachments.push(reader.result); renderAttachments(); };
    reader.readAsDataURL(f);
  }
}

function renderAttachments() {
  const box = $('attachments');
  box.replaceChildren();
  attachments.forEach((url, i) => {
    const fig = node('figure');
    const img = node('img');
    img.src = url;
    img.alt = 'attachment';
    const drop = node('button', '', '×');
    drop.type = 'button';
    drop.title = 'Remove';
    drop.addEventListener('click', () => { attachments.splice(i, 1); renderAttachments(); });
    fig.append(img, drop);
    box.appendChild(fig);
  });
}

function exportJSON() {
  const conv = current();
  const data = { title: conv.title, created: new Date(conv.created).toISOString(), model: modelId, messages: apiMessages(conv),
                 usage: conv.messages.map((m) => m._usage).filter(Boolean) };
  const a = node('a');
  a.href = URL.createObjectURL(new Blob([JSON.stringify(data, null, 2)], { type: 'application/json' }));
  a.download = (conv.title.replace(/[^\w-]+/g, '_') || 'chat') + '.json';
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

// ---- wiring --------------------------------------------------------------------------------
function wire() {
  $('composer').addEventListener('submit', (e) => { e.preventDefault(); send(); });
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  $('input').addEventListener('paste', (e) => {
    const files = [...(e.clipboardData?.files ?? [])];
    if (files.length) { e.preventDefault(); addFiles(files); }
  });
  const composer = $('composer');
  composer.addEventListener('dragover', (e) => { e.preventDefault(); composer.classList.add('drag'); });
  composer.addEventListener('dragleave', () => composer.classList.remove('drag'));
  composer.addEventListener('drop', (e) => { e.preventDefault(); composer.classList.remove('drag'); addFiles(e.dataTransfer.files); });
  $('file').addEventListener('change', (e) => { addFiles(e.target.files); e.target.value = ''; });
  $('stop').addEventListener('click', () => controller?.abort());
  $('regenerate').addEventListener('click', regenerate);
  $('new-chat').addEventListener('click', () => {
    if (controller) return;
    store.current = null;
    current();
    save();
    renderAll();
  });
  $('delete-chat').addEventListener('click', () => {
    if (controller) return;
    store.conversations = store.conversations.filter((c) => c.id !== store.current);
    store.current = store.conversations[0]?.id ?? null;
    save();
    renderAll();
  });
  $('export').addEventListener('click', exportJSON);
  $('tools-preset').addEventListener('click', () => {
    $('tools').value = JSON.stringify(PRESET_TOOLS, null, 2);
    checkTools();
    saveSettings();
  });
  for (const id of [...SETTING_FIELDS, 'auto-run']) $(id).addEventListener('change', () => { checkTools(); saveSettings(); });
  $('api-key').addEventListener('change', loadModel);
}

loadSettings();
wire();
renderAll();
setBusy(false);
loadModel();
