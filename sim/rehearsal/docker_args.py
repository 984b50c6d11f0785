"""The docker client's command-line grammar for the subset the launcher uses.

One parser for every docker stand-in in this repo: the rehearsal's process runtime
(`docker_cli`) and the launcher unit tests' fake (tests/fakes/fake_tools.py), so a flag
the real client rejects fails in both. It is strict on purpose and checked flag by flag
against the real docker client in tests/test_proc_docker.py: an unknown flag fails with
docker's own `unknown flag` wording, and a real docker flag outside the subset of
docs/INTERFACES.md fails too, saying so.

Two layers: `*_args` functions check what the real client checks before it talks to a
daemon (flag syntax, argument counts, `--shm-size`/`--ulimit` values); `require_contract`
adds what docs/INTERFACES.md promises on top (`run -d`, `--network host`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# Real `docker run` flags the rehearsal does not implement: named in the error so the
# reader knows the launcher left the contract (not that it typed a non-flag).
_REAL_RUN_FLAGS = {
    "-i",
    "--interactive",
    "-t",
    "--tty",
    "--privileged",
    "--cap-add",
    "--cap-drop",
    "-w",
    "--workdir",
    "--restart",
    "-p",
    "--publish",
    "--env-file",
    "--mount",
    "--init",
    "--pid",
    "--runtime",
    "--security-opt",
    "--hostname",
    "-h",
    "--add-host",
    "--memory",
    "-m",
    "--cpus",
    "--pull",
    "--platform",
    "--label-file",
    "--log-driver",
    "--log-opt",
    "--stop-signal",
    "--stop-timeout",
}


class CliError(ValueError):
    """A command line docker (or the contract) rejects; `code` is the exit status (125)."""

    def __init__(self, message: str, code: int = 125) -> None:
        super().__init__(message)
        self.code = code


class UsageError(CliError):
    """Flag errors exit 125 with docker's hint line, like the real CLI."""

    def __init__(self, message: str, command: str) -> None:
        super().__init__(f"{message}\nSee 'docker {command} --help'.")


@dataclass
class FlagSpec:
    """Flags of one subcommand: canonical name -> (aliases, takes_value, repeatable)."""

    bools: dict[str, tuple[str, ...]] = field(default_factory=dict)
    values: dict[str, tuple[str, ...]] = field(default_factory=dict)
    repeat: set[str] = field(default_factory=set)


def parse_flags(
    args: list[str], spec: FlagSpec, command: str, interspersed: bool = True
) -> tuple[dict[str, Any], list[str]]:
    """pflag-style parsing: `--k v`, `--k=v`, `-k v`, `-kv`; stops at the first
    positional when `interspersed` is False (docker run: the rest is the command)."""
    lookup: dict[str, tuple[str, bool]] = {}
    for name, aliases in spec.bools.items():
        for alias in aliases:
            lookup[alias] = (name, False)
    for name, aliases in spec.values.items():
        for alias in aliases:
            lookup[alias] = (name, True)
    opts: dict[str, Any] = {n: False for n in spec.bools}
    opts.update({n: ([] if n in spec.repeat else None) for n in spec.values})
    positional: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            positional.extend(args[i + 1 :])
            break
        if not arg.startswith("-") or arg == "-":
            positional.append(arg)
            if not interspersed:
                positional.extend(args[i + 1 :])
                break
            i += 1
            continue
        if arg.startswith("--"):
            key, eq, inline = arg.partition("=")
        else:
            key, inline = arg[:2], arg[2:]
            eq = "=" if inline else ""
            inline = inline.removeprefix("=")
        if key not in lookup:
            note = ""
            if command == "run" and key in _REAL_RUN_FLAGS:
                note = (
                    "\n(rehearsal runtime: a real docker flag outside the subset in "
                    "docs/INTERFACES.md; extend the contract and the runtime together)"
                )
            if key.startswith("--"):
                message = f"unknown flag: {key}"
            else:
                message = f"unknown shorthand flag: '{key[1:]}' in {arg}"
            raise UsageError(message + note, command)
        name, takes_value = lookup[key]
        if takes_value:
            if eq:
                value = inline
            elif i + 1 < len(args):
                i += 1
                value = args[i]
            else:
                raise UsageError(f"flag needs an argument: {key}", command)
            if name in spec.repeat:
                opts[name].append(value)
            else:
                opts[name] = value
        else:
            if eq and inline not in ("true", "false"):
                raise UsageError(f'invalid argument "{inline}" for "{key}" flag', command)
            opts[name] = inline != "false"
        i += 1
    return opts, positional


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([bkmgt]?)b?$", re.IGNORECASE)
_ULIMITS = {
    "core",
    "cpu",
    "data",
    "fsize",
    "locks",
    "memlock",
    "msgqueue",
    "nice",
    "nofile",
    "nproc",
    "rss",
    "rtprio",
    "rttime",
    "sigpending",
    "stack",
}


def parse_size(text: str) -> int:
    """Docker's RAMInBytes: `16g`, `512m`, `1024`."""
    m = _SIZE.match(text.strip())
    if not m:
        raise UsageError(
            f'invalid argument "{text}" for "--shm-size" flag: invalid size: \'{text}\'', "run"
        )
    mult = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    return int(float(m.group(1)) * mult[m.group(2).lower()])


def parse_ulimit(text: str) -> dict[str, Any]:
    """`name=soft[:hard]` as docker's HostConfig.Ulimits entry."""
    name, eq, limits = text.partition("=")
    if not eq or name not in _ULIMITS:
        raise UsageError(
            f'invalid argument "{text}" for "--ulimit" flag: invalid ulimit type: {name}', "run"
        )
    soft, _, hard = limits.partition(":")
    try:
        soft_i = int(soft)
        hard_i = int(hard) if hard else soft_i
    except ValueError:
        raise UsageError(
            f'invalid argument "{text}" for "--ulimit" flag: invalid ulimit argument: {limits}',
            "run",
        ) from None
    return {"Name": name, "Soft": soft_i, "Hard": hard_i}


RUN_SPEC = FlagSpec(
    bools={"detach": ("-d", "--detach"), "rm": ("--rm",)},
    values={
        "name": ("--name",),
        "label": ("--label", "-l"),
        "network": ("--network", "--net"),
        "gpus": ("--gpus",),
        "ipc": ("--ipc",),
        "shm_size": ("--shm-size",),
        "ulimit": ("--ulimit",),
        "volume": ("-v", "--volume"),
        "env": ("-e", "--env"),
        "device": ("--device",),
        "entrypoint": ("--entrypoint",),
        "user": ("-u", "--user"),
    },
    repeat={"label", "ulimit", "volume", "env", "device"},
)
PS_SPEC = FlagSpec(
    bools={"all": ("-a", "--all"), "no_trunc": ("--no-trunc",), "quiet": ("-q", "--quiet")},
    values={"filter": ("-f", "--filter"), "format": ("--format",)},
    repeat={"filter"},
)
INSPECT_SPEC = FlagSpec(values={"format": ("-f", "--format"), "type": ("--type",)})
IMAGE_INSPECT_SPEC = FlagSpec(values={"format": ("-f", "--format")})
LOGS_SPEC = FlagSpec(bools={"follow": ("-f", "--follow")}, values={"tail": ("-n", "--tail")})
RM_SPEC = FlagSpec(bools={"force": ("-f", "--force")})
SAVE_SPEC = FlagSpec(values={"output": ("-o", "--output"), "platform": ("--platform",)})
LOAD_SPEC = FlagSpec(
    bools={"quiet": ("-q", "--quiet")},
    values={"input": ("-i", "--input"), "platform": ("--platform",)},
)
TAG_SPEC = FlagSpec()
LOAD_FAKE_SPEC = FlagSpec(
    values={"env": ("--env", "-e"), "entrypoint": ("--entrypoint",), "digest": ("--digest",)},
    repeat={"env", "entrypoint", "digest"},
)


@dataclass(frozen=True)
class RunArgs:
    """`docker run`: flags as given (`labels`/`env`/`volumes` raw `K=V`/`SRC:DST` strings),
    sizes and ulimits already validated, then IMAGE and its command."""

    image: str
    cmd: list[str]
    detach: bool
    name: str | None
    labels: list[str]
    network: str | None
    gpus: str | None
    ipc: str | None
    shm_size: int | None
    ulimits: list[dict[str, Any]]
    volumes: list[str]
    env: list[str]
    rm: bool = False
    devices: list[dict[str, str]] = field(default_factory=list)  # HostConfig.Devices entries
    entrypoint: str | None = None  # None: the image's; "": none (docker's --entrypoint "")
    user: str | None = None  # Config.User (recorded; the process runs as the runtime's user)

    def label_dict(self) -> dict[str, str]:
        return dict(item.partition("=")[::2] for item in self.labels)


def parse_device(text: str) -> dict[str, str]:
    """`--device HOST[:CONTAINER][:PERMS]` as docker's HostConfig.Devices entry (docker/cli
    opts ParseDevice: a second field that is a mode is the mode; the client checks paths only
    against the daemon's OS, so here only the shape is checked)."""
    parts = text.split(":")
    if len(parts) > 3 or not parts[0]:
        raise UsageError(f"invalid device specification: {text}", "run")
    dst, perms = "", "rwm"
    if len(parts) == 3:
        perms = parts[2]
    if len(parts) >= 2:
        if parts[1] and set(parts[1]) <= set("rwm"):
            perms = parts[1]
        else:
            dst = parts[1]
    return {"PathOnHost": parts[0], "PathInContainer": dst or parts[0], "CgroupPermissions": perms}


def run_args(args: list[str]) -> RunArgs:
    """`docker run` argv (after `run`), checked as the real client checks it."""
    opts, rest = parse_flags(args, RUN_SPEC, "run", interspersed=False)
    if not rest:
        raise UsageError('"docker run" requires at least 1 argument.', "run")
    return RunArgs(
        image=rest[0],
        cmd=rest[1:],
        detach=opts["detach"],
        name=opts["name"],
        labels=opts["label"],
        network=opts["network"],
        gpus=opts["gpus"],
        ipc=opts["ipc"],
        shm_size=parse_size(opts["shm_size"]) if opts["shm_size"] else None,
        ulimits=[parse_ulimit(u) for u in opts["ulimit"]],
        volumes=opts["volume"],
        env=opts["env"],
        rm=opts["rm"],
        devices=[parse_device(d) for d in opts["device"]],
        entrypoint=opts["entrypoint"],
        user=opts["user"],
    )


def require_contract(run: RunArgs) -> None:
    """What docs/INTERFACES.md adds on top of docker: a rank runs detached on the host
    network; a throwaway (`--rm`, the argv check) runs attached with no network."""
    network = run.network or "default"
    if run.detach and run.rm:
        raise CliError(
            "rehearsal runtime: `run -d --rm` is outside the subset in docs/INTERFACES.md "
            "(a rank is kept for `inspect`/`logs`; only an attached throwaway takes --rm)"
        )
    if run.detach:
        if network != "host":
            raise CliError(
                f"rehearsal runtime: --network {network} is not supported for `run -d`; "
                "the contract is --network host"
            )
        return
    if not run.rm:
        raise CliError(
            "rehearsal runtime: only `docker run -d` (a rank) and `docker run --rm` (a "
            "throwaway) are implemented (docs/INTERFACES.md)"
        )
    if network not in ("none", "host"):
        raise CliError(
            f"rehearsal runtime: --network {network} is not supported; a throwaway runs "
            "with --network none (or host)"
        )


@dataclass(frozen=True)
class PsArgs:
    all: bool
    no_trunc: bool
    quiet: bool
    filters: list[str]
    format: str | None


def ps_args(args: list[str]) -> PsArgs:
    opts, rest = parse_flags(args, PS_SPEC, "ps")
    if rest:
        raise UsageError('"docker ps" accepts no arguments.', "ps")
    return PsArgs(opts["all"], opts["no_trunc"], opts["quiet"], opts["filter"], opts["format"])


@dataclass(frozen=True)
class InspectArgs:
    refs: list[str]
    format: str | None


def inspect_args(args: list[str]) -> InspectArgs:
    opts, refs = parse_flags(args, INSPECT_SPEC, "inspect")
    if not refs:
        raise UsageError('"docker inspect" requires at least 1 argument.', "inspect")
    return InspectArgs(refs, opts["format"])


def image_inspect_args(args: list[str]) -> InspectArgs:
    """`docker image inspect ...` (argv after `image`); other `image` verbs are refused."""
    if not args or args[0] != "inspect":
        raise CliError(
            "rehearsal runtime: only `docker image inspect` is implemented (docs/INTERFACES.md)",
            code=1,
        )
    opts, refs = parse_flags(args[1:], IMAGE_INSPECT_SPEC, "image inspect")
    if not refs:
        raise UsageError('"docker image inspect" requires at least 1 argument.', "image inspect")
    return InspectArgs(refs, opts["format"])


@dataclass(frozen=True)
class LogsArgs:
    ref: str
    follow: bool
    tail: str | None

    def tail_lines(self) -> int | None:
        """`--tail` as a line count (None: everything). The client passes any string on;
        the daemon is what rejects a non-number, so this is checked at use, not at parse."""
        if self.tail in (None, "all"):
            return None
        try:
            return int(self.tail)
        except ValueError:
            raise UsageError(
                f'invalid argument "{self.tail}" for "-n, --tail" flag', "logs"
            ) from None


def logs_args(args: list[str]) -> LogsArgs:
    opts, refs = parse_flags(args, LOGS_SPEC, "logs")
    if len(refs) != 1:
        raise UsageError('"docker logs" requires exactly 1 argument.', "logs")
    return LogsArgs(refs[0], opts["follow"], opts["tail"])


@dataclass(frozen=True)
class RmArgs:
    refs: list[str]
    force: bool


def rm_args(args: list[str]) -> RmArgs:
    opts, refs = parse_flags(args, RM_SPEC, "rm")
    if not refs:
        raise UsageError('"docker rm" requires at least 1 argument.', "rm")
    return RmArgs(refs, opts["force"])


@dataclass(frozen=True)
class SaveArgs:
    refs: list[str]
    output: str | None  # None: the tar goes to stdout


def save_args(args: list[str]) -> SaveArgs:
    """`docker save [-o FILE] IMAGE...` (image ship, on rank 0)."""
    opts, refs = parse_flags(args, SAVE_SPEC, "save")
    if not refs:
        raise UsageError('"docker save" requires at least 1 argument.', "save")
    return SaveArgs(refs, opts["output"])


@dataclass(frozen=True)
class LoadArgs:
    input: str | None  # None: the tar comes on stdin
    quiet: bool


def load_args(args: list[str]) -> LoadArgs:
    """`docker load [-i FILE] [-q]` (image ship, on rank 1)."""
    opts, rest = parse_flags(args, LOAD_SPEC, "load")
    if rest:
        raise UsageError('"docker load" accepts no arguments.', "load")
    return LoadArgs(opts["input"], opts["quiet"])


@dataclass(frozen=True)
class TagArgs:
    source: str  # an image name or ID
    target: str  # a name (repo[:tag]), never a digest


def tag_args(args: list[str]) -> TagArgs:
    """`docker tag SOURCE TARGET` (image ship, on rank 1: a digest-pinned IMAGE's local
    name). The client refuses a digest as the target before it asks the daemon (moby
    client/image_tag.go: "refusing to create a tag with a digest reference"), exit 1."""
    _, refs = parse_flags(args, TAG_SPEC, "tag")
    if len(refs) != 2:
        raise UsageError('"docker tag" requires exactly 2 arguments.', "tag")
    if "@" in refs[1]:
        raise CliError("refusing to create a tag with a digest reference", code=1)
    return TagArgs(refs[0], refs[1])


def verdict(argv: list[str]) -> str | None:
    """None if the real client would accept `docker ARGV...`'s flags, else the error."""
    parsers = {
        "run": run_args,
        "ps": ps_args,
        "inspect": inspect_args,
        "image": image_inspect_args,
        "logs": logs_args,
        "rm": rm_args,
        "save": save_args,
        "load": load_args,
        "tag": tag_args,
    }
    if not argv or argv[0] not in parsers:
        return f"docker: {argv[0] if argv else ''!r} is not in the contract's subset"
    try:
        parsers[argv[0]](argv[1:])
    except CliError as exc:
        return str(exc)
    return None
