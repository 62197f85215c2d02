"""A minimal GGUF (v3) metadata reader and streaming writer for the benchmark tools.

Only what benches/real_shapes.py needs: read a file's metadata (keys with their GGUF value
types, so arrays round-trip exactly) and tensor table; write a new file whose tensor data
is produced tensor by tensor (a multi-gigabyte file never sits in memory). Standard library
only, so the benchmark tools run on a fresh machine. The format is GGUF's as documented in
ggml's docs/gguf.md: little-endian, header, key/value pairs, tensor infos, data aligned to
`general.alignment` (default 32).
"""
import struct

# GGUF value types (gguf.md, "gguf_metadata_value_type").
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
           BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}

# ggml tensor types used here: (id, block size, bytes per block), from ggml.h / ggml.c
# type_traits.
GGML_F32 = (0, 1, 4)
GGML_F16 = (1, 1, 2)
GGML_Q8_0 = (8, 32, 34)
# Block layouts of the types a published checkpoint holds (ggml.c type_traits): id ->
# (id, values per block, bytes per block).
LAYOUTS = {0: GGML_F32, 1: GGML_F16, 2: (2, 32, 18), 3: (3, 32, 20), 6: (6, 32, 22),
           7: (7, 32, 24), 8: GGML_Q8_0, 10: (10, 256, 84), 11: (11, 256, 110),
           12: (12, 256, 144), 13: (13, 256, 176), 14: (14, 256, 210), 30: (30, 1, 2)}
TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
              10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 30: "BF16"}


class Reader:
    """Metadata and tensor table of a GGUF file: `kv` maps key -> (type, value), with
    arrays as (ARRAY, (item_type, [items])); `tensors` is a list of
    (name, dims, ggml_type_id, offset)."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self._f = f
            if f.read(4) != b"GGUF":
                raise ValueError(f"{path}: not a GGUF file")
            (self.version,) = self._u("<I")
            n_tensors, n_kv = self._u("<QQ")
            self.kv = {}
            for _ in range(n_kv):
                key = self._str()
                (ty,) = self._u("<I")
                self.kv[key] = (ty, self._val(ty))
            self.tensors = []
            for _ in range(n_tensors):
                name = self._str()
                (nd,) = self._u("<I")
                dims = list(self._u("<" + "Q" * nd))
                ty, off = self._u("<IQ")
                self.tensors.append((name, dims, ty, off))
            # Tensor offsets count from here: the end of the tensor table, aligned.
            align = self.value("general.alignment", 32)
            self.data_start = (f.tell() + align - 1) // align * align
        del self._f

    def _u(self, fmt):
        return struct.unpack(fmt, self._f.read(struct.calcsize(fmt)))

    def _str(self):
        (n,) = self._u("<Q")
        return self._f.read(n).decode("utf-8")

    def _val(self, ty):
        if ty == STRING:
            return self._str()
        if ty == ARRAY:
            it, n = self._u("<IQ")
            if it in _SCALAR:
                fmt = _SCALAR[it]
                size = struct.calcsize(fmt)
                raw = self._f.read(size * n)
                return (it, list(struct.unpack("<" + fmt[1] * n, raw)))
            return (it, [self._val(it) for _ in range(n)])
        return self._u(_SCALAR[ty])[0]

    def value(self, key, default=None):
        return self.kv[key][1] if key in self.kv else default


def _pack_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _pack_val(ty, v):
    if ty == STRING:
        return _pack_str(v)
    if ty == ARRAY:
        it, items = v
        head = struct.pack("<IQ", it, len(items))
        if it in _SCALAR:
            return head + struct.pack("<" + _SCALAR[it][1] * len(items), *items)
        return head + b"".join(_pack_val(it, x) for x in items)
    return struct.pack(_SCALAR[ty], v)


def tensor_bytes(dims, ggml_type):
    """Stored bytes of a tensor of `dims` (GGUF order: dims[0] is the row length)."""
    _, block, size = ggml_type
    n = 1
    for d in dims:
        n *= d
    assert dims[0] % block == 0, f"row of {dims[0]} is not whole blocks of {block}"
    return n // block * size


def write(path, kv, tensors, alignment=32):
    """Writes a GGUF v3 file. `kv`: list of (key, type, value). `tensors`: list of
    (name, dims, ggml_type, fill) where `fill(f, n_bytes)` writes exactly the tensor's
    bytes to the open file `f`."""
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)))
        for key, ty, v in kv:
            f.write(_pack_str(key) + struct.pack("<I", ty) + _pack_val(ty, v))
        off = 0
        sizes = []
        for name, dims, gt, _ in tensors:
            n = tensor_bytes(dims, gt)
            sizes.append(n)
            f.write(_pack_str(name) + struct.pack("<I", len(dims))
                    + struct.pack("<" + "Q" * len(dims), *dims) + struct.pack("<IQ", gt[0], off))
            off += (n + alignment - 1) // alignment * alignment
        pad = (-f.tell()) % alignment
        f.write(b"\0" * pad)
        for (name, dims, gt, fill), n in zip(tensors, sizes):
            start = f.tell()
            fill(f, n)
            assert f.tell() - start == n, f"{name}: wrote {f.tell() - start} of {n} bytes"
            f.write(b"\0" * ((-n) % alignment))
