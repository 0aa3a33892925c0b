"""Config validation errors as a Determined user reads them: the key's path, what was
expected, what was given (`searcher.max_length.epochs: expected a positive integer, got -3`).

pydantic reports errors by type with its own path parts (union branch names, the searcher's
tag); this module turns each into one line of the config's own words.
"""

from __future__ import annotations

from typing import Any, TypeVar

import pydantic
import yaml

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge._secrets import STORAGE_SECRET_KEYS, redact_config
from lightning_bridge.search import HP_TYPES, SEARCHER_NAMES

Section = TypeVar("Section", bound=pydantic.BaseModel)


def as_yaml(value: Any) -> str:
    """A value as the user wrote it in YAML (flow style), strings quoted."""
    if isinstance(value, str):
        return repr(value)
    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=1000)
    except yaml.YAMLError:
        return repr(value)
    return text.strip().removesuffix("...").strip()


# pydantic error types whose line needs nothing from the error's context.
_FIXED = {
    **dict.fromkeys(("int_type", "int_parsing", "int_from_float"), "expected an integer"),
    **dict.fromkeys(("float_type", "float_parsing"), "expected a number"),
    **dict.fromkeys(("bool_type", "bool_parsing"), "expected true or false"),
    "string_type": "expected a string",
    **dict.fromkeys(("dict_type", "model_type", "model_attributes_type"), "expected a mapping"),
    "list_type": "expected a list",
    "extra_forbidden": "unknown key",
    "missing": "required",
    "union_tag_not_found": "needs a type",
}


def _expected(err: Any) -> str:
    """What the key expected, in the config's words, for one pydantic error."""
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind == "greater_than" and ctx.get("gt") == 0:
        return "expected a positive integer"
    if kind == "greater_than":
        return f"expected a number greater than {ctx.get('gt'):g}"
    if kind == "greater_than_equal" and ctx.get("ge") == 0:
        return "expected a non-negative integer"
    if kind == "greater_than_equal":
        return f"expected an integer of at least {ctx.get('ge')}"
    if kind in _FIXED:
        return _FIXED[kind]
    if kind == "literal_error":
        return f"expected {ctx.get('expected')}"
    if kind == "union_tag_invalid":
        return f"expected one of {', '.join(HP_TYPES)} (or a nested group without 'type')"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return str(err["msg"])


# Union branch names pydantic puts in an error's path (besides "list[str]", "constrained-int").
_BRANCHES = ("str", "int", "list", "dict")

# What a required searcher key is for, added to its "required" message.
_REQUIRED_HINTS = {
    "searcher.metric": "the validation metric that ranks trials, e.g. metric: validation_loss",
    "searcher.max_trials": "how many trials the search runs, e.g. max_trials: 16",
    "searcher.num_rungs": "how many rungs trials are ranked at, e.g. num_rungs: 3",
}


def config_errors(
    exc: pydantic.ValidationError, prefix: tuple[str, ...] = (), hparam: bool = False
) -> list[str]:
    """One line per problem pydantic found: the key's path in the config, what was expected
    and what was given. `prefix` is the path of the validated section; `hparam` drops the
    hyperparameter form name pydantic adds to the path."""
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        # Union branches appear as extra path parts ("str", "list[str]"; a hyperparameter's
        # form name): they are not keys of the config.
        loc = [
            p
            for p in loc
            if not (p.endswith("]") or p.startswith("constrained-") or p in _BRANCHES)
        ]
        if hparam and loc and loc[0] in HP_TYPES:
            loc = loc[1:]
        if len(loc) > 1 and loc[0] == "searcher" and loc[1] in SEARCHER_NAMES:
            del loc[1]  # the searcher's name, as pydantic tags its union branch
        value = err.get("input")
        if err["type"] == "union_tag_invalid":
            loc.append("type")
            value = (err.get("ctx") or {}).get("tag")
        path = ".".join([*prefix, *loc]) or "(config)"
        message = f"{path}: {_expected(err)}"
        if err["type"] == "missing" and path in _REQUIRED_HINTS:
            message += f" ({_REQUIRED_HINTS[path]})"
        # An environment variable's value or a storage key may be a secret (`_secrets`): its
        # line names the entry instead.
        shown = not path.startswith("environment.environment_variables") and not (
            path.startswith("checkpoint_storage") and loc and loc[-1] in STORAGE_SECRET_KEYS
        )
        if path.startswith("checkpoint_storage") and isinstance(value, dict):
            value = redact_config({"checkpoint_storage": value})["checkpoint_storage"]
        if shown and err["type"] not in ("missing", "extra_forbidden"):
            message += f", got {as_yaml(value)}"
        lines.append(message)
    # Union alternatives may repeat a path; keep the first message per path.
    seen: dict[str, str] = {}
    for line in lines:
        seen.setdefault(line.split(":", 1)[0], line)
    return list(seen.values())


def launcher_section(
    model: type[Section], given: Any, name: str, messages: dict[str, str]
) -> Section:
    """A launcher's config section (`slurm`, `ray`) validated as `model`: InvalidArgumentError
    with the one line its first bad key gets in `messages` (`""`: the section as a whole;
    `{value}`: what was given), or naming an unknown key where the model refuses those."""
    try:
        return model.model_validate(given or {})
    except pydantic.ValidationError as exc:
        error = exc.errors()[0]
        key = str(error["loc"][0]) if error["loc"] else ""
        if error["type"] == "extra_forbidden":
            raise InvalidArgumentError(
                f"{name}.{key}: not a key of the {name} section (it has: "
                f"{', '.join(k for k in messages if k)})"
            ) from None
        if key not in messages:
            key = ""
        value = given.get(key) if key and isinstance(given, dict) else given
        raise InvalidArgumentError(messages[key].format(value=value)) from None
