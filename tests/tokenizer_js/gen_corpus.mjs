// Deterministic test corpus for tokenizer agreement tests (tiktoken, js-tiktoken, the
// Kimi reference). Writes framed documents:
//   #doc <index> <kind> <allow_special 0|1> <byte length>\n<bytes>\n
// Kinds: prose code cjk emoji space numbers scripts mixed long special invalid.
// `invalid` documents hold ill-formed UTF-8 (no JS string can), the others are valid UTF-8.
//
// usage: node gen_corpus.mjs OUT_FILE [--target-bytes N] [--python] [--seed N]
//   --python adds what only Python tiktoken can check: runs over 25,000 characters of
//   letters, whitespace and punctuation (the Kimi splitting cases; js-tiktoken's cubic
//   merge cannot encode them in time), and characters where JavaScript's regex differs
//   from Rust's (\s: NEL U+0085 is White_Space, BOM U+FEFF is not; case-insensitive
//   contractions also match "'ſ" (U+017F); Script=Han vs Script_Extensions (U+3001)).
import { writeFileSync } from "node:fs";

const args = process.argv.slice(2);
const out = args[0];
let targetBytes = 1_100_000;
let longRuns = false;
let seedArg = 0;
for (let i = 1; i < args.length; ++i) {
  if (args[i] === "--target-bytes") targetBytes = Number(args[++i]);
  else if (args[i] === "--python") longRuns = true;
  else if (args[i] === "--seed") seedArg = Number(args[++i]);
}
if (!out) {
  console.error("usage: node gen_corpus.mjs OUT_FILE [--target-bytes N] [--long-runs]");
  process.exit(2);
}

// mulberry32: small, fast, and the same sequence everywhere.
let seed = (0x6b696d69 + seedArg * 0x9e3779b9) | 0;
function rand() {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const int = (n) => Math.floor(rand() * n);
const pick = (a) => a[int(a.length)];
const range = (lo, hi) => String.fromCodePoint(lo + int(hi - lo + 1));

const words = ("the of and to in is you that it he was for on are as with his they at be this have from or one " +
  "had by word but not what all were we when your can said there use an each which she do how their if will up " +
  "other about out many then them these so some her would make like him into time has look two more write go see " +
  "number no way could people my than first water been call who oil its now find long down day did get come made " +
  "may part tokenizer server request stream model cache kernel attention gradient latency throughput").split(" ");
const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL", "'D", "'M", "'x", "’s"];
const punct = [".", ",", ";", ":", "!", "?", "...", "—", "–", "-", "(", ")", "\"", "'", "«", "»", "“", "”", "…", "/", "&", "%", "#", "@"];

function prose() {
  let s = "";
  const n = 40 + int(300);
  for (let i = 0; i < n; ++i) {
    let w = pick(words);
    const r = rand();
    if (r < 0.08) w = w[0].toUpperCase() + w.slice(1);
    else if (r < 0.11) w = w.toUpperCase();
    else if (r < 0.13) w = w.replace(/./g, (c) => (rand() < 0.5 ? c.toUpperCase() : c));
    if (rand() < 0.07) w += pick(contractions);
    s += w;
    const p = rand();
    if (p < 0.08) s += pick(punct);
    if (p < 0.02) s += "\n";
    else if (p < 0.025) s += "\n\n";
    s += rand() < 0.97 ? " " : "  ";
  }
  return s;
}

const codeLines = [
  "int main(int argc, char** argv) {", "  return 0;", "}", "for (size_t i = 0; i < n; ++i) {",
  "    total += values[i] * weights[i];", "def encode(self, text: str) -> list[int]:", "    return self._core.encode(text)",
  "if __name__ == \"__main__\":", "const x = await fetch(`${base}/v1/chat/completions`);", "SELECT id, name FROM users WHERE id = 42;",
  "\t\tpos = end > begin ? end : begin + 1;", "#include <vector>", "// TODO(moonrun): handle the empty case", "x = {'a': 1, \"b\": [2, 3.5e-7]}",
  "  - name: build", "    run: cmake -S . -B build && ninja -C build", "<div class=\"row\"><span>&nbsp;</span></div>", "fn main() { println!(\"{}\", 1 << 20); }",
  "$ echo $HOME | tr a-z A-Z", "    }\r", "a+=b;c-=d;e*=f;g/=h;i%=j;k<<=1;l>>=2;m&=n;o|=p;q^=r;", "}}}]]]))));;",
];
function code() {
  let s = "";
  const n = 10 + int(60);
  for (let i = 0; i < n; ++i) {
    const indent = pick(["", "  ", "    ", "        ", "\t", "\t\t", "   "]);
    s += indent + pick(codeLines) + pick(["\n", "\n", "\n", "\r\n", "\n\n", "  \n", "\n    \n"]);
  }
  return s;
}

function cjk() {
  let s = "";
  const n = 50 + int(400);
  for (let i = 0; i < n; ++i) {
    const r = rand();
    if (r < 0.5) s += range(0x4e00, 0x9fa5);                 // CJK unified ideographs
    else if (r < 0.58) s += pick(["、", "。", "，", "！", "？", "「", "」", "（", "）", "：", "；", "·"]);
    else if (r < 0.68) s += range(0x3041, 0x3096);          // hiragana
    else if (r < 0.74) s += range(0x30a1, 0x30fa);          // katakana
    else if (r < 0.82) s += range(0xac00, 0xd7a3);          // hangul syllables
    else if (r < 0.85) s += pick(["々", "〇", "〻", "ー", "㐀", "豈", "⺀", "⼀", "〡"]);  // Han-script non-Lo and compatibility forms
    else if (r < 0.9) s += " ";
    else if (r < 0.93) s += "\n";
    else if (r < 0.97) s += pick(words);
    else s += String(int(100000));
  }
  return s;
}

const emoji = ["🙂", "😀", "😂", "👍", "👍🏽", "🚀", "❤️", "🎉", "✅", "🇯🇵", "🇫🇷", "👨‍👩‍👧‍👦", "🧑🏿‍💻", "🏳️‍🌈", "☕", "⭐", "🤖",
  "©", "™", "🔥", "💯", "🥲", "🫶", "\u{1f9d1}\u200d\u{1f373}", "1️⃣", "#️⃣"];
function emojis() {
  let s = "";
  const n = 30 + int(200);
  for (let i = 0; i < n; ++i) {
    const r = rand();
    if (r < 0.45) s += pick(emoji);
    else if (r < 0.7) s += pick(words);
    else if (r < 0.9) s += " ";
    else s += pick(punct);
  }
  return s;
}

// Whitespace the Rust and JS regex engines agree on (both: \s minus NEL and BOM).
const spaces = [" ", "  ", "\t", "\n", "\r\n", "\r", "\v", "\f", "\u00a0", "\u1680", "\u2000", "\u2003", "\u2009", "\u200a",
  "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\u001c", "\u001f", "\u200b", "   \n", "\n\n\n", " \t \n"];
function space() {
  let s = "";
  const n = 40 + int(300);
  for (let i = 0; i < n; ++i) {
    const r = rand();
    if (r < 0.5) s += pick(spaces);
    else if (r < 0.55) s += pick(spaces).repeat(1 + int(40));
    else if (r < 0.85) s += pick(words);
    else s += pick(punct);
  }
  return s;
}

function numbers() {
  let s = "";
  const n = 40 + int(200);
  for (let i = 0; i < n; ++i) {
    const r = rand();
    if (r < 0.3) s += String(int(10 ** (1 + int(9))));
    else if (r < 0.4) s += (rand() * 1000).toFixed(int(6));
    else if (r < 0.45) s += "٠١٢٣٤٥٦٧٨٩".slice(int(5), 5 + int(5));     // Arabic-Indic digits
    else if (r < 0.5) s += "０１２３４５６７８９".slice(int(5), 5 + int(5)); // fullwidth
    else if (r < 0.53) s += pick(["²", "³", "½", "Ⅻ", "ⅷ", "①", "⑩", "𝟘𝟙", "१२३"]);
    else if (r < 0.6) s += "0x" + int(0xffffff).toString(16);
    else if (r < 0.7) s += "2024-" + String(1 + int(12)).padStart(2, "0") + "-" + String(1 + int(28)).padStart(2, "0");
    else if (r < 0.75) s += String(int(10)).repeat(1 + int(30));
    else s += pick(words);
    s += pick([" ", " ", ", ", "\n", "", "+", "-", "*", "/", "=", "%"]);
  }
  return s;
}

const scriptRanges = [[0x0391, 0x03c9], [0x0410, 0x044f], [0x05d0, 0x05ea], [0x0627, 0x064a], [0x0905, 0x0939], [0x0e01, 0x0e2e],
  [0x10d0, 0x10fa], [0x0531, 0x0556], [0x00c0, 0x00ff], [0x0100, 0x017e], [0x1e00, 0x1eff]];
const marks = ["\u0301", "\u0308", "\u0327", "\u093e", "\u093f", "\u094d", "\u0e31", "\u0e48", "\u064e", "\u05b8", "\u20dd"];
function scripts() {
  let s = "";
  const n = 30 + int(200);
  for (let i = 0; i < n; ++i) {
    const [lo, hi] = pick(scriptRanges);
    const len = 1 + int(10);
    for (let j = 0; j < len; ++j) {
      s += range(lo, hi);
      if (rand() < 0.15) s += pick(marks);
    }
    if (rand() < 0.1) s += pick(contractions);
    s += pick([" ", " ", " ", ", ", ". ", "\n", "-", ""]);
  }
  return s;
}

function mixed() {
  const parts = [prose, code, cjk, emojis, space, numbers, scripts];
  let s = "";
  const n = 2 + int(5);
  for (let i = 0; i < n; ++i) s += pick(parts)().slice(0, 50 + int(400));
  return s;
}

// Long single runs (one regex piece each) short enough for js-tiktoken's merge.
function longRun() {
  const r = rand();
  const len = 1000 + int(2500);
  if (r < 0.2) return "x" + "a".repeat(len) + " end";
  if (r < 0.35) return "start" + " ".repeat(len) + "end";
  if (r < 0.5) return "=".repeat(len) + "\n";
  if (r < 0.65) return String(int(10)).repeat(30000) + " digits";  // > 25,000 chars, cut into 3-digit pieces
  if (r < 0.8) return Array.from({ length: len }, () => range(0x61, 0x7a)).join("");
  return Array.from({ length: len / 4 }, () => range(0x4e00, 0x9fa5)).join("");
}

// Kimi's >25,000-character runs: letters, spaces, punctuation, Han, and mixtures that
// cross the limit in the middle of a word.
function kimiLongRuns() {
  const runs = [];
  runs.push("lead " + "a".repeat(25_000) + " tail");
  runs.push("lead " + "b".repeat(25_001) + " tail");
  runs.push("Word".repeat(7000) + "\n");
  runs.push("start" + " ".repeat(30_000) + "end");
  runs.push("\n".repeat(26_000) + "x");
  runs.push("-".repeat(40_000));
  runs.push(Array.from({ length: 26_000 }, () => range(0x4e00, 0x9fa5)).join(""));
  runs.push(Array.from({ length: 30_000 }, () => range(0x61, 0x7a)).join("") + " " + "z".repeat(100));
  runs.push(" \t".repeat(14_000) + "done");
  const odd = ["\u0085", "\ufeff", "\u180e", "'ſ", "'ſt", "'K", "'\u212a", "、", "。", "々", "〇", "\u3001中文", "中\u3001文", "\u001c",
    "\u2028", "İ", "ǅ", "ǈ", "ᾈ", "Σ'S", "ﬀ", "ẞ'LL", " \u0085\n", "x\ufeffy", "\u0300\u0301", "a\u0300'S"];
  for (let d = 0; d < 40; ++d) {
    let s = "";
    for (let i = 0; i < 200; ++i) s += pick(odd) + pick(["", " ", "\n", pick(words), "中", "Ab"]);
    runs.push(s);
  }
  return runs;
}

// Ill-formed UTF-8: stray continuation bytes, truncated sequences, overlongs, surrogates,
// bytes over F4, between and inside words.
const badBytes = [[0x80], [0xbf], [0xff], [0xfe], [0xc0, 0xaf], [0xe0, 0x80, 0xaf], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80],
  [0xe4, 0xbd], [0xf0, 0x9f, 0x98], [0xc3], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xe2, 0x82], [0x80, 0x80, 0x80]];
function invalid() {
  const chunks = [];
  const n = 20 + int(100);
  for (let i = 0; i < n; ++i) {
    const r = rand();
    if (r < 0.3) chunks.push(Buffer.from(pick(badBytes)));
    else if (r < 0.6) chunks.push(Buffer.from(pick(words) + pick([" ", "", "\n"]), "utf8"));
    else if (r < 0.7) chunks.push(Buffer.from(range(0x4e00, 0x9fa5), "utf8"));
    else if (r < 0.8) chunks.push(Buffer.from(pick(emoji), "utf8"));
    else chunks.push(Buffer.from(pick(punct) + " ", "utf8"));
  }
  return Buffer.concat(chunks);
}

// Text that spells special tokens; encoded with them allowed (and the others without).
const specialNames = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|endofprompt|>", "<|endoftext", "<|", "|>"];
function special() {
  let s = "";
  const n = 10 + int(60);
  for (let i = 0; i < n; ++i) {
    const r = rand();
    if (r < 0.3) s += pick(specialNames);
    else s += pick(words) + pick([" ", "", "\n"]);
  }
  return s;
}

const generators = { prose, code, cjk, emoji: emojis, space, numbers, scripts, mixed, special, invalid };
const kinds = Object.keys(generators);
const buffers = [];
let total = 0;
let index = 0;
function add(kind, body, allowSpecial) {
  const bytes = Buffer.isBuffer(body) ? body : Buffer.from(body, "utf8");
  buffers.push(Buffer.from(`#doc ${index++} ${kind} ${allowSpecial ? 1 : 0} ${bytes.length}\n`), bytes, Buffer.from("\n"));
  total += bytes.length;
}
for (let i = 0; i < 12; ++i) add("long", longRun(), false);
if (longRuns) for (const run of kimiLongRuns()) add("long", run, false);
while (total < targetBytes) {
  const kind = kinds[index % kinds.length];
  add(kind, generators[kind](), kind === "special" && rand() < 0.5);
}
writeFileSync(out, Buffer.concat(buffers));
console.error(`gen_corpus: ${index} documents, ${total} bytes -> ${out}`);
