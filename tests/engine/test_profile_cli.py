"""`lockstep profile`'s arguments and the profile it adds to: refused in one sentence (exit 2) before any timing,
the file at --out untouched."""
from __future__ import annotations

import json
import os
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
    out.write_text(DeviceProfile("mine", {"gradient|kept|[]": 0.5}, _this_host(), torch=torch.__version__,
                                created="then").to_json())
    rc, err = _profile(["--name", "mine", "--out", str(out), *EXP], capsys)
    assert rc == 0, err
    prof = read_profile(str(out))
    assert (prof.name, prof.host) == ("mine", _this_host())
    assert prof.signatures["gradient|kept|[]"] == 0.5  # kept
    assert sorted({s.split("|")[0] for s in prof.signatures if s != "gradient|kept|[]"}) == \
        ["aggregate", "gradient", "update"]  # added


# --- overrides the measurement does not use ---------------------------------------------------------------------

_REAL = ("this host's real computations of the model, batch sizes and device the other overrides describe; "
         "accepted: leave it out.")


@pytest.mark.parametrize("override, why", [
    ("compute=constant", "which times " + _REAL.replace("real computations", "real computations (compute=profiled)")),
    ("compute=analytic", "which times " + _REAL.replace("real computations", "real computations (compute=profiled)")),
    ("compute.gradient=0.5", ": it is a duration of compute=constant and compute=distribution, and a profile times "
                             + _REAL),
    ("compute.update=1ms", ": it is a duration of compute=constant and compute=distribution, and a profile times "
                           + _REAL),
    ("compute.aggregate=0", ": it is a duration of compute=constant and compute=distribution, and a profile times "
                            + _REAL),
    ("compute.distribution=normal", ": it shapes compute=distribution's draws, and a profile times " + _REAL),
    ("compute.params=[0.1,0.2]", ": it shapes compute=distribution's draws, and a profile times " + _REAL),
    ("compute.kinds=[update]", ": it shapes compute=distribution's draws, and a profile times " + _REAL),
    ("compute.peak_flops=5e12", ": it is compute=analytic's FLOP rate, and a profile times " + _REAL),
    ("compute.profile=epyc-1t", ": a profile is measured on this host, not copied from another one; accepted: leave "
                                "it out (--name and --out say which profile is written)."),
    ("compute.db=/tmp/db.json", ": a profile times every call afresh, into a database of its own that it does not "
                                "keep; accepted: leave it out."),
])
def test_a_compute_override_the_measurement_does_not_use_is_refused_in_one_sentence(tmp_path, capsys, override,
                                                                                     why):
    # compute=constant and the rest were dropped silently: the profile held this host's timings all the same
    out = tmp_path / "mine.json"
    rc, err = _profile(["--name", "mine", "--out", str(out), *EXP, override], capsys)
    sep = ", " if why.startswith("which") else ""
    assert (rc, err) == (2, f"lockstep profile: {override} has no effect on a profile{sep}{why}\n")
    assert not out.exists()


def test_every_ignored_compute_override_is_named_one_line_each(tmp_path, capsys):
    out = tmp_path / "mine.json"
    rc, err = _profile(["--name", "mine", "--out", str(out), *EXP, "compute=constant", "compute.gradient=0.5"], capsys)
    assert rc == 2 and [line.split(" has no effect")[0] for line in err.splitlines()] == \
        ["lockstep profile: compute=constant", "lockstep profile: compute.gradient=0.5"]
    assert not out.exists()


def test_the_compute_overrides_a_profile_uses_or_agrees_with_are_accepted():
    from controller.config.profiles import ignored_overrides

    assert ignored_overrides(["compute=profiled", "compute.profile=null", "compute.runs=3", "compute.speed=[1,2]",
                              "compute.jitter=0.1", "compute.batch=off", "~compute.gradient", "model=mlp",
                              "computer=1", "strategy.compute=1"]) == []


# --- an existing profile of another torch version ---------------------------------------------------------------

@pytest.mark.parametrize("version", ["1.13.1", ""])
def test_profiling_into_a_profile_of_another_torch_version_is_refused_and_leaves_it_untouched(tmp_path, capsys,
                                                                                             version):
    # its timings were merged with this torch's, and the file relabelled with this version
    out = tmp_path / "mine.json"
    out.write_text(DeviceProfile("mine", {"gradient|kept|[]": 0.5}, _this_host(), torch=version).to_json())
    before = out.read_bytes()
    rc, err = _profile(["--name", "mine", "--out", str(out), *EXP], capsys)
    theirs = f"torch {version}" if version else "an unknown torch version"
    assert (rc, err) == (2, f"lockstep profile: {out} holds the profile 'mine' measured with {theirs}, not with this "
                            f"torch ({torch.__version__}), and one profile cannot mix two torch versions' timings; "
                            f"accepted: another --out (or another --name without --out), or move {out} away to "
                            "measure the profile again with this torch.\n")
    assert out.read_bytes() == before


# --- an existing file at --out that is no profile ---------------------------------------------------------------

def _no_profile(out: Path, reason: str) -> str:
    return (f"lockstep profile: {out} is not a device profile to add to ({reason}), and writing there would lose "
            f"what it holds; accepted: another --out (or another --name without --out), or move {out} away first.\n")


@pytest.mark.parametrize("content, reason", [
    (b'{"name": "mine", "signatures": {', "not JSON: Expecting property name enclosed in double quotes at line 1 "
                                         "column 33"),
    (b'{"name": "mine", "signatures": {"\xff": 1}}', "not UTF-8 text: byte 0xff at offset 33"),
    (b'[1, 2]', 'not {"name": ..., "signatures": {signature: seconds >= 0}} as `lockstep profile` writes it'),
    (b'{"name": "mine", "signatures": {}, "estimators": []}',
     "its 'estimators' section is not a mapping of fitted models"),
])
def test_a_file_at_out_that_is_no_profile_is_refused_and_kept(tmp_path, capsys, content, reason):
    # it was overwritten by the new profile (invalid UTF-8: a UnicodeDecodeError traceback)
    out = tmp_path / "notes.json"
    out.write_bytes(content)
    rc, err = _profile(["--name", "mine", "--out", str(out), *EXP], capsys)
    assert (rc, err) == (2, _no_profile(out, reason))
    assert out.read_bytes() == content


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root reads a file without read permission: the case cannot be made here")
def test_a_file_at_out_that_cannot_be_read_is_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "secret.json"
    out.write_text(DeviceProfile("mine", {"gradient|kept|[]": 0.5}, _this_host(), torch=torch.__version__).to_json())
    out.chmod(0o200)
    try:
        rc, err = _profile(["--name", "mine", "--out", str(out), *EXP], capsys)
        assert (rc, err) == (2, _no_profile(out, "it cannot be read: Permission denied"))
    finally:
        out.chmod(0o600)


def test_a_directory_at_out_is_refused_as_before(tmp_path, capsys):
    out = tmp_path / "dir.json"
    out.mkdir()
    rc, err = _profile(["--name", "mine", "--out", str(out), *EXP], capsys)
    assert (rc, err) == (2, f"lockstep profile: --out {out}: {out} is a directory, not a file; accepted: a file to "
                            "write the profile to.\n")


def test_a_profile_that_is_not_utf8_is_one_sentence_for_compute_profile_too(tmp_path):
    from controller.config.profiles import ProfileError

    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"name": "\xff"}')
    with pytest.raises(ProfileError, match=r"^compute.profile='.*bad.json': .*bad.json is not a readable JSON "
                                           r"profile \(.*can't decode byte 0xff.*\)\.$"):
        read_profile(str(bad))
