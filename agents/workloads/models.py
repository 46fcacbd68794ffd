"""Built-in models, deterministic construction, and the gradient/evaluation helpers — DESIGN §7.

Any ``torch.nn.Module`` works: ``build_model`` instantiates a Hydra ``_target_``
with torch's global RNG forked and seeded from the key ``(seed, "init")``, so a
module's own ``reset_parameters`` gives bit-identical weights for the same seed.
"""
from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import hydra.utils
from hydra.errors import InstantiationException
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from agents.common.units import parse_size
from agents.sim.keyed import key_int

__all__ = ["MLP", "ThesisCNN", "SmallResNet", "Flat", "MODELS", "build_model", "optimizer", "step", "param_bytes",
           "flat_params", "set_flat_params", "gradient", "evaluate"]


class MLP(nn.Module):
    """Flatten, then ``Linear + ReLU`` per hidden width, then a linear classifier."""

    def __init__(self, in_features: int = 784, hidden: Sequence[int] = (200,), num_classes: int = 10) -> None:
        super().__init__()
        if not all(type(h) is int and h >= 1 for h in hidden):  # a width of 0 builds, and learns nothing
            raise ValueError(f"model.hidden={list(hidden)} is not valid; accepted: a list of layer widths, each an "
                             "integer >= 1 (e.g. [200] or [256, 128]).")
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class ThesisCNN(nn.Module):
    """The 2-conv/3-fc CNN of the FL-timing thesis (§6, "Architectures").

    The thesis gives no layer sizes; these are the LeNet-style ones of the Flower
    and PyTorch tutorial CNN it builds on: conv(C→6, 5), max-pool 2, conv(6→16, 5),
    max-pool 2, fc 120, fc 84, fc ``num_classes``. ``in_channels`` is 1 for
    (Fashion-)MNIST and 3 for CIFAR-10, as in the thesis; for 28×28 inputs the first
    fc layer takes 16·4·4 = 256 features (400 for 32×32).
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> None:
        super().__init__()
        side = ((image_size - 4) // 2 - 4) // 2
        if side < 1:
            raise ValueError(f"ThesisCNN: image_size must be at least 16, got {image_size}.")
        self.conv1 = nn.Conv2d(in_channels, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(8, channels), channels)


class BasicBlock(nn.Module):
    """Two 3×3 convolutions with a residual connection (He et al. 2016), GroupNorm after each."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.norm1 = _norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.norm2 = _norm(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                                          _norm(out_channels))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """A 3×3 stem, one stage of BasicBlocks per width (stride 2 between stages), global pooling, fc.

    GroupNorm instead of BatchNorm: the whole state is then in the parameters,
    which strategies average and ship as ``flat_params``; BatchNorm's running
    statistics are buffers that no strategy would exchange.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10,
                 widths: Sequence[int] = (16, 32, 64), blocks_per_stage: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False),
                                   _norm(widths[0]), nn.ReLU()]
        width = widths[0]
        for stage, out in enumerate(widths):
            for block in range(blocks_per_stage):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(width, out, stride))
                width = out
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


FLAT_MAX_BYTES = 16 << 30
"""``model=flat``'s largest ``model.bytes``: validation builds the model once, and a user who meant MB but typed
bytes should get a sentence, not an allocation of a terabyte (found by the config fuzzer)."""


class Flat(nn.Module):
    """One float32 tensor of ``bytes`` bytes (rounded down to whole floats): a model for network experiments.

    Its size on the wire is exactly what a measured run moved (``lockstep validate`` emulates
    ``model.bytes=M``), and its gradient costs next to nothing: the logits read only the first
    ``num_classes`` values (times the image's mean pixel), so the backward pass is one small
    scatter into a zero tensor — no network-sized MLP to compute. ``bytes`` accepts a number
    or a size string (``10MB``, ``4MiB``).
    """

    def __init__(self, bytes: int | str = 1_000_000, num_classes: int = 10) -> None:  # noqa: A002 - model.bytes
        """Raises ValueError (one sentence) for a size outside [4 · num_classes, FLAT_MAX_BYTES]."""
        super().__init__()
        n = int(parse_size(bytes, "model.bytes")) // 4
        if not num_classes <= n <= FLAT_MAX_BYTES // 4:
            raise ValueError(f"model.bytes={bytes!r} is not valid; accepted: at least {4 * num_classes} bytes "
                             f"(one float32 per class) and at most {FLAT_MAX_BYTES} (16GiB: every vworker "
                             f"holding it is a copy).")
        self.num_classes = num_classes
        self.weight = nn.Parameter(torch.randn(n) * 0.01)

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(1).mean(1, keepdim=True) * self.weight[: self.num_classes]


MODELS = {"mlp": f"{__name__}.MLP", "cnn": f"{__name__}.ThesisCNN", "resnet": f"{__name__}.SmallResNet",
          "flat": f"{__name__}.Flat"}
"""Short names accepted by ``build_model`` and as ``model._target_``."""


# torch.optim imports torch._dynamo, the compiler, on the first call of an optimizer's step and of these
# methods (1.9 s of a process's start-up on this VM: each agent paid it before its first update) only to keep a
# compiler from tracing them. lockstep never compiles: ``optimizer`` and ``step`` run them without it.
_DYNAMO_WRAPPED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def _unwrap_dynamo_disable() -> None:
    """Give each wrapped method the cached "disabled" function torch's wrapper looks for: itself.

    torch/_compile.py's wrapper runs ``fn.__dynamo_disable`` if set, and otherwise imports torch._dynamo to
    make it. Left alone where the wrapper is not the one this was written for, or the compiler is loaded.
    """
    if "torch._dynamo" in sys.modules:
        return
    for name in _DYNAMO_WRAPPED:
        fn = getattr(getattr(torch.optim.Optimizer, name, None), "__wrapped__", None)
        if fn is not None and getattr(fn, "__dynamo_disable", None) is None:
            fn.__dynamo_disable = fn


def optimizer(name: str, params: Any, lr: float, momentum: float = 0.0) -> torch.optim.Optimizer:
    """torch's SGD (with ``momentum``) or Adam over ``params``, made without importing torch's compiler."""
    _unwrap_dynamo_disable()
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum)
    raise ValueError(f"optimizer={name!r}: expected sgd or adam")


def step(opt: torch.optim.Optimizer) -> None:
    """``opt.step()`` as the same call on the same tensors (identical floats), without torch's wrappers around it.

    They are the profiler's label, the step hooks (lockstep registers none), and ``_use_grad``: no-grad mode plus
    a compiler graph break, whose first call imports torch._dynamo. Here no-grad mode is kept and the import skipped.
    """
    with torch.no_grad():
        inspect.unwrap(type(opt).step)(opt)


def build_model(cfg_or_target: str | Mapping[str, Any] | DictConfig, seed: int) -> nn.Module:
    """Instantiate a model from a short name, a dotted class path, or a config with ``_target_``.

    Construction runs under ``torch.random.fork_rng`` seeded with ``key_int(seed, "init")``:
    the initial parameters are a function of the seed alone, and the caller's global
    RNG state is left untouched.
    """
    if isinstance(cfg_or_target, str):
        cfg: dict[str, Any] = {"_target_": cfg_or_target}
    elif isinstance(cfg_or_target, DictConfig):
        cfg = OmegaConf.to_container(cfg_or_target, resolve=True)  # type: ignore[assignment]
    elif isinstance(cfg_or_target, Mapping):
        cfg = dict(cfg_or_target)
    else:
        raise TypeError(f"build_model: expected a name, a dotted path or a config with _target_, "
                        f"got {type(cfg_or_target).__name__}.")
    target = cfg.get("_target_")
    if not isinstance(target, str):
        raise ValueError(f"model config needs a _target_ (one of {', '.join(MODELS)} or a dotted "
                         f"path to an nn.Module class), got {cfg!r}.")
    target = MODELS.get(target, target)
    if "." not in target:
        raise ValueError(f"model._target_={target!r} is neither a built-in model "
                         f"({', '.join(MODELS)}) nor a dotted path such as my_pkg.nets.MyNet.")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(key_int(seed, "init"))
        try:
            model = hydra.utils.instantiate({**cfg, "_target_": target}, _convert_="all")
        except InstantiationException as e:  # import and constructor errors alike
            cause = " ".join(str(e.__cause__ or e).split())  # one line: the config error is one sentence
            cause = cause.split(" Are you sure")[0]  # Hydra's closing question: the sentence ends with a full stop
            raise ValueError(f"model._target_={target!r} could not be instantiated: "
                             f"{cause[:300].rstrip(' .?!')}.") from e
    if not isinstance(model, nn.Module):
        raise TypeError(f"model._target_={target!r} built a {type(model).__name__}, not a torch.nn.Module.")
    return model


def param_bytes(model: nn.Module) -> int:
    """Bytes of one copy of the parameters: what a full model or gradient message carries."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def flat_params(model: nn.Module) -> Tensor:
    """A new 1-D tensor holding every parameter, in ``model.parameters()`` order (buffers excluded)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def set_flat_params(model: nn.Module, flat: Tensor, params: Sequence[Tensor] | None = None) -> None:
    """Copy a ``flat_params`` vector back into the model's parameters, in place.

    ``params``: ``list(model.parameters())``, when the caller keeps it (a scratch model's per-call cost).
    """
    if params is None:
        params = list(model.parameters())
    sizes = [p.numel() for p in params]
    if flat.ndim != 1 or flat.numel() != sum(sizes):
        raise ValueError(f"set_flat_params: expected a 1-D tensor of {sum(sizes)} values, got shape {tuple(flat.shape)}.")
    with torch.no_grad():
        for p, v in zip(params, flat.split(sizes)):
            p.copy_(v.view_as(p))


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters(), torch.empty(0)).device


def gradient(model: nn.Module, x: Tensor, y: Tensor,
             params: Sequence[Tensor] | None = None) -> tuple[float, list[Tensor]]:
    """Mean cross-entropy of ``model(x)`` against ``y`` and its gradient, one tensor per parameter.

    The gradients are detached and in ``model.parameters()`` order (zeros for a
    frozen or unused parameter); the model's ``.grad`` fields are left as None.
    Nothing is updated: applying the gradient is the strategy's job. ``params``:
    ``list(model.parameters())``, when the caller keeps it.
    """
    if params is None:
        params = list(model.parameters())
    if any(p.grad is not None for p in params):
        model.zero_grad(set_to_none=True)
    device = params[0].device if params else torch.device("cpu")
    loss = F.cross_entropy(model(x.to(device)), y.to(device))
    trainable = [p for p in params if p.requires_grad]
    grads = torch.autograd.grad(loss, trainable, allow_unused=True)
    if len(trainable) == len(params) and all(g is not None for g in grads):
        return loss.item(), [g.detach() for g in grads]
    it = iter(grads)
    out = []
    for p in params:
        g = next(it) if p.requires_grad else None
        out.append(torch.zeros_like(p) if g is None else g.detach())
    return loss.item(), out


def evaluate(model: nn.Module, x: Tensor, y: Tensor, batch: int = 2000) -> tuple[float, float]:
    """Mean cross-entropy and accuracy over ``(x, y)`` in eval mode, ``batch`` samples at a time."""
    if len(x) == 0 or len(x) != len(y):
        raise ValueError(f"evaluate: need as many labels as inputs (> 0), got {len(x)} and {len(y)}.")
    device = _device(model)
    was_training = model.training
    model.eval()
    loss_sum, correct = 0.0, 0
    try:
        with torch.no_grad():
            for start in range(0, len(x), batch):
                xb, yb = x[start:start + batch].to(device), y[start:start + batch].to(device)
                logits = model(xb)
                loss_sum += F.cross_entropy(logits, yb, reduction="sum").item()
                correct += int((logits.argmax(dim=1) == yb).sum())
    finally:
        model.train(was_training)
    return loss_sum / len(x), correct / len(x)
