"""Tests for a DBN's input preprocessing (DBN.set_inputs, dbn.model.preprocess): a model fitted on
scaled features and class indices, given the Scaler and the label classes, takes raw rows and
answers in label values, and keeps both in its model file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dbn import DBN, DataError, ModelFileError
from dbn.model import persist, preprocess
from dbn.model.scaler import FeatureStats, Scaler
from shardio.labels import LabelMap

SMALL = dict(pretrain_epochs=3, finetune_epochs=20, top_layer_epochs=2, finetune_learning_rate=0.3,
             pretrain_batch_size=20, finetune_batch_size=20, device="cpu", seed=0)
NAMES = ("ant", "bee", "cat")
N_FEATURES = 6


def raw_table(n: int, seed: int):
    """``n`` raw rows of 3 well-separated clusters, far outside [0, 1], and their string labels.

    Integers from -100 to 156 (rows 0 and 1 at the ends): with a span of 256 the min-max scaler's
    float32 arithmetic is exact, so the scaled rows lie in [0, 1]. (With other spans,
    ``(x - min) * (1 / span)`` rounded to float32 can exceed 1 by an ulp at the maximum.)"""
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(42).uniform(-40, 100, size=(len(NAMES), N_FEATURES))
    index = rng.integers(0, len(NAMES), n)
    X = np.clip(np.round(centers[index] + rng.normal(0, 12, size=(n, N_FEATURES))), -100, 156)
    X[0], X[1] = -100, 156
    return X, np.asarray(NAMES)[index]


@pytest.fixture(scope="module")
def trained():
    """What a training job does: scale with the table's min-max scaler, map labels to indices, fit."""
    X, labels = raw_table(300, seed=0)
    scaler = FeatureStats.of(X).min_max_scaler()
    classes = LabelMap(tuple(sorted(set(labels.tolist()))))
    model = DBN([16], **SMALL).fit(scaler.transform(X), classes.encode(labels))
    return model, scaler, classes, X, labels


def plain_copy(model: DBN) -> DBN:
    """A model with the same learned arrays and no inputs (so tests do not share set_inputs)."""
    return DBN(**model.get_params()).set_state(model.get_state())


def test_predicts_label_strings_from_raw_rows(trained):
    base, scaler, classes, X, labels = trained
    expected_proba = base.predict_proba(scaler.transform(X))  # scaled by hand, before set_inputs
    expected_features = base.transform(scaler.transform(X))
    model = plain_copy(base).set_inputs(scaler=scaler, classes=classes.classes)

    predicted = model.predict(X)
    assert predicted.dtype.kind == "U" and set(predicted.tolist()) <= set(NAMES)
    np.testing.assert_array_equal(predicted, classes.decode(expected_proba.argmax(axis=1)))
    np.testing.assert_array_equal(model.predict_proba(X), expected_proba)  # bit for bit
    np.testing.assert_array_equal(model.transform(X), expected_features)
    assert model.score(X, labels) == np.mean(predicted == labels) > 0.9
    assert model.score(X.tolist(), labels.tolist()) == model.score(X, labels)  # lists work too

    test_X, test_labels = raw_table(200, seed=1)  # new rows of the same table
    assert np.mean(model.predict(test_X) == test_labels) > 0.9


def test_set_inputs_keeps_checked_copies_and_leaves_params_alone(trained):
    base, scaler, classes, X, _ = trained
    model = plain_copy(base)
    params = model.get_params()
    offset = scaler.offset.astype(np.float32)  # float32 in: kept as float64
    assert model.set_inputs(scaler=Scaler("min_max", offset, scaler.scale), classes=list(classes.classes)) is model
    assert model.get_params() == params and "input_scaler_" not in params and "classes_" not in params
    assert model.input_scaler_.offset.dtype == np.float64 and model.input_scaler_.offset is not offset
    offset[:] = 1e6  # a later change to the caller's array does not reach the model
    np.testing.assert_array_equal(model.input_scaler_.offset, scaler.offset.astype(np.float32))
    np.testing.assert_array_equal(model.classes_, np.asarray(NAMES))
    clone = DBN(**model.get_params())  # scikit-learn's clone: hyperparameters only
    assert getattr(clone, "input_scaler_", None) is None and getattr(clone, "classes_", None) is None
    model.set_inputs()  # None: none again
    assert model.input_scaler_ is None and model.classes_ is None
    np.testing.assert_array_equal(model.predict(scaler.transform(X)), base.predict(scaler.transform(X)))


@pytest.mark.parametrize("label_values", [NAMES, (3, 7, 11)], ids=["strings", "integers"])
def test_save_load_round_trip_keeps_scaler_classes_and_predictions(trained, tmp_path, label_values):
    base, scaler, _, X, _ = trained
    model = plain_copy(base).set_inputs(scaler=scaler, classes=label_values)
    path = tmp_path / "model.npz"
    model.save(path)
    header, arrays = persist.load_arrays(path)
    assert header["version"] == persist.INPUTS_VERSION == 3
    assert header["scaler"] == {"kind": "min_max"} and header["classes"] == list(label_values)
    for field, name in preprocess.SCALER_ARRAYS.items():
        assert arrays[name].dtype == np.float64
        np.testing.assert_array_equal(arrays[name], getattr(scaler, field))

    loaded = DBN.load(path, device="cpu")
    assert loaded.backend.device == "cpu"
    assert loaded.input_scaler_.kind == "min_max"
    for field in ("offset", "scale"):
        value = getattr(loaded.input_scaler_, field)
        assert value.dtype == np.float64
        np.testing.assert_array_equal(value, getattr(scaler, field))
    assert loaded.classes_.dtype == model.classes_.dtype and loaded.classes_.tolist() == list(label_values)
    np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    np.testing.assert_array_equal(loaded.transform(X[:20]), model.transform(X[:20]))
    assert set(loaded.get_state()) == set(model.get_state())  # the scaler is no part of the learned state
    predicted = loaded.predict(X)
    assert predicted.dtype == model.classes_.dtype and set(predicted.tolist()) <= set(label_values)
    assert loaded.score(X, predicted) == 1.0


def test_model_without_inputs_is_unchanged(trained, tmp_path):
    base, scaler, classes, X, labels = trained
    Xs = scaler.transform(X)
    model = plain_copy(base)
    assert not hasattr(model, "input_scaler_") and not hasattr(model, "classes_")
    predicted = model.predict(Xs)
    assert np.issubdtype(predicted.dtype, np.integer)
    np.testing.assert_array_equal(predicted, model.predict_proba(Xs).argmax(axis=1))
    assert model.score(Xs, classes.encode(labels)) == base.score(Xs, classes.encode(labels))
    path = tmp_path / "plain.npz"
    model.save(path)
    header, arrays = persist.load_arrays(path)
    assert header["version"] == persist.VERSION == 2  # readable by every reader of version 2
    assert set(header) == {"format", "version", "params", "n_features_in", "n_classes", "has_network"}
    assert not set(preprocess.SCALER_ARRAYS.values()) & set(arrays)
    loaded = DBN.load(path, device="cpu")
    assert not hasattr(loaded, "input_scaler_") and not hasattr(loaded, "classes_")
    np.testing.assert_array_equal(loaded.predict_proba(Xs), model.predict_proba(Xs))
    np.testing.assert_array_equal(loaded.predict(Xs), predicted)


def test_raw_rows_outside_unit_interval_need_the_scaler(trained):
    base, scaler, _, X, _ = trained
    assert X.min() < 0 and X.max() > 1
    model = plain_copy(base)
    with pytest.raises(DataError, match=r"X has values in .* outside \[0, 1\]"):
        model.predict(X)
    model.set_inputs(scaler=scaler)
    assert model.predict(X).shape == (len(X),)
    # Rows beyond the training data's range are clipped to it: min-max scaling maps them to [0, 1].
    beyond, at_edge = X[:3].copy(), X[:3].copy()
    beyond[1, 2], at_edge[1, 2] = X[:, 2].max() + 100, X[:, 2].max()
    np.testing.assert_array_equal(model.predict_proba(beyond), model.predict_proba(at_edge))
    with pytest.raises(DataError, match="has 5 features but the model expects 6"):  # checked before scaling
        model.predict(X[:, :5])
    with pytest.raises(DataError, match="NaN"):
        model.predict(np.where(np.eye(len(X), N_FEATURES, dtype=bool), np.nan, X))


def test_gaussian_units_take_standardized_raw_rows():
    X, labels = raw_table(200, seed=3)
    scaler = FeatureStats.of(X).standardizer()
    y = LabelMap(NAMES).encode(labels)
    model = DBN([8], visible="gaussian", **{**SMALL, "pretrain_learning_rate": 0.01}).fit(scaler.transform(X), y)
    expected = model.predict_proba(scaler.transform(X))
    model.set_inputs(scaler=scaler, classes=NAMES)
    np.testing.assert_array_equal(model.predict_proba(X), expected)
    assert model.input_scaler_.kind == "standard"


@pytest.mark.parametrize("scaler, classes, match", [
    (lambda s: Scaler("min_max", s.offset[:5], s.scale[:5]), None, "scaler takes 5 features but the model has 6"),
    (lambda s: s, ("ant", "bee"), "classes has 2 values but the model has 3 classes"),
    (lambda s: s, ("bee", "ant", "cat"), r"sorted and distinct: 'ant' \(at 1\) comes after 'bee'"),
    (lambda s: s, ("ant", "ant", "cat"), r"sorted and distinct: 'ant' \(at 1\) comes after 'ant'"),
    (lambda s: s, (3, 11, 7), r"sorted and distinct: 7 \(at 2\) comes after 11"),
    (lambda s: s, ("ant", 1, "cat"), r"all integers or all strings: 1 \(at 1\) is of type int, class 0 'ant' of"),
    (lambda s: s, (1.0, 2.0, 3.0), r"all integers or all strings: 1.0 \(at 0\) is of type float$"),
    (lambda s: s, (True, 2, 3), r"all integers or all strings: True \(at 0\) is of type bool"),
    (lambda s: s, (0, 1, 2**70), r"class 1180591620717411303424 \(at 2\) does not fit in 64 bits"),
    (lambda s: s, np.array([["ant", "bee", "cat"]]), r"classes must be 1-D, got shape \(1, 3\)"),
    (lambda s: s, "abc", "classes must be a sequence"),
    (lambda s: s.to_dict(), None, "scaler must be an dbn.model.scaler.Scaler, got dict"),
    (lambda s: Scaler("max_abs", s.offset, s.scale), None, "scaler kind must be one of .*'max_abs'"),
    (lambda s: Scaler("min_max", s.offset, s.scale[:4]), None, "scaler scale has 4 values but its offset 6"),
    (lambda s: Scaler("min_max", np.where(np.arange(6) == 4, np.inf, s.offset), s.scale), None,
     "scaler offset holds 1 NaN or infinite value.*feature 4"),
])
def test_set_inputs_refuses_bad_values_by_name(trained, scaler, classes, match):
    base, good_scaler, good_classes, X, _ = trained
    model = plain_copy(base).set_inputs(scaler=good_scaler, classes=good_classes.classes)
    before = model.predict(X)
    with pytest.raises((ValueError, TypeError), match=match):
        model.set_inputs(scaler=scaler(good_scaler), classes=classes)
    assert model.input_scaler_ is not None and model.classes_.tolist() == list(NAMES)  # unchanged on error
    np.testing.assert_array_equal(model.predict(X), before)


def test_score_refuses_labels_that_are_not_classes(trained):
    base, scaler, classes, X, labels = trained
    model = plain_copy(base).set_inputs(scaler=scaler, classes=classes.classes)
    wrong = labels.copy().astype(object)
    wrong[7] = "zebra"
    with pytest.raises(DataError, match=r"y: label 'zebra' \(at 7\) is not one of the 3 classes "
                                        r"\['ant', 'bee', 'cat'\]"):
        model.score(X, wrong)
    with pytest.raises(DataError, match="labels of type int64, but the classes are strings"):
        model.score(X, classes.encode(labels))  # class indices are no label values here
    with pytest.raises(DataError, match="y: labels that are not all strings"):
        model.score(X[:3], ["ant", 1, "bee"])
    with pytest.raises(DataError, match="y has 299 labels but X has 300 samples"):
        model.score(X, labels[1:])
    with pytest.raises(DataError, match=r"y must be 1-D"):
        model.score(X, labels[:, None])


def test_inputs_set_before_training_are_checked_then(trained):
    _, scaler, _, X, labels = trained
    Xs = scaler.transform(X)
    y = LabelMap(NAMES).encode(labels)
    model = DBN([8], **{**SMALL, "finetune_epochs": 1}).set_inputs(scaler=scaler, classes=(*NAMES, "dog"))
    with pytest.raises(DataError, match="does not fit the inputs given to set_inputs: the scaler takes 6 features "
                                        "but the model has 5"):
        model.pretrain(Xs[:, :5])
    model.fit(Xs, y)  # labels 0..2 only, but 4 classes: the softmax layer has an output for each
    assert model.n_classes_ == 4 and model.predict_proba(X).shape == (len(X), 4)
    assert set(model.predict(X).tolist()) <= {*NAMES, "dog"}
    with pytest.raises(DataError, match="classes has 4 values but the model has 3 classes"):
        DBN([8], n_classes=3, **SMALL).set_inputs(classes=(*NAMES, "dog")).fit(Xs, y)


def test_a_reader_of_version_2_refuses_a_model_with_inputs(trained, tmp_path, monkeypatch):
    base, scaler, classes, _, _ = trained
    plain, scaled = tmp_path / "plain.npz", tmp_path / "scaled.npz"
    plain_copy(base).save(plain)
    plain_copy(base).set_inputs(scaler=scaler, classes=classes.classes).save(scaled)
    monkeypatch.setattr(persist, "NEWEST_VERSION", 2)  # as the code before version 3 reads
    assert DBN.load(plain, device="cpu").network_ is not None
    with pytest.raises(ModelFileError, match=r"written by a newer version \(file format 3, this one reads 2\)"):
        DBN.load(scaled, device="cpu")


@pytest.mark.parametrize("edit, match", [
    (lambda h, a: h.update(classes=["ant", "bee"]), "classes has 2 values but the model has 3"),
    (lambda h, a: h.update(classes=["bee", "ant", "cat"]), "sorted and distinct"),
    (lambda h, a: h.update(classes="ant"), "header 'classes' must be a list"),
    (lambda h, a: h.update(columns="x0"), "header 'columns' must be a list"),
    (lambda h, a: h.update(columns=["x0", "x0"]), "names 'x0' twice"),
    (lambda h, a: h.update(scaler="min_max"), "header 'scaler' must be"),
    (lambda h, a: h.update(scaler={"kind": "other"}), "scaler kind must be one of"),
    (lambda h, a: a.pop("scaler.scale"), "scaler.scale"),
    (lambda h, a: h.pop("scaler"), "array 'scaler.offset' but no 'scaler' in the header"),
    (lambda h, a: a.update({"scaler.offset": a["scaler.offset"][:4]}), "scaler scale has 6 values but its offset 4"),
    (lambda h, a: a.update({"scaler.offset": a["scaler.offset"][:4], "scaler.scale": a["scaler.scale"][:4]}),
     "scaler takes 4 features but the model has 6"),
])
def test_model_file_with_bad_inputs_is_refused(trained, tmp_path, edit, match):
    base, scaler, classes, _, _ = trained
    path = tmp_path / "m.npz"
    plain_copy(base).set_inputs(scaler=scaler, classes=classes.classes).save(path)
    header, arrays = persist.load_arrays(path)
    edit(header, arrays)
    persist.save_arrays(path, {k: v for k, v in header.items() if k not in ("format", "version")}, arrays,
                        version=persist.INPUTS_VERSION)
    with pytest.raises(ModelFileError, match=f"{path}.*inconsistent.*{match}"):
        DBN.load(path, device="cpu")


def test_header_holds_classes_exactly(trained, tmp_path):
    """Integer classes beyond float64's exact range survive the JSON header."""
    base, scaler, _, X, _ = trained
    big = (-(2**62), 2**53 + 1, 2**63 - 1)
    model = plain_copy(base).set_inputs(classes=big)
    model.save(tmp_path / "m.npz")
    raw = dict(np.load(tmp_path / "m.npz"))["__header__"].tobytes()
    assert json.loads(raw)["classes"] == list(big)
    loaded = DBN.load(tmp_path / "m.npz", device="cpu")
    assert loaded.classes_.dtype == np.int64 and loaded.classes_.tolist() == list(big)
    Xs = scaler.transform(X)
    np.testing.assert_array_equal(loaded.predict(Xs), model.predict(Xs))


def test_columns_are_kept_checked_and_saved(trained, tmp_path):
    """A model trained on a table names its columns (``input_columns_``); the file keeps them
    (as format 3, like a scaler or classes: a reader of 2 would read tables by the job file's order)."""
    base, _, _, _, _ = trained
    columns = ("m 0", "m 1", "age", "vec", "x[1]", "tenure")
    model = plain_copy(base).set_inputs(columns=list(columns))
    assert model.input_columns_ == columns and model.input_scaler_ is None and model.classes_ is None
    path = tmp_path / "m.npz"
    model.save(path)
    header, _ = persist.load_arrays(path)
    assert header["version"] == persist.INPUTS_VERSION and header["columns"] == list(columns)
    assert DBN.load(path, device="cpu").input_columns_ == columns
    plain_copy(base).save(path)
    assert getattr(DBN.load(path, device="cpu"), "input_columns_", None) is None  # absent: none, as fitted
    for bad, match in (([], "non-empty strings"), (["a", ""], "non-empty strings"), (["a", 3], "non-empty strings"),
                       (["a", "b", "a"], "names 'a' twice"), ("abc", "sequence of column names")):
        with pytest.raises((TypeError, ValueError), match=match):
            plain_copy(base).set_inputs(columns=bad)


def test_fine_tuning_keeps_the_columns_set_before(trained):
    base, scaler, classes, X, labels = trained
    model = DBN([8], **{**SMALL, "finetune_epochs": 1}).set_inputs(scaler=scaler, columns=["a", "b"])
    model.fit(scaler.transform(X), labels)  # string labels: fit sets classes_, keeping the rest
    assert model.input_columns_ == ("a", "b") and model.classes_.tolist() == list(NAMES)
