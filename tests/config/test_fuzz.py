"""Property tests for the config parser: valid values parse exactly; bad input only raises ConfigError.

The profile is derandomized (the same examples every run) so CI is repeatable. To hunt for new
failures locally, run with a different profile, e.g. temporarily `derandomize=False, max_examples=5000`.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.config import Config, ConfigError, apply_override, dump_toml, load_config, save_config, validate
from kiln.config.choices import is_switch, literal_values

settings.register_profile(
    "kiln-config-fuzz",
    max_examples=200,
    deadline=None,  # a loaded CI machine must not turn a slow example into a failure
    derandomize=True,  # the same examples every run
    database=None,  # nothing written to or replayed from .hypothesis/
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
FUZZ = settings.get_profile("kiln-config-fuzz")

SECTION_TYPES: dict[str, type] = typing.get_type_hints(Config)
FIELD_TYPES: dict[str, Any] = {
    f"{section}.{name}": tp for section, cls in SECTION_TYPES.items() for name, tp in typing.get_type_hints(cls).items()
}
FIELD_NAMES = sorted({key.split(".")[1] for key in FIELD_TYPES})


def keys_of(tp: Any) -> list[str]:
    return sorted(k for k, t in FIELD_TYPES.items() if t == tp)


INT_KEYS, FLOAT_KEYS, BOOL_KEYS, STR_KEYS = keys_of(int), keys_of(float), keys_of(bool), keys_of(str)
LIST_KEYS = keys_of(list[float])
DICT_KEYS = keys_of(dict[str, Any])
# Closed choices (`Literal`) parse as strings (validate checks the value); switches (`bool | None`).
STR_KEYS += sorted(k for k, t in FIELD_TYPES.items() if literal_values(t) is not None)
SWITCH_KEYS = sorted(k for k, t in FIELD_TYPES.items() if is_switch(t))


def test_every_field_type_is_fuzzed():
    covered = {*INT_KEYS, *FLOAT_KEYS, *BOOL_KEYS, *STR_KEYS, *SWITCH_KEYS, *LIST_KEYS, *DICT_KEYS}
    assert covered == set(FIELD_TYPES), f"add a strategy for {sorted(set(FIELD_TYPES) - covered)}"


def set_and_get(key: str, text: str) -> Any:
    cfg = Config()
    apply_override(cfg, f"{key}={text}")
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def pad(text: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """The text, sometimes with surrounding spaces (numbers and bools ignore them)."""
    return st.tuples(st.sampled_from(["", " ", "  "]), text, st.sampled_from(["", " ", "\t"])).map("".join)


# --------------------------------------------------------------------------- (a) valid values parse exactly


@st.composite
def int_text(draw) -> tuple[int, str]:
    value = draw(st.one_of(st.integers(-(10**6), 10**6), st.integers(-(2**200), 2**200)))
    style = draw(st.sampled_from(["plain", "underscores", "plus", "exponent"]))
    if style == "underscores":
        text = f"{value:_d}"
    elif style == "plus" and value >= 0:
        text = f"+{value}"
    elif style == "exponent" and 0 < abs(value) < 2**40:
        # `1e3`: read through float, exact for these magnitudes
        exponent = draw(st.integers(0, 6))
        value *= 10**exponent
        text = f"{value // 10**exponent}e{exponent}"
    else:
        text = str(value)
    return value, text


@FUZZ
@given(key=st.sampled_from(INT_KEYS), case=int_text(), padding=st.sampled_from(["", " "]))
def test_int_values_parse_exactly(key, case, padding):
    value, text = case
    result = set_and_get(key, padding + text + padding)
    assert type(result) is int and result == value


@FUZZ
@given(key=st.sampled_from(FLOAT_KEYS), value=st.floats(allow_nan=False, allow_infinity=False), data=st.data())
def test_float_values_parse_exactly(key, value, data):
    text = data.draw(pad(st.sampled_from([repr(value), str(value), f"{value:.17g}"])))
    result = set_and_get(key, text)
    assert type(result) is float
    assert result == value and math.copysign(1.0, result) == math.copysign(1.0, value)


@FUZZ
@given(key=st.sampled_from(FLOAT_KEYS), value=st.integers(-(10**15), 10**15))
def test_float_fields_take_integers(key, value):
    result = set_and_get(key, str(value))
    assert type(result) is float and result == value


BOOL_SPELLINGS = {
    "true": True,
    "1": True,
    "yes": True,
    "on": True,
    "false": False,
    "0": False,
    "no": False,
    "off": False,
}


@FUZZ
@given(key=st.sampled_from(BOOL_KEYS), spelling=st.sampled_from(sorted(BOOL_SPELLINGS)), data=st.data())
def test_bool_values_parse_exactly(key, spelling, data):
    cased = "".join(c.upper() if data.draw(st.booleans()) else c for c in spelling)
    result = set_and_get(key, data.draw(pad(st.just(cased))))
    assert result is BOOL_SPELLINGS[spelling]


@FUZZ
@given(key=st.sampled_from(SWITCH_KEYS), spelling=st.sampled_from(["auto", "true", "false"]))
def test_switch_values_parse_exactly(key, spelling):
    assert set_and_get(key, spelling) is {"auto": None, "true": True, "false": False}[spelling]


@FUZZ
@given(key=st.sampled_from(STR_KEYS), value=st.text())
def test_str_values_are_taken_verbatim(key, value):
    assert set_and_get(key, value) == value


@FUZZ
@given(
    key=st.sampled_from(LIST_KEYS),
    values=st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=5),
    style=st.sampled_from(["toml", "comma", "comma-space", "brackets-comma"]),
)
def test_list_values_parse_exactly(key, values, style):
    items = [repr(v) for v in values]
    if style == "toml":
        text = "[" + ", ".join(items) + "]"
    elif style == "comma":
        text = ",".join(items)
    elif style == "comma-space":
        text = ", ".join(items)
    else:
        text = "[" + ",".join(items) + "]"
    result = set_and_get(key, text)
    assert result == values
    assert all(type(v) is float for v in result)


TOML_SCALARS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
    st.text(),
    st.dates(),
    st.lists(st.integers(-100, 100), max_size=4),
)


def toml_literal(value: Any) -> str:
    return tomli_w.dumps({"v": value}).partition("=")[2].strip()


@FUZZ
@given(
    key=st.sampled_from(DICT_KEYS),
    entry=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True),
    value=TOML_SCALARS,
)
def test_dict_entries_parse_toml_literals(key, entry, value):
    cfg = Config()
    apply_override(cfg, f"{key}.{entry}={toml_literal(value)}")
    section, name = key.split(".")
    result = getattr(getattr(cfg, section), name)[entry]
    assert result == value and type(result) is type(value)


# --------------------------------------------------------------------------- (b) arbitrary text for known keys

TOML_CHARS = "[]{}=,.\"'\\0123456789eE+-_ :#\ninfatrusolxbn"
NASTY_TEXT = st.one_of(
    st.text(),
    st.text(alphabet=TOML_CHARS, max_size=40),
    st.integers(0, 6000).map(lambda n: "9" * n),
    st.integers(0, 3000).map(lambda n: "[" * n + "]" * n),
    st.integers(0, 3000).map(lambda n: "[" * n),
    st.integers(0, 2000).map(lambda n: "{a=" * n + "1" + "}" * n),
    st.sampled_from(["nan", "inf", "-inf", "+nan", "1e400", "-1e400", "1e-400", "0x10", "1_", "_1", "1__0", "١٢"]),
    st.lists(st.sampled_from(["nan", "inf", "1e400", "0.5", "x", "", "[", "]", "true"]), max_size=4).map(",".join),
)


def apply_and_validate(assignments: list[str]) -> None:
    """Either succeeds or raises ConfigError; anything else fails the test with its traceback."""
    cfg = Config()
    try:
        for a in assignments:
            apply_override(cfg, a)
        validate(cfg)
    except ConfigError:
        return
    assert_accepted_config_is_sane(cfg)


def assert_accepted_config_is_sane(cfg: Config) -> None:
    """What validate() let through has finite numbers and saves and loads back unchanged."""
    for key in FLOAT_KEYS:
        section, name = key.split(".")
        assert math.isfinite(getattr(getattr(cfg, section), name)), key
    assert all(math.isfinite(b) for b in cfg.optim.betas)
    assert_round_trips(cfg)


def assert_round_trips(cfg: Config) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.toml"
        save_config(cfg, path)
        loaded = load_config(path)
    assert comparable(dataclasses.asdict(loaded)) == comparable(dataclasses.asdict(cfg))


def comparable(value: Any) -> Any:
    """NaN != NaN; model.kwargs may hold NaN (it is not validated), so compare it by name."""
    if isinstance(value, float) and math.isnan(value):
        return "<nan>"
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


ANY_KEY = st.one_of(
    st.sampled_from(sorted(FIELD_TYPES)),
    st.sampled_from(DICT_KEYS).map(lambda k: f"{k}.x"),
    st.sampled_from(["compile.options.coordinate_descent_tuning", "compile.options.triton", "model.kwargs.a.b"]),
)


@FUZZ
@given(key=ANY_KEY, text=NASTY_TEXT)
def test_any_text_for_known_keys_raises_only_config_error(key, text):
    apply_and_validate([f"{key}={text}"])


@FUZZ
@given(assignments=st.lists(st.tuples(ANY_KEY, NASTY_TEXT).map("=".join), min_size=2, max_size=5))
def test_sequences_of_overrides_raise_only_config_error(assignments):
    apply_and_validate(assignments)


# --------------------------------------------------------------------------- (c) arbitrary dotted keys

SEGMENT = st.one_of(
    st.sampled_from(sorted(SECTION_TYPES)),
    st.sampled_from(FIELD_NAMES),
    st.sampled_from(["", " ", "__class__", "__dict__", "kwargs", "options", "x", "0", "[0]"]),
    st.text(max_size=12),
)


@FUZZ
@given(segments=st.lists(SEGMENT, max_size=5), text=st.one_of(st.just("1"), NASTY_TEXT))
def test_arbitrary_dotted_keys_raise_only_config_error(segments, text):
    apply_and_validate([".".join(segments) + "=" + text])


@FUZZ
@given(assignment=st.text())
def test_arbitrary_assignment_text_raises_only_config_error(assignment):
    apply_and_validate([assignment])


# --------------------------------------------------------------------------- (d) arbitrary TOML documents

SCALARS = st.one_of(
    st.integers(-(10**30), 10**30),
    st.integers(-(10**400), 10**400),  # past float range: int -> float must not overflow
    st.floats(),  # includes nan and inf
    st.booleans(),
    st.text(max_size=20),
    st.sampled_from(["mlp", "cpu", "cuda:0", "adamw", "max-autotune", "inductor", "files", "true", "1e3"]),
    st.dates(),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=8)), inner, max_size=3),
    ),
    max_leaves=8,
)


def typed_values(tp: Any) -> st.SearchStrategy[Any]:
    """Values of roughly the field's type, edge cases included, so documents get past type
    conversion and reach validation."""
    if tp is float:
        return st.one_of(st.floats(), st.integers(-(10**400), 10**400), st.sampled_from([0.0, 1e-3, 0.5]))
    if tp is int:
        return st.one_of(st.integers(-5, 300), st.integers(-(2**70), 2**70), st.floats())
    if tp is bool:
        return st.one_of(st.booleans(), st.sampled_from(["yes", "off", "2"]))
    if tp is str:
        return st.one_of(st.sampled_from(["auto", "cpu", "mlp", "synthetic", "", "none", "fp32"]), st.text(max_size=10))
    if typing.get_origin(tp) is list:
        return st.lists(st.one_of(st.floats(), st.integers(-(10**400), 10**400)), max_size=3)
    return st.dictionaries(st.text(max_size=8), VALUES, max_size=3)


@st.composite
def documents(draw) -> dict[str, Any]:
    """Mostly real section and field names (so values reach type conversion and validation)."""
    doc: dict[str, Any] = {}
    for section in draw(st.lists(st.one_of(st.sampled_from(sorted(SECTION_TYPES)), st.text(max_size=8)), max_size=4)):
        if section in SECTION_TYPES and draw(st.integers(0, 9)) > 0:
            hints = typing.get_type_hints(SECTION_TYPES[section])
            table: dict[str, Any] = {}
            for name in draw(st.lists(st.sampled_from(sorted(hints)), max_size=3)):
                table[name] = draw(typed_values(hints[name]) if draw(st.integers(0, 4)) else VALUES)
            if draw(st.integers(0, 9)) == 0:
                table[draw(st.text(max_size=8))] = draw(VALUES)
            doc[section] = table
        else:
            doc[section] = draw(VALUES)
    return doc


@pytest.fixture(scope="module")
def doc_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def load_or_config_error(path: Path) -> Config | None:
    try:
        return load_config(path)
    except ConfigError:
        return None


@FUZZ
@given(doc=documents())
def test_arbitrary_toml_documents_load_or_raise_config_error(doc_dir, doc):
    path = doc_dir / "doc.toml"
    path.write_text(tomli_w.dumps(doc), encoding="utf-8")
    cfg = load_or_config_error(path)
    if cfg is not None:
        assert_accepted_config_is_sane(cfg)


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), st.text(alphabet=TOML_CHARS, max_size=200).map(str.encode)))
def test_arbitrary_file_bytes_load_or_raise_config_error(doc_dir, data):
    path = doc_dir / "raw.toml"
    path.write_bytes(data)
    load_or_config_error(path)


def test_defaults_load_and_dump():
    assert load_config(None) == Config()
    assert dump_toml(Config())
