"""Compose the config like ``lockstep run`` does and validate it, turning every rejection into a sentence.

Hydra composes ``conf/`` over the schemas of :mod:`controller.config.schema`
and stops at the first override it cannot apply (an unknown key, a value of
the wrong type, a group option that does not exist). :func:`load` reports
that override in our words, drops it and composes again, so a user sees every
problem of a command line at once; then :func:`~controller.config.validate.validate`
adds the semantic ones. :func:`check_sweep` does the same for every job of a
``--multirun`` before the first job starts.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf

from controller.config import schema as S
from controller.config.validate import ConfigError, RunConfig, accepted_text, did_you_mean, field_at, validate

__all__ = ["CONF_DIR", "compose_config", "load", "check_sweep", "describe_compose_error", "sweeper_params",
           "absolute_paths"]


def _conf_dir() -> str:
    """conf/ of the source tree, or the copy a regular install ships as the ``conf`` package."""
    source_tree = Path(__file__).resolve().parents[2] / "conf"
    if (source_tree / "config.yaml").is_file():
        return str(source_tree)
    import conf

    return str(Path(conf.__file__).resolve().parent)


CONF_DIR = _conf_dir()

# the schema of the group nodes typed ``Any`` in LockstepConfig, by option (conf/<group>/<option>.yaml)
_GROUP_OPTION_SCHEMA = {"launcher": {"inprocess": S.InprocessLauncherConfig, "local": S.LocalLauncherConfig,
                                     "kubernetes": S.KubernetesLauncherConfig, "ray": S.RayLauncherConfig},
                        "model": {"mlp": S.MLPConfig, "flat": S.FlatConfig}}


def group_options(group: str) -> list[str]:
    """The options a user may pick for ``group=`` (the YAML files, not the schemas)."""
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


def compose_config(overrides: list[str], return_hydra_config: bool = False) -> DictConfig:
    """Hydra's composition of conf/ with ``overrides`` (raises Hydra's exceptions)."""
    S.register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=return_hydra_config)


def _parse(overrides: list[str]) -> list[Any]:
    return OverridesParser.create().parse_overrides(list(overrides))


def _parse_checked(overrides: list[str]) -> list[Any]:
    """:func:`_parse`, or a ConfigError with one sentence (``lockstep run throughput_scaling``: no ``key=``)."""
    try:
        return _parse(overrides)
    except OverrideParseException as e:
        raise ConfigError([f"cannot read the command line ({str(e).splitlines()[0]}); accepted: key=value "
                           "overrides (https://hydra.cc/docs/advanced/override_grammar/basic)."]) from None


def describe_compose_error(e: Exception, overrides: list[str]) -> tuple[str, str | None]:
    """One sentence for a composition error, and the override that caused it (None: not one override)."""
    text = str(e)
    parsed = []
    try:
        parsed = _parse(overrides)
    except OverrideParseException:
        pass
    by_key = {o.key_or_group: (o, s) for o, s in zip(parsed, overrides)}
    if isinstance(e, MissingConfigException):
        m = re.search(r"Could not find '([^/']+)/([^']+)'", text)
        if m and m.group(1) in by_key:
            group, option = m.group(1), m.group(2)
            accepted = " | ".join(group_options(group))
            hint = did_you_mean(option, group_options(group)).removeprefix("; ")
            return (f"{group}={option} is not valid; accepted: {accepted}" + (f" ({hint})" if hint else "") + ".",
                    by_key[group][1])
        return f"the config cannot be composed: {text.splitlines()[0].rstrip('.')}.", None
    cause = e.__cause__
    key = getattr(cause, "full_key", None)
    m = re.search(r"(?:Error merging override|Could not override|Could not append to config\. An item is "
                  r"already at) '?([^\s=']+)", text)
    if key is None and m:
        key = m.group(1).split("=")[0].lstrip("+~")
    named = m.group(1).split("=")[0].lstrip("+~") if m else None
    if key and named in by_key and key != named and not key.startswith(named + ".") and not named.startswith(key):
        # the override Hydra names holds the bad value: a key inside one of its items (faults[0].workers) has a
        # bare leaf name that another override may share (workers=3), which was blamed instead
        listed = _list_item_error(key, cause, named, by_key)
        if listed is not None:
            return listed
    if key and key not in by_key:  # the error may name a key inside the overridden value
        key = next((k for k in by_key if key.startswith(k + ".")), key)
    if key and key not in by_key:  # ... or the node above the overridden key (netwrk in netwrk.latency=1ms)
        key = next((k for k in by_key if k.startswith(key + ".")), key)
    if key and key not in by_key and m:  # ... or inside one item of an overridden list of typed items
        listed = _list_item_error(key, cause, m.group(1).split("=")[0].lstrip("+~"), by_key)
        if listed is not None:
            return listed
    m = re.search(r"Ambiguous value for argument '([^']+)'", text)
    if m:  # key=a,b outside --multirun
        return (f"{m.group(1)} has several values; accepted: one value, a list as key=[a,b], or a sweep of runs "
                "with --multirun.", m.group(1) if m.group(1) in overrides else None)
    if not key or key not in by_key:
        return f"the config cannot be composed: {text.splitlines()[0].rstrip('.')}.", None
    override, raw = by_key[key]
    value = raw.split("=", 1)[1] if "=" in raw else None
    if "Could not override" in text or "not in struct" in text or "Key '" in str(cause) and "not in" in str(cause):
        parent, _, leaf = key.rpartition(".")
        if not parent and not raw.startswith("+") and group_options(key):  # a group the defaults do not list
            return (f"{key} is a config group the defaults do not list: add it with '+' (+{raw}); accepted: "
                    f"{' | '.join(group_options(key))}.", raw)
        others = [o for o in overrides if o != raw]
        options = _keys_under(parent, others)
        while parent and not options:  # a node above the key does not exist either: name the first missing one
            key = parent
            parent, _, leaf = key.rpartition(".")
            options = _keys_under(parent, others)
        hint = did_you_mean(leaf, options)
        where = f"a key of {parent}" if parent else "a config key"
        accepted = ", ".join(o for o in options if not o.startswith("_")) or (
            f"no key besides _target_; a class of your own ({parent}._target_=my.Module) takes its constructor's "
            f"arguments" if "_target_" in options else "none")
        return f"{key} is not {where}{hint} (accepted: {accepted}).", raw
    if "Could not append to config. An item is already at" in text and raw.startswith("+"):
        return (f"{raw.lstrip('+')} cannot be appended with '+': {key} is already a config key; accepted: "
                f"{raw.lstrip('+')} (or ++{raw.lstrip('+')}).", raw)
    found = field_at(S.LockstepConfig, key, _node_types(overrides))
    accepted = accepted_text(*found) if found else "see docs/configuration.md"
    return f"{key}={value} is not valid; accepted: {accepted}.", raw


def _list_item_error(leaf: str, cause: Any, parent: str, by_key: dict[str, Any]) -> tuple[str, str] | None:
    """A sentence naming ``parent[i].leaf`` for a bad key or value inside a list of dataclasses (``faults``)."""
    import dataclasses
    import typing

    if parent not in by_key:
        return None
    override, raw = by_key[parent]
    items = override.value()
    f = next((f for f in dataclasses.fields(S.LockstepConfig) if f.name == parent), None)
    args = typing.get_args(typing.get_type_hints(S.LockstepConfig).get(parent)) if f else ()
    if not isinstance(items, list) or not args or not dataclasses.is_dataclass(args[0]):
        return None
    item_cls = args[0]
    i = next((i for i, it in enumerate(items) if isinstance(it, dict) and leaf in it), None)
    if i is None:
        return None
    names = [x.name for x in dataclasses.fields(item_cls)]
    where = f"{parent}[{i}]"
    if leaf not in names:
        return (f"{where}.{leaf} is not a key of {where}{did_you_mean(leaf, names)} (accepted: {', '.join(names)}).",
                raw)
    return f"{where}.{leaf}={items[i][leaf]} is not valid; accepted: {accepted_text(item_cls, leaf)}.", raw


def _node_types(overrides: list[str]) -> dict[str, type]:
    """The schema classes of group nodes chosen on the command line (for error messages)."""
    out: dict[str, type] = {}
    for o in _safe_parse(overrides):
        opts = _GROUP_OPTION_SCHEMA.get(o.key_or_group)
        if opts and not o.is_sweep_override():
            cls = opts.get(str(o.value()))
            if cls is not None:
                out[o.key_or_group] = cls
    return out


def _safe_parse(overrides: list[str]) -> list[Any]:
    try:
        return _parse(overrides)
    except OverrideParseException:
        return []


def _keys_under(parent: str, others: list[str]) -> list[str]:
    """The keys a node accepts with the other overrides applied (for suggestions)."""
    groups = [s for o, s in zip(_safe_parse(others), others)
              if "." not in o.key_or_group and group_options(o.key_or_group.lstrip("+~"))]
    try:
        cfg = compose_config(groups)
    except Exception:  # noqa: BLE001 - suggestions only
        return []
    node: Any = cfg
    for part in [x for x in parent.split(".") if x]:
        if not isinstance(node, DictConfig) or part not in node:
            return []
        node = node[part]
    return [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []


# keys naming a file or directory on the machine ``lockstep run`` runs on: read by the controller ...
_CONTROLLER_PATHS = ("controller.token_file", "controller.tls.cert", "controller.tls.key", "controller.tls.ca",
                     "launcher.kubeconfig", "launcher.pod_template_file", "compute.profile")
# ... and by the agents, which run on that machine too with these launchers (kubernetes, ray: on theirs, where a
# relative path means what it means in the agent's working directory)
_AGENT_PATHS = ("data.root", "compute.db", "controller.tls.agent_cert", "controller.tls.agent_key")
_LOCAL_AGENTS = ("inprocess", "local")


def absolute_paths(cfg: DictConfig, base: str | None = None) -> None:
    """Make the relative paths of ``cfg`` absolute against ``base`` (default: the working directory), in place.

    A relative path means relative to the directory the command ran in: ``hydra.job.chdir=true`` moves a run
    into its run directory before it reads anything (Hydra's ``to_absolute_path``), and the run directory's
    config.yaml then names the same files for ``lockstep resume`` from anywhere. ``~`` is left to the reader,
    and a device profile's name (``compute.profile=epyc-1t``) is not a path."""
    from omegaconf import read_write

    from controller.config.profiles import is_name

    base = os.getcwd() if base is None else base
    keys = _CONTROLLER_PATHS
    if OmegaConf.select(cfg, "launcher.name", throw_on_resolution_failure=False) in _LOCAL_AGENTS:
        keys += _AGENT_PATHS
    with read_write(cfg):
        for key in keys:
            value = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
            if not isinstance(value, str) or not value or os.path.isabs(value) or value.startswith("~") or (
                    key == "compute.profile" and is_name(value)):
                continue
            OmegaConf.update(cfg, key, os.path.normpath(os.path.join(base, value)), merge=False)


def compose_checked(overrides: list[str]) -> tuple[DictConfig, list[str], list[str]]:
    """:func:`compose_config` of ``overrides`` without those Hydra cannot compose: (the config, one sentence per
    override left out, the overrides kept). ConfigError when no config composes (a problem no override causes)."""
    problems: list[str] = []
    remaining = list(overrides)
    _parse_checked(remaining)
    while True:
        try:
            return compose_config(remaining), problems, remaining
        except (ConfigCompositionException, MissingConfigException) as e:
            sentence, culprit = describe_compose_error(e, remaining)
            problems.append(sentence)
            if culprit is None:
                raise ConfigError(problems) from None
            remaining.remove(culprit)


def load(overrides: list[str], check_data: bool = True) -> RunConfig:
    """Compose conf/ with ``overrides`` and validate it; ConfigError lists every problem."""
    cfg, problems, remaining = compose_checked(overrides)
    absolute_paths(cfg)
    written = {o.key_or_group: s.split("=", 1)[1] for o, s in zip(_parse(remaining), remaining) if "=" in s}
    try:
        rc = validate(cfg, check_data=check_data and not problems, written=written)
    except ConfigError as e:
        problems.extend(p for p in e.problems if not any(p.startswith(k.split("=")[0].lstrip("+~") + "=")
                                                           for k in set(overrides) - set(remaining)))
    if problems:
        raise ConfigError(problems)
    return rc


def check_sweep(job_overrides: list[list[str]]) -> None:
    """Validate every job of a sweep before any starts; ConfigError names the failing jobs."""
    problems: list[str] = []
    for i, ov in enumerate(job_overrides):
        try:
            load(ov)
        except ConfigError as e:
            problems.extend(f"job {i} ({' '.join(ov)}): {p}" for p in e.problems)
    if problems:
        raise ConfigError(problems)


def sweeper_params(overrides: list[str]) -> dict[str, Any]:
    """``hydra.sweeper.params`` of the config ``overrides`` compose (an experiment's grid; {} if it cannot)."""
    try:
        cfg = compose_config(overrides, return_hydra_config=True)
        return dict(cfg.hydra.sweeper.get("params") or {})
    except (ConfigCompositionException, MissingConfigException):
        return {}  # load() reports the problem for every job


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """The override list of every job ``lockstep run --multirun overrides`` will run (Hydra's basic sweeper).

    Sweep parameters come from the command line and from ``hydra.sweeper.params`` of the composed config
    (the experiment configs set them), combined as Hydra's ``BasicSweeper`` combines them.
    """
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra._internal.utils import create_config_search_path

    _parse_checked(overrides)  # one sentence for an override Hydra cannot read
    S.register_configs()  # glob(...) lists a group's options: the parser needs a config loader for that
    parser = OverridesParser.create(config_loader=ConfigLoaderImpl(create_config_search_path(CONF_DIR)))
    parsed = parser.parse_overrides(list(overrides))
    fixed = [s for o, s in zip(parsed, overrides) if not o.is_sweep_override()]
    for o, raw in zip(parsed, overrides):  # Hydra reads the grid of the experiment the fixed overrides name only
        if o.is_sweep_override() and o.key_or_group.lstrip("+~") == "experiment":
            grids = [str(v) for v in o.sweep_iterator() if sweeper_params(fixed + [f"+experiment={v}"])]
            if grids:
                raise ConfigError([f"{raw} sweeps presets that define a grid of their own ({', '.join(grids)}: "
                                   "hydra.sweeper.params), which Hydra's sweeper does not expand per preset; "
                                   "accepted: one such +experiment per --multirun."])
    params = sweeper_params(fixed)
    args = [f"{k}={v}" for k, v in params.items()] + list(overrides)
    batches = BasicSweeper.split_arguments(parser.parse_overrides(args), None)
    return [list(job) for batch in batches for job in batch]
