"""Rows given to a model from Python as a pyarrow Table or a pandas DataFrame are read by column
name: ``fit`` and ``pretrain`` keep the names (``input_columns_``, saved with the model), and
``predict``, ``predict_proba``, ``transform``, ``score`` and ``finetune`` read those columns, in
that order, whatever the order of columns given (before, a DataFrame was read by position:
its columns in another order were other features, silently). A model of a job on a table or a
CSV file names its columns the same way."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dbn import DBN, DataError

SMALL = dict(hidden_layers=[12], pretrain_epochs=2, finetune_epochs=15, pretrain_batch_size=20,
             finetune_batch_size=20, finetune_learning_rate=0.3, device="cpu", seed=0)


def rows(n: int, seed: int) -> tuple[pa.Table, np.ndarray]:
    """Features in [0, 1]: scalars a, b and a list column v of 2; the class from their weighted sum."""
    rng = np.random.default_rng(seed)
    X = rng.random((n, 4)).astype(np.float32)
    y = (2 * X[:, 0] - X[:, 1] + X[:, 3] > 1.0).astype(int)
    table = pa.table({"a": X[:, 0], "b": X[:, 1], "v": pa.array(list(X[:, 2:]), pa.list_(pa.float32()))})
    return table, y


def test_a_table_is_read_by_the_names_the_model_was_fitted_on():
    table, y = rows(400, seed=0)
    model = DBN(**SMALL).fit(table, y)
    assert model.input_columns_ == ("a", "b", "v") and model.n_features_in_ == 4
    test, y_test = rows(200, seed=1)
    X_test = np.column_stack([test.column("a"), test.column("b"), np.stack(test.column("v").to_numpy(False))])
    expected = model.predict_proba(X_test)  # an array: by position, as always
    assert model.score(X_test, y_test) > 0.8  # it learned: a mix-up of columns would show
    shuffled = test.select(["v", "b", "a"]).append_column("id", pa.array(range(200)))
    np.testing.assert_array_equal(model.predict_proba(shuffled), expected)
    np.testing.assert_array_equal(model.predict_proba(shuffled.to_batches()[0]), expected)
    np.testing.assert_array_equal(model.transform(shuffled), model.transform(X_test))
    assert model.score(shuffled, y_test) == model.score(X_test, y_test)
    with pytest.raises(DataError, match=r"X: no column 'a' \(columns: v, b, id, A\)"):
        model.predict(shuffled.drop(["a"]).append_column("A", test.column("a")))


def test_the_features_each_column_gives_are_kept_saved_and_checked(tmp_path):
    table, y = rows(200, seed=0)
    model = DBN(**SMALL).fit(table, y)
    assert model.input_widths_ == (1, 1, 2)  # the list column v gives two
    model.save(tmp_path / "m.npz")
    assert DBN.load(tmp_path / "m.npz", device="cpu").input_widths_ == (1, 1, 2)
    assert DBN(**SMALL).fit(table.column("a").to_numpy()[:, None], y).learned("input_widths_") is None  # an array
    for widths, message in (([1, 2], "one positive integer for each of the 3 columns"),
                            ([1, 1, 0], "one positive integer"), ([1, 1, 1], "add up to 3 features, but the model "
                                                                             "takes 4"), (["a", 1, 1], "integers")):
        with pytest.raises((TypeError, ValueError), match=message):
            model.set_inputs(columns=["a", "b", "v"], widths=widths)
    with pytest.raises(ValueError, match="widths without columns"):
        model.set_inputs(widths=[4])


def test_a_dataframe_is_read_by_name_and_the_names_are_saved(tmp_path):
    table, y = rows(400, seed=0)
    frame = pd.DataFrame({"a": table.column("a"), "b": table.column("b"), "c": 1.0 - np.asarray(table.column("b"))})
    model = DBN(**SMALL).fit(frame, y)
    assert model.input_columns_ == ("a", "b", "c")
    model.save(tmp_path / "m.npz")
    loaded = DBN.load(tmp_path / "m.npz", device="cpu")
    assert loaded.input_columns_ == ("a", "b", "c")
    reordered = frame[["c", "a", "b"]].assign(note="x")
    np.testing.assert_array_equal(loaded.predict_proba(reordered), model.predict_proba(frame.to_numpy()))
    # Numbered columns (a DataFrame made from an array) have no names to read: by position.
    numbered = pd.DataFrame(frame.to_numpy())
    np.testing.assert_array_equal(loaded.predict_proba(numbered), model.predict_proba(frame.to_numpy()))
    with pytest.raises(DataError, match=r"X: column 'b' is null at row 3 \(1 null in rows 0\.\.399\)$"):
        loaded.predict(frame.assign(b=frame["b"].where(frame.index != 3)))


def test_names_set_before_training_win_over_the_frames_order():
    """As a job sets them (set_inputs before training): the frame's other columns play no part."""
    table, y = rows(300, seed=2)
    frame = pd.DataFrame({"b": table.column("b"), "zzz": 0.5, "a": table.column("a")})
    model = DBN(**SMALL).set_inputs(columns=["a", "b"]).fit(frame, y)
    assert model.input_columns_ == ("a", "b") and model.n_features_in_ == 2
    direct = DBN(**SMALL).fit(np.column_stack([table.column("a"), table.column("b")]), y)
    np.testing.assert_array_equal(model.rbms_[0].weights_, direct.rbms_[0].weights_)


def test_a_frame_of_categories_is_refused_as_a_job_refuses_a_table_of_them():
    table, y = rows(100, seed=3)
    frame = pd.DataFrame({"a": table.column("a"), "plan": np.where(y == 1, "pro", "basic")})
    with pytest.raises(DataError, match="X: feature column 'plan' is (large_)?string: .*a column of categories; encode it"):
        DBN(**SMALL).fit(frame, y)
