// Encodes the corpus with js-tiktoken and exports the encoding's ranks in tiktoken.model
// form, for tokenizer_js_check to compare against.
// usage: node encode.mjs cl100k_base|o200k_base CORPUS RANKS_OUT IDS_OUT
//        node encode.mjs cl100k_base|o200k_base --export-ranks RANKS_OUT
//   IDS_OUT: one line per document, "<index> <id> <id> ..." or "<index> skip" for the
//   ill-formed UTF-8 documents (a JS string cannot hold them).
import { readFileSync, writeFileSync } from "node:fs";
import { Tiktoken } from "js-tiktoken/lite";

const argv = process.argv.slice(2);
const exportOnly = argv[1] === "--export-ranks";
const [name, corpusPath, ranksOut, idsOut] = exportOnly ? [argv[0], null, argv[2], null] : argv;
if (!ranksOut || (!exportOnly && !idsOut)) {
  console.error("usage: node encode.mjs cl100k_base|o200k_base CORPUS RANKS_OUT IDS_OUT");
  process.exit(2);
}
const ranks = (await import(`js-tiktoken/ranks/${name}`)).default;
const enc = new Tiktoken(ranks);

// Ranks: js-tiktoken's own decoded table (rank -> bytes), written as `base64 rank`.
const lines = [];
for (const [rank, bytes] of [...enc.textMap.entries()].sort((a, b) => a[0] - b[0])) {
  lines.push(`${Buffer.from(bytes).toString("base64")} ${rank}`);
}
writeFileSync(ranksOut, lines.join("\n") + "\n");
writeFileSync(ranksOut + ".special.json", JSON.stringify(ranks.special_tokens));
if (exportOnly) process.exit(0);

const corpus = readFileSync(corpusPath);
const fatal = new TextDecoder("utf-8", { fatal: true });
const out = [];
let pos = 0, docs = 0, bytes = 0;
while (pos < corpus.length) {
  const eol = corpus.indexOf(10, pos);
  const [tag, index, kind, allow, length] = corpus.toString("latin1", pos, eol).split(" ");
  if (tag !== "#doc") throw new Error(`corpus: bad header at byte ${pos}`);
  const start = eol + 1, end = start + Number(length);
  pos = end + 1;
  let text;
  try {
    text = fatal.decode(corpus.subarray(start, end));
  } catch {
    out.push(`${index} skip`);
    continue;
  }
  const ids = allow === "1" ? enc.encode(text, "all") : enc.encode(text, [], []);
  out.push(`${index} ${ids.join(" ")}`);
  docs++;
  bytes += end - start;
}
writeFileSync(idsOut, out.join("\n") + "\n");
console.error(`encode.mjs ${name}: ${docs} documents, ${bytes} bytes encoded`);
