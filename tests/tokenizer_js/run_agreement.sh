#!/usr/bin/env bash
# run_agreement.sh js|python ENCODING NODE CHECKER WORKDIR
#   js:     generate the corpus, encode it with js-tiktoken, compare our ids exactly.
#   python: generate the --python corpus (runs over 25,000 characters, characters where
#           JS and Rust regexes differ, ill-formed UTF-8) and compare with the digests in
#           python_fixtures/, recorded from Python tiktoken 0.14 and tokenization_kimi.py
#           (python_fixtures/README.md). ENCODING: kimi, cl100k_base or o200k_base.
set -euo pipefail
mode=$1 enc=$2 node=$3 checker=$4 work=$5
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
need_js() {
  if [[ ! -d $here/node_modules/js-tiktoken ]]; then
    echo "tests/tokenizer_js/node_modules is missing: run scripts/bootstrap (npm ci there)" >&2
    exit 1
  fi
}
if [[ $mode == js ]]; then
  need_js
  "$node" "$here/gen_corpus.mjs" "$work/corpus.bin"
  (cd "$here" && "$node" encode.mjs "$enc" "$work/corpus.bin" "$work/$enc.model" "$work/$enc.ids")
  exec "$checker" check --ranks "$work/$enc.model" --specials "$work/$enc.model.special.json" \
    --pattern "${enc%%_base}" --plain --corpus "$work/corpus.bin" --ids "$work/$enc.ids"
fi
fx=$here/python_fixtures
"$node" "$here/gen_corpus.mjs" "$work/corpus.bin" $(cat "$fx/gen_args.txt")
if [[ $enc == kimi ]]; then
  # tokenization_kimi.py's encode: K3 special names after the base ranks, 400k/25k splitting.
  exec "$checker" check --ranks "$fx/kimi_test.model" --specials k3-defaults --pattern kimi \
    --corpus "$work/corpus.bin" --ids "$fx/kimi_ids.txt"
fi
need_js
(cd "$here" && "$node" encode.mjs "$enc" --export-ranks "$work/$enc.model")
exec "$checker" check --ranks "$work/$enc.model" --specials "$work/$enc.model.special.json" \
  --pattern "${enc%%_base}" --plain --corpus "$work/corpus.bin" --ids "$fx/${enc}_ids.txt"
