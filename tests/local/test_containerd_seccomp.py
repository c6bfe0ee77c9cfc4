"""containerd's RuntimeDefault seccomp profile for podman (nvrx_eks/rehearse/seccomp/), and its
generator (scripts/containerd_seccomp.py).

The committed profile is checked for what the rehearsal relies on: memory-policy syscalls only
with CAP_SYS_NICE (containerd, unlike podman's own profile), CPU affinity always, a denying
default. Where podman can run a container here, the profile is also applied for real: numactl
--membind fails without CAP_SYS_NICE and works with it, taskset works, while podman's own profile
lets numactl through (the control that shows the failure is the profile's).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

from scripts.containerd_seccomp import ShapeError, generate, main
from tests.support import REPO_ROOT

SECCOMP_DIR = REPO_ROOT / "nvrx_eks" / "rehearse" / "seccomp"
PROFILE = SECCOMP_DIR / "containerd-runtime-default.json"
MEMPOLICY = ("get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node")


@pytest.fixture(scope="module")
def profile() -> dict:
    return json.loads(PROFILE.read_text())


def _allowing(profile: dict, name: str) -> list[dict]:
    return [e for e in profile["syscalls"] if name in e["names"] and e["action"] == "SCMP_ACT_ALLOW"]


# ---------------------------------------------------------------------------------------------
# The committed profile
# ---------------------------------------------------------------------------------------------


def test_default_action_denies_with_eperm(profile):
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    assert profile["defaultErrnoRet"] == 1  # EPERM, what runc answers for containerd's unset errno
    assert profile["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]


@pytest.mark.parametrize("name", MEMPOLICY)
def test_memory_policy_syscalls_need_cap_sys_nice(profile, name):
    entries = _allowing(profile, name)
    assert entries, f"{name} is never allowed"
    for entry in entries:
        assert "CAP_SYS_NICE" in entry["includes"].get("caps", []), entry["comment"]


def test_cpu_affinity_is_allowed_unconditionally(profile):
    unconditional = [e for e in _allowing(profile, "sched_setaffinity") if not e["includes"] and not e["excludes"]]
    assert unconditional and all(e["args"] == [] for e in unconditional)


def test_each_name_appears_once_per_condition(profile):
    seen: dict[str, list[str]] = defaultdict(list)
    for entry in profile["syscalls"]:
        key = json.dumps(
            [entry["action"], entry.get("errnoRet"), entry["args"], entry["includes"], entry["excludes"]],
            sort_keys=True,
        )
        seen[key] += entry["names"]
    duplicates = {k: sorted({n for n in v if v.count(n) > 1}) for k, v in seen.items()}
    assert not any(duplicates.values()), duplicates


def test_entries_use_only_podmans_schema(profile):
    """containers/common pkg/seccomp reads these keys; includes/excludes hold caps and arches only
    (no minKernel: podman would ignore it)."""
    assert set(profile) == {"defaultAction", "defaultErrnoRet", "architectures", "syscalls"}
    for entry in profile["syscalls"]:
        assert set(entry) - {"errnoRet"} == {"names", "action", "args", "comment", "includes", "excludes"}
        assert set(entry["includes"]) <= {"caps", "arches"} and set(entry["excludes"]) <= {"caps"}
        assert entry["comment"].startswith("containerd v2.2.4 contrib/seccomp/seccomp_default.go:")


def test_readme_states_the_same_containerd_release(profile):
    readme = (SECCOMP_DIR / "README.md").read_text()
    assert "v2.2.4" in readme and "193637f7ee8ae5f5aa5248f49e7baa3e6164966e" in readme


def test_clone_without_cap_sys_admin_is_namespace_free_and_clone3_is_enosys(profile):
    clone = [e for e in profile["syscalls"] if e["names"] == ["clone"]]
    assert clone[0]["excludes"] == {"caps": ["CAP_SYS_ADMIN"]}
    assert clone[0]["args"][0]["op"] == "SCMP_CMP_MASKED_EQ" and clone[0]["args"][0]["value"] == 0x7E020000
    clone3 = [e for e in profile["syscalls"] if e["names"] == ["clone3"]]
    assert clone3[0]["action"] == "SCMP_ACT_ERRNO" and clone3[0]["errnoRet"] == 38  # ENOSYS


# ---------------------------------------------------------------------------------------------
# The generator, on a source shaped like containerd's
# ---------------------------------------------------------------------------------------------

SOURCE = """//go:build linux

package seccomp

import (
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/containerd/containerd/v2/pkg/kernelversion"
	"github.com/opencontainers/runtime-spec/specs-go"
)

func arches() []specs.Arch {
	switch runtime.GOARCH {
	case "amd64":
		return []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32}
	case "arm64":
		return []specs.Arch{specs.ArchARM, specs.ArchAARCH64}
	default:
		return []specs.Arch{}
	}
}

// DefaultProfile defines the allowed syscalls for the default seccomp profile.
func DefaultProfile(sp *specs.Spec) *specs.LinuxSeccomp {
	nosys := uint(unix.ENOSYS)
	syscalls := []specs.LinuxSyscall{
		{
			Names: []string{
				"read",
				"sched_setaffinity", // a comment
			},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{},
		},
		{
			Names:  []string{"socket"},
			Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{
				{
					Index: 0,
					Value: unix.AF_ALG + 1,
					Op:    specs.OpEqualTo,
				},
			},
		},
	}

	s := &specs.LinuxSeccomp{
		DefaultAction: specs.ActErrno,
		Architectures: arches(),
		Syscalls:      syscalls,
	}

	if ok, err := kernelversion.GreaterEqualThan(
		kernelversion.KernelVersion{Kernel: 4, Major: 8}); err == nil {
		if ok {
			s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{
				Names:  []string{"ptrace"},
				Action: specs.ActAllow,
				Args:   []specs.LinuxSeccompArg{},
			})
		}
	}

	switch runtime.GOARCH {
	case "arm", "arm64":
		s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{
			Names:  []string{"set_tls"},
			Action: specs.ActAllow,
		})
	case "amd64":
		s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{
			Names:  []string{"arch_prctl"},
			Action: specs.ActAllow,
		})
	}

	admin := false
	for _, c := range sp.Process.Capabilities.Bounding {
		switch c {
		case "CAP_SYS_ADMIN":
			admin = true
			s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{
				Names:  []string{"mount"},
				Action: specs.ActAllow,
				Args:   []specs.LinuxSeccompArg{},
			})
		case "CAP_SYS_NICE":
			s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{
				Names:  []string{"mbind"},
				Action: specs.ActAllow,
				Args:   []specs.LinuxSeccompArg{},
			})
		}
	}

	if !admin {
		s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{
			Names:    []string{"clone3"},
			Action:   specs.ActErrno,
			ErrnoRet: &nosys,
		})
	}

	return s
}
"""


def test_generator_translates_each_condition():
    out = generate(SOURCE, "src.go")
    assert out["defaultAction"] == "SCMP_ACT_ERRNO" and out["defaultErrnoRet"] == 1
    assert out["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]
    by_name = {e["names"][0]: e for e in out["syscalls"]}
    assert list(by_name) == ["read", "socket", "ptrace", "arch_prctl", "mount", "mbind", "clone3"]
    assert by_name["read"]["names"] == ["read", "sched_setaffinity"]
    assert by_name["read"]["includes"] == {} and by_name["read"]["excludes"] == {}
    assert by_name["socket"]["args"] == [{"index": 0, "value": 39, "valueTwo": 0, "op": "SCMP_CMP_EQ"}]
    assert by_name["ptrace"]["includes"] == {} and "kernel >= 4.8" in by_name["ptrace"]["comment"]
    assert by_name["arch_prctl"]["includes"] == {"arches": ["amd64"]}
    assert by_name["mount"]["includes"] == {"caps": ["CAP_SYS_ADMIN"]}
    assert by_name["mbind"]["includes"] == {"caps": ["CAP_SYS_NICE"]}
    assert by_name["clone3"]["excludes"] == {"caps": ["CAP_SYS_ADMIN"]}
    assert by_name["clone3"]["errnoRet"] == 38 and by_name["clone3"]["action"] == "SCMP_ACT_ERRNO"
    assert by_name["mbind"]["comment"].startswith("src.go:")


def test_generator_cli_writes_the_profile(tmp_path):
    source = tmp_path / "seccomp_default.go"
    source.write_text(SOURCE)
    assert main([str(source), "-o", str(tmp_path / "out.json"), "--label", "containerd vX"]) == 0
    written = json.loads((tmp_path / "out.json").read_text())
    assert written["syscalls"][0]["comment"].startswith("containerd vX:")


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ("//go:build linux", "//go:build !linux", "go:build linux"),
        ('Names:  []string{"mbind"},', 'Names:  []string{"mbind"},\n\t\t\t\tComment: "x",', "LinuxSyscall.Comment"),
        ("admin := false", "admin := false\n\tfmt.Println(admin)", "only assignments"),
        ('case "CAP_SYS_NICE":', 'default:\n\t\t\tadmin = true\n\t\tcase "CAP_SYS_NICE":', "default case"),
        ("unix.AF_ALG + 1", "unix.AF_NETLINK", "unix.AF_NETLINK"),
        ("Kernel: 4, Major: 8", "Kernel: 6, Major: 8", "no minKernel"),
        ("specs.ActAllow,\n\t\t\tArgs:   []specs.LinuxSeccompArg{},\n\t\t},", "specs.ActNope,\n\t\t},", "ActNope"),
        ("\t\tSyscalls:      syscalls,\n", "\t\tSyscalls:      syscalls,\n\t\tFlags: nil,\n", "LinuxSeccomp.Flags"),
        ("if !admin {", "if admin {", "if condition"),
        ('switch runtime.GOARCH {\n\tcase "arm"', 'switch runtime.GOOS {\n\tcase "arm"', "runtime.GOOS"),
        ("return s\n", "", "without return"),
        (
            'case "CAP_SYS_NICE":',
            'case "CAP_SYS_NICE":\n\t\t\ts.Syscalls = []specs.LinuxSyscall{}',
            "conditional assignment",
        ),
        ('case "CAP_SYS_NICE":', 'case "CAP_SYS_NICE":\n\t\t\treturn s', "return that depends"),
    ],
)
def test_generator_refuses_what_it_does_not_understand(old, new, complaint):
    assert old in SOURCE
    with pytest.raises(ShapeError, match=complaint):
        generate(SOURCE.replace(old, new, 1))


def test_generator_cli_fails_without_writing(tmp_path, capsys):
    source = tmp_path / "seccomp_default.go"
    source.write_text(SOURCE.replace("specs.OpEqualTo", "specs.OpSomething"))
    assert main([str(source), "-o", str(tmp_path / "out.json")]) == 1
    assert not (tmp_path / "out.json").exists()
    assert "no profile written" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# The profile applied by podman (root, runc), when this machine can run it
# ---------------------------------------------------------------------------------------------

CONTAINERS_CONF = """[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
"""


def _rootfs_from_host(root: Path, programs: list[str]) -> None:
    """A root file system of the host's own `programs` and the libraries they load (no image,
    no network)."""
    for program in programs:
        path = Path(shutil.which(program) or "")
        libraries = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True).stdout
        files = [path] + [
            Path(word) for line in libraries.splitlines() for word in line.split() if word.startswith("/")
        ]
        for f in files:
            target = root / f.relative_to("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f.resolve(), target)
    for d in ("proc", "sys", "dev", "tmp", "etc"):
        (root / d).mkdir(exist_ok=True)


@pytest.fixture
def podman(tmp_path, request):
    """podman with its own storage under tmp_path; skips when it cannot run containers here."""
    missing = [p for p in ("podman", "runc", "numactl", "taskset", "ldd") if shutil.which(p) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} on this machine")
    if os.geteuid() != 0:
        pytest.skip("runs rootful podman (cgroupfs, runc); not root")
    conf = tmp_path / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    # podman refuses a run root longer than 50 characters; pytest's tmp_path can be longer.
    runroot = Path(tempfile.mkdtemp(prefix="nvrx-seccomp-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(runroot, ignore_errors=True))
    base = ["podman", "--root", str(tmp_path / "storage"), "--runroot", str(runroot)]
    base += ["--storage-driver", "vfs"]
    info = subprocess.run([*base, "info"], capture_output=True, text=True, env=env, timeout=120)
    if info.returncode != 0:
        pytest.skip(f"podman info fails: {info.stderr.strip().splitlines()[-1:]}")
    rootfs = tmp_path / "rootfs"
    _rootfs_from_host(rootfs, ["numactl", "taskset", "true"])

    def run(seccomp: Path, caps: list[str], command: list[str]) -> subprocess.CompletedProcess:
        cap_args = ["--cap-drop", "ALL"] + [a for c in caps for a in ("--cap-add", c)]
        return subprocess.run(
            [*base, "run", "--rm", "--network", "none", "--security-opt", f"seccomp={seccomp}", *cap_args]
            + ["--rootfs", str(rootfs), *command],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    yield run
    subprocess.run([*base, "rm", "--all", "--force"], capture_output=True, env=env, timeout=120)


NUMACTL = ["numactl", "--cpunodebind", "0", "--membind", "0", "true"]
TASKSET = ["taskset", "-c", "0", "true"]
PODMAN_DEFAULT_PROFILE = Path("/usr/share/containers/seccomp.json")


def test_podman_applies_the_profile(podman):
    if not PODMAN_DEFAULT_PROFILE.exists():
        pytest.skip(f"{PODMAN_DEFAULT_PROFILE} (containers-common) is absent: no control")
    control = podman(PODMAN_DEFAULT_PROFILE, ["IPC_LOCK"], NUMACTL)
    if control.returncode != 0:
        pytest.skip(f"numactl fails here even under podman's own profile: {control.stderr.strip()}")

    denied = podman(PROFILE, ["IPC_LOCK"], NUMACTL)
    assert denied.returncode != 0 and "Operation not permitted" in denied.stderr, denied
    allowed = podman(PROFILE, ["IPC_LOCK", "SYS_NICE"], NUMACTL)
    assert allowed.returncode == 0, allowed
    affinity = podman(PROFILE, ["IPC_LOCK"], TASKSET)
    assert affinity.returncode == 0, affinity
