"""Framework-neutral helpers over NumPy arrays and torch tensors (torch is optional).

pagoda's Python API takes and returns the caller's array type: NumPy on the CPU, torch on the CPU
or CUDA. These helpers allocate, reshape and convert without importing torch unless the caller
passed a torch tensor. dtype names are pagoda's: "f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2".

NumPy has no bfloat16 or fp8: NumPy callers pass bf16 data as uint16 arrays and fp8 data as
uint8 arrays (the raw bits) and name the dtype (q_data_type="bfloat16", ...).
"""
import sys

import numpy as np

_NP_NAMES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16",
             np.dtype(np.uint16): "bf16", np.dtype(np.uint8): "u8"}
_NP_STORAGE = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "fp8_e4m3": np.uint8,
               "fp8_e5m2": np.uint8, "i32": np.int32, "i64": np.int64, "u8": np.uint8}
_ALIASES = {"float32": "f32", "float": "f32", "f32": "f32", "float16": "f16", "half": "f16",
            "f16": "f16", "fp16": "f16", "bfloat16": "bf16", "bf16": "bf16",
            "float8_e4m3fn": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "e4m3": "fp8_e4m3",
            "float8_e5m2": "fp8_e5m2", "fp8_e5m2": "fp8_e5m2", "e5m2": "fp8_e5m2"}


def _torch():
    return sys.modules.get("torch")


def is_torch(x):
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def canonical_dtype(spec, what="dtype"):
    """pagoda's name for a dtype given as a string, a NumPy dtype or a torch dtype."""
    if spec is None:
        return None
    t = _torch()
    if t is not None and isinstance(spec, t.dtype):
        spec = str(spec).replace("torch.", "")
    elif not isinstance(spec, str):
        spec = np.dtype(spec).name
    name = _ALIASES.get(spec)
    if name is None:
        raise ValueError(f"unsupported {what} {spec!r} (float32, float16, bfloat16, "
                         "float8_e4m3fn, float8_e5m2)")
    return name


def dtype_name(x):
    """pagoda's name of an array's element type; "bf16" for NumPy uint16 and "u8" for uint8."""
    if is_torch(x):
        return canonical_dtype(x.dtype) if str(x.dtype) in _TORCH_FLOATS else str(x.dtype)
    return _NP_NAMES.get(x.dtype, x.dtype.name)


_TORCH_FLOATS = {"torch.float32", "torch.float16", "torch.bfloat16", "torch.float8_e4m3fn",
                 "torch.float8_e5m2"}


def matches(x, name):
    """Whether array x holds elements of pagoda dtype `name` (NumPy: by its storage type)."""
    own = dtype_name(x)
    if is_torch(x):
        return own == name
    return own == name or (own == "u8" and name.startswith("fp8"))


def device_of(x):
    """'cpu' or 'cuda:N'."""
    if is_torch(x):
        d = x.device
        return "cpu" if d.type == "cpu" else f"{d.type}:{d.index or 0}"
    return "cpu"


def empty(shape, name, like):
    """An uninitialised array of pagoda dtype `name` in like's framework and on like's device."""
    if is_torch(like):
        t = _torch()
        return t.empty(shape, dtype=_torch_dtype(name), device=like.device)
    return np.empty(shape, dtype=_NP_STORAGE[name])


def numpy_storage(name):
    """The NumPy dtype that holds pagoda dtype `name` (bf16: uint16 bits, fp8: uint8 bits)."""
    return np.dtype(_NP_STORAGE[name])


def _torch_dtype(name):
    t = _torch()
    return {"f32": t.float32, "f16": t.float16, "bf16": t.bfloat16, "i32": t.int32,
            "i64": t.int64, "u8": t.uint8, "fp8_e4m3": getattr(t, "float8_e4m3fn", None),
            "fp8_e5m2": getattr(t, "float8_e5m2", None)}[name]


def host_numpy(x, dtype=None):
    """A host NumPy copy (or view) of x, C-contiguous, optionally cast."""
    if is_torch(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if dtype is not None:
        a = a.astype(dtype, copy=False)
    return np.ascontiguousarray(a)


def like(a, ref):
    """The NumPy array `a` converted to ref's framework and device."""
    if is_torch(ref):
        return _torch().from_numpy(np.ascontiguousarray(a)).to(ref.device)
    return a


def permute(x, axes):
    """A permuted view (no copy)."""
    return x.permute(*axes) if is_torch(x) else x.transpose(axes)


def unsqueeze(x, axis):
    return x.unsqueeze(axis) if is_torch(x) else np.expand_dims(x, axis)


def kernel_array(x):
    """The array to hand to the C++ extension (with its dtype named beside it): torch fp8
    tensors travel as uint8 views (DLPack exporters differ on fp8), everything else as itself."""
    if is_torch(x) and str(x.dtype) in ("torch.float8_e4m3fn", "torch.float8_e5m2"):
        return x.view(_torch().uint8)
    return x


def xp(x):
    """The array module of x (numpy or torch) for element-wise math."""
    return _torch() if is_torch(x) else np


def to_f32(x):
    """x as float32 values (NumPy uint16 arrays are read as bf16 bits)."""
    if is_torch(x):
        return x.float()
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def from_f32(x, ref):
    """float32 x in ref's dtype (NumPy uint16: bf16 bits, rounded to nearest even)."""
    if is_torch(ref):
        return x.to(ref.dtype)
    if ref.dtype == np.uint16:
        bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)
        return np.where(np.isnan(x), 0x7FC0, rounded >> 16).astype(np.uint16)
    return x.astype(ref.dtype)


def data_ptr(x):
    return x.data_ptr() if is_torch(x) else x.__array_interface__["data"][0]


def element_size(x):
    return x.element_size() if is_torch(x) else x.itemsize


def strides(x):
    """Strides in elements."""
    return tuple(x.stride()) if is_torch(x) else tuple(s // x.itemsize for s in x.strides)


def as_strided(x, shape, strides_elems):
    """A view of x's memory (from x's first element) with other shape / strides (elements)."""
    if is_torch(x):
        return x.as_strided(shape, strides_elems)
    return np.lib.stride_tricks.as_strided(
        x, shape, tuple(s * x.itemsize for s in strides_elems))


def cat_last(a, b):
    """a and b concatenated along the last dim (a copy)."""
    return _torch().cat([a, b], -1) if is_torch(a) else np.concatenate([a, b], -1)


def joined_last(a, b):
    """One array whose last dim is a's then b's: a zero-copy view where b's rows start right
    after a's in the same buffer (SGLang's MLA latent layout), else a concatenated copy."""
    n = a.shape[-1]
    same = (a.shape[:-1] == b.shape[:-1] and strides(a) == strides(b) and
            strides(a)[-1] == 1 and same_dtype(a, b) and
            data_ptr(b) == data_ptr(a) + n * element_size(a) and
            all(s >= n + b.shape[-1] for s, d in zip(strides(a)[:-1], a.shape[:-1]) if d > 1))
    if same:
        return as_strided(a, tuple(a.shape[:-1]) + (n + b.shape[-1],), strides(a))
    return cat_last(a, b)


def same_dtype(a, b):
    return dtype_name(a) == dtype_name(b)
