"""The one Options object: declared once, validated at construction naming the option, frozen."""
import dataclasses
from zoneinfo import ZoneInfo

import pytest

from bridge.errors import OptionsError
from bridge.options import DEFAULT_OPTIONS, Options, option_specs

SPECS = {name: (type_, default, choices, help_) for name, type_, default, choices, help_ in option_specs()}
CHOICE_OPTIONS = sorted(name for name, (_, _, choices, _) in SPECS.items() if choices)
BOOL_OPTIONS = sorted(name for name, (type_, _, _, _) in SPECS.items() if type_ == "bool")


def raises_naming(option, **kwargs) -> OptionsError:
    with pytest.raises(OptionsError) as info:
        Options(**kwargs)
    assert f"'{option}'" in str(info.value), str(info.value)
    return info.value


def test_defaults_are_lossless_utc_string_decimals_and_fail_on_error():
    o = Options()
    assert (o.strict, o.lossless, o.timezone, o.decimal, o.on_error) == (False, True, "UTC", "string", "fail")
    assert o.max_message_bytes == 1 << 20 and o.emit_control and not o.system_time
    assert DEFAULT_OPTIONS == o


def test_option_specs_list_every_field_once_in_declaration_order():
    fields = dataclasses.fields(Options)
    assert [name for name, *_ in option_specs()] == [f.name for f in fields]
    defaults = Options()
    for name, (type_, default, choices, help_) in SPECS.items():
        assert getattr(defaults, name) == default
        assert help_ and len(help_) > 10, name
        assert choices is None or default is None or default in choices, name
        assert type_ in {"bool", "str", "int", "str | None"}, (name, type_)


def test_the_choice_options_are_the_documented_ones():
    assert {name: SPECS[name][2] for name in CHOICE_OPTIONS} == {
        "control_events": ("emit", "drop"),
        "decimal": ("string", "double"),
        "on_error": ("fail", "skip", "keep"),
        "tuple_binary": ("base64", "hex"),
        "zero_dates": ("null", "error", "string"),
        "temporal_precision": ("exact", "truncate", "round"),
    }


def test_temporal_policy_defaults_never_fail_on_data_mysql_accepts():
    """Zero dates become null and sub-millisecond digits are truncated, both counted (docs/decisions.md)."""
    o = Options()
    assert (o.zero_dates, o.temporal_precision) == ("null", "truncate")


@pytest.mark.parametrize("name", CHOICE_OPTIONS)
def test_each_choice_is_accepted(name):
    for choice in SPECS[name][2]:
        assert getattr(Options(**{name: choice}), name) == choice


@pytest.mark.parametrize("name", CHOICE_OPTIONS)
@pytest.mark.parametrize("bad", ["nonsense", "", "FAIL", 1])
def test_a_bad_choice_names_the_option_and_the_choices(name, bad):
    err = raises_naming(name, **{name: bad})
    assert err.value == bad
    for choice in SPECS[name][2]:
        assert choice in err.reason


@pytest.mark.parametrize("name", BOOL_OPTIONS)
@pytest.mark.parametrize("bad", ["yes", 1, 0, None, "false"])
def test_a_bool_option_takes_only_true_or_false(name, bad):
    raises_naming(name, **{name: bad})


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "", "../etc/passwd", "utc+8", 8])
def test_a_bad_timezone_is_rejected(zone):
    err = raises_naming("timezone", timezone=zone)
    assert err.value == zone


@pytest.mark.parametrize("zone", ["UTC", "Asia/Shanghai", "America/Sao_Paulo", "Etc/GMT-8"])
def test_iana_zones_are_accepted(zone):
    assert Options(timezone=zone).zone == ZoneInfo(zone)


def test_strict_with_emitted_control_events_is_rejected():
    err = raises_naming("control_events", strict=True, control_events="emit")
    assert "strict" in str(err)


@pytest.mark.parametrize("kwargs, emit", [
    ({}, True),
    ({"strict": True}, False),
    ({"strict": True, "control_events": "drop"}, False),
    ({"control_events": "drop"}, False),
    ({"control_events": "emit"}, True),
])
def test_control_events_follow_the_mode_unless_chosen(kwargs, emit):
    assert Options(**kwargs).emit_control is emit


@pytest.mark.parametrize("size", [64, 65, 1 << 20, 1 << 30])
def test_max_message_bytes_within_bounds(size):
    assert Options(max_message_bytes=size).max_message_bytes == size


@pytest.mark.parametrize("size", [63, 0, -1, (1 << 30) + 1, "1024", 1024.0, None, True])
def test_max_message_bytes_out_of_bounds_is_rejected(size):
    raises_naming("max_message_bytes", max_message_bytes=size)


def test_options_are_frozen_and_hashable():
    o = Options(decimal="double")
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.decimal = "string"
    assert hash(o) == hash(Options(decimal="double")) and o != Options()


def test_replace_returns_a_validated_copy():
    o = Options()
    assert o.replace(on_error="skip").on_error == "skip" and o.on_error == "fail"
    with pytest.raises(OptionsError, match="on_error"):
        o.replace(on_error="ignore")
    with pytest.raises(OptionsError, match="control_events"):
        Options(control_events="emit").replace(strict=True)


def test_options_error_is_a_value_error():
    with pytest.raises(ValueError):
        Options(decimal="float")


def test_unknown_options_are_a_type_error():
    with pytest.raises(TypeError):
        Options(timezon="UTC")
