"""One way to read a config: YAML (or JSON) into a strict pydantic model, one error style.

Every config model forbids unknown keys, so a typo is an error that names the key, where it
sits and the keys allowed there, never a silently ignored setting. All errors are
:class:`~polar.errors.ConfigError` with one line per problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ValidationError

from polar.errors import ConfigError

ModelT = TypeVar("ModelT", bound=BaseModel)


def load_config(model: type[ModelT], path: str | Path, *, what: str) -> ModelT:
    """``path`` read as YAML and validated as ``model``; ``what`` names it in errors
    ("topology", "task", "training config")."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from exc
    return parse_config(model, {} if data is None else data, what=f"{what} {path}")


def parse_config(model: type[ModelT], data: Any, *, what: str) -> ModelT:
    """``data`` validated as ``model``, or a ConfigError listing every problem."""
    if isinstance(data, Mapping):
        data = dict(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid {what}:\n{explain(exc, model)}") from exc


def explain(exc: ValidationError, root: type[BaseModel]) -> str:
    """One line per problem, with its dotted location, and the allowed keys for unknown ones."""
    lines = []
    for err in exc.errors():
        loc = err["loc"]
        where = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            owner = _model_at(root, loc[:-1])
            allowed = ", ".join(owner.model_fields) if owner else "?"
            lines.append(f"  {where}: unknown key (allowed here: {allowed})")
        else:
            lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class found by following ``loc`` (field names and list indexes) from ``model``."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part) if _is_model(current) else None
        if field is None:
            return None
        current = _inner_model(field.annotation)
    return current if _is_model(current) else None


def _inner_model(annotation: Any) -> Any:
    """The BaseModel inside ``X``, ``X | None``, ``list[X]`` or ``dict[str, X]``."""
    if _is_model(annotation):
        return annotation
    for arg in get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _is_model(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, BaseModel)
