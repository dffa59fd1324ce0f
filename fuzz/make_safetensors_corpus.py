#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_safetensors into fuzz/corpus/safetensors/ (committed; rerun after
changing this script). Standard library only: the files are built byte by byte, a few valid ones in
the layout Python safetensors writes and a few that break one rule each.
  usage: python3 fuzz/make_safetensors_corpus.py
"""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors")
BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
        "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
        "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}
ORDER = list(BITS)  # the safetensors Dtype enum order


def image(header_text, data, declared=None, pad=True):
    h = header_text.encode("utf-8") if isinstance(header_text, str) else header_text
    if pad:
        h += b" " * (-len(h) % 8)
    n = len(h) if declared is None else declared
    return struct.pack("<Q", n) + h + data


def valid(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape); written in the writer's order with patterned data."""
    tensors = sorted(tensors, key=lambda t: (-ORDER.index(t[1]), t[0]))
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * BITS[dtype] // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":"))
    return image(text, bytes((i * 37 + 11) & 0xFF for i in range(offset)), pad=pad)


def entry(name, dtype, shape, begin, end):
    return '"%s":{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}' % (name, dtype, json.dumps(shape), begin, end)


CASES = {
    # valid
    "valid_empty": valid([]),
    "valid_scalar_f32": valid([("x", "F32", [])], {"format": "pt"}),
    "valid_nvfp4_linear": valid([("l.weight", "U8", [4, 8]), ("l.weight_scale", "F8_E4M3", [4, 1]),
                                 ("l.weight_scale_2", "F32", []), ("l.input_scale", "F32", [])], {"format": "pt"}),
    "valid_mixed_dtypes": valid([("b", "BF16", [2, 3]), ("i", "I64", [2]), ("f4", "F4", [2, 2]),
                                 ("f6", "F6_E2M3", [4]), ("z", "F16", [0, 3]), ("c", "C64", [1])]),
    "valid_unpadded": valid([("a", "U8", [3]), ("b", "I16", [1])], pad=False),
    "valid_all_dtypes": valid([("t_" + d, d, [8]) for d in ORDER]),
    # invalid, one rule each
    "bad_short": b"\x08\x00\x00",
    "bad_header_past_eof": image('{"a":1}', b"", declared=64),
    "bad_not_json": image('{"a":{"dtype":"U8",', b""),
    "bad_not_object": image("[1,2,3]", b""),
    "bad_dtype": image("{" + entry("a", "F33", [2], 0, 2) + "}", b"\x00\x01"),
    "bad_shape": image("{" + entry("a", "U8", [-2], 0, 0) + "}", b""),
    "bad_overlap": image("{" + entry("a", "U8", [4], 0, 4) + "," + entry("b", "U8", [4], 2, 6) + "}", b"\x00" * 6),
    "bad_gap": image("{" + entry("a", "U8", [2], 0, 2) + "," + entry("b", "U8", [2], 4, 6) + "}", b"\x00" * 6),
    "bad_size": image("{" + entry("a", "F32", [2], 0, 4) + "}", b"\x00" * 4),
    "bad_duplicate": image("{" + entry("a", "U8", [1], 0, 1) + "," + entry("a", "U8", [1], 1, 2) + "}", b"\x00\x00"),
    "bad_metadata": image('{"__metadata__":{"format":1}}', b""),
    "bad_utf8": image(b'{"\xff":1}', b""),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        os.remove(os.path.join(OUT, name))
    for name, data in sorted(CASES.items()):
        with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
            f.write(data)
    print("wrote %d files to %s" % (len(CASES), OUT))


if __name__ == "__main__":
    main()
