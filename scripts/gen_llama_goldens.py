"""Write llama.cpp's answers for the Llama work into tests/golden_data/ (tokens, logits, greedy text).

    python scripts/gen_llama_goldens.py [--model PATH] [--out tests/golden_data]
                                        [--only tokens|logits|tiny|tiny-archs|tiny-gpt-oss|greedy64|gemma3]

`--only tiny` needs no download: it writes llama_tiny.npz only (in about 3 s).

The oracle is llama-cpp-python==0.3.36 (vendored llama.cpp commit 0c1e570 / ggml 0c1e570), built
portably, with no AVX-512 and no AMX (their kernels change the numbers):

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \\
      -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" pip install llama-cpp-python==0.3.36

and SmolLM2-135M-Instruct Q4_1 (`refimpl fetch smollm2`). `sentencepiece` trains the toy SentencePiece
vocabulary below. The tests read only the files written here; they never need llama-cpp-python.

Files (each under 1 MB; every file records the build: llama-cpp-python version, llama.cpp's
`llama_print_system_info()`, and the settings used):

llama_tokens_smollm2.json  tokenization of the real SmolLM2 vocabulary (`vocab_only=True`)
    strings            a few hundred texts: whitespace runs, newlines and tabs, digits and long
                       numbers, contractions, accents, CJK, emoji, code, mixed scripts, Unicode
                       spaces and controls, unassigned codepoints, special tokens, the empty string
    ids                `Llama.tokenize(s.encode(), add_bos=False, special=True)` per string
    ids_plain          the same with special=False (special-token texts as plain text)
    ids_add_bos        add_bos=True for a few strings (SmolLM2's add_bos_token is false: no BOS)
    vocab              bos/eos/eot/eom/nl/pad ids, add_bos/add_eos, the EOG set
                       (`llama_vocab_is_eog` over every id), and a SHA-256 of every
                       `llama_token_to_piece(id, lstrip=0, special)` for special True and False
                       (each piece as 4-byte little-endian length + bytes, ids in order)
    decode             `llama_detokenize(ids, remove_special=False, unparse_special=True)` hex,
                       for the strings whose text it does not reproduce exactly (none expected)
    chat               a chat rendered with llama-cpp-python's Jinja2ChatFormatter from the GGUF's
                       `tokenizer.chat_template`, and its ids

llama_tokens_pre.json  the same strings through other tokenizers of llama.cpp
    pre[name]          ids for SmolLM2's vocabulary relabelled `tokenizer.ggml.pre = name`
                       ("default", "gpt-2", "llama3", "qwen2", "starcoder"): a vocab-only copy
                       of the GGUF with that one key changed (the regexes differ, the merges not);
                       "decode": llama_detokenize's bytes (hex) where they differ from the string
                       (these pre-tokenizers set clean_spaces: " ," -> "," and the like)
    spm                a toy SentencePiece vocabulary (`tokenizer.ggml.model = "llama"`, 1000
                       pieces, BPE with byte fallback and two user-defined pieces, trained here by
                       `sentencepiece` on the strings) as GGUF metadata, and llama.cpp's ids for
                       every string with add_special True/False and parse_special True/False

llama_logits_smollm2.npz   (in refimpl/data/goldens/: shipped, the notebooks read it) the real SmolLM2 forward, for a
                           handful of prompts p0, p1, ... (one is chat-formatted); "meta" is a JSON string with
                           the prompts and the build
    p{i}_prompt_ids        int32 (n,)         the prompt's ids (llama.cpp's tokenizer)
    p{i}_top_ids/_logits   int32/f32 (n, 16)  top 16 logits of every position, descending (ties:
                           lower id first), from ONE llama_decode over the whole prompt (batched
                           prefill, logits for every position)
    p{i}_last_logits       f16 (n_vocab,)     the last position's full logits from that forward
    p{i}_greedy_ids        int32 (32,)        greedy continuation: the prompt forward, then one
                           llama_decode per token, each token the first index of the max logit
                           (end-of-generation tokens are not special here: always 32 tokens;
                           meta gives the index of the first EOG token)
    p{i}_greedy_top_ids/_logits (32, 16)      top 16 of the logits each greedy token was picked
                           from (row 0 is the prompt's last position, rows 1.. single-token decodes)
    p{i}_tf_ids            int32 (n+31,)      teacher forcing: prompt + greedy[:31]
    p{i}_tf_top_ids/_logits (n+31, 16)        top 16 of every position of ONE batched forward over
                           tf_ids (compare refimpl position by position; meta records whether its
                           argmax reproduces every greedy token)

Which path produced the logits: llama.cpp's CPU backend (ggml-cpu, x86 AVX2/FMA/F16C, llamafile
sgemm compiled in), n_threads=2, n_batch=n_ubatch=512 (one micro-batch per forward), n_ctx=512,
KV cache f16, flash attention off (KQ soft_max path), weights mmap'ed and *not repacked*: the model
is loaded with `use_extra_bufts=False` (llama-cpp-python has no argument for it; the script sets it
in the default model params), so there is no CPU_REPACK buffer (the load log lines naming the
buffers are kept in meta["load_log"]). Q4_1 weights multiply through ggml's q4_1 x q8_1 dot product
(activations quantized to Q8_1); the tied Q8_0 output (token_embd) through q8_0 x q8_0 (llamafile's
tinyBLAS where it applies). The seed (1234) does not matter: no sampling is done.

Batched and single-token forwards are different paths in llama.cpp: llamafile's tinyBLAS handles
only mat-muls with at least 2 columns (the Q8_0 output and the F16 attention products of a batch),
single-token decodes use ggml's vec_dot kernels. Their rounding differs, and the Q8 quantization of
activations before every weight mat-mul amplifies that over 30 layers: the greedy path's logits and
the teacher-forced batch's logits for the same position differ by up to ~0.65 (meta records the
largest top-1 difference per prompt, and where a near tie flips the argmax). The prompt positions of
the prompt forward and of the teacher-forced forward are bit-identical. Compare refimpl's batched
forward with `top_*`/`tf_top_*`, its token-by-token decoding with `greedy_top_*`.

llama_greedy64_smollm2.npz   `--only greedy64`: 64 greedy tokens per prompt of the same PROMPTS (the faithful-mode
                             test, tests/models/test_llama_faithful.py); "meta" as above, plus per prompt the
                             smallest top-2 margin along the greedy path and where it is
    p{i}_prompt_ids        int32 (n,)         the prompt's ids
    p{i}_last_logits       f32 (n_vocab,)     the prompt's last position, full logits, from ONE llama_decode
                           over the prompt (batched prefill)
    p{i}_greedy_ids        int32 (64,)        greedy continuation, one llama_decode per token (as above)
    p{i}_greedy_top_ids/_logits (64, 16)      top 16 of the logits each greedy token was picked from, f32
                           (row 0: the prompt's last position; rows 1..: single-token decodes); the top-2
                           margin of step k is top_logits[k, 0] - top_logits[k, 1]

gemma3_270m.npz   `--only gemma3`: the real Gemma 3 270M Q4_K_M (`refimpl fetch gemma3`), the prompts of PROMPTS and
                  three more, llama.cpp on ONE thread; per prompt p{i}_prompt_ids, p{i}_greedy_ids (32, one
                  llama_decode per token), p{i}_tf_ids (prompt + greedy[:31]) and p{i}_tf_top_ids/_logits
                  (top 16 of every position of ONE batched llama_decode over tf_ids); meta gives each
                  position's SHA-256 of its full f32 logits row (the vocabulary is 262,144: the rows
                  themselves would not fit), the greedy text and the first end-of-generation token

llama_tiny_archs.npz  `--only tiny-archs`: the same for TINY_ARCH_MODELS, llama.cpp architectures that
                 refimpl.models.llama runs besides llama (qwen3: Q/K norms), written by the same writer

gpt_oss_tiny.npz  `--only tiny-gpt-oss`: the same for TINY_GPT_OSS_MODELS, tiny random gpt-oss GGUFs
                 (tests/models/tiny.py's `write_tiny_gpt_oss`: attention sinks, biases, sliding-window
                 layers, a router and MXFP4 or f32 experts), for refimpl.models.gpt_oss

llama_tiny.npz   tiny random Llama GGUFs (tests/models/tiny.py's `write_tiny_llama`, fixed seeds), one per
                 entry of TINY_MODELS: GQA and MHA, tied and untied output, rope bases 1e4 .. 1e6, weights
                 F32, F16, Q8_0, Q4_0. Each file is written to a temporary directory and run through the
                 same loader and settings as the SmolLM2 logits (CPU, n_threads=2, no repacking, flash
                 attention off, f16 KV cache, ONE llama_decode over the whole sequence with logits for
                 every position); "meta" (JSON) records the build, the settings, the load log and, per
                 model, the exact writer arguments and the SHA-256 of the GGUF bytes (the test rewrites
                 the file and checks it before comparing)
    {name}_tokens  int32 (n_tokens,)          the token ids (seeded draw from the model's vocabulary)
    {name}_logits  f32 (n_tokens, n_vocab)    llama.cpp's logits of every position, all of the vocabulary
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import io
import json
import os
import random
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from refimpl import gguf as rgguf  # noqa: E402
from refimpl.fetch import path as model_path  # noqa: E402

LLAMA_CPP_PYTHON = "0.3.36"
TOP_K = 16
N_GREEDY = 32
SEED = 1234
N_THREADS = 2
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden_data")
GOLDENS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "refimpl", "data", "goldens")
PRE_NAMES = ("default", "gpt-2", "llama3", "qwen2", "starcoder")
SPM_USER_DEFINED = ("<tool>", "[INST]")


# ---------------------------------------------------------------------------------------------
# the strings

def golden_strings() -> list[str]:
    s: list[str] = ["", " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", " \n", "\n ", "a", "A", "Hello", " Hello",
                    "Hello world", "Hello, world!", "hello world", "HELLO WORLD", "hELLO wORLD", "Hello World"]
    # whitespace runs inside, before and after words
    for ws in (" ", "\t", "\n", "\r\n", " \n", "\n ", "\t ", " \t", "\n\t"):
        for n in (1, 2, 3, 5, 8):
            run = ws * n
            s += [f"a{run}b", f"{run}a", f"a{run}"]
    s += ["    def f():\n        return 1\n", "\t\tindented\twith\ttabs", "line1\nline2\n\nline4\n\n\n",
          "trailing spaces   \n", "  leading", "a \n b \n\n c", "x\r\ny\rz", "end with space ", "\n\n\nHello"]
    # digits and numbers
    s += ["0", "7", "42", "123", "1234", "12345", "123456789", "1234567890123456789012345", "3.14159265358979",
          "1,000,000", "1 000 000", "2024-01-01T12:34:56Z", "0x1F2E3D", "1e-10", "-42", "+3", "v1.2.3",
          "ISO 8601", "$1,299.99", "50%", "1/2", "10^6", "phone: +1 (555) 123-4567", "a1b2c3", "A100 GPU",
          "٣٤٥ ١٢", "१२३", "²³", "½ ¾", "Ⅻ ⅷ", "① ②", "１２３", "𝟙𝟚𝟛", "round 3 of 10", "1st 2nd 3rd 4th"]
    # contractions and apostrophes
    s += ["I'm", "you're", "they've", "she'll", "he'd", "it's", "don't", "can't", "won't", "I'M", "YOU'RE",
          "It'S", "WE'LL", "'s", "'", "''", "'''", "'ll've", "rock 'n' roll", "O'Neil", "it’s curly",
          "'tis the season", "the dogs' bones", "He said 'hello'", " 's", "x's y'm z're", "'S'T'RE'VE'M'LL'D"]
    # accents and Latin/Greek/Cyrillic
    s += ["café", "naïve", "Zürich", "São Paulo", "Ångström", "cafe\u0301", "ñandú", "Œuvre", "Straße",
          "Tiếng Việt có dấu", "Zażółć gęślą jaźń", "Γειά σου Κόσμε", "Привет, мир!", "İstanbul ıi",
          "Ελληνικά και English", "résumé", "ﬁnance ﬂow", "Å Å Å"]
    # CJK and other scripts
    s += ["你好，世界！", "我爱自然语言处理。", "こんにちは世界", "カタカナとひらがな", "안녕하세요 세계",
          "日本語とEnglishのmix", "中文 English 日本語 한국어", "漢字", "一二三四五六七八九十",
          "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "வணக்கம்", "გამარჯობა",
          "ሰላም ልዑል", "Բարեւ", "English русский 中文 العربية हिन्दी", "ㄅㄆㄇ", "ｶﾀｶﾅ", "Ｈｅｌｌｏ"]
    # emoji
    s += ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "❤️", "🤖 robots", "a😀b", "😀😀😀", "⭐️✨", "🏳️‍🌈",
          "I ❤ NY", "🫨", "🐦‍🔥", "emoji at end 🎉", "🎉 at start", "👩🏾‍💻 coding", "🙂🙃"]
    # code
    s += ['def add(a, b):\n    return a + b\n',
          'for (int i = 0; i < n; ++i) { sum += a[i]; }',
          '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}',
          '<div class="main"><p>Hello &amp; welcome</p></div>',
          r'^\s*(\d{3})-(\d{4})$',
          'ls -la | grep ".py" > out.txt && echo $?',
          "SELECT name, COUNT(*) FROM users WHERE age > 21 GROUP BY name;",
          "# Title\n\n- item 1\n- item 2\n\n```python\nprint('hi')\n```\n",
          "x = [i**2 for i in range(10) if i % 2 == 0]",
          "fn main() -> Result<(), Box<dyn Error>> {\n\tOk(())\n}",
          "if (a != b && c >= d || !e) return;", "a->b; c::d; e=>f; g<=h; i:=j",
          "#include <stdio.h>\nint main(void){printf(\"%d\\n\",42);}", "    \n    \n", "self.__init__()",
          "https://example.com/path?query=1&x=y#frag", "user@example.com", "@user #hashtag", "C:\\Users\\me"]
    # punctuation, math, symbols
    s += ["!!!!!!", "......", "----", "====", "???", "!?", "...", "…", "—", "–", "«»", "“quoted”", "(parens)",
          "[brackets]", "{braces}", "<angle>", "a.b,c;d:e", "∑_{i=1}^n x_i² ≤ ∞", "E=mc²", "α+β=γ", "∀x∃y",
          "→ ← ↑ ↓", "© ® ™", "€ £ ¥ ₹ ₿", "°C", "±", "×÷", "≠≈", "Hello , world .", "wait ! what ?"]
    # Unicode spaces, controls, unassigned and private-use codepoints
    s += ["\u00a0", "a\u00a0b", "a\u00a0\u00a0b", "a\u3000b", "a\u2028b", "a\u2029b", "a\u0085b", "a\x0bb",
          "a\x0cb", "a\x1cb", "a\x1fb", "\x00", "a\x00b", "\x7f", "\x01\x02", "\u200b zero width", "\ufeffBOM",
          "a\u200db", "soft\u00adhyphen", "\u0378", "\ue000", "\U0010ffff", "\ufffe", "\ufffd", "\u2060",
          "a \u00a0b", "a\u00a0 b", "\u1680x", "x\u202fy", "\u205f", "\u0300", "a\u0300\u0301"]
    # special tokens (SmolLM2's), partial and adjacent
    s += ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHello<|im_end|>\n",
          "<|im_start|><|im_end|>", "x<|im_start|>y", "<|im_start", "im_start|>", "<|IM_START|>",
          "<<|im_start|>>", "<|im_start|><|im_start|>", " <|im_end|> ", "<repo_name>foo<file_sep>bar",
          "<jupyter_code>print(1)<jupyter_output>1", "<|endoftext|><|endoftext|>", "<empty_output>",
          "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
          "<|im_start|>assistant\n", "text<|im_end|>", "<|im_end|>text", "<|im_start|> user",
          "<filename>a.py\n<gh_stars>10", "<reponame><reponame>", "<|im_start|>\n\n<|im_end|>", "<|",
          "|>", "<>", "< |im_start| >", "<tool>call</tool>", "[INST] hi [/INST]", "<s>", "</s>"]
    # long texts
    para = ("The quick brown fox jumps over the lazy dog. It's 3:45pm on 2024-06-01, and the temperature "
            "is 23.5°C. \"Well,\" she said, \"I didn't expect THAT!\" They'd been walking for 12 hours... "
            "Meanwhile, in Zürich, naïve coöperation continued.\n\n")
    s += [para, para * 4, "word " * 100, "a" * 300, " " * 64, "\n" * 40, "1" * 100, "😀" * 20,
          "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut "
          "labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco."]
    # seeded random strings from a tricky alphabet
    alphabet = (list(" \t\n") * 4 + list("aeiouxyzAEZ") + list("0123456789") + list("'\".,!?-_()[]{}<>/\\|")
                + ["é", "ü", "ß", "ñ", "你", "好", "日", "本", "한", "ア", "😀", "👍", "🏽", "\u200d", "\u00a0",
                   "\u0301", "ا", "ש", "क", "ไ", "∑", "€", "©", "’", "—", "…", "<|im_start|>", "<|im_end|>",
                   "'s", "'re", "  ", "\r\n", "123", "\u3000", "\x0b"])
    rng = random.Random(20240601)
    for _ in range(120):
        s.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))))
    seen, out = set(), []
    for x in s:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


# ---------------------------------------------------------------------------------------------
# llama-cpp-python: build info, logging, model loading without repacking

def build_info(llama_cpp) -> dict:
    return {"llama_cpp_python": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode(),
            "cmake_args": "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
                          "-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"}


class LogCapture:
    """Route llama.cpp's log into a list (kept for meta) instead of stderr."""

    def __init__(self, llama_cpp):
        self.lines: list[str] = []

        @llama_cpp.llama_log_callback
        def cb(level, text, user_data):
            self.lines.append(text.decode("utf-8", "replace"))

        self._cb = cb              # keep the ctypes callback alive
        llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))

    def text(self) -> str:
        return "".join(self.lines)


def load_llama(path, *, vocab_only: bool, logits_all: bool = False, n_threads: int = N_THREADS):
    """llama_cpp.Llama with extra buffer types (weight repacking) off; returns (llm, settings)."""
    import llama_cpp
    import llama_cpp.llama_cpp as C

    default = C.llama_model_default_params

    def no_repack_params():
        p = default()
        p.use_extra_bufts = False      # no CPU_REPACK buffer: weights stay in their GGUF layout
        return p

    C.llama_model_default_params = no_repack_params
    try:
        settings = dict(vocab_only=vocab_only, use_mmap=True, use_mlock=False, n_gpu_layers=0, seed=SEED,
                        n_ctx=512, n_batch=512, n_ubatch=512, n_threads=n_threads, n_threads_batch=n_threads,
                        logits_all=logits_all, flash_attn=False, offload_kqv=False, verbose=False)
        llm = llama_cpp.Llama(str(path), **settings)
    finally:
        C.llama_model_default_params = default
    settings["use_extra_bufts"] = bool(llm.model_params.use_extra_bufts)
    settings["kv_cache_type"] = "f16 (default type_k/type_v)"
    return llm, settings


def vocab_facts(llm) -> dict:
    import llama_cpp.llama_cpp as C
    v = C.llama_model_get_vocab(llm.model)
    n = C.llama_vocab_n_tokens(v)
    ids = lambda f: (lambda x: None if x < 0 else int(x))(f(v))   # noqa: E731
    facts = {"n_vocab": n, "bos": ids(C.llama_vocab_bos), "eos": ids(C.llama_vocab_eos),
             "eot": ids(C.llama_vocab_eot), "eom": ids(C.llama_vocab_eom) if hasattr(C, "llama_vocab_eom") else None,
             "nl": ids(C.llama_vocab_nl), "pad": ids(C.llama_vocab_pad),
             "add_bos": bool(C.llama_vocab_get_add_bos(v)), "add_eos": bool(C.llama_vocab_get_add_eos(v)),
             "eog": [i for i in range(n) if C.llama_vocab_is_eog(v, i)]}
    buf = ctypes.create_string_buffer(4096)
    for special in (True, False):
        h = hashlib.sha256()
        for i in range(n):
            k = C.llama_token_to_piece(v, i, buf, len(buf), 0, special)
            assert 0 <= k <= len(buf), (i, k)
            h.update(k.to_bytes(4, "little") + buf.raw[:k])
        facts[f"pieces_sha256_special_{str(special).lower()}"] = h.hexdigest()
    return facts


def detokenize(llm, ids: list[int]) -> bytes:
    import llama_cpp.llama_cpp as C
    v = C.llama_model_get_vocab(llm.model)
    arr = (C.llama_token * max(len(ids), 1))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    k = C.llama_detokenize(v, arr, len(ids), buf, size, False, True)
    assert 0 <= k <= size
    return buf.raw[:k]


def tokenize_all(llm, strings, *, special=True, add_bos=False) -> list[list[int]]:
    return [llm.tokenize(s.encode("utf-8"), add_bos=add_bos, special=special) for s in strings]


# ---------------------------------------------------------------------------------------------

def vocab_only_copy(src: str, dst: str, **overrides) -> None:
    """A tensor-less GGUF with src's metadata, some keys replaced (value None deletes the key)."""
    f = rgguf.load(src)
    md = dict(f.metadata)
    vt = dict(f.value_types)
    for k, v in overrides.items():
        if v is None:
            md.pop(k, None)
            vt.pop(k, None)
        else:
            md[k] = v
            vt.pop(k, None)
    rgguf.save(dst, md, {}, value_types=vt)


def train_spm(strings: list[str]):
    """A 1000-piece SentencePiece BPE vocabulary with byte fallback, trained on the strings."""
    import sentencepiece as spm
    corpus = [x for x in strings if x.strip() and "\x00" not in x] * 3
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=model, vocab_size=1000,
                                   model_type="bpe", byte_fallback=True, character_coverage=0.9995,
                                   user_defined_symbols=list(SPM_USER_DEFINED), num_threads=1,
                                   split_digits=True, allow_whitespace_only_pieces=True,
                                   remove_extra_whitespaces=False, normalization_rule_name="identity",
                                   minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        p = sp.id_to_piece(i)
        tokens.append(p)
        scores.append(float(sp.get_score(i)))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                     else 5 if sp.is_unused(i) else 4 if p in SPM_USER_DEFINED else 1)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": sp.bos_id(),
            "tokenizer.ggml.eos_token_id": sp.eos_id(), "tokenizer.ggml.unknown_token_id": sp.unk_id(),
            "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": False,
            "tokenizer.ggml.add_space_prefix": True}


def gen_tokens(model: str, out: str, log: LogCapture) -> None:
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    strings = golden_strings()
    llm, settings = load_llama(model, vocab_only=True)
    ids = tokenize_all(llm, strings, special=True)
    ids_plain = tokenize_all(llm, strings, special=False)
    bos_subset = [s for s in strings if s in ("", "Hello", "<|im_start|>user\nHello<|im_end|>\n", " ")]
    decode = {}
    for s, t in zip(strings, ids):
        d = detokenize(llm, t)
        if d != s.encode("utf-8"):
            decode[s] = d.hex()
    md = rgguf.load(model).metadata
    messages = [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "What is 2+2? Answer with one word."},
                {"role": "assistant", "content": "Four."},
                {"role": "user", "content": "And 3+3? 😀"}]
    tokens = md["tokenizer.ggml.tokens"]
    fmt = Jinja2ChatFormatter(md["tokenizer.chat_template"], eos_token=tokens[md["tokenizer.ggml.eos_token_id"]],
                              bos_token=tokens[md["tokenizer.ggml.bos_token_id"]])
    chat_text = fmt(messages=messages).prompt
    doc = {"about": "llama.cpp tokenization of SmolLM2-135M-Instruct's vocabulary; see "
                    "scripts/gen_llama_goldens.py",
           "build": build_info(llama_cpp), "settings": settings,
           "model": os.path.basename(model), "tokenizer_pre": md.get("tokenizer.ggml.pre"),
           "vocab": vocab_facts(llm),
           "strings": strings, "ids": ids, "ids_plain": ids_plain,
           "ids_add_bos": {s: llm.tokenize(s.encode(), add_bos=True, special=True) for s in bos_subset},
           "decode": decode,
           "chat": {"messages": messages, "add_generation_prompt": True, "text": chat_text,
                    "ids": llm.tokenize(chat_text.encode(), add_bos=False, special=True)}}
    del llm
    write_json(os.path.join(out, "llama_tokens_smollm2.json"), doc)

    pre = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in PRE_NAMES:
            p = os.path.join(tmp, f"pre-{name}.gguf")
            vocab_only_copy(model, p, **{"tokenizer.ggml.pre": name})
            llm, _ = load_llama(p, vocab_only=True)
            pre_ids = tokenize_all(llm, strings, special=True)
            dec = {s: detokenize(llm, t) for s, t in zip(strings, pre_ids)}
            pre[name] = {"ids": pre_ids,
                         "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(llm.model))),
                         "decode": {s: d.hex() for s, d in dec.items() if d != s.encode("utf-8")}}
            del llm
        spm_md = train_spm(strings)
        p = os.path.join(tmp, "spm.gguf")
        overrides = {k: None for k in md if k.startswith("tokenizer.")}
        overrides.update({"llama.vocab_size": None, **spm_md})
        vocab_only_copy(model, p, **overrides)
        llm, _ = load_llama(p, vocab_only=True)
        spm = {"metadata": spm_md, "vocab": vocab_facts(llm)}
        for add in (True, False):
            for special in (True, False):
                spm[f"ids_add_{str(add).lower()}_special_{str(special).lower()}"] = \
                    tokenize_all(llm, strings, special=special, add_bos=add)
        spm["decode"] = {s: detokenize(llm, t).hex()
                         for s, t in zip(strings, spm["ids_add_false_special_true"])}
        del llm
    doc = {"about": "llama.cpp tokenization with other pre-tokenizers (SmolLM2's vocabulary relabelled) "
                    "and a toy SentencePiece vocabulary; see scripts/gen_llama_goldens.py",
           "build": build_info(llama_cpp), "strings": strings, "pre": pre, "spm": spm}
    write_json(os.path.join(out, "llama_tokens_pre.json"), doc)


def top_k(logits: np.ndarray, k: int = TOP_K):
    idx = np.argsort(-logits, axis=-1, kind="stable")[..., :k]
    return idx.astype(np.int32), np.take_along_axis(logits, idx, axis=-1).astype(np.float32)


PROMPTS = [
    ("plain", "The capital of France is"),
    ("chat", None),    # rendered from the chat template
    ("code", "def fibonacci(n):\n    "),
    ("story", "Once upon a time, in a small village nestled between two mountains, there lived"),
    ("digits", "1, 2, 3, 4, 5, 6,"),
]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def gen_logits(model: str, out: str, log: LogCapture) -> None:
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    md = rgguf.load(model).metadata
    tokens = md["tokenizer.ggml.tokens"]
    fmt = Jinja2ChatFormatter(md["tokenizer.chat_template"], eos_token=tokens[md["tokenizer.ggml.eos_token_id"]],
                              bos_token=tokens[md["tokenizer.ggml.bos_token_id"]])
    n0 = len(log.lines)
    llm, settings = load_llama(model, vocab_only=False, logits_all=True)
    load_log = [ln for ln in "".join(log.lines[n0:]).splitlines()
                if "buffer size" in ln or "REPACK" in ln or "repack" in ln or "extra" in ln]
    v = llama_cpp.llama_model_get_vocab(llm.model)
    arrays, prompts = {}, []
    for i, (name, text) in enumerate(PROMPTS):
        if text is None:
            text = fmt(messages=CHAT).prompt
        ids = llm.tokenize(text.encode(), add_bos=True, special=True)   # add_bos: as the GGUF says (no BOS)
        n = len(ids)
        llm.reset()
        llm.eval(ids)                                   # one llama_decode over the prompt
        logits = np.array(llm.scores[:n], dtype=np.float32)
        greedy, g_logits = [], [logits[-1]]
        for k in range(N_GREEDY):
            t = int(np.argmax(g_logits[-1]))
            greedy.append(t)
            if k + 1 < N_GREEDY:
                llm.eval([t])                           # one llama_decode per token
                g_logits.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
        tf_ids = ids + greedy[:-1]
        llm.reset()
        llm.eval(tf_ids)                                # one llama_decode over prompt + continuation
        tf = np.array(llm.scores[:len(tf_ids)], dtype=np.float32)
        tf_argmax = tf[n - 1:].argmax(-1).tolist()
        eog = [k for k, t in enumerate(greedy) if llama_cpp.llama_vocab_is_eog(v, t)]
        p = f"p{i}_"
        arrays[p + "prompt_ids"] = np.array(ids, np.int32)
        arrays[p + "top_ids"], arrays[p + "top_logits"] = top_k(logits)
        arrays[p + "last_logits"] = logits[-1].astype(np.float16)
        arrays[p + "greedy_ids"] = np.array(greedy, np.int32)
        arrays[p + "greedy_top_ids"], arrays[p + "greedy_top_logits"] = top_k(np.stack(g_logits))
        arrays[p + "tf_ids"] = np.array(tf_ids, np.int32)
        arrays[p + "tf_top_ids"], arrays[p + "tf_top_logits"] = top_k(tf)
        prompts.append({"name": name, "text": text, "n_prompt": n, "messages": CHAT if name == "chat" else None,
                        "greedy_text": detokenize(llm, greedy).decode("utf-8", "replace"),
                        "first_eog": eog[0] if eog else None,
                        "tf_argmax_matches_greedy": tf_argmax == greedy,
                        "tf_argmax_mismatches": [k for k, (a, b) in enumerate(zip(tf_argmax, greedy)) if a != b],
                        "prompt_vs_tf_max_abs_diff": float(np.abs(tf[:n] - logits).max()),
                        "greedy_vs_tf_top1_max_abs_diff": float(np.abs(
                            np.stack(g_logits).max(-1) - tf[n - 1:].max(-1)).max())})
    meta = {"about": "llama.cpp logits of SmolLM2-135M-Instruct Q4_1; see scripts/gen_llama_goldens.py",
            "build": build_info(llama_cpp), "settings": settings, "model": os.path.basename(model),
            "model_sha256": sha256_file(model), "top_k": TOP_K, "n_greedy": N_GREEDY,
            "path": "llama.cpp CPU backend (ggml-cpu AVX2/FMA/F16C, GGML_USE_LLAMAFILE sgemm compiled in), "
                    "no weight repacking (use_extra_bufts=False), flash attention off, KV cache f16, "
                    "one llama_decode per prompt (batched prefill, logits for all positions), "
                    "one micro-batch (n_ubatch=512)",
            "load_log": load_log, "prompts": prompts}
    del llm
    path = os.path.join(GOLDENS, "llama_logits_smollm2.npz")     # shipped with refimpl: the notebooks read it
    np.savez_compressed(path, meta=np.array(json.dumps(meta, ensure_ascii=False)), **arrays)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


N_GREEDY_LONG = 64


def gen_greedy64(model: str, out: str, log: LogCapture) -> None:
    """llama_greedy64_smollm2.npz: N_GREEDY_LONG greedy tokens per prompt, the top-16 logits of every
    step and the prompt's full last-position logits in f32 (the faithful-mode goldens)."""
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    md = rgguf.load(model).metadata
    tokens = md["tokenizer.ggml.tokens"]
    fmt = Jinja2ChatFormatter(md["tokenizer.chat_template"], eos_token=tokens[md["tokenizer.ggml.eos_token_id"]],
                              bos_token=tokens[md["tokenizer.ggml.bos_token_id"]])
    n0 = len(log.lines)
    llm, settings = load_llama(model, vocab_only=False, logits_all=True)
    load_log = [ln for ln in "".join(log.lines[n0:]).splitlines()
                if "buffer size" in ln or "REPACK" in ln or "repack" in ln or "extra" in ln]
    assert not settings["use_extra_bufts"]
    v = llama_cpp.llama_model_get_vocab(llm.model)
    arrays, prompts = {}, []
    for i, (name, text) in enumerate(PROMPTS):
        if text is None:
            text = fmt(messages=CHAT).prompt
        ids = llm.tokenize(text.encode(), add_bos=True, special=True)
        n = len(ids)
        llm.reset()
        llm.eval(ids)                                   # one llama_decode over the prompt
        step = [np.array(llm.scores[n - 1], dtype=np.float32)]
        greedy = []
        for k in range(N_GREEDY_LONG):
            t = int(np.argmax(step[-1]))
            greedy.append(t)
            if k + 1 < N_GREEDY_LONG:
                llm.eval([t])                           # one llama_decode per token
                step.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
        top_ids, top_logits = top_k(np.stack(step))
        margins = top_logits[:, 0] - top_logits[:, 1]
        eog = [k for k, t in enumerate(greedy) if llama_cpp.llama_vocab_is_eog(v, t)]
        p = f"p{i}_"
        arrays[p + "prompt_ids"] = np.array(ids, np.int32)
        arrays[p + "last_logits"] = step[0]
        arrays[p + "greedy_ids"] = np.array(greedy, np.int32)
        arrays[p + "greedy_top_ids"], arrays[p + "greedy_top_logits"] = top_ids, top_logits
        prompts.append({"name": name, "text": text, "n_prompt": n, "messages": CHAT if name == "chat" else None,
                        "greedy_text": detokenize(llm, greedy).decode("utf-8", "replace"),
                        "first_eog": eog[0] if eog else None,
                        "min_top2_margin": float(margins.min()), "min_top2_margin_step": int(margins.argmin())})
    meta = {"about": f"llama.cpp's {N_GREEDY_LONG} greedy tokens of SmolLM2-135M-Instruct Q4_1 per prompt; see "
                     "scripts/gen_llama_goldens.py",
            "build": build_info(llama_cpp), "settings": settings, "model": os.path.basename(model),
            "model_sha256": sha256_file(model), "top_k": TOP_K, "n_greedy": N_GREEDY_LONG,
            "path": "llama.cpp CPU backend (ggml-cpu AVX2/FMA/F16C, GGML_USE_LLAMAFILE sgemm compiled in), "
                    "no weight repacking (use_extra_bufts=False), flash attention off, KV cache f16, "
                    "one llama_decode over the prompt, then one per greedy token",
            "load_log": load_log, "prompts": prompts}
    del llm
    path = os.path.join(out, "llama_greedy64_smollm2.npz")
    np.savez_compressed(path, meta=np.array(json.dumps(meta, ensure_ascii=False)), **arrays)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


# name -> write_tiny_llama arguments; what each covers is in its name (n_head x n_head_kv, output, rope base)
TINY_MODELS = {
    "f32_gqa4x2_untied_rope5e4": dict(n_vocab=96, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96,
                                      rope_base=50000.0, tied=False, wtype="f32", seed=0),
    "f32_mha4_tied_rope1e4": dict(n_vocab=96, n_embd=64, n_layer=2, n_head=4, n_head_kv=4, n_ff=96,
                                  rope_base=10000.0, tied=True, wtype="f32", seed=1),
    "f16_gqa4x1_tied_rope1e4": dict(n_vocab=128, n_embd=64, n_layer=2, n_head=4, n_head_kv=1, n_ff=128,
                                    rope_base=10000.0, tied=True, wtype="f16", seed=2),
    "q8_0_gqa4x2_untied_rope5e5": dict(n_vocab=96, n_embd=64, n_layer=3, n_head=4, n_head_kv=2, n_ff=96,
                                       rope_base=500000.0, tied=False, wtype="q8_0", seed=3),
    "q4_0_gqa8x2_tied_rope1e6": dict(n_vocab=300, n_embd=64, n_layer=2, n_head=8, n_head_kv=2, n_ff=128,
                                     rope_base=1000000.0, tied=True, wtype="q4_0", seed=4),
}
TINY_N_TOKENS = 32
TINY_TOKEN_SEED = 1234


def tiny_tokens(n_vocab: int) -> np.ndarray:
    """The fixed sequence: TINY_N_TOKENS ids drawn with a fixed seed, plus a repeat (attention to an equal key)."""
    t = np.random.default_rng(TINY_TOKEN_SEED).integers(0, n_vocab, TINY_N_TOKENS).astype(np.int32)
    t[TINY_N_TOKENS // 2] = t[3]
    return t


# llama.cpp architectures refimpl.models.llama runs besides llama (the same writer, arch=...)
TINY_ARCH_MODELS = {
    "qwen3_f32_gqa4x2_untied": dict(n_vocab=96, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96,
                                    rope_base=1000000.0, tied=False, wtype="f32", seed=10, arch="qwen3"),
    "qwen3_q8_0_mha4_tied": dict(n_vocab=128, n_embd=64, n_layer=3, n_head=4, n_head_kv=4, n_ff=128,
                                 rope_base=1000000.0, tied=True, wtype="q8_0", seed=11, arch="qwen3"),
}


# gpt-oss (refimpl.models.gpt_oss): tests/models/tiny.py's write_tiny_gpt_oss; what each covers is in its name
# (expert type, n_head x n_head_kv, experts used of all, sliding window); 32 tokens, so the window is crossed
TINY_GPT_OSS_MODELS = {
    "gptoss_mxfp4_gqa4x2_top2of4_swa8": dict(n_vocab=96, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=24,
                                            n_expert=4, n_expert_used=2, n_ff_exp=64, n_swa=8, rope_base=150000.0,
                                            expert_type="mxfp4", seed=20),
    "gptoss_mxfp4_mha4_top4of8_swa16_3layers": dict(n_vocab=128, n_embd=64, n_layer=3, n_head=4, n_head_kv=4,
                                                    head_dim=16, n_expert=8, n_expert_used=4, n_ff_exp=32,
                                                    n_swa=16, rope_base=10000.0, expert_type="mxfp4", seed=21),
    "gptoss_f32_gqa4x1_top1of4_swa4": dict(n_vocab=96, n_embd=64, n_layer=2, n_head=4, n_head_kv=1, head_dim=32,
                                          n_expert=4, n_expert_used=1, n_ff_exp=64, n_swa=4, rope_base=150000.0,
                                          expert_type="f32", seed=22),
    # RoPE scaling "yarn" with the released files' factor 32, over an original context shorter than the tokens
    "gptoss_mxfp4_gqa4x2_top2of4_swa8_yarn32": dict(n_vocab=96, n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
                                                   head_dim=24, n_expert=4, n_expert_used=2, n_ff_exp=64, n_swa=8,
                                                   rope_base=150000.0, expert_type="mxfp4", seed=23,
                                                   yarn=(32.0, 16)),
}


def gen_tiny(out: str, log: LogCapture, models_in: dict | None = None, fname: str = "llama_tiny.npz",
             writer_name: str = "write_tiny_llama") -> None:
    import llama_cpp
    from tests.models import tiny
    write_tiny_llama = getattr(tiny, writer_name)

    arrays, models, load_log, settings = {}, [], [], None
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in (TINY_MODELS if models_in is None else models_in).items():
            p = os.path.join(tmp, f"{name}.gguf")
            write_tiny_llama(p, **args)
            n0 = len(log.lines)
            llm, settings = load_llama(p, vocab_only=False, logits_all=True)
            lines = [ln for ln in "".join(log.lines[n0:]).splitlines()
                     if "buffer size" in ln or "REPACK" in ln or "repack" in ln or "extra" in ln]
            load_log += [f"{name}: {ln}" for ln in lines]
            assert not settings["use_extra_bufts"]
            n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llm.model))
            assert n_vocab == args["n_vocab"], (name, n_vocab)
            tokens = tiny_tokens(args["n_vocab"])
            llm.reset()
            llm.eval(tokens.tolist())                   # one llama_decode, logits for every position
            logits = np.array(llm.scores[:len(tokens)], dtype=np.float32)
            del llm
            assert logits.shape == (len(tokens), args["n_vocab"]) and np.isfinite(logits).all()
            arrays[f"{name}_tokens"] = tokens
            arrays[f"{name}_logits"] = logits
            models.append({"name": name, "writer_args": args, "gguf_sha256": sha256_file(p),
                           "gguf_bytes": os.path.getsize(p), "n_tokens": len(tokens)})
    meta = {"about": f"llama.cpp logits of tiny random GGUFs (tests/models/tiny.py {writer_name}); see "
                     "scripts/gen_llama_goldens.py",
            "build": build_info(llama_cpp), "settings": settings, "writer": f"tests.models.tiny.{writer_name}",
            "tokens": f"numpy default_rng({TINY_TOKEN_SEED}).integers(0, n_vocab, {TINY_N_TOKENS}), "
                      f"token {TINY_N_TOKENS // 2} set to token 3",
            "path": "llama.cpp CPU backend (ggml-cpu AVX2/FMA/F16C, GGML_USE_LLAMAFILE sgemm compiled in), "
                    "no weight repacking (use_extra_bufts=False), flash attention off, KV cache f16, "
                    "one llama_decode per sequence (logits for all positions), one micro-batch (n_ubatch=512)",
            "load_log": load_log, "models": models}
    path = os.path.join(out, fname)
    np.savez_compressed(path, meta=np.array(json.dumps(meta)), **arrays)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_json(path: str, doc: dict) -> None:
    text = json.dumps(doc, ensure_ascii=True, separators=(",", ":"))   # ASCII: every codepoint escaped
    with open(path, "w") as f:
        f.write(text + "\n")
    print(f"wrote {path} ({len(text)} bytes)")


GEMMA3_PROMPTS = PROMPTS + [
    ("question", "Q: Why is the sky blue?\nA:"),
    ("list", "Three things to pack for a beach holiday:\n1."),
    ("translation", "English: Good morning, how are you?\nFrench:"),
]


def gen_gemma3(model: str, out: str, log: LogCapture) -> None:
    """gemma3_270m.npz: llama.cpp on the real Gemma 3 270M (`refimpl fetch gemma3`), one thread (bit-level
    goldens), every prompt of GEMMA3_PROMPTS: the prompt's ids, 32 greedy tokens (one llama_decode per token),
    then ONE batched llama_decode over prompt + greedy[:31] (teacher forcing) with its top-16 logits and the
    SHA-256 of every position's full f32 logits row (262,144 values each: too many to store, enough to check
    refimpl's numerics="ggml" bit for bit)."""
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    md = rgguf.load(model).metadata
    tokens = md["tokenizer.ggml.tokens"]
    if md.get("tokenizer.chat_template"):
        fmt = Jinja2ChatFormatter(md["tokenizer.chat_template"], eos_token=tokens[md["tokenizer.ggml.eos_token_id"]],
                                  bos_token=tokens[md["tokenizer.ggml.bos_token_id"]])
    else:                 # the 270M GGUF carries no template: Gemma's turn format, written out (no BOS: added)
        fmt = lambda messages: type("P", (), {"prompt": "".join(   # noqa: E731
            f"<start_of_turn>{'model' if m['role'] == 'assistant' else m['role']}\n{m['content']}<end_of_turn>\n"
            for m in messages) + "<start_of_turn>model\n"})
    n0 = len(log.lines)
    llm, settings = load_llama(model, vocab_only=False, logits_all=True, n_threads=1)
    load_log = [ln for ln in "".join(log.lines[n0:]).splitlines()
                if "buffer size" in ln or "REPACK" in ln or "repack" in ln or "extra" in ln or "swa" in ln.lower()]
    v = llama_cpp.llama_model_get_vocab(llm.model)
    arrays, prompts = {}, []
    for i, (name, text) in enumerate(GEMMA3_PROMPTS):
        if text is None:
            text = fmt(messages=CHAT).prompt
        ids = llm.tokenize(text.encode(), add_bos=True, special=True)
        n = len(ids)
        llm.reset()
        llm.eval(ids)
        greedy = [int(np.argmax(llm.scores[n - 1]))]
        for _ in range(N_GREEDY - 1):
            llm.eval([greedy[-1]])
            greedy.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        tf_ids = ids + greedy[:-1]
        llm.reset()
        llm.eval(tf_ids)
        tf = np.array(llm.scores[:len(tf_ids)], dtype=np.float32)
        tf_argmax = tf[n - 1:].argmax(-1).tolist()
        eog = [k for k, t in enumerate(greedy) if llama_cpp.llama_vocab_is_eog(v, t)]
        p = f"p{i}_"
        arrays[p + "prompt_ids"] = np.array(ids, np.int32)
        arrays[p + "greedy_ids"] = np.array(greedy, np.int32)
        arrays[p + "tf_ids"] = np.array(tf_ids, np.int32)
        arrays[p + "tf_top_ids"], arrays[p + "tf_top_logits"] = top_k(tf)
        prompts.append({"name": name, "text": text, "n_prompt": n, "messages": CHAT if name == "chat" else None,
                        "greedy_text": detokenize(llm, greedy).decode("utf-8", "replace"),
                        "first_eog": eog[0] if eog else None,
                        "tf_argmax_mismatches": [k for k, (a, b) in enumerate(zip(tf_argmax, greedy)) if a != b],
                        "tf_row_sha256": [hashlib.sha256(np.ascontiguousarray(r).tobytes()).hexdigest() for r in tf]})
    meta = {"about": "llama.cpp logits of Gemma 3 270M Q4_K_M; see scripts/gen_llama_goldens.py --only gemma3",
            "build": build_info(llama_cpp), "settings": settings, "model": os.path.basename(model),
            "model_sha256": sha256_file(model), "top_k": TOP_K, "n_greedy": N_GREEDY,
            "path": "llama.cpp CPU backend (ggml-cpu AVX2/FMA/F16C, GGML_USE_LLAMAFILE sgemm compiled in), one "
                    "thread, no weight repacking (use_extra_bufts=False), flash attention off, KV cache f16, "
                    "greedy: one llama_decode per token; teacher forcing: one llama_decode over prompt + "
                    "greedy[:31] (one micro-batch, n_ubatch=512)",
            "load_log": load_log, "prompts": prompts}
    del llm
    path = os.path.join(out, "gemma3_270m.npz")
    np.savez_compressed(path, meta=np.array(json.dumps(meta, ensure_ascii=False)), **arrays)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(model_path("smollm2")))
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--only", choices=("tokens", "logits", "tiny", "tiny-archs", "tiny-gpt-oss", "greedy64", "gemma3"))
    ap.add_argument("--gemma3", default=str(model_path("gemma3")), help="the Gemma 3 270M GGUF (refimpl fetch gemma3)")
    args = ap.parse_args()
    import llama_cpp
    if llama_cpp.__version__ != LLAMA_CPP_PYTHON:
        print(f"warning: llama-cpp-python {llama_cpp.__version__}, goldens were made with {LLAMA_CPP_PYTHON}",
              file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    log = LogCapture(llama_cpp)
    if args.only in (None, "tokens"):
        gen_tokens(args.model, args.out, log)
    if args.only in (None, "logits"):
        gen_logits(args.model, args.out, log)
    if args.only in (None, "tiny"):
        gen_tiny(args.out, log)
    if args.only in (None, "tiny-archs"):
        gen_tiny(args.out, log, TINY_ARCH_MODELS, "llama_tiny_archs.npz")
    if args.only in (None, "tiny-gpt-oss"):
        gen_tiny(args.out, log, TINY_GPT_OSS_MODELS, "gpt_oss_tiny.npz", "write_tiny_gpt_oss")
    if args.only in (None, "greedy64"):
        gen_greedy64(args.model, args.out, log)
    if args.only in (None, "gemma3"):
        gen_gemma3(args.gemma3, args.out, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
