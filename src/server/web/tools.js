// The seed's tools (../shared/seeds, "Agentic tool calling with the kimi_k3 parser"), run
// in the page: its calculate (basic arithmetic, parsed here: no eval) and its weather stub.

export const PRESET_TOOLS = [
  {
    type: 'function',
    function: {
      name: 'calculate',
      description: 'Evaluate a basic arithmetic expression.',
      parameters: {
        type: 'object',
        properties: { expression: { type: 'string', description: "e.g. '47*89'" } },
        required: ['expression'],
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Get current weather for a city.',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  },
];

// + - * / ** (and Python's ^-free grammar), unary minus, parentheses, numbers.
export function calculate({ expression }) {
  const src = String(expression);
  let pos = 0;
  const peek = () => { while (src[pos] === ' ') pos++; return src[pos]; };
  const fail = () => { throw new Error('bad expr'); };
  function primary() {
    const c = peek();
    if (c === '(') { pos++; const v = sum(); if (peek() !== ')') fail(); pos++; return v; }
    if (c === '-') { pos++; return -power(); }
    if (c === '+') { pos++; return power(); }
    const m = src.slice(pos).match(/^\d+(\.\d*)?([eE][-+]?\d+)?|^\.\d+/);
    if (!m) fail();
    pos += m[0].length;
    return Number(m[0]);
  }
  function power() {
    const base = primary();
    if (peek() === '*' && src[pos + 1] === '*') { pos += 2; return base ** unary(); }
    return base;
  }
  function unary() { return power(); }
  function product() {
    let v = power();
    for (;;) {
      const c = peek();
      if (c === '*' && src[pos + 1] !== '*') { pos++; v *= power(); }
      else if (c === '/') { pos++; v /= power(); }
      else return v;
    }
  }
  function sum() {
    let v = product();
    for (;;) {
      const c = peek();
      if (c === '+') { pos++; v += product(); }
      else if (c === '-') { pos++; v -= product(); }
      else return v;
    }
  }
  const result = sum();
  if (peek() !== undefined) fail();
  return { result };
}

export function get_weather({ city }) {
  const fake = { Tokyo: '22C, clear', London: '14C, rain', Cairo: '35C, sunny' };
  return { city, weather: fake[city] ?? '18C, partly cloudy' };
}

export const PRESET_IMPL = { calculate, get_weather };
