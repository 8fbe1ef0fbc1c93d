#!/usr/bin/env bash
# The demo model's training data, from nothing but this repository (deterministic):
#   1. training/make_data.py writes the conversations (seeded, standard library only);
#   2. `moonrun make-train-data --corpus-out` renders them with the K3 chat format and
#      keeps the ordinary text; `moonrun train-tokenizer` learns the BPE on it (or the
#      committed tokenizer of the shipped model is reused: TOKENIZER=models/moonrun-demo);
#   3. `moonrun make-train-data --out` renders them again through the server's own chat
#      pipeline into token ids and the loss mask (see src/cli/cmd_make_train_data.cpp);
#   4. the three files are gzipped into DATA/carry for the GPU machine.
#
#   training/build_data.sh [MOONRUN] [DATA]     (defaults: build/moonrun, training/data)
set -euo pipefail
cd "$(dirname "$0")/.."
MOONRUN=${1:-build/moonrun}
DATA=${2:-training/data}
N=${N:-40000}
SEED=${SEED:-1}
MERGES=${MERGES:-2048}
PY=${PY:-python3}
mkdir -p "$DATA"

"$PY" training/make_data.py --out "$DATA/conversations.jsonl" --n "$N" --seed "$SEED"

if [[ -n "${TOKENIZER:-}" ]]; then
  mkdir -p "$DATA/tokenizer"
  cp "$TOKENIZER/tiktoken.model" "$TOKENIZER/tokenizer_config.json" "$DATA/tokenizer/"
else
  # The corpus render needs only a K3 config with a vision tower: the random demo model's.
  "$MOONRUN" make-demo-model --out "$DATA/render-config"
  "$MOONRUN" make-train-data --model "$DATA/render-config" --in "$DATA/conversations.jsonl" \
    --corpus-out "$DATA/corpus.txt"
  "$MOONRUN" train-tokenizer --corpus "$DATA/corpus.txt" --merges "$MERGES" --out "$DATA/tokenizer"
fi
# The model's config.json for this vocabulary (what export.py writes beside the weights).
"$PY" -c "
import json, sys
sys.path.insert(0, 'training')
from demo_config import demo_config
n_base = sum(1 for _ in open('$DATA/tokenizer/tiktoken.model'))
json.dump(demo_config(n_base), open('$DATA/tokenizer/config.json', 'w'), indent=1)
"
"$MOONRUN" make-train-data --model "$DATA/tokenizer" --in "$DATA/conversations.jsonl" --out "$DATA/train"
mkdir -p "$DATA/carry"
for f in ids.u32 mask.u8 docs.json; do gzip -c -6 "$DATA/train/$f" > "$DATA/carry/$f.gz"; done
ls -la "$DATA/carry"
