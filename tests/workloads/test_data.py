"""The Fashion-MNIST loader: search order, IDX parsing, clear errors."""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from agents.sim.keyed import generator
from agents.workloads import data
from agents.workloads.data import DataNotFoundError, IDXFormatError, load_fashion_mnist, read_idx

NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file of unsigned bytes: magic 00 00 08 <rank>, big-endian dims, data."""
    return struct.pack(">BBBB", 0, 0, 8, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def write_dataset(directory: Path, *, gz: bool, n_train: int = 12, n_test: int = 5, tag: int = 0) -> dict:
    """Write four small IDX files; return the raw arrays."""
    rng = generator(tag, "test-data")
    arrays = {
        NAMES[0]: rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        NAMES[1]: (np.arange(n_train) % 10).astype(np.uint8),
        NAMES[2]: rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        NAMES[3]: (np.arange(n_test) % 10).astype(np.uint8),
    }
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        raw = idx_bytes(array)
        if gz:
            (directory / f"{name}.gz").write_bytes(gzip.compress(raw))
        else:
            (directory / name).write_bytes(raw)
    return arrays


@pytest.fixture
def no_defaults(tmp_path, monkeypatch):
    """Neither the Debian directory nor ./data exists."""
    monkeypatch.setattr(data, "DEBIAN_DIR", tmp_path / "no-debian")
    monkeypatch.chdir(tmp_path)


def expected_pixels(raw: np.ndarray, name: str = "fashion-mnist") -> torch.Tensor:
    mean, std = data.NORMALISATION[name]
    return torch.from_numpy(((raw.astype(np.float64) / 255 - mean) / std).astype(np.float32))[:, None]


@pytest.mark.skipif(not data.DEBIAN_DIR.is_dir(), reason="apt-get install dataset-fashion-mnist")
def test_loader_finds_the_debian_files_with_the_right_shapes_and_counts():
    ds = load_fashion_mnist()
    assert ds.name == "fashion-mnist" and ds.source == str(data.DEBIAN_DIR) and ds.num_classes == 10
    assert ds.train_x.shape == (60000, 1, 28, 28) and ds.test_x.shape == (10000, 1, 28, 28)
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    assert torch.bincount(ds.train_y).tolist() == [6000] * 10
    assert torch.bincount(ds.test_y).tolist() == [1000] * 10
    # Normalised with the training set's own statistics.
    assert abs(ds.train_x.mean().item()) < 1e-3 and abs(ds.train_x.std().item() - 1) < 1e-3
    assert load_fashion_mnist() is ds


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_a_user_directory_with_the_idx_files_directly_in_it(tmp_path, gz):
    arrays = write_dataset(tmp_path / "mine", gz=gz)
    ds = load_fashion_mnist(tmp_path / "mine")
    assert ds.name == "fashion-mnist" and ds.source == str((tmp_path / "mine").resolve())
    assert torch.allclose(ds.train_x, expected_pixels(arrays[NAMES[0]]), atol=1e-6)
    assert torch.allclose(ds.test_x, expected_pixels(arrays[NAMES[2]]), atol=1e-6)
    assert ds.train_y.tolist() == arrays[NAMES[1]].tolist() and ds.train_y.dtype == torch.int64
    assert ds.test_y.tolist() == arrays[NAMES[3]].tolist()


@pytest.mark.parametrize("layout, name", [("FashionMNIST/raw", "fashion-mnist"), ("MNIST/raw", "mnist")])
def test_the_torchvision_raw_layout_under_a_user_root(tmp_path, layout, name):
    arrays = write_dataset(tmp_path / layout, gz=True)
    for root in (tmp_path, tmp_path / layout):
        ds = load_fashion_mnist(str(root))
        assert ds.name == name
        assert torch.allclose(ds.train_x, expected_pixels(arrays[NAMES[0]], name), atol=1e-6)


def test_debian_is_preferred_to_the_local_data_directory(tmp_path, monkeypatch):
    write_dataset(tmp_path / "debian", gz=True, n_train=10)
    write_dataset(tmp_path / "data" / "FashionMNIST" / "raw", gz=False, n_train=20)
    monkeypatch.setattr(data, "DEBIAN_DIR", tmp_path / "debian")
    monkeypatch.chdir(tmp_path)
    assert len(load_fashion_mnist().train_y) == 10
    monkeypatch.setattr(data, "DEBIAN_DIR", tmp_path / "no-debian")
    assert len(load_fashion_mnist().train_y) == 20


def test_missing_data_names_all_three_locations_and_the_fix(no_defaults):
    with pytest.raises(DataNotFoundError) as info:
        load_fashion_mnist()
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    for part in ("data.root is not set", str(data.DEBIAN_DIR), "./data/FashionMNIST/raw",
                 "apt-get install dataset-fashion-mnist", "data.root=<dir"):
        assert part in message


def test_a_user_root_without_data_is_an_error_even_when_the_defaults_exist(tmp_path, monkeypatch):
    write_dataset(tmp_path / "debian", gz=True)
    monkeypatch.setattr(data, "DEBIAN_DIR", tmp_path / "debian")
    with pytest.raises(DataNotFoundError, match=r"not found in data\.root=.*typo") as info:
        load_fashion_mnist(tmp_path / "typo")
    assert "FashionMNIST/raw/ or MNIST/raw/" in str(info.value) and str(data.DEBIAN_DIR) in str(info.value)


def test_a_directory_with_only_some_files_names_the_missing_ones(tmp_path):
    write_dataset(tmp_path, gz=False)
    (tmp_path / NAMES[3]).unlink()
    with pytest.raises(DataNotFoundError, match=r"holds only part of the data set: t10k-labels"):
        load_fashion_mnist(tmp_path)


@pytest.mark.parametrize("corrupt, expected", [
    (lambda raw: b"\x08\x03" + raw[2:], "not an IDX file"),
    (lambda raw: raw[:2] + b"\x07" + raw[3:], "not an IDX file"),
    (lambda raw: raw[:-1], "header says shape (12, 28, 28)"),
    (lambda raw: raw[:6], "truncated header"),
])
def test_a_malformed_file_is_named_in_the_error(tmp_path, corrupt, expected):
    write_dataset(tmp_path, gz=False)
    path = tmp_path / NAMES[0]
    path.write_bytes(corrupt(path.read_bytes()))
    with pytest.raises(IDXFormatError) as info:
        load_fashion_mnist(tmp_path)
    assert str(path) in str(info.value) and expected in str(info.value)


def test_a_corrupt_gzip_file_is_named_in_the_error(tmp_path):
    write_dataset(tmp_path, gz=True)
    path = tmp_path / f"{NAMES[1]}.gz"
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(IDXFormatError, match="cannot read or decompress") as info:
        load_fashion_mnist(tmp_path)
    assert str(path) in str(info.value)


def test_labels_must_match_the_images_and_lie_below_ten(tmp_path):
    write_dataset(tmp_path, gz=False)
    (tmp_path / NAMES[1]).write_bytes(idx_bytes(np.zeros(11, np.uint8)))
    with pytest.raises(IDXFormatError, match="expected 12 labels"):
        load_fashion_mnist(tmp_path)
    (tmp_path / NAMES[1]).write_bytes(idx_bytes(np.full(12, 10, np.uint8)))
    with pytest.raises(IDXFormatError, match=r"labels must lie in \[0, 10\)"):
        load_fashion_mnist(tmp_path)


def test_read_idx_handles_wider_big_endian_types(tmp_path):
    values = np.array([[1, -2], [300, 70000]], dtype=">i4")
    path = tmp_path / "x.idx"
    path.write_bytes(struct.pack(">BBBB", 0, 0, 0x0C, 2) + struct.pack(">2I", 2, 2) + values.tobytes())
    out = read_idx(path)
    assert out.dtype == np.dtype("int32") and out.tolist() == [[1, -2], [300, 70000]]
