"""`lockstep profile`'s arguments and the profile it adds to: refused in one sentence (exit 2) before any timing,
the file at --out untouched."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from controller.config.profiles import DeviceProfile, profile_main, read_profile

ROOT = Path(__file__).resolve().parents[2]
EXP = ["strategy=ps_sync", "workers=2", "stop.updates=4", "model=mlp", "compute.runs=2"]


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """profile_main sets torch's thread count to the experiment's (threads=1), as the profile is measured."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _this_host() -> str:
    """The host string `lockstep profile` records for the default experiment (device cpu, threads=1)."""
    from agents.sim.compute import device_kind

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return device_kind("cpu")
    finally:
        torch.set_num_threads(n)


def _profile(argv: list[str], capsys) -> tuple[int, str]:
    rc = profile_main(argv)
    return rc, capsys.readouterr().err


# --- --estimator N ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [-1, 1, 2, 5, 9])
def test_an_estimator_of_fewer_than_10_shapes_is_one_sentence_and_writes_nothing(tmp_path, capsys, n):
    # 2 ended in a traceback from agents/sim/estimator.py (one training shape), 5 stored estimators with held-out
    # errors of 32-370 %, although the message said "at least 10 shapes"
    out = tmp_path / "p" / "mine.json"
    rc, err = _profile(["--name", "mine", "--out", str(out), "--estimator", str(n), *EXP], capsys)
    assert (rc, err) == (2, f"lockstep profile: --estimator {n} is not valid; accepted: 0 (none) or at least 10 "
                            "shapes.\n")
    assert not out.exists() and not out.parent.exists()


# --- --name -----------------------------------------------------------------------------------------------------

def test_a_name_ending_in_json_is_refused_as_compute_profile_would_read_it_as_a_path(tmp_path, capsys):
    # --name foo.json wrote conf/profiles/foo.json.json, and compute.profile=foo.json looks for ./foo.json
    out = tmp_path / "foo.json"
    rc, err = _profile(["--name", "foo.json", "--out", str(out), *EXP], capsys)
    assert (rc, err) == (2, "lockstep profile: --name 'foo.json' is not valid; accepted: 1-63 letters, digits, "
                            "'.', '_', '-', not ending in '.json' (the profile is written to NAME.json).\n")
    assert not out.exists()


def test_the_name_rule_and_the_lookup_of_compute_profile_agree():
    from controller.config.profiles import _path_of, is_name, profiles_dir

    assert is_name("foo") and is_name("foo.v2") and not is_name("foo.json") and not is_name("a/b")
    assert _path_of("foo.v2") == profiles_dir() / "foo.v2.json"  # where `lockstep profile --name foo.v2` writes
    assert _path_of("foo.json") == Path("foo.json")  # a path, which no --name can write to by default


# --- an existing profile at --out -------------------------------------------------------------------------------

@pytest.mark.parametrize("name, host", [("other", "cpu:AMD EPYC:threads=1"), ("epyc-1t", "cpu:AMD EPYC:threads=1"),
                                        ("epyc-1t", "")])
def test_profiling_into_a_profile_of_another_host_is_refused_and_leaves_it_untouched(tmp_path, capsys, name, host):
    # a copy of the shipped epyc-1t profile: its timings were merged with this host's, and the file relabelled
    # with this host and the new --name
    this = _this_host()
    if host == this:
        host = "cpu:Another CPU:threads=1"  # on the machine the shipped profile was measured on
    d = json.loads((ROOT / "conf" / "profiles" / "epyc-1t.json").read_text())
    d["host"] = host
    out = tmp_path / "copy.json"
    out.write_text(json.dumps(d, indent=1) + "\n")
    before = out.read_bytes()
    rc, err = _profile(["--name", name, "--out", str(out), *EXP], capsys)
    where = repr(host) if host else "an unknown host"
    assert (rc, err) == (2, f"lockstep profile: {out} holds the profile 'epyc-1t' measured on {where}, not on this "
                            f"host ({this!r}), and one profile cannot mix two machines' timings; accepted: another "
                            "--out (or another --name without --out) for a profile of this host.\n")
    assert out.read_bytes() == before


def test_profiling_into_a_profile_of_another_name_is_refused_and_leaves_it_untouched(tmp_path, capsys):
    out = tmp_path / "theirs.json"
    out.write_text(DeviceProfile("theirs", {"gradient|x": 0.5}, _this_host()).to_json())
    before = out.read_bytes()
    rc, err = _profile(["--name", "mine", "--out", str(out), *EXP], capsys)
    assert (rc, err) == (2, f"lockstep profile: {out} holds the profile 'theirs', not 'mine'; accepted: --name "
                            "theirs to add to it, or another --out (or no --out) for a profile named 'mine'.\n")
    assert out.read_bytes() == before


def test_profiling_again_into_a_profile_of_this_host_adds_to_it(tmp_path, capsys):
    out = tmp_path / "mine.json"
    out.write_text(DeviceProfile("mine", {"gradient|kept|[]": 0.5}, _this_host(), created="then").to_json())
    rc, err = _profile(["--name", "mine", "--out", str(out), *EXP], capsys)
    assert rc == 0, err
    prof = read_profile(str(out))
    assert (prof.name, prof.host) == ("mine", _this_host())
    assert prof.signatures["gradient|kept|[]"] == 0.5  # kept
    assert sorted({s.split("|")[0] for s in prof.signatures if s != "gradient|kept|[]"}) == \
        ["aggregate", "gradient", "update"]  # added
