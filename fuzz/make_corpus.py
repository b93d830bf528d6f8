#!/usr/bin/env python3
"""Writes the seed corpora fuzz/corpus/<target>/: a few valid files of each
format and a few near-valid ones (one field or byte off), from which libFuzzer
mutates. Deterministic; run it again after a format changes:
    python3 fuzz/make_corpus.py
The module and optimizer seeds match the module and parameters of
fuzz_safetensors_module.cpp and fuzz_safetensors_optimizer.cpp."""
import json
import math
import shutil
import struct
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"
FORMATS = {"F32": "f", "F64": "d", "I64": "q", "F16": "e"}


def pack(dtype, values):
    """values as dtype's little-endian bytes; BF16 keeps float32's high half (rounded to nearest even)."""
    if dtype == "BF16":
        out = b""
        for v in values:
            (u,) = struct.unpack("<I", struct.pack("<f", v))
            if (u & 0x7F800000) != 0x7F800000:  # inf and NaN keep their bits
                u += 0x7FFF + ((u >> 16) & 1)
            out += struct.pack("<H", (u >> 16) & 0xFFFF)
        return out
    return struct.pack("<%d%s" % (len(values), FORMATS[dtype]), *values)


def safetensors(tensors, metadata=None, pad=True):
    """tensors: [(name, dtype, shape, values)] in data order."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, values in tensors:
        blob = pack(dtype, values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def values(n, scale=0.25):
    return [scale * math.sin(1 + i) for i in range(n)]


def module_state(dtype="F32"):
    return [("fc.weight", dtype, [2, 3], values(6)), ("fc.bias", dtype, [2], values(2)),
            ("norm.weight", dtype, [2], [1.0, 1.0]), ("norm.bias", dtype, [2], [0.0, 0.0]),
            ("seen", "I64", [2], [3, 4])]


def optimizer_state(buffers, steps=1):
    shapes = [[2, 3], [2], []]
    out = [("steps", "I64", [], [steps]), ("groups", "I64", [1], [3]), ("0.lr", "F64", [], [1e-3])]
    for i, shape in enumerate(shapes):
        n = math.prod(shape)
        out.append((f"0.{i}.step", "I64", [], [steps]))
        out += [(f"0.{i}.{b}", "F32", shape, values(n, 0.01 * (k + 1))) for k, b in enumerate(buffers)]
    return out


def word2vec(words, dim, binary):
    out = b"%d %d\n" % (len(words), dim)
    for i, w in enumerate(words):
        row = [math.sin(1 + 3 * i + c) for c in range(dim)]
        if binary:
            out += w.encode() + b" " + struct.pack("<%df" % dim, *row) + b"\n"
        else:
            out += (w + "".join(" %.6g" % x for x in row) + "\n").encode()
    return out


def seeds():
    adam = {"tapegrad.optimizer": "Adam"}
    sgd = {"tapegrad.optimizer": "SGD"}
    two = [("a", "F32", [2, 3], values(6)), ("b", "F64", [2], values(2)), ("c", "I64", [], [7])]
    yield "safetensors", "tensors", safetensors(two, {"step": "100"})
    yield "safetensors", "empty", safetensors([])
    yield "safetensors", "zero_size", safetensors([("z", "F32", [0, 4], []), ("one", "F32", [1], [1.0])])
    yield "safetensors", "unpadded", safetensors(two, pad=False)
    yield "safetensors", "truncated", safetensors(two)[:-3]
    yield "safetensors", "f16", safetensors(two).replace(b'"F64"', b'"F16"')
    half = [("a", "BF16", [2, 3], values(6)), ("b", "F16", [2], values(2)), ("c", "I64", [], [7]),
            ("d", "F32", [1], [1.0])]
    yield "safetensors", "bf16_f16", safetensors(half, {"step": "100"})
    yield "safetensors", "bf16_f16_special", safetensors([("z", "F16", [0, 4], []),
                                                          ("x", "F16", [5], [6e-8, -0.0, 65504.0, math.inf, math.nan]),
                                                          ("y", "BF16", [4], [3e38, -math.inf, math.nan, 1e-40])])
    yield "safetensors", "bf16_misspan", safetensors(half).replace(b'"BF16"', b'"F32" ', 1)  # same length: the span is off
    yield "safetensors", "overlap", safetensors(two).replace(b'"data_offsets":[24,40]', b'"data_offsets":[20,36]')
    yield "safetensors_module", "f32", safetensors(module_state(), {"step": "3"})
    yield "safetensors_module", "f64", safetensors(module_state("F64"))
    yield "safetensors_module", "missing_key", safetensors(module_state()[1:])
    yield "safetensors_module", "misshaped", safetensors([("fc.weight", "F32", [3, 2], values(6))] + module_state()[1:])
    yield "safetensors_module", "int_weight", safetensors([("fc.weight", "I64", [2, 3], list(range(6)))] +
                                                          module_state()[1:])
    yield "safetensors_optimizer", "adam", safetensors(optimizer_state(["exp_avg", "exp_avg_sq"]), adam)
    yield "safetensors_optimizer", "adam_fresh", safetensors(optimizer_state([])[:3], adam)
    yield "safetensors_optimizer", "sgd_momentum", safetensors(optimizer_state(["momentum_buffer"], 5), sgd)
    yield "safetensors_optimizer", "adam_as_sgd", safetensors(optimizer_state(["exp_avg", "exp_avg_sq"]), sgd)
    yield "safetensors_optimizer", "no_name", safetensors(optimizer_state(["momentum_buffer"]), {})
    chars = sorted(set("The quick brown fox jumps over the lazy dog.\n é—€"))
    char_file = {"type": "char", "version": 1, "chars": chars}
    yield "tokenizer", "char", json.dumps(char_file, ensure_ascii=False).encode()
    yield "tokenizer", "char_escaped", json.dumps(char_file).encode()
    yield "tokenizer", "char_unsorted", json.dumps({**char_file, "chars": chars[::-1]}).encode()
    bpe = {"type": "bpe", "version": 1, "pretokenizer": "chunks-v1",
           "merges": [[116, 104], [256, 101], [32, 257], [105, 110], [259, 103], [32, 97]]}
    yield "tokenizer", "bpe", json.dumps(bpe).encode()
    yield "tokenizer", "bpe_empty", json.dumps({**bpe, "merges": []}).encode()
    yield "tokenizer", "bpe_forward_ref", json.dumps({**bpe, "merges": [[256, 256]]}).encode()
    yield "tokenizer", "bpe_version2", json.dumps({**bpe, "version": 2}).encode()
    words = ["the", "king", "queen", "man", "woman", "paris"]
    yield "word2vec_text", "vectors", word2vec(words, 4, False)
    yield "word2vec_text", "crlf", word2vec(words, 3, False).replace(b"\n", b"\r\n")
    yield "word2vec_text", "long_and_short_rows", word2vec(words, 4, False).replace(b"\nking", b" 1\nking", 1)[:-12]
    yield "word2vec_text", "huge_count", b"75555557 1\nthe 0.5\n"
    yield "word2vec_binary", "vectors", word2vec(words, 4, True)
    yield "word2vec_binary", "no_newlines", word2vec(words, 2, True).replace(b"\n", b"")
    yield "word2vec_binary", "truncated", word2vec(words, 4, True)[:-7]
    yield "word2vec_binary", "huge_dim", b"1 4611686018427387904\nthe \x00\x00\x80?\n"
    yield "similarity", "wordsim", (b"# Word 1\tWord 2\tHuman (mean)\nking\tqueen\t8.58\nman\twoman\t8.3\n"
                                    b"cat\tdog\t7.35\nParis\tfrance\t9.1\ncar\tunknown\t1.0\n")
    yield "similarity", "simlex_header", b"word1 word2 SimLex999\nKING queen 6.5\nberlin germany 8\nthe car 0.3\n"
    yield "similarity", "nan_score", b"king queen nan\nman woman inf\ncat dog 1e400\n"
    yield "similarity", "two_fields", b"king queen\n"
    yield "analogy", "questions", (b": capital-common-countries\nparis france berlin germany\n"
                                   b"Berlin Germany Paris France\n: family\nman woman king queen\n"
                                   b"king queen man woman\ncat dog unknown car\n")
    yield "analogy", "no_section", b"man woman king queen\n"
    yield "analogy", "three_words", b": s\nman woman king\n"
    text = "The first paragraph.\nStill the first.\n\n  \t\nThe second — with UTF-8.\r\n\r\nThird.\n"
    yield "text", "paragraphs", text.encode()
    yield "text", "bom", b"\xef\xbb\xbf" + text.encode()
    yield "text", "invalid_utf8", b"ok\n\nbad \xc0\xaf overlong\n"
    yield "text", "surrogate", b"a \xed\xa0\x80 b\n"
    yield "text", "blank", b" \n\t\n"
    yield "brown", "ca01", (b"\n\n\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd ,/, ``/`` "
                            b"an/at investigation/nn ''/'' ./.\n\n\n\tThe/at 1/2/cd jury/nn (/( further/rbr )/) "
                            b"said/vbd //in term-end/nn ;/.\n")
    yield "brown", "no_tag", b"\tThe/at jury said/vbd\n"
    yield "brown", "empty_tag", b"\tThe/ jury/nn\n"
    yield "brown", "blank", b"\n\n"


def main():
    if CORPUS.exists():
        shutil.rmtree(CORPUS)
    for target, name, data in seeds():
        path = CORPUS / target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    print(f"wrote {sum(1 for _ in CORPUS.rglob('*') if _.is_file())} seeds under {CORPUS}")


if __name__ == "__main__":
    main()
