"""The one reader of user files: regular files only, bounded, BOM accepted, strict JSON."""

import os

import pytest

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.inputfile import MAX_DEPTH, nesting_depth, parse_json, parse_toml, read_text


def refused(fn, *args) -> str:
    with pytest.raises(InputError) as err:
        fn(*args)
    assert str(err.value).isprintable()
    return err.value.rule


def test_fifo_device_and_directory_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading would block for ever
    assert refused(read_text, str(fifo)).startswith("not a regular file")
    assert refused(read_text, "/dev/zero").startswith("not a regular file")
    assert refused(read_text, str(tmp_path)).startswith("is a directory")
    assert refused(read_text, "").startswith("an empty path")


def test_size_bound_and_encoding(tmp_path):
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * 2000)
    assert "at most 1,000" in refused(read_text, str(big), "-", 1000)
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"name = \"\xff\"")
    assert refused(read_text, str(bad)) == "not UTF-8 text"


def test_byte_order_mark_is_dropped(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_text("\ufeffname = 'x'\n", encoding="utf-8")
    assert parse_toml(str(path), read_text(str(path))) == {"name": "x"}


def test_nesting_is_bounded_in_json_and_toml():
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    assert refused(parse_json, "f.json", deep).startswith("nested more than")
    assert refused(parse_toml, "f.toml", "a = " + deep).startswith("nested more than")
    assert refused(parse_json, "f.json", "[" * 100_000).startswith("nested more than")
    # brackets inside strings and comments do not count
    assert nesting_depth('a = "[[[[" # [[[[\nb = [[1], {x = [2]}]') == 3
    assert parse_json("f.json", '{"a": "' + "[" * 100 + '"}') == {"a": "[" * 100}


def test_json_numbers_must_be_finite_and_short():
    for text in ("NaN", "Infinity", "-Infinity", '{"tp": Infinity}'):
        assert "not a number JSON allows" in refused(parse_json, "f.json", text)
    assert "at most 40" in refused(parse_json, "f.json", "1" * 5000)
    assert "overflows a float" in refused(parse_json, "f.json", '{"tp": 1e400}')
    assert parse_json("f.json", '{"a": 4, "b": 4.5, "c": -2e3}') == {"a": 4, "b": 4.5, "c": -2000.0}
