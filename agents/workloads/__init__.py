"""Workloads: data sets, partitions, per-vworker batch streams and models — DESIGN §7."""
from agents.workloads.batches import BatchStream
from agents.workloads.data import DataNotFoundError, Dataset, IDXFormatError, load_fashion_mnist
from agents.workloads.models import (
    MLP,
    MODELS,
    SmallResNet,
    ThesisCNN,
    build_model,
    evaluate,
    flat_params,
    gradient,
    param_bytes,
    set_flat_params,
)
from agents.workloads.partition import PARTITIONERS, dirichlet, iid, partition, two_class_non_iid

__all__ = [
    "BatchStream",
    "DataNotFoundError", "Dataset", "IDXFormatError", "load_fashion_mnist",
    "MLP", "MODELS", "SmallResNet", "ThesisCNN",
    "build_model", "evaluate", "flat_params", "gradient", "param_bytes", "set_flat_params",
    "PARTITIONERS", "dirichlet", "iid", "partition", "two_class_non_iid",
]
