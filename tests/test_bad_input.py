"""Bad data, bad labels, bad model files and bad settings: each gets an error that names the problem."""

from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest

from dbn import DBN, RBM, Backend, BackendError, DataError, ModelFileError
import dbn
from dbn.model.estimator import _PARAM_RANGES

N_FEATURES = 8


def toy_data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, N_FEATURES)).astype(np.float32)
    y = np.arange(n) % 3  # classes 0, 1, 2
    return X, y


def small_dbn(**kwargs):
    params = dict(pretrain_epochs=1, finetune_epochs=1, top_layer_epochs=0, pretrain_batch_size=20,
                  finetune_batch_size=20, device="cpu", seed=0)
    params.update(kwargs)
    return DBN([5], **params)


@pytest.fixture(scope="module")
def fitted():
    X, y = toy_data()
    return small_dbn().fit(X, y)


# ------------------------------------------------------------------ features


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_name_row_and_column(fitted, bad):
    X, y = toy_data()
    X[7, 3] = bad
    X[9, 1] = bad
    for call in (lambda: small_dbn().fit(X, y), lambda: fitted.predict(X), lambda: fitted.transform(X),
                 lambda: RBM(4, device="cpu").fit(X)):
        with pytest.raises(DataError, match=r"2 NaN or infinite value\(s\), the first at row 7, column 3"):
            call()


def test_wrong_feature_count_at_predict(fitted):
    X, _ = toy_data()
    for call in (fitted.predict, fitted.predict_proba, fitted.transform):
        with pytest.raises(DataError, match=f"X has 5 features but the model expects {N_FEATURES}"):
            call(X[:, :5])
    with pytest.raises(DataError, match="has 9 features but the model expects 8"):
        fitted.score(np.zeros((3, 9)), [0, 1, 2])


def test_bernoulli_inputs_outside_unit_interval(fitted):
    X, y = toy_data()
    pixels = (X * 255).round()
    pixels[0, 0] = 255
    with pytest.raises(DataError, match=r"values in \[0, 255\].*need \[0, 1\]"):
        small_dbn().fit(pixels, y)
    with pytest.raises(DataError, match=r"\[0, 1\]"):
        fitted.predict(X - 0.5)
    with pytest.raises(DataError, match=r"\[0, 1\]"):
        RBM(3, device="cpu").fit(pixels)
    # Gaussian visible units take the same data.
    small_dbn(visible="gaussian").fit((pixels - pixels.mean(0)) / pixels.std(0), y)


def test_empty_X():
    with pytest.raises(DataError, match="empty"):
        small_dbn().fit(np.empty((0, N_FEATURES)), np.empty(0, dtype=int))
    with pytest.raises(DataError, match="empty"):
        RBM(3, device="cpu").fit(np.empty((0, 4)))


def test_one_dimensional_X(fitted):
    with pytest.raises(DataError, match=r"must be 2-D \(samples x features\), got shape \(8,\)"):
        fitted.predict(np.zeros(N_FEATURES))
    with pytest.raises(DataError, match="2-D"):
        small_dbn().fit(np.zeros(10), np.zeros(10, dtype=int))


def test_the_common_wrong_shapes_say_how_to_fix_them():
    X = np.zeros((6, 2, 4))  # images, not flattened
    with pytest.raises(DataError, match=r"got shape \(6, 2, 4\): one sample per row.*X.reshape\(6, -1\)"):
        small_dbn().fit(X, np.zeros(6, dtype=int))
    X, y = np.zeros((6, N_FEATURES)), np.array([0, 1, 2, 0, 1, 2])
    with pytest.raises(DataError, match=r"got shape \(6, 1\): a column of labels; pass y.ravel\(\)"):
        small_dbn().fit(X, y[:, None])
    with pytest.raises(DataError, match=r"got shape \(6, 3\): one-hot rows; pass the class indices, y.argmax"):
        small_dbn().fit(X, np.eye(3)[y])
    with pytest.raises(DataError, match=r"got shape \(6, 3\)$"):  # two labels a row: no hint fits
        small_dbn().fit(X, np.ones((6, 3)))


def test_non_numeric_X():
    with pytest.raises(DataError, match="numeric"):
        small_dbn().fit(np.array([["a", "b"], ["c", "d"]]), [0, 1])


# -------------------------------------------------------------------- labels


def test_label_count_mismatch():
    X, y = toy_data()
    with pytest.raises(DataError, match="y has 59 labels but X has 60 samples"):
        small_dbn().fit(X, y[:-1])


def test_negative_labels():
    X, y = toy_data()
    y = y.copy()
    y[4] = -1
    with pytest.raises(DataError, match="negative label -1"):
        small_dbn().fit(X, y)


def test_float_non_integer_labels():
    X, y = toy_data()
    with pytest.raises(DataError, match=r"integer class labels, got 0\.5 at row 0"):
        small_dbn().fit(X, np.where(np.arange(len(y)) == 0, 0.5, 1.0))
    with pytest.raises(DataError, match=r"integer class labels, got \d\.5 at row 0"):
        small_dbn().fit(X, y + 0.5)
    first_nan = int(np.argmax(y == 0))
    with pytest.raises(DataError, match=f"no label at row {first_nan} "):
        small_dbn().fit(X, np.where(y == 0, np.nan, y))
    # Whole-valued floats are accepted as labels.
    small_dbn().fit(X, y.astype(np.float64))


def test_string_mixed_and_2d_labels():
    X, y = toy_data()
    # Strings are label values (tests/test_string_labels.py): digits as text are classes "0", "1", "2".
    assert small_dbn().fit(X, y.astype(str)).classes_.tolist() == ["0", "1", "2"]
    with pytest.raises(DataError, match="integer class labels"):
        small_dbn().fit(X, np.array([*y[:-1].astype(str), 1], dtype=object))  # text and a number
    with pytest.raises(DataError, match="1-D"):
        small_dbn().fit(X, y[:, None])
    with pytest.raises(DataError, match="1-D"):
        small_dbn().fit(X, y[:, None].astype(str))


def test_labels_outside_class_range_at_score_and_finetune(fitted):
    X, y = toy_data()
    y = y.copy()
    y[0] = 7
    with pytest.raises(DataError, match=r"label 7 at row 0, outside the model's classes 0\.\.2"):
        fitted.score(X, y)
    with pytest.raises(DataError, match=r"label 7 at row 0, outside the model's classes 0\.\.2"):
        fitted.finetune(X, y)  # the fitted network has 3 outputs


# ---------------------------------------------------------------- model files


@pytest.fixture
def saved(fitted, tmp_path):
    path = tmp_path / "model.npz"
    fitted.save(path)
    return path


def test_truncated_model_file(saved):
    data = saved.read_bytes()
    saved.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="truncated or corrupt") as info:
        DBN.load(saved, device="cpu")
    assert str(saved) in str(info.value)


def test_non_zip_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("this is not a model\n")
    with pytest.raises(ModelFileError) as info:
        DBN.load(path, device="cpu")
    assert str(path) in str(info.value)


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    with pytest.raises(ModelFileError) as info:
        DBN.load(empty, device="cpu")
    assert str(empty) in str(info.value)
    with pytest.raises(ModelFileError, match="no such model file") as info:
        DBN.load(tmp_path / "missing.npz", device="cpu")
    assert str(tmp_path / "missing.npz") in str(info.value)


def test_npy_file_instead_of_model(tmp_path):
    path = tmp_path / "weights.npy"
    np.save(path, np.zeros((3, 3)))
    with pytest.raises(ModelFileError) as info:
        DBN.load(path, device="cpu")
    assert str(path) in str(info.value)


def test_zip_without_header(tmp_path):
    path = tmp_path / "plain.npz"
    np.savez(path, weights=np.zeros((2, 2)))
    with pytest.raises(ModelFileError, match="no header") as info:
        DBN.load(path, device="cpu")
    assert str(path) in str(info.value)


def test_zip_of_other_files(tmp_path):
    path = tmp_path / "other.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(ModelFileError) as info:
        DBN.load(path, device="cpu")
    assert str(path) in str(info.value)


def test_model_file_missing_arrays(saved, tmp_path):
    """A file with a valid header whose arrays are incomplete."""
    with np.load(saved) as npz:
        arrays = {name: npz[name] for name in npz.files if name != "net.1.weights"}
    broken = tmp_path / "broken.npz"
    np.savez(broken, **arrays)
    with pytest.raises(ModelFileError, match="inconsistent") as info:
        DBN.load(broken, device="cpu")
    assert str(broken) in str(info.value)


def test_failed_save_keeps_previous_file_and_leaves_no_temp(fitted, saved, monkeypatch):
    good = saved.read_bytes()
    before = set(os.listdir(saved.parent))

    def failing_savez(file, *args, **kwargs):
        file.write(b"PK\x03\x04 half a model")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", failing_savez)
    with pytest.raises(OSError, match="disk full"):
        fitted.save(saved)
    monkeypatch.undo()
    assert saved.read_bytes() == good
    assert set(os.listdir(saved.parent)) == before  # no temp file left behind
    X, _ = toy_data()
    np.testing.assert_array_equal(DBN.load(saved, device="cpu").predict(X), fitted.predict(X))


def test_failed_first_save_creates_nothing(fitted, tmp_path, monkeypatch):
    def failing_savez(file, *args, **kwargs):
        file.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", failing_savez)
    with pytest.raises(KeyboardInterrupt):
        fitted.save(tmp_path / "new.npz")
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------- devices and dtypes


@pytest.mark.skipif(dbn.gpu_available(), reason="a GPU is present: device='gpu' works here")
def test_gpu_without_gpu_gives_install_hint():
    for make in (lambda: Backend("gpu"), lambda: RBM(3, device="gpu").backend, lambda: DBN([3], device="gpu").backend):
        with pytest.raises(BackendError, match=r"CuPy and a CUDA device.*pip install 'dbn-yarn\[gpu\]'"):
            make()
    assert Backend("auto").device == "cpu"


@pytest.mark.skipif(dbn.gpu_available(), reason="a GPU is present: device='gpu' works here")
def test_load_on_gpu_without_gpu(saved):
    with pytest.raises(BackendError, match="CuPy"):
        DBN.load(saved, device="gpu")


def test_bad_device_and_dtype_strings():
    with pytest.raises(BackendError, match=r"device must be one of \('cpu', 'gpu', 'auto'\), got 'tpu'"):
        Backend("tpu")
    with pytest.raises(BackendError, match=r"dtype must be one of \('float32', 'float64'\), got 'float16'"):
        Backend("cpu", "float16")
    with pytest.raises(BackendError, match="device must be one of"):
        DBN([3], device="CPU").fit(np.zeros((4, 2)), [0, 1, 0, 1])
    with pytest.raises(BackendError, match="dtype must be one of"):
        RBM(3, device="cpu", dtype="int32").fit(np.zeros((4, 2)))
    with pytest.raises(ValueError, match="visible must be one of"):
        RBM(3, visible="poisson", device="cpu").validate_params()
    for name in ("n_hidden", "cd_k", "batch_size"):
        kwargs = {"n_hidden": 3, name: 0}
        with pytest.raises(ValueError, match=f"{name} must be >= 1"):
            RBM(device="cpu", **kwargs).validate_params()


def test_class_warnings_name_one_class_and_id_like_labels_in_a_few_lines():
    from dbn.data.validation import class_warnings
    from dbn.jobs.progress import data_lines

    (one,) = class_warnings([100], name="y")
    assert "one class only (0)" in one and "label column" in one
    ids = class_warnings(np.ones(5000, int), name="y")  # a label column of row IDs
    assert len(ids) == 1 and "5000 classes for 5000 rows" in ids[0] and "ID column" in ids[0]
    sparse = np.zeros(400, int)
    sparse[::2] = 50  # 200 empty classes
    sparse[1:41:2] = 1  # 20 rare ones
    warnings = class_warnings(sparse, name="y")
    assert len(warnings) == 2, warnings
    assert "(180 in all)" in warnings[0] and "20 classes (1, 3, 5" in warnings[1] and "(20 in all)" in warnings[1]
    assert all(len(w) < 400 for w in warnings)
    line = data_lines({"rows": 5000, "classes": [1] * 5000, "warnings": ids}).splitlines()[0]
    assert line.endswith("19:1 ... (4980 more)") and len(line) < 300
    assert "1 class, examples of each: 0:100" in data_lines({"rows": 100, "classes": [100]})


BAD_VALUES = {  # a value out of each rule's range, and one of the wrong type
    "count>=1": (0, 2.5), "count>=0": (-1, True), "positive": (0.0, float("nan")), ">=0": (-0.1, float("inf")),
    "[0, 1)": (1.0, -0.5),
}


@pytest.mark.parametrize("name", sorted(_PARAM_RANGES))
def test_every_numeric_hyperparameter_out_of_range_is_named(name, tmp_path):
    from dbn.errors import ConfigError
    from dbn.jobs.spec import load_spec

    X, y = toy_data()
    for bad in BAD_VALUES[_PARAM_RANGES[name]]:
        with pytest.raises(ValueError, match=f"^{name} must be"):
            small_dbn().set_params(**{name: bad}).fit(X, y)
    job = tmp_path / "job.toml"
    job.write_text(f"[data]\ntrain = 'mnist'\n[model]\n{name} = {str(BAD_VALUES[_PARAM_RANGES[name]][0]).lower()}\n")
    with pytest.raises(ConfigError, match=f"{job}.*{name}"):
        load_spec(str(job))


def test_pretrain_learning_rates_are_checked_one_by_one():
    X, y = toy_data()
    with pytest.raises(ValueError, match=r"pretrain_learning_rate must be a number > 0, got -0\.1"):
        small_dbn().set_params(pretrain_learning_rate=[-0.1]).fit(X, y)


def test_a_checkpoint_loaded_as_a_model_says_what_it_is(tmp_path):
    from iterreduce.master import checkpoint

    path = checkpoint.save(str(tmp_path), 3, {"fingerprint": "f"}, {"w": np.zeros((2, 2), np.float32)})
    with pytest.raises(ModelFileError, match="a training checkpoint, not a model: the model is model.npz"):
        DBN.load(path)
