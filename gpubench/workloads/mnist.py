"""MNIST in its standard IDX files, read from a local directory (never downloaded).

``data_dir`` must hold ``train-images-idx3-ubyte`` and ``train-labels-idx1-ubyte`` (each
possibly gzipped, ``.gz``), as distributed by the MNIST authors, and for a held-out evaluation
``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``. Images are scaled to [0, 1]
and standardised with the usual MNIST mean and std (0.1307, 0.3081).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

IMAGES = "train-images-idx3-ubyte"
LABELS = "train-labels-idx1-ubyte"
TEST_IMAGES, TEST_LABELS = "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"  # the held-out split
MEAN, STD = 0.1307, 0.3081
_UBYTE = 0x08


class IdxError(ValueError):
    """A missing or malformed IDX file; the message names the file."""


def find(data_dir: str | Path, name: str) -> Path:
    base = Path(data_dir)
    for candidate in (base / name, base / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise IdxError(f"{base}: no {name} (or {name}.gz) there; put the MNIST IDX files in data_dir")


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """An unsigned-byte IDX array with ``ndim`` dimensions (a clear IdxError otherwise)."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise IdxError(f"{path}: cannot read: {e}") from None
    if len(raw) < 4 + 4 * ndim:
        raise IdxError(f"{path}: too short for an IDX header ({len(raw)} bytes)")
    zero, dtype, dims = raw[0:2], raw[2], raw[3]
    if zero != b"\x00\x00" or dtype != _UBYTE or dims != ndim:
        raise IdxError(f"{path}: not an unsigned-byte IDX file with {ndim} dimension(s) "
                       f"(magic {raw[:4].hex()}, expected 0000080{ndim})")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    body = raw[4 + 4 * ndim:]
    expected = int(np.prod(shape))
    if len(body) != expected:
        raise IdxError(f"{path}: header says {shape} ({expected} bytes of data) but {len(body)} bytes follow")
    return np.frombuffer(body, dtype=np.uint8).reshape(shape)


def has_test_split(data_dir: str | Path) -> bool:
    """Whether ``data_dir`` holds the t10k files (MNIST's held-out split)."""
    try:
        find(data_dir, TEST_IMAGES), find(data_dir, TEST_LABELS)
    except IdxError:
        return False
    return True


def load_mnist(data_dir: str | Path, test: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(x float32 (N, 1, 28, 28) standardised, y int64 (N,)) of the training files (``test``:
    the t10k files, the held-out split); IdxError on any problem."""
    images = read_idx(find(data_dir, TEST_IMAGES if test else IMAGES), 3)
    labels = read_idx(find(data_dir, TEST_LABELS if test else LABELS), 1)
    if images.shape[0] != labels.shape[0]:
        raise IdxError(f"{data_dir}: {images.shape[0]} images but {labels.shape[0]} labels")
    if images.shape[1:] != (28, 28):
        raise IdxError(f"{data_dir}: images are {images.shape[1:]}, expected (28, 28)")
    if labels.size and labels.max() > 9:
        raise IdxError(f"{data_dir}: label {int(labels.max())} out of range 0..9")
    x = (images.astype(np.float32) / np.float32(255.0) - np.float32(MEAN)) / np.float32(STD)
    return x[:, None, :, :], labels.astype(np.int64)


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write an unsigned-byte IDX file (tests and users who need a tiny data set)."""
    a = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, _UBYTE, a.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in a.shape)
    data = header + a.tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
