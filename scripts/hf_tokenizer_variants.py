#!/usr/bin/env python3
"""Write HF `tokenizers` ids for tokenizer.json variants over a fuzz corpus.

The Go tokenizer (tokenizer/) is held against this file by
TestTokenizerVariants. Each variant is the Qwen2 or DeepSeek-V2 file of this
folder with some top-level keys replaced (normalizer, pre_tokenizer, ...), or a
small synthetic BPE given whole; together they cover the Split behaviours and
invert, Digits, ByteLevel options, the normalizers, the added-token flags
(single_word, lstrip, rstrip, normalized), the post-processors and the BPE
options (unk, fuse_unk, byte_fallback, prefixes, ignore_merges).

Run where HF `tokenizers` is installed (the GPU machine):

    python3 scripts/hf_tokenizer_variants.py testdata/tokenizer/variants_golden.json.gz [--random N]

--random sets how many random texts join the fragments (default 150; the
committed file was written with the default by tokenizers 0.23.2, and a run
with 400 matched too: FUSELM_TOKENIZER_VARIANTS=FILE points the test at one).
"""
import gzip
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))


def base(name):
    with gzip.open(os.path.join(HERE, f"{name}.tokenizer.json.gz"), "rb") as f:
        return json.loads(f.read().decode("utf-8"))


FRAGMENTS = [
    # words and contractions, with the case and fold variants Oniguruma's (?i) sees
    "hello", "Hello", "HELLO", "world", "don't", "I'M", "we'LL", "it's", "'s", "'S", "'ſ", "'K", "'Re",
    "'ve", "'d", "x'y", "''", "'", "o'clock", "ſ", "K",
    # whitespace of every kind
    " ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", " \n ", "\u00a0", "\u3000", "\u2028", "\u2029",
    "\u0085", "\u200b", "\u000b", "\u000c", "\u180e", "\ufeff", "\t\t ", " \t\n",
    # numbers of several scripts and categories (Nd, Nl, No)
    "0", "12", "123", "1234", "٣٤٥", "１２３", "²", "½", "Ⅻ", "๓", "3.14", "1,000", "-5", "1e10",
    # punctuation and code
    ".", ",", "!?", "...", "—", "–", "“quoted”", "«»", "()", "{}", "[]", "<>", "</", "/>", "==", "=>",
    "->", "::", "#", "@", "$", "%", "^&*", "\\", "|", "~", "`", "_", "__init__", "a_b", "x2",
    # CJK and the edges of DeepSeek's ranges
    "中文", "日本語", "カタカナ", "ひらがな", "한국어", "龘", "𠀀", "一", "龥", "龦", "ࠀ", "가", "퟿", "힣", "，", "。",
    # other scripts, compatibility and combining characters, DeepSeek's byte-like added tokens
    "Привет", "مرحبا", "שלום", "नमस्ते", "ไทย", "Ελληνικά", "ǅ", "ß", "İstanbul", "ﬁ", "Å", "A\u030a", "é",
    "e\u0301", "\u0301", "ñ", "µ", "ø", "ö", "ú", "ÿ", "À", "Á", "þ", "ü", "÷", "ẞ", "Ω", "K",
    # emoji
    "😀", "🫠", "👍🏽", "🇫🇷", "👨\u200d👩\u200d👧\u200d👦", "❤️", "🦩",
    # special and added tokens, whole and broken
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "<|fim_prefix|>",
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<|im_start", "|>", "<x>", "<y>", "<z>", "foo", "bar",
    " baz", "Hello", "World", "HELLO", "world", "[BOS]", "<s>", "</s>",
    # controls
    "\x00", "\x01", "\x7f", "\u0080", "\u00ad",
]
SEPARATORS = ["", "", "", " ", " ", "  ", "\n", "\t", "\u00a0"]


def corpus(n_random):
    rng = random.Random(20261122)
    texts = list(FRAGMENTS)
    for _ in range(n_random):
        n = rng.randint(2, 12)
        texts.append("".join(rng.choice(FRAGMENTS) + rng.choice(SEPARATORS) for _ in range(n)))
    letters = "abcdefghijklmnopqrstuvwxyz"
    texts += [
        "a" * 1000, "ab" * 300, " " * 50 + "x", "x" + " " * 50, "\n" * 20, "1" * 40,
        "".join(rng.choice(letters) for _ in range(600)),
        "".join(rng.choice(letters + "  \n") for _ in range(600)),
        "foo bar foobar barfoo _foo foo_ (foo) foo1 1foo", "<x>  <x> a <x>a a<x>", "a  <y>  b<y>\n\nc <y>",
        "  <z>  ", "Hello HELLO hello World WORLD world", "line one  \nline two \n  \n",
        "'ſy", "x'ſy 'ſ 'Sy", "\n\u212ay", "k\u212a \u212ak '\u212ay", "<|im_end|>\u0301", "İİ", "\u0130x",
    ]
    seen, out = set(), []
    for t in texts:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def bytelevel(prefix=False, regex=False):
    return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": False, "use_regex": regex}


def split(pattern, behavior, invert=False, literal=False):
    return {"type": "Split", "pattern": {"String" if literal else "Regex": pattern}, "behavior": behavior,
            "invert": invert}


def seq_pre(*p):
    return {"type": "Sequence", "pretokenizers": list(p)}


def added(id, content, special=False, normalized=None, lstrip=False, rstrip=False, single_word=False):
    return {"id": id, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def tiny_model(**kw):
    """Bytes as their own characters (no byte-level mapping) plus a few merges."""
    vocab = {}
    for c in "abcdefghijklmnopqrstuvwxyz<>/ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789":
        vocab[c] = len(vocab)
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("w", "o"), ("wo", "r"), ("wor", "l"),
              ("worl", "d"), ("f", "o"), ("fo", "o"), ("b", "a"), ("ba", "r"), ("a", "a"), ("aa", "aa")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]}
    model.update(kw)
    return model


def tiny(**model_kw):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None, "pre_tokenizer": split("\\s+", "Removed"), "post_processor": None,
            "decoder": None, "model": tiny_model(**model_kw)}


def variants(q, d):
    v = []
    qadded = q["added_tokens"]
    n = 151665  # the next free id in Qwen2

    def qv(name, **set_):
        v.append({"name": name, "base": "qwen2", "set": set_})

    v.append({"name": "qwen2", "base": "qwen2", "set": {}})
    v.append({"name": "deepseek-v2", "base": "deepseek-v2", "set": {}})
    qv("bytelevel-gpt2", pre_tokenizer=bytelevel(prefix=False, regex=True))
    qv("bytelevel-prefix-regex", pre_tokenizer=bytelevel(prefix=True, regex=True))
    qv("bytelevel-prefix-noregex", pre_tokenizer=bytelevel(prefix=True, regex=False))
    for behavior in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for invert in [False, True]:
            qv(f"split-{behavior}-{'invert' if invert else 'plain'}",
               pre_tokenizer=seq_pre(split("\\s+|[0-9]", behavior, invert), bytelevel()))
    qv("split-literal", pre_tokenizer=seq_pre(split(" ", "MergedWithNext", literal=True), bytelevel()))
    qv("split-anchors", pre_tokenizer=seq_pre(split("\\s+$", "Isolated"), split("^\\s+", "Isolated"), bytelevel()))
    qv("digits-contiguous", pre_tokenizer=seq_pre({"type": "Digits", "individual_digits": False}, bytelevel(regex=True)))
    qv("digits-individual", pre_tokenizer=seq_pre({"type": "Digits", "individual_digits": True}, bytelevel()))
    for nm in ["NFKC", "NFD", "NFKD", "Lowercase"]:
        qv(f"norm-{nm}", normalizer={"type": nm})
    qv("norm-replace", normalizer={"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        {"type": "Replace", "pattern": {"Regex": "[0-9]+"}, "content": "#"}]})
    qv("norm-prepend-strip", normalizer={"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": True, "strip_right": True}, {"type": "Prepend", "prepend": "▁"}]})
    qv("norm-strip-accents", normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "StripAccents"}, {"type": "Lowercase"}]})
    extra = [
        added(n, "<x>", lstrip=True, normalized=False),
        added(n + 1, "<y>", rstrip=True, special=True),
        added(n + 2, "<z>", lstrip=True, rstrip=True, special=True),
        added(n + 3, "foo", single_word=True, normalized=False),
        added(n + 4, "bar", normalized=True),
        added(n + 5, " baz", normalized=False),
        added(n + 6, "Hello", normalized=True),
        added(n + 7, "World", normalized=False),
        added(n + 8, "hello", normalized=False),  # in the vocabulary: keeps id 14990
        added(n + 9, "<|im_start", special=True),  # a prefix of <|im_start|>: longest wins
    ]
    qv("added-flags", added_tokens=qadded + extra)
    qv("added-flags-lowercase", added_tokens=qadded + extra, normalizer={"type": "Lowercase"})
    # The ids written for added tokens are not used: HF gives the next free one.
    qv("added-wrong-ids", added_tokens=qadded + [added(200000, "<x>", special=True), added(7, "<y>")])
    qv("post-template", post_processor={
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [151644], "tokens": ["<|im_start|>"]},
                           "<|im_end|>": {"id": "<|im_end|>", "ids": [151645, 151643],
                                          "tokens": ["<|im_end|>", "<|endoftext|>"]}}})
    qv("post-roberta", post_processor={"type": "RobertaProcessing", "sep": ["<|im_end|>", 151645],
                                       "cls": ["<|im_start|>", 151644], "trim_offsets": True,
                                       "add_prefix_space": False})
    qv("post-bert", post_processor={"type": "BertProcessing", "sep": ["<|im_end|>", 151645],
                                    "cls": ["<|im_start|>", 151644]})
    qv("post-sequence", post_processor={"type": "Sequence", "processors": [
        q["post_processor"], d["post_processor"] | {"special_tokens": {"<｜begin▁of▁sentence｜>": {
            "id": "<｜begin▁of▁sentence｜>", "ids": [151643], "tokens": ["<|endoftext|>"]}}}]})
    qv("no-decoder", decoder=None)
    qv("merges-as-pairs", model=q["model"] | {"merges": [m.split(" ") for m in q["model"]["merges"]]})
    v.append({"name": "deepseek-normalized-nfkc", "base": "deepseek-v2", "set": {"normalizer": {"type": "NFKC"}}})

    def tv(name, t):
        v.append({"name": name, "base": None, "set": t})

    tv("tiny", tiny())
    tv("tiny-unk", tiny(unk_token="<"))
    tv("tiny-unk-fuse", tiny(unk_token="<", fuse_unk=True))
    fb = tiny_model(byte_fallback=True, unk_token="<")
    for b in range(256):
        fb["vocab"][f"<0x{b:02X}>"] = len(fb["vocab"])
    tv("tiny-byte-fallback", tiny() | {"model": fb})
    pm = tiny_model(continuing_subword_prefix="##", end_of_word_suffix="</w>")
    for c in list(pm["vocab"]):
        if len(c) == 1:
            pm["vocab"]["##" + c] = len(pm["vocab"])
            pm["vocab"][c + "</w>"] = len(pm["vocab"])
            pm["vocab"]["##" + c + "</w>"] = len(pm["vocab"])
    pm["merges"] = ["h ##e", "he ##l", "hel ##l", "hell ##o</w>", "f ##o", "fo ##o</w>"]
    for tok in ["he", "hel", "hell", "hello</w>", "fo", "foo</w>"]:
        pm["vocab"].setdefault(tok, len(pm["vocab"]))
    tv("tiny-prefix-suffix", tiny() | {"model": pm})
    im = tiny_model(ignore_merges=True)
    im["vocab"]["hlo"] = len(im["vocab"])
    tv("tiny-ignore-merges", tiny() | {"model": im})
    tv("tiny-added", tiny() | {"added_tokens": [added(0, "<s>", special=True), added(0, "</s>", special=True),
                                                 added(0, "foo", single_word=True, lstrip=True, rstrip=True)],
                               "post_processor": {"type": "TemplateProcessing",
                                                  "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                             {"Sequence": {"id": "A", "type_id": 0}},
                                                             {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                                                  "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                                           {"Sequence": {"id": "B", "type_id": 1}}],
                                                  "special_tokens": {"<s>": {"id": "<s>", "ids": [1000], "tokens": ["<s>"]},
                                                                     "</s>": {"id": "</s>", "ids": [1001], "tokens": ["</s>"]}}}})
    # Does (?i) fold "ſ" to "s" and the Kelvin sign to "k", as Unicode case
    # folding would? A byte-free model where the split shows in the ids.
    cf = tiny_model()
    for tok in ["'", "ſ", "'ſ", "ſy", "'s", "\u212a", "\u212ay"]:
        cf["vocab"].setdefault(tok, len(cf["vocab"]))
    cf["merges"] = cf["merges"] + ["ſ y", "' ſ", "\u212a y", "' s"]
    tv("tiny-casefold", tiny() | {"model": cf, "pre_tokenizer": seq_pre(
        split("(?i:'s|'t|k)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\s+|.", "Isolated"))})
    # A string template is refused by HF's tokenizer.json loader.
    tv("template-string", tiny() | {"post_processor": {"type": "TemplateProcessing", "single": "$A", "pair": "$A $B",
                                                       "special_tokens": {}}})
    return v


def build(v, bases):
    t = dict(bases[v["base"]]) if v["base"] else {}
    t.update(v["set"])
    return t


def main():
    out_path = sys.argv[1]
    n_random = int(sys.argv[sys.argv.index("--random") + 1]) if "--random" in sys.argv else 150
    bases = {"qwen2": base("qwen2"), "deepseek-v2": base("deepseek-v2")}
    texts = corpus(n_random)
    result = {"tokenizers_version": tokenizers.__version__, "texts": texts, "variants": []}
    for v in variants(bases["qwen2"], bases["deepseek-v2"]):
        row = {"name": v["name"], "base": v["base"], "set": v["set"]}
        if v["name"] == "merges-as-pairs":
            row["set"] = {"model": "<qwen2 model with merges as pairs>"}
        try:
            tok = Tokenizer.from_str(json.dumps(build(v, bases)))
        except Exception as e:  # noqa: BLE001
            row["error"] = str(e)
            result["variants"].append(row)
            print(v["name"], "ERROR", e, file=sys.stderr)
            continue
        row["vocab_size"] = tok.get_vocab_size(with_added_tokens=True)
        rows = []
        for text in texts:
            enc = tok.encode(text)
            rows.append({
                "ids": enc.ids,
                "ids_no_special": tok.encode(text, add_special_tokens=False).ids,
                "decoded": tok.decode(enc.ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(enc.ids, skip_special_tokens=True),
            })
        row["results"] = rows
        result["variants"].append(row)
        print(v["name"], "ok", file=sys.stderr)
    opener = gzip.open if out_path.endswith(".gz") else open
    with opener(out_path, "wt", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, separators=(",", ":"))


if __name__ == "__main__":
    main()
