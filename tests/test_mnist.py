"""Tests for dbn.data.mnist: real-data loading, IDX validation, locating, downloading (no network)."""

from __future__ import annotations

import gzip
import hashlib
import shutil
import struct
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

from dbn.data import mnist
from dbn.data.mnist import MnistError, download_mnist, find_mnist_dir, load_mnist, read_idx, scale_images

REAL_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"
HAVE_REAL = all((REAL_DIR / name).is_file() for name in mnist.MNIST_FILES)
needs_real = pytest.mark.skipif(not HAVE_REAL, reason=f"real MNIST files not found in {REAL_DIR}")

TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def idx_bytes(arr) -> bytes:
    """Encode a uint8 array as IDX (magic 0x000008NN, NN = ndim)."""
    arr = np.asarray(arr, dtype=np.uint8)
    return struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def write_file(path: Path, data: bytes) -> Path:
    """Write data, gzip-compressed when path ends in .gz."""
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def write_fake_mnist(d: Path, n_train=5, n_test=3, n_train_labels=None) -> Path:
    """Small synthetic MNIST-shaped .gz files (wrong checksums, so load with verify=False)."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    n_train_labels = n_train if n_train_labels is None else n_train_labels
    write_file(d / mnist.TRAIN_IMAGES, idx_bytes(rng.integers(0, 256, (n_train, 28, 28))))
    write_file(d / mnist.TRAIN_LABELS, idx_bytes(np.arange(n_train_labels) % 10))
    write_file(d / mnist.TEST_IMAGES, idx_bytes(rng.integers(0, 256, (n_test, 28, 28))))
    write_file(d / mnist.TEST_LABELS, idx_bytes(np.arange(n_test) % 10))
    return d


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No DBN_MNIST_DIR, an empty cache dir under tmp_path, cwd in an empty tmp dir."""
    monkeypatch.delenv(mnist.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path


# ------------------------------------------------------------------ real data


@pytest.fixture(scope="module")
def real():
    if not HAVE_REAL:
        pytest.skip(f"real MNIST files not found in {REAL_DIR}")
    return load_mnist(REAL_DIR, verify=True)


def test_real_shapes_and_dtypes(real):
    assert real.x_train.shape == (60000, 784) and real.x_train.dtype == np.uint8
    assert real.y_train.shape == (60000,) and real.y_train.dtype == np.uint8
    assert real.x_test.shape == (10000, 784) and real.x_test.dtype == np.uint8
    assert real.y_test.shape == (10000,) and real.y_test.dtype == np.uint8
    assert real.x_train.min() == 0 and real.x_train.max() == 255


def test_real_label_counts(real):
    assert np.bincount(real.y_train, minlength=10).tolist() == TRAIN_COUNTS
    assert np.bincount(real.y_test, minlength=10).tolist() == TEST_COUNTS


def test_real_arrays_writable_and_frozen(real):
    assert real.x_train.flags.writeable
    with pytest.raises(AttributeError):
        real.x_train = None  # frozen dataclass


@needs_real
def test_module_checksums_match_real_files():
    for name, info in mnist.MNIST_FILES.items():
        data = (REAL_DIR / name).read_bytes()
        assert len(data) == info.size
        assert hashlib.sha256(data).hexdigest() == info.sha256


def test_scale_images(real):
    x = scale_images(real.x_test[:100])
    assert x.dtype == np.float32 and x.shape == (100, 784)
    assert x.min() == 0.0 and x.max() == 1.0
    np.testing.assert_allclose(x, real.x_test[:100] / 255.0, rtol=1e-6)
    with pytest.raises(TypeError):
        scale_images(x)  # already scaled
    with pytest.raises(ValueError):
        scale_images(np.array([300]))


# ------------------------------------------------------------------ read_idx


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_read_idx_roundtrip(tmp_path, suffix):
    imgs = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    labels = np.array([3, 7, 1], dtype=np.uint8)
    got_imgs = read_idx(write_file(tmp_path / f"i{suffix}", idx_bytes(imgs)))
    got_labels = read_idx(write_file(tmp_path / f"l{suffix}", idx_bytes(labels)))
    assert got_imgs.shape == (2, 28, 28) and got_imgs.dtype == np.uint8
    np.testing.assert_array_equal(got_imgs, imgs)
    np.testing.assert_array_equal(got_labels, labels)
    assert read_idx(write_file(tmp_path / f"e{suffix}", idx_bytes(np.zeros((0, 4, 2))))).shape == (0, 4, 2)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_read_idx_truncated(tmp_path, suffix):
    data = idx_bytes(np.ones((3, 28, 28)))
    p = write_file(tmp_path / f"trunc-idx3{suffix}", data[:-10])
    with pytest.raises(MnistError, match="truncated") as e:
        read_idx(p)
    msg = str(e.value)
    assert str(p) in msg and str(3 * 784) in msg and str(3 * 784 - 10) in msg


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_read_idx_trailing_bytes(tmp_path, suffix):
    p = write_file(tmp_path / f"trail{suffix}", idx_bytes(np.arange(5)) + b"xyz")
    with pytest.raises(MnistError, match="3 trailing bytes") as e:
        read_idx(p)
    assert str(p) in str(e.value)
    assert "5 data bytes" in str(e.value) and "found 8" in str(e.value)


def test_read_idx_truncated_header(tmp_path):
    p = write_file(tmp_path / "hdr.gz", idx_bytes(np.ones((2, 28, 28)))[:9])
    with pytest.raises(MnistError, match="header") as e:
        read_idx(p)
    assert str(p) in str(e.value)


@pytest.mark.parametrize(
    "magic", [b"\x00\x00\x08\x00", b"\x00\x00\x0d\x03", b"\x12\x34\x08\x01", b"\x1f\x00"]
)
def test_read_idx_wrong_magic(tmp_path, magic):
    data = magic + struct.pack(">I", 2) + b"\x01\x02"
    p = write_file(tmp_path / "magic.idx", data)
    with pytest.raises(MnistError, match="magic|header") as e:
        read_idx(p)
    assert str(p) in str(e.value)


def test_read_idx_corrupt_gzip(tmp_path):
    gz = gzip.compress(idx_bytes(np.arange(2000) % 256))
    cut = tmp_path / "cut.gz"
    cut.write_bytes(gz[: len(gz) // 2])  # stream ends early
    flipped = bytearray(gz)
    flipped[len(gz) // 2] ^= 0xFF  # damaged deflate data / CRC
    bad = tmp_path / "flipped.gz"
    bad.write_bytes(bytes(flipped))
    junk = tmp_path / "notgzip.gz"
    junk.write_bytes(b"this is not gzip at all")
    for p in (cut, bad, junk):
        with pytest.raises(MnistError, match="gzip") as e:
            read_idx(p)
        assert str(p) in str(e.value)


def test_read_idx_gzip_bomb_is_refused_in_little_memory(tmp_path):
    """A small .gz whose header promises 200 MB of pixels (and whose stream holds them, all zeros)
    is refused once it inflates past MAX_INFLATION times its size: it never fills memory."""
    rows = 200 * 2**20 // 784
    pack = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [pack.compress(struct.pack(">IIII", 0x803, rows, 28, 28))]
    zeros = bytes(2**20)
    for _ in range(rows * 784 // len(zeros)):
        parts.append(pack.compress(zeros))
    parts.append(pack.compress(bytes(rows * 784 % len(zeros))) + pack.flush())
    bomb = tmp_path / "train-images-idx3-ubyte.gz"
    bomb.write_bytes(b"".join(parts))
    assert bomb.stat().st_size < 2**20
    tracemalloc.start()
    try:
        with pytest.raises(MnistError, match="inflates to more than") as e:
            read_idx(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(bomb) in str(e.value)
    assert peak < 64 * 2**20, peak


def test_read_idx_reads_every_gzip_member(tmp_path):
    """A stream of several gzip members (as `cat a.gz b.gz` makes) reads as their concatenation, as gzip does."""
    data = idx_bytes(np.arange(3000) % 256)
    p = tmp_path / "two.gz"
    p.write_bytes(gzip.compress(data[:1000]) + gzip.compress(data[1000:]))
    np.testing.assert_array_equal(read_idx(p), np.arange(3000) % 256)


def test_read_idx_missing_file(tmp_path):
    p = tmp_path / "nope.gz"
    with pytest.raises(MnistError) as e:
        read_idx(p)
    assert str(p) in str(e.value)


# ------------------------------------------------------------------ load_mnist


def test_load_synthetic_without_verify(tmp_path):
    data = load_mnist(write_fake_mnist(tmp_path / "m"), verify=False)
    assert data.x_train.shape == (5, 784) and data.y_train.shape == (5,)
    assert data.x_test.shape == (3, 784) and data.x_test.dtype == np.uint8


def test_checksum_mismatch(tmp_path):
    d = write_fake_mnist(tmp_path / "m")
    with pytest.raises(MnistError, match="SHA256 mismatch") as e:
        load_mnist(d, verify=True)
    msg = str(e.value)
    assert str(d / mnist.TRAIN_IMAGES) in msg
    assert mnist.MNIST_FILES[mnist.TRAIN_IMAGES].sha256 in msg
    actual = hashlib.sha256((d / mnist.TRAIN_IMAGES).read_bytes()).hexdigest()
    assert actual in msg


def test_count_mismatch(tmp_path):
    d = write_fake_mnist(tmp_path / "m", n_train=5, n_train_labels=4)
    with pytest.raises(MnistError, match="5 images.*4 labels") as e:
        load_mnist(d, verify=False)
    assert str(d / mnist.TRAIN_IMAGES) in str(e.value)


def test_wrong_image_shape(tmp_path):
    d = write_fake_mnist(tmp_path / "m")
    write_file(d / mnist.TEST_IMAGES, idx_bytes(np.zeros((3, 28, 27))))
    with pytest.raises(MnistError, match=r"\(n, 28, 28\)"):
        load_mnist(d, verify=False)


def test_missing_file_suggests_download(tmp_path):
    d = write_fake_mnist(tmp_path / "m")
    (d / mnist.TEST_LABELS).unlink()
    with pytest.raises(MnistError) as e:
        load_mnist(d, verify=False)
    assert str(d / mnist.TEST_LABELS) in str(e.value)
    assert "download_mnist" in str(e.value)


# -------------------------------------------------------------- find_mnist_dir


def test_env_var_honoured(clean_env, monkeypatch):
    d = write_fake_mnist(clean_env / "elsewhere")
    monkeypatch.setenv(mnist.ENV_VAR, str(d))
    assert find_mnist_dir() == d
    assert load_mnist(verify=False).x_test.shape == (3, 784)


def test_env_var_missing_dir(clean_env, monkeypatch):
    monkeypatch.setenv(mnist.ENV_VAR, str(clean_env / "nowhere"))
    with pytest.raises(MnistError, match=mnist.ENV_VAR) as e:
        find_mnist_dir()
    assert str(clean_env / "nowhere") in str(e.value)


def test_missing_everywhere_lists_places(clean_env):
    with pytest.raises(MnistError) as e:
        find_mnist_dir()
    msg = str(e.value)
    assert mnist.ENV_VAR in msg
    assert str(clean_env / "work" / "shared" / "data" / "mnist") in msg
    assert str(clean_env / "shared" / "data" / "mnist") in msg  # ../shared/data/mnist
    assert str(clean_env / "cache" / "dbn" / "mnist") in msg
    assert "download_mnist" in msg
    with pytest.raises(MnistError):
        load_mnist()


def test_finds_sibling_shared_dir(clean_env, monkeypatch):
    d = write_fake_mnist(clean_env / "shared" / "data" / "mnist")
    sub = clean_env / "work" / "main" / "tests"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    assert find_mnist_dir() == d.resolve()


def test_incomplete_shared_dir_falls_through_to_cache(clean_env):
    partial = clean_env / "shared" / "data" / "mnist"
    partial.mkdir(parents=True)
    (partial / mnist.TRAIN_IMAGES).write_bytes(b"")
    cache = write_fake_mnist(clean_env / "cache" / "dbn" / "mnist")
    assert mnist.default_cache_dir() == cache
    assert find_mnist_dir() == cache


# --------------------------------------------------------------- download_mnist


@pytest.fixture
def mirrors(tmp_path):
    """(good, corrupt, empty) file:// mirror URLs; good holds copies of the real files."""
    if not HAVE_REAL:
        pytest.skip(f"real MNIST files not found in {REAL_DIR}")
    good, corrupt, empty = (tmp_path / n for n in ("good", "corrupt", "empty"))
    for d in (good, corrupt, empty):
        d.mkdir()
    for name in mnist.MNIST_FILES:
        shutil.copyfile(REAL_DIR / name, good / name)
        data = bytearray((REAL_DIR / name).read_bytes())
        data[len(data) // 2] ^= 0x01
        (corrupt / name).write_bytes(bytes(data))
    return tuple(d.as_uri() + "/" for d in (good, corrupt, empty))


def test_download_falls_through_to_good_mirror(tmp_path, mirrors):
    good, corrupt, empty = mirrors
    dest = tmp_path / "dest"
    assert download_mnist(dest, mirrors=[empty, corrupt, good]) == dest
    for name, info in mnist.MNIST_FILES.items():
        assert hashlib.sha256((dest / name).read_bytes()).hexdigest() == info.sha256
    assert sorted(p.name for p in dest.iterdir()) == sorted(mnist.MNIST_FILES)  # no temp files left
    # Everything present and valid: nothing to fetch, so no mirrors are needed.
    assert download_mnist(dest, mirrors=[]) == dest


def test_download_rejects_corrupt_mirror(tmp_path, mirrors):
    good, corrupt, empty = mirrors
    dest = tmp_path / "dest"
    with pytest.raises(MnistError) as e:
        download_mnist(dest, mirrors=[corrupt, empty])
    msg = str(e.value)
    assert "SHA256 mismatch" in msg
    assert corrupt in msg and empty in msg
    assert str(dest) in msg
    assert list(dest.iterdir()) == []  # no bad file under the final name, no temp files


def test_download_replaces_bad_existing_file(tmp_path, mirrors):
    good, _, _ = mirrors
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / mnist.TEST_LABELS).write_bytes(b"garbage")
    download_mnist(dest, mirrors=[good])
    data = load_mnist(dest)  # verify=True passes
    assert np.bincount(data.y_test, minlength=10).tolist() == TEST_COUNTS


def test_download_default_dest_is_cache(clean_env, mirrors):
    good, _, _ = mirrors
    dest = download_mnist(mirrors=[good])
    assert dest == clean_env / "cache" / "dbn" / "mnist"
    assert find_mnist_dir() == dest
