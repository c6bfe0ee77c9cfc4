"""containerd's RuntimeDefault seccomp profile as a JSON file podman reads.

On EKS a pod with `seccompProfile: RuntimeDefault` runs under the profile containerd's CRI plugin
builds in Go at container creation (contrib/seccomp/seccomp_default.go, `DefaultProfile`), not
under podman's /usr/share/containers/seccomp.json; the two differ (containerd allows
get_mempolicy, mbind and set_mempolicy only with CAP_SYS_NICE in the bounding set, podman always).
`nvrx-eks rehearse` runs the rendered pods in podman with the profile this script writes:

    python scripts/containerd_seccomp.py path/to/containerd/contrib/seccomp/seccomp_default.go \\
        -o nvrx_eks/rehearse/seccomp/containerd-runtime-default.json

The Go file is read by a small purpose-made parser for the subset of Go it is written in
(composite literals, `append`, `switch`, `if`, `for ... range`) and interpreted for linux/amd64:

* `switch runtime.GOARCH` is decided at generation time (containerd decides it when it is built);
  the entries of the amd64 case carry `"includes": {"arches": ["amd64"]}`, podman's test of the
  same fact (its native architecture).
* `for _, c := range sp.Process.Capabilities.Bounding { switch c { case "CAP_X": ... } }`: each
  case becomes entries with `"includes": {"caps": ["CAP_X"]}` (podman tests those against the
  container's bounding set, as containerd does).
* a boolean set to true in such a case (`admin = true` under CAP_SYS_ADMIN) and then tested
  negated (`if !admin`) becomes `"excludes": {"caps": ["CAP_SYS_ADMIN"]}`.
* the kernel-version test (`kernelversion.GreaterEqualThan`) has no equivalent in podman's schema
  (containers/common's Filter has caps and arches only); it is decided against the oldest kernel
  of the target nodes (`--min-kernel`, 6.1: EKS AL2023 AMIs ship kernels 6.1, 6.12 and 6.18) and the
  entries are unconditional when every target kernel passes it; otherwise the script fails.
* containerd leaves `DefaultErrnoRet` unset; runc, the runtime EKS nodes run, then answers EPERM.
  The profile states `"defaultErrnoRet": 1` so that podman's runtime cannot answer otherwise.

Anything outside that subset (an unknown statement, struct field, constant, function, a `default`
case in the capability switch, ...) stops the script with an error naming the line: it writes a
profile faithful to the source or none. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: containerd is built per architecture; this profile is the amd64 build's.
GOARCH = "amd64"
#: libseccomp's name of the amd64 native architecture, what podman compares `includes.arches` with.
PODMAN_ARCH = "amd64"
#: The oldest kernel of the EKS AL2023 AMIs (kernel 6.1; 6.12 and 6.18 are the newer ones).
DEFAULT_MIN_KERNEL = (6, 1)
#: runc's answer to SCMP_ACT_ERRNO when the profile names no errno (libcontainer/seccomp: EPERM).
RUNC_DEFAULT_ERRNO = 1


class ShapeError(Exception):
    """The Go source is not in the shape this generator understands."""


# --------------------------------------------------------------------------------------------
# Constants the source refers to, for linux/amd64.
# --------------------------------------------------------------------------------------------

#: github.com/opencontainers/runtime-spec/specs-go/config.go
SPECS_CONSTANTS: dict[str, str] = {
    "ActKill": "SCMP_ACT_KILL",
    "ActKillProcess": "SCMP_ACT_KILL_PROCESS",
    "ActKillThread": "SCMP_ACT_KILL_THREAD",
    "ActTrap": "SCMP_ACT_TRAP",
    "ActErrno": "SCMP_ACT_ERRNO",
    "ActTrace": "SCMP_ACT_TRACE",
    "ActAllow": "SCMP_ACT_ALLOW",
    "ActLog": "SCMP_ACT_LOG",
    "ActNotify": "SCMP_ACT_NOTIFY",
    "OpNotEqual": "SCMP_CMP_NE",
    "OpLessThan": "SCMP_CMP_LT",
    "OpLessEqual": "SCMP_CMP_LE",
    "OpEqualTo": "SCMP_CMP_EQ",
    "OpGreaterEqual": "SCMP_CMP_GE",
    "OpGreaterThan": "SCMP_CMP_GT",
    "OpMaskedEqual": "SCMP_CMP_MASKED_EQ",
    "ArchX86": "SCMP_ARCH_X86",
    "ArchX86_64": "SCMP_ARCH_X86_64",
    "ArchX32": "SCMP_ARCH_X32",
    "ArchARM": "SCMP_ARCH_ARM",
    "ArchAARCH64": "SCMP_ARCH_AARCH64",
    "ArchMIPS": "SCMP_ARCH_MIPS",
    "ArchMIPS64": "SCMP_ARCH_MIPS64",
    "ArchMIPS64N32": "SCMP_ARCH_MIPS64N32",
    "ArchMIPSEL": "SCMP_ARCH_MIPSEL",
    "ArchMIPSEL64": "SCMP_ARCH_MIPSEL64",
    "ArchMIPSEL64N32": "SCMP_ARCH_MIPSEL64N32",
    "ArchPPC": "SCMP_ARCH_PPC",
    "ArchPPC64": "SCMP_ARCH_PPC64",
    "ArchPPC64LE": "SCMP_ARCH_PPC64LE",
    "ArchS390": "SCMP_ARCH_S390",
    "ArchS390X": "SCMP_ARCH_S390X",
    "ArchPARISC": "SCMP_ARCH_PARISC",
    "ArchPARISC64": "SCMP_ARCH_PARISC64",
    "ArchRISCV64": "SCMP_ARCH_RISCV64",
    "ArchLOONGARCH64": "SCMP_ARCH_LOONGARCH64",
}

#: golang.org/x/sys/unix, zerrors_linux.go / zerrors_linux_amd64.go. Only what the source uses;
#: a constant missing here stops the script (add it from x/sys/unix for linux/amd64).
UNIX_CONSTANTS: dict[str, int] = {
    "AF_ALG": 0x26,
    "AF_VSOCK": 0x28,
    "ENOSYS": 0x26,
    "EPERM": 0x1,
    "CLONE_NEWNS": 0x20000,
    "CLONE_NEWCGROUP": 0x2000000,
    "CLONE_NEWUTS": 0x4000000,
    "CLONE_NEWIPC": 0x8000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

#: The fields each struct type may set, and the JSON key podman reads for each.
STRUCT_FIELDS: dict[str, dict[str, str]] = {
    "specs.LinuxSeccomp": {
        "DefaultAction": "defaultAction",
        "DefaultErrnoRet": "defaultErrnoRet",
        "Architectures": "architectures",
        "Syscalls": "syscalls",
    },
    "specs.LinuxSyscall": {"Names": "names", "Action": "action", "ErrnoRet": "errnoRet", "Args": "args"},
    "specs.LinuxSeccompArg": {"Index": "index", "Value": "value", "ValueTwo": "valueTwo", "Op": "op"},
    "kernelversion.KernelVersion": {"Kernel": "kernel", "Major": "major"},
}

KNOWN_PACKAGES = {"specs", "unix", "runtime", "kernelversion"}


# --------------------------------------------------------------------------------------------
# Tokens
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    kind: str  # "ident", "int", "string", "op", ";" (also inserted at line ends), "eof"
    value: str
    line: int


_TOKEN_RE = re.compile(
    r"""
    (?P<newline>\n)
  | (?P<space>[ \t\r]+)
  | (?P<line_comment>//[^\n]*)
  | (?P<block_comment>/\*.*?\*/)
  | (?P<raw_string>`[^`]*`)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<int>0[xX][0-9a-fA-F_]+|0[oO]?[0-7_]*|[1-9][0-9_]*)(?![0-9A-Za-z_.])
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>:=|==|!=|<=|>=|&&|\|\||\.\.\.|[-+*/%&|^<>=!(){}\[\],.;:])
    """,
    re.VERBOSE | re.DOTALL,
)

#: Go inserts a semicolon after a line ending in a name, a literal, one of these or a few keywords.
_SEMI_AFTER_OPS = {")", "]", "}"}
_KEYWORDS = {
    "break",
    "case",
    "chan",
    "const",
    "continue",
    "default",
    "defer",
    "else",
    "fallthrough",
    "for",
    "func",
    "go",
    "goto",
    "if",
    "import",
    "interface",
    "map",
    "package",
    "range",
    "return",
    "select",
    "struct",
    "switch",
    "type",
    "var",
}

_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "r": "\r", "0": "\0"}


def _unquote(literal: str, line: int) -> str:
    if literal.startswith("`"):
        return literal[1:-1]
    out, i, body = [], 0, literal[1:-1]
    while i < len(body):
        if body[i] == "\\":
            if i + 1 >= len(body) or body[i + 1] not in _ESCAPES:
                raise ShapeError(f"line {line}: string escape not understood in {literal}")
            out.append(_ESCAPES[body[i + 1]])
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


def tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    line, pos = 1, 0

    def end_line() -> None:
        if not tokens:
            return
        last = tokens[-1]
        if (
            last.kind in ("int", "string")
            or last.kind == "ident"
            and (last.value not in _KEYWORDS or last.value in ("break", "continue", "fallthrough", "return"))
            or last.kind == "op"
            and last.value in _SEMI_AFTER_OPS
        ):
            tokens.append(Token(";", "\n", line))

    while pos < len(source):
        m = _TOKEN_RE.match(source, pos)
        if not m:
            raise ShapeError(f"line {line}: cannot read {source[pos : pos + 20]!r}")
        kind, text = m.lastgroup, m.group()
        assert kind is not None
        if kind == "newline" or (kind == "block_comment" and "\n" in text):
            end_line()
        elif kind == "int":
            digits = text.replace("_", "")
            if re.fullmatch(r"0[0-7]+", digits):  # Go's legacy octal
                digits = "0o" + digits[1:]
            tokens.append(Token("int", str(int(digits, 0)), line))
        elif kind in ("string", "raw_string"):
            tokens.append(Token("string", _unquote(text, line), line))
        elif kind == "ident":
            tokens.append(Token("ident", text, line))
        elif kind == "op":
            tokens.append(Token(";" if text == ";" else "op", text, line))
        line += text.count("\n")
        pos = m.end()
    end_line()
    tokens.append(Token("eof", "", line))
    return tokens


# --------------------------------------------------------------------------------------------
# Syntax tree and parser for the subset of Go the file is written in
# --------------------------------------------------------------------------------------------


@dataclass
class Node:
    line: int


@dataclass
class Ident(Node):
    name: str


@dataclass
class IntLit(Node):
    value: int


@dataclass
class StrLit(Node):
    value: str


@dataclass
class Selector(Node):
    x: Node
    name: str


@dataclass
class Call(Node):
    fn: Node
    args: list[Node]


@dataclass
class SliceType(Node):
    elem: Node


@dataclass
class Composite(Node):
    type: Node | None  # None: the element type of the enclosing slice literal
    elements: list[tuple[str | None, Node]]


@dataclass
class Unary(Node):
    op: str
    x: Node


@dataclass
class Binary(Node):
    op: str
    x: Node
    y: Node


@dataclass
class Assign(Node):
    targets: list[Node]
    op: str  # ":=" or "="
    value: Node


@dataclass
class If(Node):
    init: Assign | None
    cond: Node
    body: list[Node]


@dataclass
class Switch(Node):
    tag: Node
    clauses: list[tuple[list[Node] | None, list[Node]]]  # (None for default, body)


@dataclass
class RangeFor(Node):
    key: str
    value: str
    x: Node
    body: list[Node]


@dataclass
class Return(Node):
    value: Node


@dataclass
class Func:
    name: str
    params: list[tuple[str, str]]  # (name, type as written)
    body: list[Node]
    line: int


_BINARY_PRECEDENCE = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3, "+": 4, "-": 4, "|": 4}


class Parser:
    def __init__(self, tokens: list[Token]):
        self.tokens = tokens
        self.i = 0
        self.expr_lev = 0  # < 0: in a control clause, where `{` opens the block, not a literal

    # -- helpers
    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def error(self, what: str) -> ShapeError:
        t = self.tok
        return ShapeError(f"line {t.line}: {what} (at {t.value!r})")

    def is_op(self, value: str) -> bool:
        return self.tok.kind == "op" and self.tok.value == value

    def is_kw(self, value: str) -> bool:
        return self.tok.kind == "ident" and self.tok.value == value

    def next(self) -> Token:
        t = self.tok
        self.i += 1
        return t

    def expect_op(self, value: str) -> Token:
        if not self.is_op(value):
            raise self.error(f"expected {value!r}")
        return self.next()

    def expect_kw(self, value: str) -> Token:
        if not self.is_kw(value):
            raise self.error(f"expected {value!r}")
        return self.next()

    def expect_ident(self) -> Token:
        if self.tok.kind != "ident" or self.tok.value in _KEYWORDS:
            raise self.error("expected a name")
        return self.next()

    def skip_semis(self) -> None:
        while self.tok.kind == ";":
            self.next()

    def end_statement(self) -> None:
        if self.tok.kind == ";":
            self.next()
        elif not self.is_op("}"):
            raise self.error("expected the end of the statement")

    # -- file
    def parse_file(self) -> dict[str, Func]:
        self.skip_semis()
        self.expect_kw("package")
        if self.expect_ident().value != "seccomp":
            raise ShapeError("the file is not of package seccomp")
        self.end_statement()
        self.skip_semis()
        while self.is_kw("import"):
            self.next()
            if self.is_op("("):
                self.next()
                self.skip_semis()
                while not self.is_op(")"):
                    self.parse_import_spec()
                    self.skip_semis()
                self.next()
            else:
                self.parse_import_spec()
            self.end_statement()
            self.skip_semis()
        funcs: dict[str, Func] = {}
        while self.tok.kind != "eof":
            if not self.is_kw("func"):
                raise self.error("only func declarations are expected after the imports")
            fn = self.parse_func()
            if fn.name in funcs:
                raise ShapeError(f"line {fn.line}: func {fn.name} declared twice")
            funcs[fn.name] = fn
            self.skip_semis()
        return funcs

    def parse_import_spec(self) -> None:
        if self.tok.kind == "ident":
            self.next()
        if self.tok.kind != "string":
            raise self.error("expected an import path")
        self.next()

    def parse_func(self) -> Func:
        line = self.expect_kw("func").line
        name = self.expect_ident().value
        self.expect_op("(")
        params: list[tuple[str, str]] = []
        while not self.is_op(")"):
            pname = self.expect_ident().value
            ptype = []
            while not (self.is_op(",") or self.is_op(")")):
                if self.tok.kind == "eof":
                    raise self.error("unterminated parameter list")
                ptype.append(self.next().value)
            params.append((pname, "".join(ptype)))
            if self.is_op(","):
                self.next()
        self.next()
        while not self.is_op("{"):  # the result type; none of this file's has a brace
            if self.tok.kind in (";", "eof"):
                raise self.error(f"func {name} has no body")
            self.next()
        body = self.parse_block()
        return Func(name, params, body, line)

    # -- statements
    def parse_block(self) -> list[Node]:
        self.expect_op("{")
        saved, self.expr_lev = self.expr_lev, 0
        body = self.parse_statements(lambda: self.is_op("}"))
        self.expr_lev = saved
        self.expect_op("}")
        return body

    def parse_statements(self, at_end: Callable[[], bool]) -> list[Node]:
        statements: list[Node] = []
        self.skip_semis()
        while not at_end():
            statements.append(self.parse_statement())
            self.end_statement()
            self.skip_semis()
        return statements

    def parse_statement(self) -> Node:
        line = self.tok.line
        if self.is_kw("switch"):
            return self.parse_switch()
        if self.is_kw("if"):
            self.next()
            saved, self.expr_lev = self.expr_lev, -1
            init: Assign | None = None
            first = self.parse_simple_statement()
            if self.tok.kind == ";":
                self.next()
                if not isinstance(first, Assign):
                    raise ShapeError(f"line {line}: an if statement's init must be an assignment")
                init, cond = first, self.parse_expr()
            elif isinstance(first, Assign):
                raise ShapeError(f"line {line}: an if statement's condition cannot be an assignment")
            else:
                cond = first
            self.expr_lev = saved
            body = self.parse_block()
            if self.is_kw("else"):
                raise self.error("else branches are not expected")
            return If(line, init, cond, body)
        if self.is_kw("for"):
            self.next()
            key = self.expect_ident().value
            self.expect_op(",")
            value = self.expect_ident().value
            self.expect_op(":=")
            self.expect_kw("range")
            saved, self.expr_lev = self.expr_lev, -1
            x = self.parse_expr()
            self.expr_lev = saved
            return RangeFor(line, key, value, x, self.parse_block())
        if self.is_kw("return"):
            self.next()
            return Return(line, self.parse_expr())
        if self.tok.kind == "ident" and self.tok.value in _KEYWORDS:
            raise self.error("statement not expected")
        statement = self.parse_simple_statement()
        if not isinstance(statement, Assign):
            raise ShapeError(f"line {line}: only assignments are expected as plain statements")
        return statement

    def parse_simple_statement(self) -> Node:
        line = self.tok.line
        targets = [self.parse_expr()]
        while self.is_op(","):
            self.next()
            targets.append(self.parse_expr())
        if self.is_op(":=") or self.is_op("="):
            op = self.next().value
            return Assign(line, targets, op, self.parse_expr())
        if len(targets) != 1:
            raise self.error("expected := or =")
        return targets[0]

    def parse_switch(self) -> Switch:
        line = self.expect_kw("switch").line
        saved, self.expr_lev = self.expr_lev, -1
        tag = self.parse_expr()
        self.expr_lev = saved
        self.expect_op("{")
        self.skip_semis()
        clauses: list[tuple[list[Node] | None, list[Node]]] = []
        while not self.is_op("}"):
            values: list[Node] | None
            if self.is_kw("case"):
                self.next()
                values = [self.parse_expr()]
                while self.is_op(","):
                    self.next()
                    values.append(self.parse_expr())
            elif self.is_kw("default"):
                self.next()
                values = None
            else:
                raise self.error("expected case or default")
            self.expect_op(":")
            body = self.parse_statements(lambda: self.is_kw("case") or self.is_kw("default") or self.is_op("}"))
            clauses.append((values, body))
        self.next()
        return Switch(line, tag, clauses)

    # -- expressions
    def parse_expr(self, min_prec: int = 1) -> Node:
        x = self.parse_unary()
        while self.tok.kind == "op" and _BINARY_PRECEDENCE.get(self.tok.value, 0) >= min_prec:
            op = self.next()
            y = self.parse_expr(_BINARY_PRECEDENCE[op.value] + 1)
            x = Binary(op.line, op.value, x, y)
        return x

    def parse_unary(self) -> Node:
        if self.tok.kind == "op" and self.tok.value in ("!", "&", "-"):
            op = self.next()
            return Unary(op.line, op.value, self.parse_unary())
        return self.parse_primary()

    def parse_operand(self) -> Node:
        t = self.tok
        if t.kind == "int":
            self.next()
            return IntLit(t.line, int(t.value))
        if t.kind == "string":
            self.next()
            return StrLit(t.line, t.value)
        if t.kind == "ident" and t.value not in _KEYWORDS:
            self.next()
            return Ident(t.line, t.value)
        if self.is_op("["):
            self.next()
            self.expect_op("]")
            return SliceType(t.line, self.parse_type())
        if self.is_op("("):
            self.next()
            self.expr_lev += 1
            x = self.parse_expr()
            self.expr_lev -= 1
            self.expect_op(")")
            return x
        raise self.error("expression not understood")

    def parse_type(self) -> Node:
        t = self.expect_ident()
        x: Node = Ident(t.line, t.value)
        if self.is_op("."):
            self.next()
            x = Selector(t.line, x, self.expect_ident().value)
        return x

    def parse_primary(self) -> Node:
        x = self.parse_operand()
        while True:
            if self.is_op("."):
                self.next()
                x = Selector(x.line, x, self.expect_ident().value)
            elif self.is_op("("):
                self.next()
                self.expr_lev += 1
                args: list[Node] = []
                self.skip_semis()
                while not self.is_op(")"):
                    args.append(self.parse_expr())
                    if self.is_op("..."):
                        raise self.error("variadic calls are not expected")
                    if not self.is_op(","):
                        break
                    self.next()
                    self.skip_semis()
                self.expr_lev -= 1
                self.expect_op(")")
                x = Call(x.line, x, args)
            elif self.is_op("{") and isinstance(x, Ident | Selector | SliceType) and self.expr_lev >= 0:
                x = Composite(x.line, x, self.parse_elements())
            else:
                return x

    def parse_elements(self) -> list[tuple[str | None, Node]]:
        self.expect_op("{")
        self.expr_lev += 1
        elements: list[tuple[str | None, Node]] = []
        self.skip_semis()
        while not self.is_op("}"):
            key: str | None = None
            if self.tok.kind == "ident" and self.tokens[self.i + 1].value == ":":
                key = self.next().value
                self.next()
            if self.is_op("{"):
                value: Node = Composite(self.tok.line, None, self.parse_elements())
            else:
                value = self.parse_expr()
            elements.append((key, value))
            if self.is_op(","):
                self.next()
                self.skip_semis()
            elif not self.is_op("}"):
                raise self.error("expected , or } in a composite literal")
        self.expr_lev -= 1
        self.next()
        return elements


# --------------------------------------------------------------------------------------------
# Interpretation for linux/amd64, with the capability and kernel conditions kept symbolic
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    """When an entry applies: podman's includes/excludes, plus what was decided here."""

    caps: tuple[str, ...] = ()  # all in the bounding set
    not_caps: tuple[str, ...] = ()  # none in the bounding set
    arches: tuple[str, ...] = ()  # podman's native architecture is one of these
    notes: tuple[str, ...] = ()  # conditions decided at generation time, for the entry's comment

    def also(self, **kw: tuple[str, ...]) -> Condition:
        merged = {}
        for name in ("caps", "not_caps", "arches", "notes"):
            old = getattr(self, name)
            merged[name] = old + tuple(v for v in kw.get(name, ()) if v not in old)
        return Condition(**merged)


@dataclass
class Struct:
    type: str
    fields: dict[str, Any]
    line: int
    condition: Condition = field(default_factory=Condition)


@dataclass(frozen=True)
class KernelAtLeast:
    version: tuple[int, int]


@dataclass(frozen=True)
class AnyCap:
    """A boolean that is true when any of `caps` is in the bounding set (false when empty)."""

    caps: tuple[str, ...]
    negated: bool = False


@dataclass(frozen=True)
class SpecPath:
    path: str


@dataclass(frozen=True)
class BoundingCap:
    """The variable of the range over the bounding capabilities."""

    name: str


class _Return(Exception):
    def __init__(self, value: Any):
        self.value = value


class Scope:
    def __init__(self, parent: Scope | None = None):
        self.vars: dict[str, Any] = {}
        self.parent = parent

    def find(self, name: str) -> Scope | None:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.vars:
                return scope
            scope = scope.parent
        return None


class Interpreter:
    def __init__(self, funcs: dict[str, Func], min_kernel: tuple[int, int]):
        self.funcs = funcs
        self.min_kernel = min_kernel
        self.spec_name = ""

    def run_default_profile(self) -> Struct:
        fn = self.funcs.get("DefaultProfile")
        if fn is None:
            raise ShapeError("func DefaultProfile not found")
        if len(fn.params) != 1 or fn.params[0][1] != "*specs.Spec":
            raise ShapeError(f"line {fn.line}: DefaultProfile is expected to take one *specs.Spec")
        scope = Scope()
        self.spec_name = fn.params[0][0]
        scope.vars[self.spec_name] = SpecPath(self.spec_name)
        result = self.call(fn, scope)
        if not isinstance(result, Struct) or result.type != "specs.LinuxSeccomp":
            raise ShapeError(f"line {fn.line}: DefaultProfile does not return a specs.LinuxSeccomp")
        return result

    def call(self, fn: Func, scope: Scope) -> Any:
        try:
            self.run_block(fn.body, Scope(scope), Condition())
        except _Return as r:
            return r.value
        raise ShapeError(f"line {fn.line}: func {fn.name} ends without return")

    # -- statements
    def run_block(self, body: list[Node], scope: Scope, cond: Condition) -> None:
        for statement in body:
            self.run(statement, scope, cond)

    def run(self, s: Node, scope: Scope, cond: Condition) -> None:
        if isinstance(s, Assign):
            self.assign(s, scope, cond)
        elif isinstance(s, Return):
            if cond.caps or cond.not_caps:
                raise ShapeError(f"line {s.line}: a return that depends on the capabilities is not understood")
            raise _Return(self.eval(s.value, scope, cond))
        elif isinstance(s, If):
            inner = Scope(scope)
            if s.init is not None:
                self.assign(s.init, inner, cond)
            test = self.eval(s.cond, inner, cond)
            if test is True:
                self.run_block(s.body, Scope(inner), cond)
            elif test is False:
                pass
            elif isinstance(test, KernelAtLeast):
                if test.version > self.min_kernel:
                    raise ShapeError(
                        f"line {s.line}: entries for kernels >= {test.version[0]}.{test.version[1]} cannot be "
                        f"written for podman (no minKernel in its schema) and not every target kernel "
                        f"(>= {self.min_kernel[0]}.{self.min_kernel[1]}) has them"
                    )
                note = f"kernel >= {test.version[0]}.{test.version[1]}, true on every target kernel"
                self.run_block(s.body, Scope(inner), cond.also(notes=(note,)))
            elif isinstance(test, AnyCap) and test.negated and test.caps:
                self.run_block(s.body, Scope(inner), cond.also(not_caps=test.caps))
            else:
                raise ShapeError(f"line {s.line}: if condition not understood")
        elif isinstance(s, Switch):
            self.run_switch(s, scope, cond)
        elif isinstance(s, RangeFor):
            self.run_range(s, scope, cond)
        else:
            raise ShapeError(f"line {s.line}: statement not understood")

    def run_switch(self, s: Switch, scope: Scope, cond: Condition) -> None:
        if not (isinstance(s.tag, Selector) and isinstance(s.tag.x, Ident) and s.tag.x.name == "runtime"):
            raise ShapeError(f"line {s.line}: only switches over runtime.GOARCH (or the bounding capability)")
        if s.tag.name != "GOARCH":
            raise ShapeError(f"line {s.line}: switch over runtime.{s.tag.name} not understood")
        chosen: list[Node] | None = None
        default: list[Node] | None = None
        for values, body in s.clauses:
            if values is None:
                default = body
                continue
            for v in values:
                if not isinstance(v, StrLit):
                    raise ShapeError(f"line {v.line}: a GOARCH case is expected to be a string")
                if v.value == GOARCH and chosen is None:
                    chosen = body
        taken = chosen if chosen is not None else default
        if taken is not None:
            self.run_block(taken, Scope(scope), cond.also(arches=(PODMAN_ARCH,)))

    def run_range(self, s: RangeFor, scope: Scope, cond: Condition) -> None:
        x = self.eval(s.x, scope, cond)
        if x != SpecPath(f"{self.spec_name}.Process.Capabilities.Bounding"):
            raise ShapeError(f"line {s.line}: only a range over the spec's bounding capabilities is expected")
        if s.key != "_":
            raise ShapeError(f"line {s.line}: the range index is expected to be _")
        if not (
            len(s.body) == 1
            and isinstance(s.body[0], Switch)
            and isinstance(s.body[0].tag, Ident)
            and s.body[0].tag.name == s.value
        ):
            raise ShapeError(f"line {s.line}: the range body is expected to be one switch over {s.value}")
        seen: set[str] = set()
        for values, body in s.body[0].clauses:
            if values is None:
                raise ShapeError(f"line {s.line}: a default case over capabilities cannot be written for podman")
            for v in values:
                if not isinstance(v, StrLit) or not re.fullmatch(r"CAP_[A-Z_]+", v.value):
                    raise ShapeError(f'line {v.line}: a capability case is expected to be a "CAP_..." string')
                if v.value in seen:
                    raise ShapeError(f"line {v.line}: capability {v.value} has two cases")
                seen.add(v.value)
                inner = Scope(scope)
                inner.vars[s.value] = BoundingCap(v.value)
                self.run_block(body, inner, cond.also(caps=(v.value,)))

    def assign(self, s: Assign, scope: Scope, cond: Condition) -> None:
        value = self.eval(s.value, scope, cond)
        if len(s.targets) > 1:
            if not isinstance(value, tuple) or len(value) != len(s.targets):
                raise ShapeError(f"line {s.line}: {len(s.targets)} values expected")
            values = list(value)
        else:
            values = [value]
        for target, v in zip(s.targets, values, strict=True):
            self.assign_one(target, s.op, v, scope, cond, s.line)

    def assign_one(self, target: Node, op: str, value: Any, scope: Scope, cond: Condition, line: int) -> None:
        if isinstance(target, Ident):
            if target.name == "_":
                return
            if op == ":=":
                scope.vars[target.name] = value
                return
            owner = scope.find(target.name)
            if owner is None:
                raise ShapeError(f"line {line}: assignment to undeclared {target.name}")
            old = owner.vars[target.name]
            if cond == Condition():
                owner.vars[target.name] = value
            elif value is True and len(cond.caps) == 1 and not (cond.not_caps or cond.arches or cond.notes):
                # `admin = true` in the case of one capability: admin is "any of these caps".
                if old is False:
                    owner.vars[target.name] = AnyCap(cond.caps)
                elif isinstance(old, AnyCap) and not old.negated:
                    owner.vars[target.name] = AnyCap(old.caps + cond.caps)
                else:
                    raise ShapeError(f"line {line}: {target.name} set to true under a condition not understood")
            else:
                raise ShapeError(f"line {line}: conditional assignment to {target.name} not understood")
            return
        if isinstance(target, Selector) and op == "=":
            obj = self.eval(target.x, scope, cond)
            if not isinstance(obj, Struct) or target.name not in obj.fields:
                raise ShapeError(f"line {line}: assignment to .{target.name} not understood")
            old = obj.fields[target.name]
            appended = isinstance(value, list) and isinstance(old, list) and value[: len(old)] == old
            if cond != Condition() and not (target.name == "Syscalls" and appended):
                # Under a condition only appends are understood: their entries carry the condition.
                raise ShapeError(f"line {line}: conditional assignment to .{target.name} not understood")
            obj.fields[target.name] = value
            return
        raise ShapeError(f"line {line}: assignment target not understood")

    # -- expressions
    def eval(self, x: Node, scope: Scope, cond: Condition, elem_type: str | None = None) -> Any:
        if isinstance(x, IntLit):
            return x.value
        if isinstance(x, StrLit):
            return x.value
        if isinstance(x, Ident):
            if x.name in ("true", "false"):
                return x.name == "true"
            if x.name == "nil":
                return None
            owner = scope.find(x.name)
            if owner is None:
                raise ShapeError(f"line {x.line}: {x.name} is not defined")
            return owner.vars[x.name]
        if isinstance(x, Selector):
            return self.eval_selector(x, scope, cond)
        if isinstance(x, Unary):
            v = self.eval(x.x, scope, cond)
            if x.op == "&":
                if not isinstance(v, Struct | int):
                    raise ShapeError(f"line {x.line}: & of this value not understood")
                return v  # a pointer reads as its value in JSON
            if x.op == "-" and isinstance(v, int) and not isinstance(v, bool):
                return -v
            if x.op == "!":
                if isinstance(v, bool):
                    return not v
                if isinstance(v, AnyCap):
                    return AnyCap(v.caps, not v.negated)
            raise ShapeError(f"line {x.line}: {x.op} of this value not understood")
        if isinstance(x, Binary):
            a, b = self.eval(x.x, scope, cond), self.eval(x.y, scope, cond)
            if x.op in ("==", "!=") and (a is None or b is None):
                return (a is b) == (x.op == "==")
            if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and not isinstance(b, bool):
                if x.op == "|":
                    return a | b
                if x.op == "+":
                    return a + b
                if x.op == "-":
                    return a - b
            raise ShapeError(f"line {x.line}: operator {x.op} on these values not understood")
        if isinstance(x, Call):
            return self.eval_call(x, scope, cond)
        if isinstance(x, Composite):
            return self.eval_composite(x, scope, cond, elem_type)
        raise ShapeError(f"line {x.line}: expression not understood")

    def eval_selector(self, x: Selector, scope: Scope, cond: Condition) -> Any:
        if isinstance(x.x, Ident) and x.x.name in KNOWN_PACKAGES and scope.find(x.x.name) is None:
            pkg, name = x.x.name, x.name
            if pkg == "specs" and name in SPECS_CONSTANTS:
                return SPECS_CONSTANTS[name]
            if pkg == "unix" and name in UNIX_CONSTANTS:
                return UNIX_CONSTANTS[name]
            if pkg == "runtime" and name == "GOARCH":
                return GOARCH
            raise ShapeError(f"line {x.line}: {pkg}.{name} is not known to this generator")
        base = self.eval(x.x, scope, cond)
        if isinstance(base, SpecPath):
            path = f"{base.path}.{x.name}"
            allowed = ("Process", "Process.Capabilities", "Process.Capabilities.Bounding")
            if path.split(".", 1)[1] not in allowed:
                raise ShapeError(f"line {x.line}: {path} is not understood")
            return SpecPath(path)
        if isinstance(base, Struct):
            if x.name not in base.fields:
                raise ShapeError(f"line {x.line}: {base.type}.{x.name} is not set")
            return base.fields[x.name]
        raise ShapeError(f"line {x.line}: selector .{x.name} not understood")

    def eval_call(self, x: Call, scope: Scope, cond: Condition) -> Any:
        fn = x.fn
        if isinstance(fn, Ident) and scope.find(fn.name) is None:
            if fn.name == "uint":
                (v,) = self._args(x, 1, scope, cond)
                if not isinstance(v, int) or v < 0:
                    raise ShapeError(f"line {x.line}: uint() of this value not understood")
                return v
            if fn.name == "append":
                if len(x.args) < 2:
                    raise ShapeError(f"line {x.line}: append with nothing to append")
                base = self.eval(x.args[0], scope, cond)
                if not isinstance(base, list):
                    raise ShapeError(f"line {x.line}: append to a non-slice")
                items = [self.eval(a, scope, cond, elem_type="specs.LinuxSyscall") for a in x.args[1:]]
                return base + items
            if fn.name in self.funcs:
                called = self.funcs[fn.name]
                if called.params or x.args:
                    raise ShapeError(f"line {x.line}: calls of {fn.name} with arguments are not understood")
                return self.call(called, Scope())
            raise ShapeError(f"line {x.line}: call of {fn.name} not understood")
        if (
            isinstance(fn, Selector)
            and isinstance(fn.x, Ident)
            and fn.x.name == "kernelversion"
            and fn.name == "GreaterEqualThan"
        ):
            (v,) = self._args(x, 1, scope, cond)
            if not isinstance(v, Struct) or v.type != "kernelversion.KernelVersion":
                raise ShapeError(f"line {x.line}: GreaterEqualThan of this value not understood")
            version = (v.fields.get("Kernel", 0), v.fields.get("Major", 0))
            return (KernelAtLeast(version), None)
        raise ShapeError(f"line {x.line}: call not understood")

    def _args(self, x: Call, n: int, scope: Scope, cond: Condition) -> list[Any]:
        if len(x.args) != n:
            raise ShapeError(f"line {x.line}: {n} arguments expected")
        return [self.eval(a, scope, cond) for a in x.args]

    def eval_composite(self, x: Composite, scope: Scope, cond: Condition, elem_type: str | None) -> Any:
        if x.type is None:
            if elem_type is None:
                raise ShapeError(f"line {x.line}: literal without a type")
            type_name = elem_type
        elif isinstance(x.type, SliceType):
            inner = _type_name(x.type.elem)
            for key, _ in x.elements:
                if key is not None:
                    raise ShapeError(f"line {x.line}: keyed elements in a slice literal are not expected")
            return [self.eval(v, scope, cond, elem_type=inner) for _, v in x.elements]
        else:
            type_name = _type_name(x.type)
        if type_name not in STRUCT_FIELDS:
            raise ShapeError(f"line {x.line}: literals of {type_name} are not understood")
        fields: dict[str, Any] = {}
        for key, value in x.elements:
            if key is None:
                raise ShapeError(f"line {x.line}: {type_name} literal without field names")
            if key not in STRUCT_FIELDS[type_name]:
                raise ShapeError(f"line {value.line}: field {type_name}.{key} is not known to this generator")
            if key in fields:
                raise ShapeError(f"line {value.line}: field {key} set twice")
            fields[key] = self.eval(value, scope, cond)
        return Struct(type_name, fields, x.line, cond)


def _type_name(t: Node) -> str:
    if isinstance(t, Selector) and isinstance(t.x, Ident):
        return f"{t.x.name}.{t.name}"
    if isinstance(t, Ident):
        return t.name
    raise ShapeError(f"line {t.line}: type not understood")


# --------------------------------------------------------------------------------------------
# The JSON podman reads (containers/common pkg/seccomp types.go)
# --------------------------------------------------------------------------------------------


def _string_list(value: Any, what: str, line: int) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ShapeError(f"line {line}: {what} is expected to be a non-empty list of strings")
    return list(value)


def _errno(value: Any, line: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 4096:
        raise ShapeError(f"line {line}: errno {value!r} not understood")
    return value


def _arg(a: Any, line: int) -> dict[str, Any]:
    if not isinstance(a, Struct) or a.type != "specs.LinuxSeccompArg":
        raise ShapeError(f"line {line}: Args are expected to be specs.LinuxSeccompArg literals")
    for key in ("Index", "Value", "Op"):
        if key not in a.fields:
            raise ShapeError(f"line {a.line}: argument filter without {key}")
    values = {k: a.fields.get(k, 0) for k in ("Index", "Value", "ValueTwo")}
    for k, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**64:
            raise ShapeError(f"line {a.line}: {k} {v!r} not understood")
    if a.fields["Op"] not in {v for k, v in SPECS_CONSTANTS.items() if k.startswith("Op")}:
        raise ShapeError(f"line {a.line}: operator {a.fields['Op']!r} not understood")
    return {"index": values["Index"], "value": values["Value"], "valueTwo": values["ValueTwo"], "op": a.fields["Op"]}


def _comment(entry: Struct, source_label: str) -> str:
    parts = [f"{source_label}:{entry.line}"]
    parts += [f"{cap} in the bounding set" for cap in entry.condition.caps]
    parts += [f"{cap} not in the bounding set" for cap in entry.condition.not_caps]
    parts += [f"GOARCH {GOARCH}" for _ in entry.condition.arches]
    parts += list(entry.condition.notes)
    return "; ".join(parts)


def to_podman_json(profile: Struct, source_label: str) -> dict[str, Any]:
    f = profile.fields
    for key in ("DefaultAction", "Architectures", "Syscalls"):
        if key not in f:
            raise ShapeError(f"line {profile.line}: the profile sets no {key}")
    actions = {v for k, v in SPECS_CONSTANTS.items() if k.startswith("Act")}
    if f["DefaultAction"] not in actions:
        raise ShapeError(f"line {profile.line}: default action {f['DefaultAction']!r} not understood")
    out: dict[str, Any] = {"defaultAction": f["DefaultAction"]}
    if f["DefaultAction"] == "SCMP_ACT_ERRNO":
        out["defaultErrnoRet"] = _errno(f.get("DefaultErrnoRet", RUNC_DEFAULT_ERRNO), profile.line)
    elif "DefaultErrnoRet" in f:
        raise ShapeError(f"line {profile.line}: DefaultErrnoRet with action {f['DefaultAction']}")
    out["architectures"] = _string_list(f["Architectures"], "Architectures", profile.line)
    if not isinstance(f["Syscalls"], list) or not f["Syscalls"]:
        raise ShapeError(f"line {profile.line}: no syscalls")
    syscalls = []
    for entry in f["Syscalls"]:
        if not isinstance(entry, Struct) or entry.type != "specs.LinuxSyscall":
            raise ShapeError(f"line {profile.line}: Syscalls holds something other than specs.LinuxSyscall")
        e = entry.fields
        if "Names" not in e or "Action" not in e:
            raise ShapeError(f"line {entry.line}: a syscall entry without Names or Action")
        if e["Action"] not in actions:
            raise ShapeError(f"line {entry.line}: action {e['Action']!r} not understood")
        args = e.get("Args", [])
        if not isinstance(args, list):
            raise ShapeError(f"line {entry.line}: Args is expected to be a list")
        item: dict[str, Any] = {
            "names": _string_list(e["Names"], "Names", entry.line),
            "action": e["Action"],
            "args": [_arg(a, entry.line) for a in args],
        }
        if "ErrnoRet" in e:
            if e["Action"] != "SCMP_ACT_ERRNO":
                raise ShapeError(f"line {entry.line}: ErrnoRet with action {e['Action']}")
            item["errnoRet"] = _errno(e["ErrnoRet"], entry.line)
        item["comment"] = _comment(entry, source_label)
        c = entry.condition
        item["includes"] = {k: list(v) for k, v in (("caps", c.caps), ("arches", c.arches)) if v}
        item["excludes"] = {"caps": list(c.not_caps)} if c.not_caps else {}
        syscalls.append(item)
    out["syscalls"] = syscalls
    return out


def generate(
    source: str, source_label: str = "containerd seccomp_default.go", min_kernel: tuple[int, int] = DEFAULT_MIN_KERNEL
) -> dict[str, Any]:
    """The podman profile for `source`, the text of containerd's seccomp_default.go. Each entry's
    comment names `source_label` and the line of the Go literal it comes from."""
    if not re.search(r"^//go:build linux\s*$", source, re.MULTILINE):
        raise ShapeError("the file is not the linux build of the profile (no //go:build linux line)")
    funcs = Parser(tokenize(source)).parse_file()
    profile = Interpreter(funcs, min_kernel).run_default_profile()
    return to_podman_json(profile, source_label)


def _iter_names(profile: dict[str, Any]) -> Iterator[str]:
    for entry in profile["syscalls"]:
        yield from entry["names"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="containerd's contrib/seccomp/seccomp_default.go")
    parser.add_argument("-o", "--output", type=Path, help="where to write the profile (default: stdout)")
    parser.add_argument(
        "--label",
        help="how each entry's comment names the source, e.g. 'containerd v2.2.4 contrib/seccomp/seccomp_default.go' "
        "(default: 'containerd' and the file's name)",
    )
    parser.add_argument(
        "--min-kernel",
        default="{}.{}".format(*DEFAULT_MIN_KERNEL),
        help="the oldest kernel of the target nodes; kernel-version tests are decided against it (default %(default)s)",
    )
    args = parser.parse_args(argv)
    m = re.fullmatch(r"(\d+)\.(\d+)", args.min_kernel)
    if not m:
        parser.error("--min-kernel is MAJOR.MINOR")
    try:
        profile = generate(
            args.source.read_text(encoding="utf-8"),
            args.label or f"containerd {args.source.name}",
            (int(m.group(1)), int(m.group(2))),
        )
    except ShapeError as e:
        print(f"{args.source}: {e}; no profile written", file=sys.stderr)
        return 1
    text = json.dumps(profile, indent=2) + "\n"
    if args.output:
        args.output.write_text(text, encoding="utf-8")
        n = len(profile["syscalls"])
        print(f"wrote {args.output}: {n} entries, {len(set(_iter_names(profile)))} syscall names", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
