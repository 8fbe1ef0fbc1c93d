#!/usr/bin/env bash
# run_agreement.sh js|kimi ENCODING NODE CHECKER WORKDIR
#   js:   generate the corpus, encode it with js-tiktoken, compare our ids exactly.
#   kimi: generate the corpus with the >25k runs, compare with kimi_fixtures/ digests
#         recorded from Python tiktoken + tokenization_kimi.py (see kimi_fixtures/README.md).
set -euo pipefail
mode=$1 enc=$2 node=$3 checker=$4 work=$5
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
if [[ $mode == js ]]; then
  if [[ ! -d $here/node_modules/js-tiktoken ]]; then
    echo "tests/tokenizer_js/node_modules is missing: run scripts/bootstrap (npm ci there)" >&2
    exit 1
  fi
  "$node" "$here/gen_corpus.mjs" "$work/corpus.bin"
  (cd "$here" && "$node" encode.mjs "$enc" "$work/corpus.bin" "$work/$enc.model" "$work/$enc.ids")
  pattern=${enc%%_base}
  exec "$checker" check --ranks "$work/$enc.model" --specials "$work/$enc.model.special.json" --pattern "$pattern" \
    --plain --corpus "$work/corpus.bin" --ids "$work/$enc.ids"
else
  fx=$here/kimi_fixtures
  "$node" "$here/gen_corpus.mjs" "$work/corpus.bin" $(cat "$fx/gen_args.txt")
  exec "$checker" check --ranks "$fx/kimi_test.model" --specials "$fx/specials.json" --pattern kimi \
    --corpus "$work/corpus.bin" --ids "$fx/kimi_ids.txt"
fi
