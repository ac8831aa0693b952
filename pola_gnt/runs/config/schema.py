"""The config's schema is the settings dataclasses: `RunSettings` for `conf/config.yaml`,
`ProcessDataSettings` for `conf/process_data.yaml`. A key is one field of a settings class plus its
default in the YAML; nothing else lists the keys.

- Hydra: `register_schemas` puts each root class, as a structured config (`hydra_schema`), in
  Hydra's ConfigStore; the YAML files name it first in their defaults list, so composing is strict:
  a key that is no field (a typo in a YAML file or on the command line) stops the command
  (`composition_error` words it as one line), and a key the YAML leaves out is `???` (MISSING).
- Values: `read_settings` turns a composed config (or a checkpoint's stored config, a plain mapping)
  into the settings, checking each value against its field's annotation (`int`, `float`, `bool`,
  `str`, `X | None`, `tuple[...]`, a nested settings class) and then calling the class's
  `check(key)` for ranges and choices. Every error is a `UserError` naming the full dotted key.

Hydra's schema types every value `Any` (sections stay typed: a misspelt key is still an error), so
that composing keeps the YAML's values as written and the reader alone judges them: OmegaConf's own
conversions would accept what the reader refuses (`1` or `yes` as true, a number as a path) and turn
`30` into `30.0` in the config a checkpoint stores.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException, ValidationError

from pola_gnt.core.errors import UserError, check_bool, check_int, check_number, is_int, is_number
from pola_gnt.data.settings import ProcessDataSettings
from pola_gnt.runs.settings import RunSettings

T = TypeVar("T")
# The names the YAML files' defaults lists give the schemas (conf/config.yaml, conf/process_data.yaml).
SCHEMAS: dict[str, type] = {"run_schema": RunSettings, "process_data_schema": ProcessDataSettings}
# Keys of a stored config that are no settings: Hydra's `_target_` of configs from before the
# settings objects (the network and the trainer are built from their settings now).
IGNORED_KEYS = ("_target_",)
HYDRA_KEY = "hydra"  # Hydra's own section of a composed config: not the command's


# ---- Hydra's structured configs ---------------------------------------------------------------------


def _sub(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def _is_section(hint: Any) -> bool:
    """A settings class (a section of keys), not a union with one nor a value."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


@functools.cache
def hydra_schema(cls: type) -> type:
    """`cls` as the structured config Hydra composes into: the same keys, without defaults (MISSING),
    a nested schema for each field that is a settings class and `Any` for every other field. A
    settings class that may be null (`collection`, `data.random_crop`) is a value too: Hydra cannot
    merge a mapping into a typed section that is null."""
    hints = _hints(cls)
    fields = [
        (field.name, hydra_schema(hints[field.name]) if _is_section(hints[field.name]) else Any)
        for field in dataclasses.fields(cls)
    ]
    return dataclasses.make_dataclass(f"{cls.__name__}Schema", fields)


def register_schemas() -> None:
    """Store the schemas in Hydra's ConfigStore under the names the YAML defaults lists use."""
    store = ConfigStore.instance()
    for name, cls in SCHEMAS.items():
        store.store(name=name, node=hydra_schema(cls))


def _field_names(root: type, key: str) -> list[str] | None:
    """The field names of the settings class at dotted `key` under `root` (None: no settings class there)."""
    cls: Any = root
    for part in [p for p in key.split(".") if p]:
        hint = _hints(cls).get(part.split("[")[0]) if _is_section(cls) else None
        cls = next((member for member in _members(hint) if _is_section(member)), None)
    return [field.name for field in dataclasses.fields(cls)] if _is_section(cls) else None


def _members(hint: Any) -> list[Any]:
    """The types a hint allows: the members of a union, a tuple's items, or the hint itself."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType, tuple, list):
        return [member for arg in typing.get_args(hint) for member in _members(arg)]
    return [hint]


def not_a_key(key: str, names: list[str] | None) -> UserError:
    """The one line for a key that is no setting, with the likeliest meant one."""
    close = difflib.get_close_matches(key.rpartition(".")[2], names or [], n=1)
    meant = f"; did you mean {_sub(key.rpartition('.')[0], close[0])}?" if close else "; check the name"
    return UserError(f"{key}: not a config key{meant}")


def composition_error(error: BaseException, root: type) -> UserError | None:
    """The one-line `UserError` for Hydra failing to compose the config of settings class `root`
    because of a key or value (OmegaConf's error, or its cause, names the key); None for others
    (a config group option that does not exist, an override Hydra cannot parse: Hydra reports those)."""
    cause = error if isinstance(error, OmegaConfBaseException) else error.__cause__ or error.__context__
    key = getattr(cause, "full_key", None)
    if not isinstance(cause, OmegaConfBaseException) or not key:
        return None
    if isinstance(cause, (ConfigKeyError, AttributeError)):  # ConfigAttributeError: struct mode, a schema
        return not_a_key(key, _field_names(root, key.rpartition(".")[0]))
    names = _field_names(root, key)
    if isinstance(cause, ValidationError) and names:
        return UserError(f"{key}: must be a config section, not a value (set its keys: {key}.{names[0]}=...)")
    return UserError(f"{key}: {_first_line(cause)}")


# ---- the reader -----------------------------------------------------------------------------------------


def plain_config(node: Any, key: str = "") -> Any:
    """A config (or one section, `key`) as plain values, interpolations resolved; the whole config
    without Hydra's section."""
    try:
        if not key and isinstance(node, Mapping | DictConfig):
            return {str(name): plain_config(node[name], str(name)) for name in node if name != HYDRA_KEY}
        if isinstance(node, DictConfig | ListConfig):
            return OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
        return node
    except MissingMandatoryValue as err:
        raise UserError(f"{err.full_key or key}: must be set (missing from the config)") from None
    except OmegaConfBaseException as err:
        raise UserError(f"{err.full_key or key}: {_first_line(err)}") from None


def _first_line(error: OmegaConfBaseException) -> str:
    return (getattr(error, "msg", None) or str(error)).strip().splitlines()[0]


def read_settings(cls: type[T], node: Any, key: str = "") -> T:
    """The config section `node` (a `DictConfig` or a mapping; the whole config when `key` is empty)
    as a `cls`, every value checked; the first bad one is a `UserError` naming its full key."""
    return _section(cls, plain_config(node, key), key)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _section(cls: type[T], value: Any, key: str) -> T:
    names = [field.name for field in dataclasses.fields(cls)]  # type: ignore[arg-type]
    if not isinstance(value, Mapping):
        raise UserError(f"{key}: must be a config section ({', '.join(names)}), got {value!r}")
    hints = _hints(cls)
    values = {}
    for name in names:
        if name not in value:
            raise UserError(f"{_sub(key, name)}: must be set (missing from the config)")
        values[name] = _value(hints[name], value[name], _sub(key, name))
    for name in value:
        if name not in names and name not in IGNORED_KEYS:
            raise not_a_key(_sub(key, str(name)), names)
    settings = cls(**values)
    check = getattr(settings, "check", None)
    if check is not None:
        check(key)
    return settings


def describe(hint: Any) -> str:
    """`int | None` -> "null or an integer", ..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(arg) for arg in sorted(args, key=lambda arg: arg is not type(None)))
    if origin in (tuple, list):
        count = "" if origin is list or (len(args) == 2 and args[1] is Ellipsis) else f"{len(args)} "
        if _is_section(args[0]):
            return f"a list of {count}mappings {describe(args[0]).removeprefix('a mapping ')}"
        return f"a list of {count}{describe(args[0]).split(' ', 1)[1]}s"
    if _is_section(hint):
        return f"a mapping {{{', '.join(field.name for field in dataclasses.fields(hint))}}}"
    return {
        type(None): "null",
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
    }.get(hint, str(hint))


def _value(hint: Any, value: Any, key: str, number_as_text: bool = True) -> Any:
    """`value` read as a `hint`: a settings class from a mapping, a tuple from a list, a union's
    first member that fits (strictly: `trainer.devices=1.5` is no device name), a string from a
    string or, where only a string fits, from a number as typed (`scene.name=2024`)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        members = [arg for arg in args if arg is not type(None)]
        if value is None and len(members) < len(args):
            return None
        if len(members) == 1:
            return _value(members[0], value, key)
        for member in members:
            try:
                return _value(member, value, key, number_as_text=False)
            except UserError:
                continue
        raise UserError(f"{key}: must be {describe(hint)}, got {value!r}")
    if value is None:
        raise UserError(f"{key}: must be set, got null")
    if _is_section(hint):
        return _section(hint, value, key)
    if origin in (tuple, list):
        return _sequence(hint, value, key)
    if hint is bool:
        return check_bool(value, key)
    if hint is int:
        return check_int(value, key, minimum=None)
    if hint is float:
        return check_number(value, key)
    if hint is str:
        if isinstance(value, str):
            return value
        if number_as_text and (is_int(value) or is_number(value)):  # `trainer.precision=16`: as typed
            return str(value)
        raise UserError(f"{key}: must be a string, got {value!r}")
    raise TypeError(f"{key}: no reader for a {hint!r} setting")


def _sequence(hint: Any, value: Any, key: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    variadic = origin is list or (len(args) == 2 and args[1] is Ellipsis)
    if not isinstance(value, list | tuple) or not (variadic or len(value) == len(args)):
        raise UserError(f"{key}: must be {describe(hint)}, got {value!r}")
    items = [args[0]] * len(value) if variadic else list(args)
    if items and _is_section(items[0]):  # a list of sections: each named by its index
        read = [_value(item, entry, f"{key}[{i}]") for i, (item, entry) in enumerate(zip(items, value))]
    else:
        try:
            read = [_value(item, entry, key) for item, entry in zip(items, value)]
        except UserError:
            raise UserError(f"{key}: must be {describe(hint)}, got {value!r}") from None
    return read if origin is list else tuple(read)
