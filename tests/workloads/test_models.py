"""Models: shapes, seeded construction, flat parameters, gradient and evaluation."""
from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from agents.sim.keyed import generator
from agents.workloads.models import (
    MLP,
    SmallResNet,
    ThesisCNN,
    build_model,
    evaluate,
    flat_params,
    gradient,
    optimizer,
    param_bytes,
    set_flat_params,
    step,
)


def batch(n: int = 8, channels: int = 1, side: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    rng = generator(0, "test-batch", n)
    x = torch.from_numpy(rng.standard_normal((n, channels, side, side), dtype="float32"))
    return x, torch.from_numpy(rng.integers(0, 10, n))


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet"])
def test_built_in_models_give_ten_logits_per_image(name):
    x, _ = batch()
    assert build_model(name, seed=0)(x).shape == (8, 10)


def test_the_thesis_cnn_has_two_convolutions_and_three_fc_layers():
    cnn = ThesisCNN()
    convs = [m for m in cnn.modules() if isinstance(m, torch.nn.Conv2d)]
    fcs = [m for m in cnn.modules() if isinstance(m, torch.nn.Linear)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [(1, 6), (6, 16)]
    assert [(f.in_features, f.out_features) for f in fcs] == [(256, 120), (120, 84), (84, 10)]
    cifar = ThesisCNN(in_channels=3, image_size=32)
    assert cifar.fc1.in_features == 400 and cifar(batch(2, 3, 32)[0]).shape == (2, 10)


def test_small_resnet_keeps_all_its_state_in_parameters():
    assert list(SmallResNet().buffers()) == []


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet"])
def test_the_same_seed_gives_bit_identical_parameters_whatever_the_global_rng(name):
    torch.manual_seed(1)
    a = flat_params(build_model(name, seed=3))
    torch.manual_seed(2)
    before = torch.get_rng_state()
    b = flat_params(build_model(name, seed=3))
    assert torch.equal(torch.get_rng_state(), before)  # the caller's stream is untouched
    assert torch.equal(a, b)
    assert not torch.equal(a, flat_params(build_model(name, seed=4)))


def test_build_model_accepts_configs_dotted_paths_and_user_modules():
    a = build_model({"_target_": "mlp", "hidden": [32, 16]}, seed=0)
    b = build_model(OmegaConf.create({"_target_": "agents.workloads.models.MLP", "hidden": [32, 16]}), seed=0)
    assert isinstance(a, MLP) and torch.equal(flat_params(a), flat_params(b))
    assert [m.out_features for m in a.modules() if isinstance(m, torch.nn.Linear)] == [32, 16, 10]
    assert isinstance(build_model("agents.workloads.models.SmallResNet", seed=0), SmallResNet)
    user = build_model({"_target_": "torch.nn.Linear", "in_features": 4, "out_features": 2}, seed=0)
    assert isinstance(user, torch.nn.Linear) and user.weight.shape == (2, 4)
    # Lists arrive as lists, not OmegaConf ListConfigs (Unflatten rejects anything but a list or tuple).
    unflatten = build_model({"_target_": "torch.nn.Unflatten", "dim": 1, "unflattened_size": [1, 28, 28]}, seed=0)
    assert unflatten(torch.zeros(2, 784)).shape == (2, 1, 28, 28)


@pytest.mark.parametrize("cfg, error, message", [
    ("lenet", ValueError, r"model._target_='lenet' is neither a built-in model \(mlp, cnn, resnet, flat\)"),
    ({"hidden": [3]}, ValueError, "model config needs a _target_"),
    ("no_such.Module", ValueError, "model._target_='no_such.Module' could not be instantiated"),
    ({"_target_": "mlp", "depth": 3}, ValueError, "unexpected keyword argument 'depth'"),
    ("collections.OrderedDict", TypeError, "built a OrderedDict, not a torch.nn.Module"),
    (42, TypeError, "expected a name, a dotted path or a config"),
])
def test_bad_model_configs_get_a_clear_error(cfg, error, message):
    with pytest.raises(error, match=message):
        build_model(cfg, seed=0)


def test_param_bytes_and_flat_params_round_trip():
    model = MLP(hidden=(5,))
    assert param_bytes(model) == 4 * (784 * 5 + 5 + 5 * 10 + 10)
    flat = flat_params(model)
    assert flat.shape == (param_bytes(model) // 4,)
    set_flat_params(model, flat * 2)
    assert torch.equal(flat_params(model), flat * 2)
    assert torch.equal(model.net[1].bias, (flat * 2)[784 * 5:784 * 5 + 5])
    with pytest.raises(ValueError, match=f"expected a 1-D tensor of {flat.numel()} values"):
        set_flat_params(model, flat[:-1])


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet"])
def test_gradient_equals_a_manual_backward_pass_exactly(name):
    model = build_model(name, seed=0)
    reference = copy.deepcopy(model)
    before = flat_params(model)
    for p in model.parameters():
        p.grad = torch.ones_like(p)  # stale gradients must neither leak in nor stay
    x, y = batch()
    loss, grads = gradient(model, x, y)

    manual = F.cross_entropy(reference(x), y)
    manual.backward()
    assert loss == manual.item()
    assert len(grads) == len(list(reference.parameters()))
    for g, p in zip(grads, reference.parameters()):
        assert not g.requires_grad and torch.equal(g, p.grad)
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(flat_params(model), before)  # no update


def test_gradient_gives_zeros_for_a_frozen_parameter():
    model = MLP(hidden=(5,))
    model.net[1].weight.requires_grad_(False)
    _, grads = gradient(model, *batch())
    assert torch.equal(grads[0], torch.zeros(5, 784)) and grads[1].abs().sum() > 0


def test_gradient_gives_zeros_for_an_unused_parameter_and_the_same_with_the_kept_parameter_list():
    model = MLP(hidden=(5,))
    model.spare = torch.nn.Parameter(torch.ones(3))  # registered, never used by forward
    params = list(model.parameters())
    x, y = batch()
    loss, grads = gradient(model, x, y)
    assert torch.equal(grads[0], torch.zeros(3)) and grads[1].abs().sum() > 0  # (its own parameters come first)
    loss2, grads2 = gradient(model, x, y, params)
    assert loss2 == loss and all(torch.equal(a, b) for a, b in zip(grads, grads2))
    flat = flat_params(model)
    set_flat_params(model, flat * 3, params)
    assert torch.equal(flat_params(model), flat * 3)


def test_evaluate_matches_a_manual_count_whatever_the_batch_size():
    model = build_model("cnn", seed=0)
    model.train()
    x, y = batch(50)
    with torch.no_grad():
        logits = model(x)
    correct = int((logits.argmax(1) == y).sum())
    loss, acc = evaluate(model, x, y, batch=7)
    assert acc == correct / 50 and loss == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-5)
    assert evaluate(model, x, y) == pytest.approx((loss, acc), rel=1e-5)
    assert model.training  # mode restored


@pytest.mark.parametrize("name, momentum", [("sgd", 0.0), ("sgd", 0.9), ("adam", 0.0)])
def test_step_updates_the_parameters_exactly_as_the_optimizers_own_step(name, momentum):
    ours, theirs = (MLP(hidden=(8,)) for _ in range(2))
    theirs.load_state_dict(ours.state_dict())
    opt_ours = optimizer(name, ours.parameters(), 0.05, momentum)
    opt_theirs = optimizer(name, theirs.parameters(), 0.05, momentum)
    rng = generator(0, "test-step", 0)
    for _ in range(3):
        for p, q in zip(ours.parameters(), theirs.parameters()):
            p.grad = torch.from_numpy(rng.standard_normal(p.shape, dtype="float32"))
            q.grad = p.grad.clone()
        step(opt_ours)
        opt_theirs.step()
    assert torch.equal(flat_params(ours), flat_params(theirs))
    assert str(opt_ours.state_dict()) == str(opt_theirs.state_dict())


def test_making_stepping_and_saving_an_optimizer_never_loads_torchs_compiler():
    """torch.optim imports torch._dynamo on an optimizer's first step or state_dict, 1.9 s of every agent's start."""
    code = textwrap.dedent("""
        import sys
        import torch
        from agents.workloads.models import MLP, optimizer, step
        for name in ("sgd", "adam"):
            model = MLP(hidden=(8,))
            opt = optimizer(name, model.parameters(), 0.1, 0.9 if name == "sgd" else 0.0)
            for p in model.parameters():
                p.grad = torch.ones_like(p)
            step(opt)
            opt.load_state_dict(opt.state_dict())
            opt.zero_grad()
        print("torch._dynamo" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_an_unknown_optimizer_is_named_in_the_error():
    with pytest.raises(ValueError, match="optimizer='lamb': expected sgd or adam"):
        optimizer("lamb", MLP(hidden=(8,)).parameters(), 0.1)
