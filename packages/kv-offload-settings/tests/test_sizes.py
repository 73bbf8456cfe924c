"""One size rule: binary units, case-blind; bits, negatives and fractions of a byte refused."""

from __future__ import annotations

import pytest
from kv_offload_settings import SIZE_EXAMPLES, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("8GiB", 8 << 30),
        ("8gib", 8 << 30),
        ("8GIB", 8 << 30),
        ("8GB", 8 << 30),
        ("8gb", 8 << 30),
        ("8G", 8 << 30),
        ("8 MIB", 8 << 20),
        ("1.5KIB", 1536),
        ("8B", 8),
        ("8589934592", 8 << 30),
    ],
)
def test_units_are_binary_and_case_blind(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["8b", "8bit", "8.7", "-1MiB", "1Mx", "GiB", "lots", ""])
def test_no_size_is_refused_naming_the_text_and_the_examples(text: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        parse_size(text)
    assert str(excinfo.value) == f"{text!r} is not a size such as {SIZE_EXAMPLES}"
