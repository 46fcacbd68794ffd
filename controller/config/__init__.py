"""The run's configuration: the schema (Hydra structured configs), composing it, validating it once.

``schema`` defines every key and default; ``load(overrides)`` composes conf/ like ``lockstep run``
and returns the typed :class:`RunConfig`, or raises :class:`ConfigError` with one sentence per
problem; ``validate(cfg)`` does the checking for an already composed config.
"""
from controller.config.load import CONF_DIR, check_sweep, compose_config, load, sweep_jobs, sweeper_params
from controller.config.schema import register_configs
from controller.config.validate import (BandwidthSetting, ComputeSettings, ConfigError, LatencySetting,
                                        MetricsSettings, NetworkSettings, RunConfig, TraceSettings, config_hash,
                                        validate)

__all__ = ["CONF_DIR", "ConfigError", "RunConfig", "NetworkSettings", "LatencySetting", "BandwidthSetting",
           "ComputeSettings", "TraceSettings", "MetricsSettings", "check_sweep", "compose_config", "config_hash",
           "load", "register_configs", "sweep_jobs", "sweeper_params", "validate"]
