# Records the reference ids behind python_fixtures/ and the tiktoken timings in
# docs/performance.md. Runs where Python tiktoken (and transformers, for
# tokenization_kimi.py) are installed -- the GPU machine here. Next to this script it wants:
#   kimi_test.model, kcorpus.bin (gen_corpus.mjs --python), corpus.bin (gen_corpus.mjs),
#   cl100k.model and o200k.model (encode.mjs NAME --export-ranks), and ref/ holding the
#   checkpoint's tokenization_kimi.py and encoding_k3.py, unchanged.
# Writes $OUT/{kimi,cl100k_base,o200k_base}_ids.txt (full ids); `digest` below turns them
# into the committed `<doc> h <count> <fnv1a64>` lines:
#   python3 record_reference_ids.py digest FULL_IDS > kimi_ids.txt
import ast, os, sys, time, traceback
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("OUT", "/tmp")

def fnv1a_ids(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for b in range(4):
            h ^= (i >> (8 * b)) & 0xFF
            h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h

if len(sys.argv) == 3 and sys.argv[1] == "digest":
    for line in open(sys.argv[2]):
        parts = line.split()
        if not parts:
            continue
        if parts[1:] == ["skip"]:
            print(f"{parts[0]} skip")
            continue
        ids = list(map(int, parts[1:]))
        print(f"{parts[0]} h {len(ids)} {fnv1a_ids(ids):016x}")
    sys.exit(0)

import tiktoken
from tiktoken.load import load_tiktoken_bpe
print("tiktoken", tiktoken.__version__, "python", sys.version.split()[0], flush=True)

def read_corpus(path):
    data = open(path, "rb").read(); docs = []; pos = 0
    while pos < len(data):
        eol = data.index(b"\n", pos)
        tag, idx, kind, allow, length = data[pos:eol].decode().split(" ")
        start = eol + 1; end = start + int(length)
        docs.append((int(idx), kind, allow == "1", data[start:end])); pos = end + 1
    return docs

def runs(b):
    # maximal well-formed / ill-formed runs (Python's decoder marks maximal subparts)
    s = b.decode("utf-8", "surrogateescape"); out = []; cur = ""; bad = False
    for ch in s:
        is_bad = 0xDC80 <= ord(ch) <= 0xDCFF
        if cur and is_bad != bad:
            out.append((cur.encode("utf-8", "surrogateescape"), bad)); cur = ""
        cur += ch; bad = is_bad
    if cur: out.append((cur.encode("utf-8", "surrogateescape"), bad))
    return out

K3 = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>", 18: "<|media_begin|>",
      19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>", 254: "[UNK]", 255: "[PAD]"}
model = os.path.join(HERE, "kimi_test.model")
ranks = load_tiktoken_bpe(model); n_base = len(ranks)
sys.path.insert(0, os.path.join(HERE, "ref"))
try:
    from tokenizers import AddedToken
    import tokenization_kimi
    dec = {n_base + k: AddedToken(v, special=True) for k, v in K3.items()}
    tok = tokenization_kimi.TikTokenTokenizer(vocab_file=model, added_tokens_decoder=dec, unk_token="[UNK]", pad_token="[PAD]")
    kimi_encode = lambda text, allow: tok.encode(text, allow_special_tokens=allow)
    kimi_core = tok.model; REF = "tokenization_kimi.TikTokenTokenizer.encode"
except Exception:
    traceback.print_exc()
    src = open(os.path.join(HERE, "ref", "tokenization_kimi.py")).read()
    pat = None
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "pat_str":
            pat = "|".join(ast.literal_eval(node.value.args[0]))
    specials = {K3.get(i, f"<|reserved_token_{n_base + i}|>"): n_base + i for i in range(256)}
    kimi_core = tiktoken.Encoding(name="kimi_test", pat_str=pat, mergeable_ranks=ranks, special_tokens=specials)
    def split(s, n):
        cur = 0; sp = s[0].isspace() if s else False; st = 0
        for i in range(len(s)):
            now = s[i].isspace()
            if sp ^ now: cur = 1; sp = now
            else:
                cur += 1
                if cur > n: yield s[st:i]; st = i; cur = 1
        yield s[st:]
    def kimi_encode(text, allow):
        t = []
        for i in range(0, len(text), 400_000):
            for sub in split(text[i:i + 400_000], 25_000):
                t.extend(kimi_core.encode(sub, allowed_special="all") if allow else kimi_core.encode(sub, disallowed_special=()))
        return t
    REF = "own re-implementation of tokenization_kimi._encode_text_piece over tiktoken.Encoding"
print("kimi reference:", REF, flush=True)

def byte_level(enc_fn, core, b):
    ids = []
    for run, bad in runs(b):
        ids.extend((getattr(core, "_encode_single_piece", None) or core._core_bpe.encode_single_piece)(run) if bad else enc_fn(run.decode("utf-8")))
    return ids

def write_ids(name, docs, enc_fn, core, limit_s=None):
    t0 = time.time(); lines = []
    for idx, kind, allow, b in docs:
        if limit_s and time.time() - t0 > limit_s and len(b) > 20000:
            lines.append(f"{idx} skip"); continue
        try:
            text = b.decode("utf-8"); ids = enc_fn(text, allow)
        except UnicodeDecodeError:
            ids = byte_level(lambda s: enc_fn(s, False), core, b)
        lines.append(f"{idx} " + " ".join(map(str, ids)))
    open(os.path.join(OUT, name), "w").write("\n".join(lines) + "\n")
    print(f"{name}: {len(lines)} docs in {time.time() - t0:.1f}s", flush=True)

kdocs = read_corpus(os.path.join(HERE, "kcorpus.bin"))
write_ids("kimi_ids.txt", kdocs, kimi_encode, kimi_core)

import tiktoken_ext.openai_public as op
public = {}
for name in ["cl100k_base", "o200k_base"]:
    op.load_tiktoken_bpe = lambda url, expected_hash=None, _n=name: load_tiktoken_bpe(os.path.join(HERE, _n.split("_")[0] + ".model"))
    public[name] = tiktoken.Encoding(**getattr(op, name)())
    enc = public[name]
    write_ids(name + "_ids.txt", kdocs,
              lambda text, allow, e=enc: e.encode(text, allowed_special="all") if allow else e.encode(text, disallowed_special=()),
              enc, limit_s=60)

# Timing: same corpus (the js-test corpus, well-formed documents), one thread.
docs = [b.decode("utf-8") for _, _, _, b in read_corpus(os.path.join(HERE, "corpus.bin")) if b.decode("utf-8", "replace").encode() == b]
nbytes = sum(len(d.encode()) for d in docs)
def bench(label, fn, repeat=3):
    best = 1e9
    for _ in range(repeat):
        t0 = time.perf_counter(); n = 0
        for d in docs: n += len(fn(d))
        best = min(best, time.perf_counter() - t0)
    print(f"BENCH {label}: {len(docs)} docs, {nbytes} bytes, {n} tokens, best of {repeat}: {best:.3f} s, {nbytes / best / 1e6:.2f} MB/s", flush=True)
for label, enc in [("kimi", kimi_core), ("cl100k", public["cl100k_base"]), ("o200k", public["o200k_base"])]:
    bench(f"python tiktoken Encoding.encode_ordinary {label}", enc.encode_ordinary)
    bench(f"rust core CoreBPE.encode_ordinary {label}", enc._core_bpe.encode_ordinary)
bench("tokenization_kimi encode (with its run splitting) kimi", lambda d: kimi_encode(d, False), repeat=1)
