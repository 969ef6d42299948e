#!/usr/bin/env python3
"""pagoda's tokenizers against the reference Python packages (the test oracle).

Trains tokenizers with the `tokenizers` package (PyPI) from a seeded generated corpus, saves their
tokenizer.json files, runs pagoda's tokenize_tool over a corpus with Unicode, emoji, CJK,
combining marks, digit runs, white space runs, tabs, newlines, special tokens inside the text and
random valid UTF-8, and requires the ids to equal `Tokenizer.encode(text).ids` (with and without
special tokens) and the decoded text to equal `Tokenizer.decode` (also when streamed through the
incremental detokenizer). SentencePiece models (one trained here, and the real Mistral
tokenizer.model that the mistral-common package ships, when installed) are checked against the
`sentencepiece` package the same way.

A missing `tokenizers` or `sentencepiece` package is a FAILURE, not a skip.
Usage: check_against_hf.py --tool build/.../tokenize_tool --work DIR [--cli build/pagoda] [--seed N]
"""
import argparse
import importlib.util
import json
import os
import pathlib
import random
import subprocess
import sys
import time

try:
    import tokenizers
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors, trainers)
except ImportError as e:  # the oracle is required: fail, never skip
    print(f"FAIL: the `tokenizers` package cannot be imported ({e}); scripts/setup.sh installs it")
    sys.exit(1)
try:
    import sentencepiece as spm
except ImportError as e:
    print(f"FAIL: the `sentencepiece` package cannot be imported ({e}); scripts/setup.sh installs it")
    sys.exit(1)

LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ("the of and to in is was he for it with as his on be at by I that had not are but from "
         "or have an they which one you were her all she there would their we him been has when "
         "who will more no if out so said what up its about into than them can only other new "
         "some could time these two may then do first any my now such like our over man me even "
         "most made after also did many before must through back years where much your way "
         "don't it's we're they've I'm you'll he'd PAGODA Pagoda tokenizer BPE").split()
UNICODE = ["café", "naïve", "résumé", "Ελληνικά", "Σοφία", "русский", "язык", "中文", "日本語",
           "한국어", "ひらがな", "カタカナ", "漢字テスト", "العربية", "עברית", "हिन्दी", "ไทย",
           "😀", "🚀🔥", "👩‍💻", "🇫🇷", "e\u0301", "a\u0308\u0304", "Å", "ﬁ", "①②", "Ⅻ", "ß", "İ",
           "\u00a0", "\u3000", "x²", "½", "€100", "¥", "™", "—", "…", "«»", "„“"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\t\t ", "\r\n", "    \n  "]


def make_corpus(rng, n_lines):
    lines = []
    for _ in range(n_lines):
        parts = []
        for _ in range(rng.randint(3, 25)):
            r = rng.random()
            if r < 0.6:
                parts.append(rng.choice(WORDS))
            elif r < 0.75:
                parts.append(rng.choice(UNICODE))
            elif r < 0.85:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
            else:
                parts.append(rng.choice(["!", "?", ".", ",", "...", "'s", "(x)", "#", "->", "::"]))
            parts.append(rng.choice(SPACES) if rng.random() < 0.2 else " ")
        lines.append("".join(parts))
    return lines


def random_utf8(rng, n):
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.4:
            cp = rng.randint(0x20, 0x7E)
        elif r < 0.5:
            cp = rng.randint(0x00, 0x1F)
        elif r < 0.7:
            cp = rng.randint(0x80, 0x7FF)
        elif r < 0.9:
            cp = rng.randint(0x800, 0xFFFD)
        else:
            cp = rng.randint(0x10000, 0x10FFFF)
        if 0xD800 <= cp <= 0xDFFF:
            cp = 0xFFFD
        out.append(chr(cp))
    return "".join(out)


def bpe_trainer(vocab_size, specials, byte_level):
    kw = dict(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    if byte_level:
        kw["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    else:
        kw["limit_alphabet"] = 120  # rare characters (CJK, emoji) go through byte fallback
    return trainers.BpeTrainer(**kw)


def train_gpt2(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(corpus, bpe_trainer(900, ["<|endoftext|>"], True))
    return tok


def train_llama3(corpus):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tok.train_from_iterator(corpus, bpe_trainer(1000, specials, True))
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, special=True,
                                       normalized=False)])
    tok.add_tokens([AddedToken("Pagoda", single_word=True, normalized=True),
                    AddedToken(" rstrip_me", rstrip=True, normalized=False)])
    return tok


def train_qwen2(corpus):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(corpus, bpe_trainer(1000, specials, True))
    tok.add_tokens([AddedToken("tokenizer", normalized=True)])
    return tok


def add_byte_tokens(tok_json):
    """SentencePiece-style vocabularies carry the 256 <0xNN> byte tokens; the trainer does not add
    them, so they are appended to the model's vocabulary here."""
    vocab = tok_json["model"]["vocab"]
    next_id = max(vocab.values()) + 1
    for b in range(256):
        name = f"<0x{b:02X}>"
        if name not in vocab:
            vocab[name] = next_id
            next_id += 1
    return tok_json


def train_spm_style(corpus):
    """Llama-2 / Mistral in tokenizer.json form: BPE with byte_fallback and fuse_unk."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                 split=True)
    tok.train_from_iterator(corpus, bpe_trainer(700, ["<unk>", "<s>", "</s>"], False))
    base = add_byte_tokens(json.loads(tok.to_str()))
    bos = base["model"]["vocab"]["<s>"]
    template = json.loads(processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]).__getstate__())

    # Llama-2 form: Prepend + Replace normalizer, no pre-tokenizer, Replace/ByteFallback/Fuse/Strip.
    llama2 = json.loads(json.dumps(base))
    llama2["normalizer"] = json.loads(normalizers.Sequence([
        normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]).__getstate__())
    llama2["pre_tokenizer"] = None
    llama2["decoder"] = json.loads(decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(" ", 1, 0)]).__getstate__())
    llama2["post_processor"] = template

    # Newer form: Metaspace pre-tokenizer (prepend first, no split) and Metaspace decoder.
    meta = json.loads(json.dumps(base))
    meta["normalizer"] = None
    meta["pre_tokenizer"] = json.loads(pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first", split=False).__getstate__())
    meta["decoder"] = json.loads(decoders.Sequence([
        decoders.Metaspace(replacement="▁", prepend_scheme="first"), decoders.ByteFallback(),
        decoders.Fuse()]).__getstate__())
    meta["post_processor"] = template
    return llama2, meta


def variant_gpt2_nfkc_lower(gpt2_json):
    """The GPT-2 vocabulary under NFKC + Lowercase, individual digits and add_prefix_space."""
    j = json.loads(json.dumps(gpt2_json))
    j["normalizer"] = json.loads(normalizers.Sequence([
        normalizers.NFKC(), normalizers.Lowercase()]).__getstate__())
    j["pre_tokenizer"] = json.loads(pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True)]).__getstate__())
    return j


def variant_split_behaviors(gpt2_json, which):
    """The GPT-2 vocabulary behind other pre-tokenizers: every Split behavior, invert, Digits,
    Whitespace / WhitespaceSplit, and the NFD / StripAccents / Strip normalizers."""
    j = json.loads(json.dumps(gpt2_json))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if which == 1:
        j["normalizer"] = json.loads(normalizers.Sequence([
            normalizers.NFD(), normalizers.StripAccents(), normalizers.Strip()]).__getstate__())
        pre = [pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
               pre_tokenizers.Split("-", behavior="merged_with_previous"),
               pre_tokenizers.Split(Regex(r"\p{N}"), behavior="merged_with_next"), byte_level]
    elif which == 2:
        j["normalizer"] = json.loads(normalizers.NFKD().__getstate__())
        pre = [pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="isolated", invert=True),
               pre_tokenizers.Split(Regex(r"[.,!?']"), behavior="contiguous"),
               pre_tokenizers.Digits(individual_digits=False), byte_level]
    else:
        pre = [pre_tokenizers.Whitespace(), pre_tokenizers.WhitespaceSplit(), byte_level]
    j["pre_tokenizer"] = json.loads(pre_tokenizers.Sequence(pre).__getstate__())
    return j


def test_texts(rng, corpus, specials):
    texts = ["", " ", "a", "Hello world", "  leading and trailing  ", "\n\n\t\t  \n",
             "1234567890 12 123 1234", "don't I'M we'Re", "e\u0301 vs é", "ﬁ ① x² Ⅻ ½",
             "ΣΊΣΥΦΟΣ Σοφία ΌΣΟΣ", "İstanbul STRASSE ß", "👩‍💻🇫🇷😀 🚀", "中文字符测试 日本語のテキスト",
             "Pagoda Pagodas xPagoda Pagoda.", "x <mask> y  <mask>z", "a rstrip_me   b",
             "tokenizer tokenizers", "▁already▁metaspace ▁x",
             # white space at the edges of \s: NEL, Mongolian vowel separator, ZWSP, LS, PS,
             # NBSP, ogham space, NNBSP, BOM, information separators
             "a\u0085b \u0085 c", "a\u180eb \u180e  c", "a\u200bb\u200b c", "x\u2028y\u2029z",
             "p\u00a0\u00a0q \u1680r\u202f s\ufeff", "\u001c\u001d \u001e\u001f x",
             "  \u3000\u3000 end   "]
    texts += corpus[:60]
    for _ in range(40):
        line = rng.choice(corpus)
        pos = rng.randint(0, len(line))
        sp = rng.choice(specials) if specials else ""
        texts.append(line[:pos] + sp + line[pos:] + rng.choice(["", sp]))
    texts += [random_utf8(rng, rng.randint(1, 40)) for _ in range(60)]
    return texts


class Checker:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def expect_equal(self, what, got, want, context):
        if got == want:
            self.passed += 1
            return
        self.failed += 1
        if self.failed <= 20:
            print(f"MISMATCH {what}: {context!r}\n  pagoda: {got!r}\n  oracle: {want!r}")


def run_tool(tool, model, request, work, name):
    req_path = work / f"{name}.request.json"
    resp_path = work / f"{name}.response.json"
    req_path.write_text(json.dumps(request), encoding="utf-8")
    t0 = time.time()
    subprocess.run([tool, str(model), str(req_path), str(resp_path)], check=True)
    return json.loads(resp_path.read_text(encoding="utf-8")), time.time() - t0


def check_hf(name, tok_json, texts, rng, tool, work, checker, big_text=None, cli=None):
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    path.write_text(json.dumps(tok_json, ensure_ascii=False), encoding="utf-8")
    hf = Tokenizer.from_file(str(path))
    vocab_size = hf.get_vocab_size(with_added_tokens=True)
    encoded = [hf.encode(t).ids for t in texts]
    decode_ids = list(encoded)
    decode_ids += [[rng.randrange(vocab_size) for _ in range(rng.randint(1, 12))]
                   for _ in range(40)]
    decode_ids.append(encoded[30][:4] + [vocab_size + 3] + encoded[30][4:])  # unknown id: left out
    all_texts = list(texts) + ([big_text] if big_text else [])
    resp, seconds = run_tool(tool, folder, {"texts": all_texts, "decode_ids": decode_ids}, work,
                             name)
    before = checker.failed
    checker.expect_equal(f"{name} vocab_size", resp["vocab_size"], vocab_size, "")
    for i, t in enumerate(texts):
        checker.expect_equal(f"{name} encode", resp["with_special"][i], encoded[i], t)
        checker.expect_equal(f"{name} encode(add_special_tokens=False)",
                             resp["without_special"][i],
                             hf.encode(t, add_special_tokens=False).ids, t)
    for i, ids in enumerate(decode_ids):
        want = hf.decode(ids, skip_special_tokens=False)
        checker.expect_equal(f"{name} decode", resp["decoded"][i], want, ids)
        checker.expect_equal(f"{name} decode(skip_special_tokens)", resp["decoded_skip"][i],
                             hf.decode(ids, skip_special_tokens=True), ids)
        # Streaming can only match a final decode that has no U+FFFD: `tokenizers` turns a whole
        # run of byte tokens into U+FFFDs when the run ends invalid, which a stream cannot know
        # ahead. Random ids are checked for not failing there.
        if "\ufffd" not in want:
            checker.expect_equal(f"{name} streamed decode", resp["streamed"][i], want, ids)
    if big_text:
        t0 = time.time()
        want = hf.encode(big_text).ids
        hf_s = time.time() - t0
        checker.expect_equal(f"{name} encode of {len(big_text.encode())} bytes",
                             resp["with_special"][-1], want, big_text[:60] + "...")
        print(f"  {name}: {len(big_text.encode()) / 1e6:.1f} MB text: tokenize_tool {seconds:.2f} s "
              f"in all (load + {len(all_texts)} encodes + decodes), tokenizers {hf_s:.2f} s")
    if cli:
        for t, ids in list(zip(texts, encoded))[:12]:
            out = subprocess.run([cli, "tokenize", "--model", str(folder), "--text", t, "--json"],
                                 check=True, capture_output=True, text=True).stdout
            checker.expect_equal(f"{name} pagoda tokenize --json", json.loads(out)["ids"], ids, t)
        ids = encoded[20]
        for flags, skip in (([], False), (["--no-special"], True)):
            out = subprocess.run([cli, "tokenize", "--model", str(folder), "--decode", "--json",
                                  "--ids", ",".join(map(str, ids))] + flags,
                                 check=True, capture_output=True, text=True).stdout
            checker.expect_equal(f"{name} pagoda tokenize --decode {flags}",
                                 json.loads(out)["text"],
                                 hf.decode(ids, skip_special_tokens=skip), ids)
    print(f"{name}: {len(texts)} texts, {len(decode_ids)} decodes, "
          f"{'OK' if checker.failed == before else 'FAILED'}")


def check_sentencepiece(name, model_path, texts, tool, work, checker):
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "tokenizer.model"
    target.write_bytes(pathlib.Path(model_path).read_bytes())
    sp = spm.SentencePieceProcessor(model_file=str(target))
    encoded = [sp.encode(t) for t in texts]
    resp, _ = run_tool(tool, folder, {"texts": texts, "decode_ids": encoded}, work, name)
    before = checker.failed
    checker.expect_equal(f"{name} vocab_size", resp["vocab_size"], sp.get_piece_size(), "")
    checker.expect_equal(f"{name} bos", resp["bos_id"], sp.bos_id(), "")
    for i, t in enumerate(texts):
        checker.expect_equal(f"{name} encode(no BOS)", resp["without_special"][i], encoded[i], t)
        checker.expect_equal(f"{name} encode(BOS)", resp["with_special"][i],
                             [sp.bos_id()] + encoded[i], t)
        checker.expect_equal(f"{name} decode", resp["decoded"][i], sp.decode(encoded[i]), t)
        checker.expect_equal(f"{name} streamed decode", resp["streamed"][i],
                             sp.decode(encoded[i]), t)
    print(f"{name}: {len(texts)} texts, {'OK' if checker.failed == before else 'FAILED'}")


def tokenizer_json_from_spm(model_path):
    """A Llama-2 style tokenizer.json for a SentencePiece BPE model: its pieces as the vocabulary
    and, as merges, every split of a piece into two pieces, ranked by the merged piece's score
    (SentencePiece BPE merges the highest-scoring pair first)."""
    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = []
    for i, piece in enumerate(pieces):
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i):
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                merges.append((-sp.get_score(i), i, vocab[left], vocab[right], left, right))
    merges.sort()
    specials = [i for i in range(len(pieces)) if sp.is_control(i) or sp.is_unknown(i)]
    bos = sp.bos_id()
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": pieces[i], "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i in specials],
        "normalizer": json.loads(normalizers.Sequence([
            normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]).__getstate__()),
        "pre_tokenizer": None,
        "post_processor": json.loads(processors.TemplateProcessing(
            single="<s> $A", special_tokens=[(pieces[bos], bos)]).__getstate__()),
        "decoder": json.loads(decoders.Sequence([
            decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
            decoders.Strip(" ", 1, 0)]).__getstate__()),
        "model": {"type": "BPE", "dropout": None, "unk_token": pieces[sp.unk_id()],
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [[m[4], m[5]] for m in merges]},
    }


def write_tiny_checkpoint(folder, vocab_size, bos, eos, rng):
    """A 2-layer random Llama checkpoint (config.json + f32 model.safetensors, written with the
    standard library) for `pagoda generate --prompt` with the tokenizer next to it."""
    import array
    h, inter, layers, heads, kv_heads = 32, 64, 2, 4, 2
    hd = h // heads
    shapes = {"model.embed_tokens.weight": [vocab_size, h], "model.norm.weight": [h]}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
                       p + "self_attn.q_proj.weight": [heads * hd, h],
                       p + "self_attn.k_proj.weight": [kv_heads * hd, h],
                       p + "self_attn.v_proj.weight": [kv_heads * hd, h],
                       p + "self_attn.o_proj.weight": [h, heads * hd],
                       p + "mlp.gate_proj.weight": [inter, h], p + "mlp.up_proj.weight": [inter, h],
                       p + "mlp.down_proj.weight": [h, inter]})
    header, blobs, offset = {}, [], 0
    for name, shape in shapes.items():
        n = 1
        for d in shape:
            n *= d
        values = [1.0] * n if name.endswith("norm.weight") else [rng.gauss(0, 0.1) for _ in range(n)]
        data = array.array("f", values).tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * ((8 - len(head) % 8) % 8)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head + b"".join(blobs))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size,
        "hidden_size": h, "intermediate_size": inter, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": True,
        "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "float32"}))


def check_generate(cli, tok_dir, work, rng, checker):
    """`pagoda generate --prompt` encodes with the checkpoint's tokenizer (BOS included)."""
    folder = work / "generate_ckpt"
    folder.mkdir(parents=True, exist_ok=True)
    src = pathlib.Path(tok_dir) / "tokenizer.json"
    (folder / "tokenizer.json").write_bytes(src.read_bytes())
    hf = Tokenizer.from_file(str(src))
    bos = hf.token_to_id("<|begin_of_text|>")
    write_tiny_checkpoint(folder, 1024, bos, hf.token_to_id("<|end_of_text|>"), rng)
    for prompt in ["Hello world, 12345 中文 😀", "<|eot_id|>the end"]:
        out = subprocess.run([cli, "generate", "--model", str(folder), "--prompt", prompt,
                              "--max-new-tokens", "4", "--ignore-eos", "--json"],
                             check=True, capture_output=True, text=True).stdout
        res = json.loads(out)
        checker.expect_equal("pagoda generate --prompt ids", res["prompt_token_ids"],
                             hf.encode(prompt).ids, prompt)
        checker.expect_equal("pagoda generate output_text", res["output_text"],
                             hf.decode(res["output_token_ids"]), res["output_token_ids"])
    print(f"generate: prompts encoded with the checkpoint's tokenizer.json, "
          f"{'OK' if checker.failed == 0 else 'FAILED'}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--cli", help="the pagoda binary: also check `pagoda tokenize --json`")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("PAGODA_TOKENIZER_SEED", 20261130)))
    args = ap.parse_args()
    print(f"seed {args.seed} (set PAGODA_TOKENIZER_SEED to change); tokenizers "
          f"{tokenizers.__version__}, sentencepiece {spm.__version__}")
    rng = random.Random(args.seed)
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus(rng, 3000)
    checker = Checker()

    gpt2 = json.loads(train_gpt2(corpus).to_str())
    llama3 = json.loads(train_llama3(corpus).to_str())
    qwen2 = json.loads(train_qwen2(corpus).to_str())
    llama2, metaspace = train_spm_style(corpus)
    big = "\n".join(make_corpus(rng, 12000))
    while len(big.encode()) < 1_000_000:
        big += "\n" + big[: 100_000]

    cases = [
        ("gpt2_bytelevel", gpt2, ["<|endoftext|>"], None),
        ("gpt2_nfkc_lower_digits", variant_gpt2_nfkc_lower(gpt2), ["<|endoftext|>"], None),
        ("split_behaviors_1", variant_split_behaviors(gpt2, 1), ["<|endoftext|>"], None),
        ("split_behaviors_2", variant_split_behaviors(gpt2, 2), ["<|endoftext|>"], None),
        ("whitespace_split", variant_split_behaviors(gpt2, 3), ["<|endoftext|>"], None),
        ("llama3_bytelevel", llama3, ["<|begin_of_text|>", "<|eot_id|>", "<mask>", " <mask>"], big),
        ("qwen2_nfc", qwen2, ["<|im_start|>", "<|im_end|>", "<|endoftext|>"], None),
        ("llama2_spm_bpe", llama2, ["<s>", "</s>"], big),
        ("metaspace_spm_bpe", metaspace, ["<s>", "</s>"], None),
    ]
    for name, tok_json, specials, big_text in cases:
        check_hf(name, tok_json, test_texts(rng, corpus, specials), rng, args.tool, work, checker,
                 big_text, args.cli)

    if args.cli:
        check_generate(args.cli, work / "llama3_bytelevel", work, rng, checker)

    # A SentencePiece model trained here (BPE with byte fallback), through libsentencepiece.
    corpus_file = work / "spm_corpus.txt"
    corpus_file.write_text("\n".join(corpus), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus_file), model_prefix=str(work / "spm_trained"),
                                   vocab_size=600, model_type="bpe", byte_fallback=True,
                                   character_coverage=0.98, minloglevel=2,
                                   num_threads=1)
    sp_texts = test_texts(rng, corpus, [])
    check_sentencepiece("sentencepiece_trained", work / "spm_trained.model", sp_texts, args.tool,
                        work, checker)

    # A real tokenizer.model shipped by a PyPI package (Mistral 7B's, in mistral-common).
    spec = importlib.util.find_spec("mistral_common")
    real = None
    if spec and spec.submodule_search_locations:
        real = pathlib.Path(list(spec.submodule_search_locations)[0]) / "data" / "tokenizer.model.v1"
    if real and real.exists():
        check_sentencepiece("mistral_tokenizer_model_v1", real, sp_texts, args.tool, work, checker)
        # The same real vocabulary (32,000 pieces) as a Llama-2 style tokenizer.json.
        check_hf("mistral_v1_tokenizer_json", tokenizer_json_from_spm(real),
                 test_texts(rng, corpus, ["<s>", "</s>"]), rng, args.tool, work, checker, big,
                 args.cli)
    else:
        print("note: mistral-common is not installed; the real Mistral tokenizer.model was not checked")

    print(f"{checker.passed} passed, {checker.failed} failed")
    return 1 if checker.failed else 0


if __name__ == "__main__":
    sys.exit(main())
