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


# ---------------------------------------------------------------- the decoded cache
@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache directory, and files small enough for tests counted as worth caching."""
    monkeypatch.setenv("LOCKSTEP_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(data, "CACHE_FROM_BYTES", 0)
    return tmp_path / "cache"


def _mapped_from(t: torch.Tensor, path: Path) -> bool:
    """Whether the tensor's memory is a mapping of ``path`` (/proc/self/maps)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(str(path)):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= t.data_ptr() < hi:
                return True
    return False


def _assert_pixels(x: torch.Tensor, raw: np.ndarray) -> None:
    torch.testing.assert_close(x, expected_pixels(raw), rtol=0, atol=1e-6)


def _fresh_load(root: Path):
    data._load_files.cache_clear()  # as a new process would: the per-process cache forgotten
    return load_fashion_mnist(root)


def test_a_second_process_maps_the_decoded_images_bit_for_bit(tmp_path, cache):
    arrays = write_dataset(tmp_path / "d", gz=True, n_train=30, n_test=7)
    first = _fresh_load(tmp_path / "d")
    assert sorted(p.name.split("-")[0] for p in cache.glob("*.npy")) == ["t10k", "train"]
    second = _fresh_load(tmp_path / "d")
    (entry,) = cache.glob("train*.npy")
    assert _mapped_from(second.train_x, entry) and not _mapped_from(first.train_x, entry)
    for a, b in ((first.train_x, second.train_x), (first.test_x, second.test_x)):
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b)
    torch.testing.assert_close(second.train_x, expected_pixels(arrays[NAMES[0]]), rtol=0, atol=1e-6)
    assert torch.equal(second.train_y, first.train_y)


def test_a_changed_file_is_decoded_again_and_replaces_its_old_entry(tmp_path, cache):
    write_dataset(tmp_path / "d", gz=False, n_train=30, tag=1)
    _fresh_load(tmp_path / "d")
    before = {p.name for p in cache.glob("train*.npy")}
    arrays = write_dataset(tmp_path / "d", gz=False, n_train=40, tag=2)  # new contents, size and mtime
    again = _fresh_load(tmp_path / "d")
    torch.testing.assert_close(again.train_x, expected_pixels(arrays[NAMES[0]]), rtol=0, atol=1e-6)  # not stale
    after = {p.name for p in cache.glob("train*.npy")}
    assert len(after) == 1 and after != before


def test_labels_are_checked_against_cached_images_too(tmp_path, cache):
    write_dataset(tmp_path / "d", gz=False, n_train=30)
    _fresh_load(tmp_path / "d")
    (tmp_path / "d" / NAMES[1]).write_bytes(idx_bytes(np.zeros(29, dtype=np.uint8)))  # one label short
    with pytest.raises(IDXFormatError, match="expected 30 labels"):
        _fresh_load(tmp_path / "d")


def test_an_unusable_cache_only_costs_time(tmp_path, monkeypatch):
    arrays = write_dataset(tmp_path / "d", gz=False, n_train=30)
    monkeypatch.setattr(data, "CACHE_FROM_BYTES", 0)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache directory would go")
    monkeypatch.setenv("LOCKSTEP_DATA_CACHE", str(blocker / "cache"))
    _assert_pixels(_fresh_load(tmp_path / "d").train_x, arrays[NAMES[0]])
    cache = tmp_path / "cache"
    monkeypatch.setenv("LOCKSTEP_DATA_CACHE", str(cache))
    _fresh_load(tmp_path / "d")
    (entry,) = cache.glob("train*.npy")
    entry.write_bytes(entry.read_bytes()[:100])  # cut short (a crash while another process wrote it)
    _assert_pixels(_fresh_load(tmp_path / "d").train_x, arrays[NAMES[0]])
    monkeypatch.setenv("LOCKSTEP_DATA_CACHE", "off")
    _fresh_load(tmp_path / "d")


def test_small_files_and_off_write_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_DATA_CACHE", str(tmp_path / "cache"))
    write_dataset(tmp_path / "d", gz=False)  # far below CACHE_FROM_BYTES
    _fresh_load(tmp_path / "d")
    assert not (tmp_path / "cache").exists()
    monkeypatch.setattr(data, "CACHE_FROM_BYTES", 0)
    monkeypatch.setenv("LOCKSTEP_DATA_CACHE", "off")
    _fresh_load(tmp_path / "d")
    assert not (tmp_path / "cache").exists()


def test_no_home_directory_means_no_cache(tmp_path, monkeypatch):
    """A container's arbitrary user may have neither HOME nor a passwd entry: the data still loads."""
    monkeypatch.delenv("LOCKSTEP_DATA_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert data.data_cache_dir() is None
    arrays = write_dataset(tmp_path / "d", gz=False, n_train=30)
    monkeypatch.setattr(data, "CACHE_FROM_BYTES", 0)
    _assert_pixels(_fresh_load(tmp_path / "d").train_x, arrays[NAMES[0]])


# ---------------------------------------------------------------- data sets the config check refuses
def _labelled(directory: Path, train: list[int], test: list[int]) -> Path:
    """IDX files with these labels (blank 28x28 images)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, labels in ((NAMES[0], train), (NAMES[2], test)):
        (directory / name).write_bytes(idx_bytes(np.zeros((len(labels), 28, 28), dtype=np.uint8)))
    for name, labels in ((NAMES[1], train), (NAMES[3], test)):
        (directory / name).write_bytes(idx_bytes(np.array(labels, dtype=np.uint8)))
    return directory


@pytest.mark.parametrize("train, test, extra, sentence", [
    # each was a traceback: from the partition, from the model check's max() of nothing, at the first evaluation
    ([0, 1] * 20, [0, 1] * 5, ["data.partition=non_iid"],
     "data.partition=non_iid cannot split the 40 training samples of data.root='{root}' over 4 workers "
     "(two_class_non_iid partition: needs at least 3 classes, labels have 2); accepted: fewer workers, or another "
     "data.partition."),
    ([], [0, 1, 2], [], "data.root='{root}' holds 0 training and 3 test samples; accepted: a data set with at least "
                        "one of each."),
    ([0, 1] * 20, [0, 1, 4], ["model=custom", "model._target_=torch.nn.Sequential"], None),
])
def test_a_data_set_the_run_cannot_use_is_one_sentence(tmp_path, train, test, extra, sentence):
    from controller.config import ConfigError, load

    root = _labelled(tmp_path / "d", train, test)
    if sentence is None:  # test labels up to 4: a model of two outputs (the training labels') is refused
        over = [f"data.root={root}", "workers=4", "batch_size=2", "model=custom",
                "model._target_=torch.nn.Sequential", "+model._args_=[{_target_:torch.nn.Flatten},"
                "{_target_:torch.nn.Linear,in_features:784,out_features:2}]"]
        with pytest.raises(ConfigError) as e:
            load(over)
        assert "for the 5 classes (C >= 5)" in e.value.problems[0], e.value.problems
        return
    with pytest.raises(ConfigError) as e:
        load([f"data.root={root}", "workers=4", "batch_size=2", f"eval.samples={max(1, len(test))}", *extra])
    assert e.value.problems == [sentence.format(root=root)]
