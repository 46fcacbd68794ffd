"""docs/configuration.md lists every key of the schema, with the schema's defaults (generated, checked here)."""
from __future__ import annotations

from dataclasses import fields, is_dataclass

from controller.config import schema as S
from controller.config.docs import BEGIN, DOC, END, render


def test_the_key_tables_in_the_docs_are_generated_from_the_schema():
    text = DOC.read_text()
    block = text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()
    assert block == render().strip(), "docs/configuration.md is stale: run python -m controller.config.docs"


def test_every_schema_field_has_help_and_appears_in_the_docs():
    text = DOC.read_text()
    for cls in (S.LockstepConfig, S.NetworkConfig, S.ComputeConfig, S.KubernetesLauncherConfig, S.FedAsyncConfig):
        for f in fields(cls):
            if f.name in ("strategy", "model", "network", "compute", "launcher", "name", "_target_"):
                continue
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"
            if callable(f.default_factory) and is_dataclass(f.default_factory()):
                continue  # a section: its keys have rows
            assert f"{f.name}` |" in text, f"{cls.__name__}.{f.name} is missing from docs/configuration.md"
