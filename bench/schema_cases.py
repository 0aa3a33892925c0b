"""Determined's config schema test cases through Determined's schemas and the bridge's config.

Determined keeps its experiment config's JSON schemas (`schemas/expconf/v0/*.json`) and test
cases shared by its languages (`schemas/test_cases/v0/*.yaml`: a case is valid or invalid for
some schemas, at parse time ("sanity") or once cluster defaults are in ("completeness")). This
script reads both from a Determined git repository (nothing of them is copied here) and:

1. validates every case with `jsonschema`, Determined's schema extensions (`union`, `checks`,
   `compareProperties`, `disallowProperties`, `optionalRef`, `eventuallyRequired`,
   `eventually`) implemented here from their documented meaning, and checks the verdicts are
   the ones the case expects (so the validator below is Determined's);
2. places each case where its schema sits in an experiment config (a searcher case under
   `searcher:`, a hyperparameter under `hyperparameters:`, ...), judges that whole config with
   Determined's schema (parse time, then complete with the cluster's defaults) and with
   `lightning_bridge`'s `parse_config`, and reports where they agree and why not.

    python bench/schema_cases.py [--repo /path/to/determined.git] [--ref v0.38.1] [-v]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import jsonschema
import yaml
from jsonschema import Draft7Validator, ValidationError
from referencing import Registry
from referencing.jsonschema import DRAFT7

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lightning_bridge._errors import InvalidArgumentError  # noqa: E402
from lightning_bridge.experiment.config._config import parse_config  # noqa: E402

DEFAULT_GIT = "/work/.mirror/determined-ai+determined/repo"
URL = "http://determined.ai/schemas/expconf/v0/"


# ----- reading Determined's files -----------------------------------------------------------


def _git(repo: str, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", repo, *args], check=True, capture_output=True, text=True
    ).stdout


def read_tree(repo: str, ref: str, folder: str, suffix: str) -> dict[str, str]:
    names = _git(repo, "ls-tree", "--name-only", f"{ref}:{folder}").split()
    return {
        name: _git(repo, "show", f"{ref}:{folder}/{name}")
        for name in names
        if name.endswith(suffix)
    }


# ----- Determined's schema extensions -------------------------------------------------------


def _union_key(key: str, instance: Any) -> bool:
    """Whether a union item's key selects it for the error message (Determined's unionKey)."""
    if key == "always":
        return True
    if key == "never":
        return False
    if key.startswith("not:"):
        return not _union_key(key[4:], instance)
    if key.startswith("const:"):
        name, _, value = key[6:].partition("=")
        return isinstance(instance, dict) and instance.get(name) == value
    if key.startswith("singleproperty:"):
        return isinstance(instance, dict) and list(instance) == [key[15:]]
    if key.startswith("type:"):
        kind = key[5:]
        return isinstance(instance, list if kind == "array" else dict)
    if key.startswith("hasattr:"):
        return isinstance(instance, dict) and key[8:] in instance
    raise ValueError(f"unknown unionKey {key}")


def _union(validator: Any, union: dict[str, Any], instance: Any, schema: Any) -> Iterator[Any]:
    """Exactly one item validates; else the error of the first item its key selects."""
    valid, chosen = 0, None
    for item in union["items"]:
        errors = list(validator.descend(instance, item))
        if not errors:
            valid += 1
        elif chosen is None and _union_key(item["unionKey"], instance):
            chosen = errors
    if valid == 1:
        return
    if valid > 1:
        yield ValidationError("bug in validation! Multiple schemas matched")
    elif chosen:
        yield from chosen
    else:
        yield ValidationError(union.get("defaultMessage", "union failed to validate"))


def _checks(validator: Any, checks: dict[str, Any], instance: Any, schema: Any) -> Iterator[Any]:
    for message, sub in checks.items():
        if not validator.evolve(schema=sub).is_valid(instance):
            yield ValidationError(message)


def _path(instance: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        instance = instance[key]
    return instance


def _compare(validator: Any, cmp: dict[str, str], instance: Any, schema: Any) -> Iterator[Any]:
    try:
        a, b = _path(instance, cmp["a"]), _path(instance, cmp["b"])
    except (KeyError, TypeError):
        return
    kind = cmp["type"]
    if kind in ("a<b", "a<=b"):
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
            return
        if a > b or (kind == "a<b" and a == b):
            yield ValidationError(f"{cmp['a']} must be less than {cmp['b']}")
    elif kind == "a_is_subdir_of_b" and isinstance(a, str) and isinstance(b, str):
        a_path, b_path = os.path.normpath(a), os.path.normpath(b)
        outside = (
            not a_path.startswith(b_path) if os.path.isabs(a_path) else a_path.startswith("..")
        )
        if outside:
            yield ValidationError(f"{cmp['a']} must be a subdirectory of {cmp['b']}")


def _disallow(validator: Any, props: dict[str, str], instance: Any, schema: Any) -> Iterator[Any]:
    if isinstance(instance, dict):
        for prop, message in props.items():
            if prop in instance:
                yield ValidationError(message)


def _optional_ref(validator: Any, ref: str, instance: Any, schema: Any) -> Iterator[Any]:
    if instance is not None:
        yield from validator.descend(instance, {"$ref": ref})


def _eventually_required(
    validator: Any, props: list[str], instance: Any, schema: Any
) -> Iterator[Any]:
    if isinstance(instance, dict):
        for prop in props:
            if instance.get(prop) is None:
                yield ValidationError(f"{prop} is a required property")


def _eventually(validator: Any, sub: Any, instance: Any, schema: Any) -> Iterator[Any]:
    yield from validator.descend(instance, sub)


def _ignore(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
    return iter(())


_SANITY = {
    "union": _union,
    "checks": _checks,
    "compareProperties": _compare,
    "disallowProperties": _disallow,
    "optionalRef": _optional_ref,
    "eventuallyRequired": _ignore,
    "eventually": _ignore,
}
SanityValidator = jsonschema.validators.extend(Draft7Validator, _SANITY)
CompletenessValidator = jsonschema.validators.extend(
    Draft7Validator,
    {**_SANITY, "eventuallyRequired": _eventually_required, "eventually": _eventually},
)


def _render(error: ValidationError) -> str:
    """Determined's way: `<config>.a.b[2]: message`."""
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return f"<config>{where}: {error.message}"


def _leaves(error: ValidationError) -> list[ValidationError]:
    if error.context:
        return [leaf for sub in error.context for leaf in _leaves(sub)]
    return [error]


class Determined:
    """Determined's experiment config schemas, validated as its master validates them."""

    def __init__(self, schemas: dict[str, str]) -> None:
        # Without `$schema`: jsonschema would validate a referenced schema with the plain
        # Draft 7 validator its `$schema` names, without the extensions.
        self.docs = {}
        for text in schemas.values():
            doc = json.loads(text)
            doc.pop("$schema", None)
            self.docs[doc["$id"]] = doc
        self.registry: Registry = Registry().with_resources(
            (url, DRAFT7.create_resource(doc)) for url, doc in self.docs.items()
        )

    def errors(self, url: str, instance: Any, complete: bool) -> list[str]:
        kind = CompletenessValidator if complete else SanityValidator
        validator = kind(self.docs[url], registry=self.registry)
        found = []
        for error in validator.iter_errors(instance):
            found.extend(_render(leaf) for leaf in _leaves(error))
        return sorted(found)

    def accepts_experiment(self, config: Any) -> tuple[bool, list[str]]:
        """Whether `det e create` takes the config: sane as given, and complete once the
        cluster's defaults (name, checkpoint storage, seed) are in."""
        url = URL + "experiment.json"
        errors = self.errors(url, config, complete=False)
        if errors:
            return False, errors
        full = copy.deepcopy(config)
        if isinstance(full, dict):
            for key, default in CLUSTER_DEFAULTS.items():
                if full.get(key) is None:
                    full[key] = copy.deepcopy(default)
            environment = full.get("environment")
            if isinstance(environment, dict) and environment.get("image") is None:
                environment["image"] = "determinedai/pytorch:cluster-default"
        errors = self.errors(url, full, complete=True)
        if not errors:
            errors = _master_checks(full.get("searcher") if isinstance(full, dict) else None)
        return not errors, errors


def _master_checks(searcher: Any) -> list[str]:
    """What Determined 0.38.1's master refuses at `det e create` beyond the schema (its
    searcher config's `AssertCurrent`): the removed searchers, ASHA without max_time."""
    if not isinstance(searcher, dict):
        return []
    name = searcher.get("name")
    if name in ("sync_halving", "adaptive", "adaptive_simple", "custom"):
        return [f"the '{name}' searcher has been removed and is not valid for new experiments"]
    timed = searcher.get("max_time") is not None and searcher.get("time_metric") is not None
    if name in ("adaptive_asha", "async_halving") and not timed:
        return [f"the `{name}` searcher requires `max_time` and `time_metric` to be set"]
    return []


# What a cluster fills in before the completeness check (the master's defaults; an image is
# added to a given `environment` the same way).
CLUSTER_DEFAULTS: dict[str, Any] = {
    "name": "experiment",
    "checkpoint_storage": {"type": "shared_fs", "host_path": "/tmp"},
    "reproducibility": {"experiment_seed": 1},
    "hyperparameters": {},
}


# ----- where a case sits in an experiment config --------------------------------------------

BASE: dict[str, Any] = {
    "entrypoint": "model_def:Trial",
    "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 10}},
}


def _put(*keys: str | int, wrap: Any = None) -> Any:
    """A placement: the case at `keys` of the base config (`wrap` builds the value)."""

    def place(case: Any) -> dict[str, Any]:
        config = copy.deepcopy(BASE)
        node: Any = config
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = wrap(case) if wrap else case
        return config

    return place


PLACES: dict[str, Any] = {
    "experiment.json": lambda case: case,
    "searcher.json": _put("searcher"),
    "hyperparameters.json": _put("hyperparameters"),
    "hyperparameter.json": _put("hyperparameters", "h"),
    "check-grid-hyperparameter.json": lambda case: {
        **_put("hyperparameters")(case),
        "searcher": {"name": "grid", "metric": "loss", "max_length": {"batches": 10}},
    },
    "length.json": _put("min_validation_period"),
    "check-positive-length.json": _put("searcher", "max_length"),
    "checkpoint-storage.json": _put("checkpoint_storage"),
    "resources.json": _put("resources"),
    "devices.json": _put("resources", "devices"),
    "environment.json": _put("environment"),
    "environment-image.json": _put("environment", "image"),
    "environment-variables.json": _put("environment", "environment_variables"),
    "bind-mounts.json": _put("bind_mounts"),
    "bind-mount.json": _put("bind_mounts", wrap=lambda case: [case]),
    "log-policies.json": _put("log_policies"),
    "log-policy.json": _put("log_policies", wrap=lambda case: [case]),
    "log-action.json": _put(
        "log_policies", wrap=lambda case: [{"name": "p", "pattern": "x", "action": case}]
    ),
    "log-legacy-action-cancel-retries.json": _put(
        "log_policies", wrap=lambda case: [{"pattern": "x", "action": case}]
    ),
    "log-legacy-action-exclude-node.json": _put(
        "log_policies", wrap=lambda case: [{"pattern": "x", "action": case}]
    ),
    "profiling.json": _put("profiling"),
    "security.json": _put("security"),
    "optimizations.json": _put("optimizations"),
    "reproducibility.json": _put("reproducibility"),
}
for _name in ("single", "random", "grid", "async-halving", "adaptive-asha", "custom"):
    PLACES[f"searcher-{_name}.json"] = _put("searcher")
for _name in ("adaptive", "adaptive-simple", "sync-halving"):
    PLACES[f"searcher-{_name}.json"] = _put("searcher")
for _name in ("int", "double", "log", "const", "categorical"):
    PLACES[f"hyperparameter-{_name}.json"] = _put("hyperparameters", "h")
for _name in ("shared-fs", "s3", "gcs", "azure", "directory"):
    PLACES[f"{_name}.json"] = _put("checkpoint_storage")
# Determined's own tests of its schema machinery: no experiment config holds these.
NOT_CONFIG = {"test-root.json", "test-sub.json", "test-union.json", "test-union-a.json"}
NOT_CONFIG |= {"test-union-b.json"}
CHECKPOINT_TYPES = {"shared-fs": "shared_fs", "s3": "s3", "gcs": "gcs", "azure": "azure"}
CHECKPOINT_TYPES["directory"] = "directory"


def _kind(det_ok: bool, warned: list[str]) -> str:
    """A disagreement: `warned` (the bridge runs it and says what Determined would have
    said), `ignored` (the offending section is one the bridge ignores and warns about), or
    `differs`."""
    if det_ok:
        return "differs"
    if any(not w.startswith("unused: ") for w in warned):
        return "warned"
    return "ignored" if warned else "differs"


def bridge_verdict(config: Any) -> tuple[bool, str, list[str]]:
    """Whether `lightning-bridge run` takes the config, its error, and what it warns."""
    try:
        resolved = parse_config(copy.deepcopy(config))
    except InvalidArgumentError as exc:
        return False, str(exc).replace("\n", " "), []
    return (
        True,
        "",
        resolved.determined_differences + [f"unused: {key}" for key in resolved.unused_keys],
    )


# ----- the run -------------------------------------------------------------------------------


def _urls(case: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each schema a case names, with the verdicts it expects: sane / complete (True, False,
    or None when not said) and the error patterns expected."""
    out: dict[str, dict[str, Any]] = {}

    def entry(url: str) -> dict[str, Any]:
        return out.setdefault(url, {"sane": None, "complete": None, "patterns": []})

    for url in case.get("sane_as") or []:
        entry(url)["sane"] = True
    for url in case.get("complete_as") or []:
        entry(url)["complete"] = True
    for url, patterns in (case.get("sanity_errors") or {}).items():
        entry(url)["sane"] = False
        entry(url)["patterns"] += patterns
    for url, patterns in (case.get("completeness_errors") or {}).items():
        entry(url)["complete"] = False
        entry(url)["patterns"] += patterns
    return out


def _placement(name: str, case: Any) -> Any:
    """The experiment config holding the case, for a checkpoint storage case with its type."""
    member = name.removesuffix(".json")
    if member in CHECKPOINT_TYPES and isinstance(case, dict) and "type" not in case:
        case = {**case, "type": CHECKPOINT_TYPES[member]}
    return PLACES[name](case)


def run(repo: str, ref: str, verbose: bool) -> int:
    det = Determined(read_tree(repo, ref, "schemas/expconf/v0", ".json"))
    files = read_tree(repo, ref, "schemas/test_cases/v0", ".yaml")
    expected_ok = expected_all = 0
    pattern_ok = pattern_all = 0
    agree = disagree = lenient = skipped = 0
    kinds: dict[str, int] = {}
    report: list[str] = []
    for file, text in sorted(files.items()):
        for case in yaml.safe_load(text) or []:
            if "case" not in case:
                continue
            for url, want in _urls(case).items():
                name = url.removeprefix(URL)
                for phase, complete in (("sane", False), ("complete", True)):
                    if want[phase] is None:
                        continue
                    errors = det.errors(url, case["case"], complete)
                    expected_all += 1
                    if (not errors) == want[phase]:
                        expected_ok += 1
                    else:
                        report.append(
                            f"SCHEMA {file}::{case['name']} [{name} {phase}] expected "
                            f"{want[phase]}, got {errors or 'valid'}"
                        )
                    if not want[phase]:
                        for pattern in want["patterns"]:
                            pattern_all += 1
                            if any(re.search(pattern, e) for e in errors):
                                pattern_ok += 1
                            elif verbose:
                                report.append(
                                    f"MESSAGE {file}::{case['name']} [{name}] {pattern!r} "
                                    f"not in {errors}"
                                )
                if name in NOT_CONFIG:
                    skipped += 1
                    continue
                if name not in PLACES:
                    report.append(f"UNPLACED {file}::{case['name']} [{name}]")
                    skipped += 1
                    continue
                config = _placement(name, case["case"])
                det_ok, det_errors = det.accepts_experiment(config)
                bridge_ok, bridge_error, warned = bridge_verdict(config)
                line = f"{file}::{case['name']} [{name}]"
                if det_ok == bridge_ok:
                    agree += 1
                    if verbose:
                        report.append(
                            f"AGREE {line}: both {'accept' if det_ok else 'refuse'}"
                            + (f"; bridge warns {warned}" if warned else "")
                        )
                    continue
                kind = _kind(det_ok, warned)
                kinds[kind] = kinds.get(kind, 0) + 1
                if kind != "differs":
                    lenient += 1
                else:
                    disagree += 1
                if det_ok:
                    report.append(f"DIFFERS {line}: Determined accepts, bridge: {bridge_error}")
                else:
                    report.append(
                        f"{kind.upper()} {line}: Determined refuses ({'; '.join(det_errors)}), "
                        f"bridge accepts" + (f", warning {warned}" if warned else "")
                    )
    print("\n".join(report))
    print(
        f"\nDetermined's schemas ({ref}) with the extensions here: {expected_ok}/"
        f"{expected_all} expected verdicts, {pattern_ok}/{pattern_all} expected error "
        f"messages matched (Go's wording of built-in errors differs from jsonschema's)."
    )
    print(
        f"Cases placed in an experiment config: {agree + lenient + disagree}; the bridge "
        f"agrees with Determined on {agree}; runs {kinds.get('warned', 0)} that Determined "
        f"refuses, warning what Determined says; runs {kinds.get('ignored', 0)} whose "
        f"offending section it ignores (warned as unused); differs on {disagree}; {skipped} "
        "are not config (Determined's schema-machinery test structs)."
    )
    return 0 if expected_ok == expected_all else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=DEFAULT_GIT, help="a Determined git repository")
    parser.add_argument("--ref", default="HEAD", help="the commit or tag to read (v0.38.1)")
    parser.add_argument("-v", "--verbose", action="store_true", help="every case's verdict")
    args = parser.parse_args()
    return run(args.repo, args.ref, args.verbose)


if __name__ == "__main__":
    raise SystemExit(main())
