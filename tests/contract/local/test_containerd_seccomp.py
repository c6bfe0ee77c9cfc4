"""containerd's RuntimeDefault seccomp profile for podman (nvrx_eks/rehearse/seccomp/), and its
provenance: entry by entry the profile containerd's own source builds on linux/amd64.

The committed profile is checked for what the rehearsal relies on: memory-policy syscalls only
with CAP_SYS_NICE (containerd, unlike podman's own profile), CPU affinity always, a denying
default. Where podman can run a container here, the profile is also applied for real: numactl
--membind fails without CAP_SYS_NICE and works with it, taskset works, while podman's own profile
lets numactl through (the control that shows the failure is the profile's).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

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
# Provenance: the committed profile is containerd's DefaultProfile for linux/amd64, entry by entry
# ---------------------------------------------------------------------------------------------

#: containerd's file, unmodified (tests/upstream/README.md), and its git blob id at tag v2.2.4
#: (commit 193637f7ee8ae5f5aa5248f49e7baa3e6164966e): the copy is byte for byte upstream's.
UPSTREAM_SOURCE = REPO_ROOT / "tests" / "upstream" / "containerd" / "seccomp_default.go"
UPSTREAM_BLOB = "d48983dd6c073c5b5462fe42eaad9446fd285357"
SOURCE_LABEL = "containerd v2.2.4 contrib/seccomp/seccomp_default.go"
#: The oldest kernel of the EKS AL2023 AMIs (6.1; 6.12 and 6.18 are newer): a kernel-version test
#: it passes holds on every node, so its entries are unconditional (podman's schema has no kernel
#: condition).
MIN_NODE_KERNEL = (6, 1)

#: What the Go file's names mean on linux/amd64 (runtime-spec specs-go/config.go,
#: golang.org/x/sys/unix zerrors_linux.go).
SPECS = {
    "specs.ActAllow": "SCMP_ACT_ALLOW",
    "specs.ActErrno": "SCMP_ACT_ERRNO",
    "specs.OpEqualTo": "SCMP_CMP_EQ",
    "specs.OpLessThan": "SCMP_CMP_LT",
    "specs.OpGreaterThan": "SCMP_CMP_GT",
    "specs.OpMaskedEqual": "SCMP_CMP_MASKED_EQ",
    "specs.ArchX86_64": "SCMP_ARCH_X86_64",
    "specs.ArchX86": "SCMP_ARCH_X86",
    "specs.ArchX32": "SCMP_ARCH_X32",
}
UNIX = {
    "unix.AF_ALG": 38,
    "unix.AF_VSOCK": 40,
    "unix.ENOSYS": 38,
    "unix.CLONE_NEWNS": 0x00020000,
    "unix.CLONE_NEWCGROUP": 0x02000000,
    "unix.CLONE_NEWUTS": 0x04000000,
    "unix.CLONE_NEWIPC": 0x08000000,
    "unix.CLONE_NEWUSER": 0x10000000,
    "unix.CLONE_NEWPID": 0x20000000,
    "unix.CLONE_NEWNET": 0x40000000,
}


def _go_int(expression: str) -> int:
    """An integer expression of the file: literals and unix constants joined by `|` or `+`."""
    value, operator = 0, "|"
    for token in re.findall(r"[|+]|[\w.]+", expression):
        if token in "|+":
            operator = token
            continue
        number = UNIX[token] if token in UNIX else int(token, 0)
        value = value | number if operator == "|" else value + number
    return value


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip("\t"))


def _block(lines: list[str], start: int) -> str:
    """The text from the `{` ending line `start` (0-based) to its matching `}`."""
    depth, out = 0, []
    for line in lines[start:]:
        code = line.split("//")[0]
        out.append(code)
        depth += code.count("{") - code.count("}")
        if depth == 0:
            return "\n".join(out)
    raise AssertionError(f"unbalanced braces from line {start + 1}")


def _enclosing(lines: list[str], index: int) -> list[int]:
    """The lines of the constructs around line `index` (0-based), innermost first: each opener
    with less indentation, and for a `case` also its `switch` (gofmt puts both at one
    indentation)."""
    chain, threshold, i = [], _indent(lines[index]), index - 1
    while i >= 0 and threshold > 0:
        line = lines[i]
        if line.strip() and _indent(line) < threshold:
            chain.append(i)
            threshold = _indent(line)
            if line.strip().startswith(("case ", "default:")):
                while not lines[i].strip().startswith("switch "):  # up to this case's switch
                    i -= 1
                chain.append(i)
        i -= 1
    return chain


def _switch_cases(lines: list[str], switch: int) -> list[str]:
    """The `case`/`default` lines of the switch opened on line `switch`."""
    block = _block(lines, switch).splitlines()
    return [line.strip() for line in block if _indent(line) == _indent(lines[switch]) and line.strip() != "}"][1:]


#: Constructs around a literal that make no condition of their own.
_NEUTRAL = (
    "func DefaultProfile(",
    "syscalls := []specs.LinuxSyscall{",
    "if ok, err := kernelversion.GreaterEqualThan(",
    "for _, c := range sp.Process.Capabilities.Bounding {",
    "switch c {",
    "switch runtime.GOARCH {",
)


def _conditions(lines: list[str], chain: list[int], source: str) -> tuple[dict, dict, bool] | None:
    """(includes, excludes, whether amd64 builds it) of a literal from its enclosing constructs,
    as podman's schema states them; None for a construct this check does not know."""
    includes: dict = {}
    excludes: dict = {}
    amd64 = True
    for k, line in enumerate(chain):
        construct = lines[line].strip()
        switch = lines[chain[k + 1]].strip() if construct.startswith(("case ", "default:")) else ""
        if switch == "switch c {":  # in: for _, c := range sp.Process.Capabilities.Bounding
            includes["caps"] = re.findall(r'"(CAP_\w+)"', construct)
        elif switch == "switch runtime.GOARCH {":
            listed = {a for case in _switch_cases(lines, chain[k + 1]) for a in re.findall(r'"(\w+)"', case)}
            amd64 = '"amd64"' in construct or (construct == "default:" and "amd64" not in listed)
            includes["arches"] = ["amd64"]
        elif construct == "if !admin {":
            assert 'case "CAP_SYS_ADMIN":\n\t\t\tadmin = true' in source
            excludes["caps"] = ["CAP_SYS_ADMIN"]
        elif construct == "if ok {":
            kernel = re.search(r"KernelVersion\{Kernel: (\d+), Major: (\d+)\}", source)
            assert kernel and tuple(map(int, kernel.groups())) <= MIN_NODE_KERNEL, "a kernel test not every node passes"
        elif not construct.startswith(_NEUTRAL):
            return None
    return includes, excludes, amd64


def _entry(lines: list[str], index: int, source: str) -> dict | None:
    """The profile entry containerd builds on linux/amd64 from the LinuxSyscall literal opened on
    line `index` (0-based), or None when amd64 never builds it."""
    chain = _enclosing(lines, index)
    conditions = _conditions(lines, chain, source)
    assert conditions is not None, f"line {index + 1}: a construct this check does not know: {chain}"
    includes, excludes, amd64 = conditions
    if not amd64:
        return None
    block = _block(lines, index)
    names_part = block[block.index("Names:") : block.index("Action:")]
    action = re.search(r"Action:\s*(specs\.\w+)", block)
    entry = {
        "names": re.findall(r'"([^"]+)"', names_part),
        "action": SPECS[action[1]],
        "args": [
            {"index": int(i), "value": _go_int(value), "valueTwo": int(two or 0), "op": SPECS[op]}
            for i, value, two, op in re.findall(
                r"Index:\s*(\d+),\s*Value:\s*([^,]+),(?:\s*ValueTwo:\s*(\d+),)?\s*Op:\s*(specs\.\w+)", block
            )
        ],
        "includes": includes,
        "excludes": excludes,
    }
    if "ErrnoRet: &nosys" in block:
        assert "nosys := uint(unix.ENOSYS)" in source
        entry["errnoRet"] = UNIX["unix.ENOSYS"]
    return entry


def upstream_profile_entries(source: str) -> list[tuple[int, dict]]:
    """(Go line, entry) of every LinuxSyscall literal of DefaultProfile that amd64 builds, in the
    file's order."""
    lines = source.splitlines()
    body = lines.index("func DefaultProfile(sp *specs.Spec) *specs.LinuxSeccomp {")
    found = []
    for i in range(body, len(lines)):
        line = lines[i]
        opens_literal = line.rstrip().endswith("specs.LinuxSyscall{") and "[]specs" not in line
        opens_list_item = line.strip() == "{" and lines[i + 1].strip().startswith("Names:")
        if opens_literal or opens_list_item:
            entry = _entry(lines, i, source)
            if entry is not None:
                found.append((i + 1, entry))
    return found


def test_the_vendored_source_is_containerds_own_file():
    data = UPSTREAM_SOURCE.read_bytes()
    assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == UPSTREAM_BLOB


def test_the_profile_is_containerds_default_profile_for_amd64(profile):
    """Each entry is the LinuxSyscall literal its comment names (names, action, arguments, errno),
    under the conditions around it (capability cases, the !admin block, the GOARCH switch); and
    every literal amd64 builds has its entry, in the file's order."""
    source = UPSTREAM_SOURCE.read_text()
    expected = upstream_profile_entries(source)
    assert [e["comment"].split(";")[0] for e in profile["syscalls"]] == [f"{SOURCE_LABEL}:{n}" for n, _ in expected]
    for entry, (_, want) in zip(profile["syscalls"], expected, strict=True):
        assert {k: v for k, v in entry.items() if k != "comment"} == want, entry["comment"]
    arches = re.search(r'case "amd64":\n\t\treturn \[\]specs.Arch\{([^}]*)\}', source)
    assert arches and profile["architectures"] == [SPECS[a.strip()] for a in arches[1].split(",")]
    assert "DefaultAction: specs.ActErrno," in source and profile["defaultAction"] == "SCMP_ACT_ERRNO"
    assert "DefaultErrnoRet" not in source  # so runc's EPERM, which the profile states


def test_the_check_sees_a_changed_literal(profile):
    """The check is not vacuous: a syscall moved out of a capability case, or an argument changed,
    no longer matches the committed profile."""
    source = UPSTREAM_SOURCE.read_text()
    moved = source.replace('case "CAP_SYS_NICE":', 'case "CAP_SYS_NICE", "CAP_IPC_LOCK":', 1)
    changed = source.replace("Value: unix.AF_ALG + 1,", "Value: unix.AF_ALG + 2,", 1)
    for variant in (moved, changed):
        assert variant != source
        assert [e for _, e in upstream_profile_entries(variant)] != [
            {k: v for k, v in e.items() if k != "comment"} for e in profile["syscalls"]
        ]


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
