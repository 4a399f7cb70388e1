"""load_json: every way outside JSON text can be wrong is a ValueError that says what is wrong."""

from __future__ import annotations

import pytest

from wire.jsontext import load_json, require_unicode


def test_valid_text_and_bytes_parse_alike() -> None:
    assert load_json('{"a": [1, "\\u00e9"]}') == {"a": [1, "é"]}
    assert load_json(b'{"a": [1, "\\u00e9"]}') == {"a": [1, "é"]}


def test_a_surrogate_pair_is_valid_text() -> None:
    assert load_json('"\\ud83d\\ude00"') == "\U0001f600"


@pytest.mark.parametrize("body", ['"\\ud800"', '{"\\udc00": 1}', b'["x", "\\uDBFF"]'])
def test_a_lone_surrogate_escape_is_refused(body: str | bytes) -> None:
    with pytest.raises(ValueError, match="lone UTF-16 surrogate"):
        load_json(body)


def test_a_str_holding_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(ValueError, match="lone UTF-16 surrogate"):
        load_json('"\ud800"')


@pytest.mark.parametrize("body", ["[" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000])
def test_nesting_past_the_recursion_limit_is_refused(body: str) -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        load_json(body)


def test_invalid_utf8_is_a_value_error() -> None:
    with pytest.raises(UnicodeDecodeError, match="utf-8"):
        load_json(b'"\xff"')


def test_the_object_hook_is_used() -> None:
    assert load_json('{"a": 1}', object_pairs_hook=lambda pairs: sorted(pairs)) == [("a", 1)]


def test_an_already_parsed_mapping_is_checked_for_lone_surrogates() -> None:
    require_unicode({"ok": ["é"]})
    with pytest.raises(ValueError, match="lone UTF-16 surrogate"):
        require_unicode({"id": "\udfff"})
