"""Every environment variable torch-neuronx reads, sets or forwards, and the one way to read them.

Python code reads the environment only through this module (``get``, ``raw``), so each
variable has one declaration: its type, default, meaning and the page of ``docs/`` that
documents it. Values are read at call time, never cached, so a test or a launcher that
changes ``os.environ`` is seen by the next read. Variables that the C++ core reads
(``csrc/``) are declared here too, with ``read_by`` naming ``"c++"``; the C++ code reads
them itself. Names that belong to other tools (torchrun, AWS's Neuron runtime, Inductor,
Hugging Face) carry their ``owner``: the package only reads, forwards or sets them.

``tests/neuron/test_settings.py`` keeps this true: no other Python file touches
``os.environ``, every ``getenv`` in ``csrc/`` names a variable declared here, and every
declared variable is in ``docs/configuration.md``. It is standard-library only and lives in
the torch-free ``neuronsim`` package because both the NKI simulator and torch_neuronx read it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

# Sections of docs/configuration.md, in order.
GROUPS = ("device", "compile", "readiness", "nki", "distributed", "huggingface")


@dataclass(frozen=True)
class Setting:
    """One environment variable: what ``get`` returns and where it is documented."""

    name: str
    type: type  # bool, int or str: what get() returns
    default: object  # what get() returns when the variable is unset
    meaning: str
    doc: str  # the page under docs/ that documents it
    group: str  # its section of docs/configuration.md (one of GROUPS)
    read_by: tuple[str, ...] = ("python",)  # "python" and/or "c++"
    owner: str = ""  # "" for torch-neuronx's own names, else the tool that defines the name


_ON = ("1", "true", "yes", "on")

SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        # -- device / instance (read when the device is first used) --
        Setting(
            "TORCH_NEURONX_INSTANCE_TYPE",
            str,
            "trn2.3xlarge",
            "the simulated Trainium instance type",
            "configuration.md",
            "device",
            read_by=("python", "c++"),
        ),
        Setting(
            "NEURON_LOGICAL_NC_CONFIG",
            int,
            None,
            "physical NeuronCores per logical core (1 or 2; default 2, trn1: 1)",
            "configuration.md",
            "device",
            read_by=("c++",),
            owner="AWS Neuron runtime",
        ),
        Setting(
            "NEURON_RT_VISIBLE_CORES",
            str,
            None,
            "logical cores this process sees, e.g. 0-3 or 1,3 (default: all)",
            "configuration.md",
            "device",
            read_by=("c++",),
            owner="AWS Neuron runtime",
        ),
        Setting(
            "NEURON_RT_NUM_CORES",
            int,
            None,
            "take the first N visible cores (default: all)",
            "configuration.md",
            "device",
            read_by=("c++",),
            owner="AWS Neuron runtime",
        ),
        Setting(
            "TORCH_NEURONX_ALLOW_CORE_SHARING",
            bool,
            False,
            "1: a rank whose LOCAL_RANK names no visible core uses neuron:(LOCAL_RANK % cores)",
            "configuration.md",
            "device",
            read_by=("c++",),
        ),
        Setting(
            "TORCH_NEURONX_STRICT_FALLBACK",
            bool,
            False,
            "an op that is not native on Trainium raises instead of warning",
            "fidelity.md",
            "device",
            read_by=("c++",),
        ),
        # -- torch.compile backend (read at each compile) --
        Setting(
            "TORCH_NEURONX_NEFF_CACHE_DIR",
            str,
            None,
            "persistent compile cache root (default $XDG_CACHE_HOME/torch_neuronx/neff or ~/.cache/...)",
            "compile.md",
            "compile",
        ),
        Setting(
            "TORCH_NEURONX_NEFF_DISABLE_CACHE",
            bool,
            False,
            "1: no cache reads or writes; each process compiles into a private temporary directory",
            "compile.md",
            "compile",
        ),
        Setting(
            "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS",
            bool,
            False,
            "1: keep the FX graphs and generated code of every compiled graph",
            "compile.md",
            "compile",
        ),
        Setting(
            "TORCH_NEURONX_DEBUG_DIR",
            str,
            "neuron_compile_artifacts",
            "where preserved compilation artifacts go",
            "compile.md",
            "compile",
        ),
        Setting(
            "TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY",
            bool,
            False,
            "1: CPU inputs to a compiled graph raise NeuronCpuInputError instead of being copied",
            "compile.md",
            "compile",
        ),
        Setting(
            "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION",
            bool,
            True,
            "the default of fallback_execution is its negation (0: failed graphs run eagerly)",
            "compile.md",
            "compile",
        ),
        Setting(
            "XDG_CACHE_HOME",
            str,
            None,
            "the base of the default compile cache root",
            "compile.md",
            "compile",
            owner="XDG base directory specification",
        ),
        Setting(
            "TORCHINDUCTOR_CACHE_DIR",
            str,
            None,
            "set to the compile cache while a graph compiles, restored after",
            "compile.md",
            "compile",
            owner="Inductor",
        ),
        # -- readiness (torch-neuronx check) --
        Setting(
            "RANK",
            int,
            0,
            "the rank a readiness recording reports",
            "configuration.md",
            "readiness",
            owner="torchrun",
        ),
        Setting(
            "WORLD_SIZE",
            int,
            1,
            "the number of ranks a readiness recording reports",
            "configuration.md",
            "readiness",
            owner="torchrun",
        ),
        Setting(
            "LOCAL_WORLD_SIZE",
            int,
            0,
            "ranks per instance: a recording's collectives whose group spans instances are timed over EFA",
            "configuration.md",
            "readiness",
            owner="torchrun",
        ),
        # -- distributed --
        Setting(
            "LOCAL_RANK",
            int,
            0,
            "the current device at start-up is neuron:LOCAL_RANK",
            "distributed.md",
            "distributed",
            read_by=("c++",),
            owner="torchrun",
        ),
        Setting(
            "TORCH_NEURONX_CHECK_COLLECTIVES",
            int,
            1,
            "how a neuron group's ranks that disagree on a collective are named: 1 records each "
            "collective (no communication while ranks agree) and, when one fails, names the mismatch "
            "or the absent ranks on every rank that fails; 2 also checks before each collective that "
            "every rank issues the same one (one round trip per collective, as "
            "TORCH_DISTRIBUTED_DEBUG=DETAIL, which turns 1 into 2); 0 does neither",
            "distributed.md",
            "distributed",
        ),
        Setting(
            "TORCH_DISTRIBUTED_DEBUG",
            str,
            None,
            "PyTorch's distributed debug level; DETAIL turns TORCH_NEURONX_CHECK_COLLECTIVES=1 into 2",
            "distributed.md",
            "distributed",
            owner="PyTorch",
        ),
        Setting(
            "TORCH_FR_BUFFER_SIZE",
            int,
            0,
            "entries of PyTorch's Flight Recorder ring buffer (0: off); read by torch-neuronx to "
            "dump it when a collective of a neuron group times out or ranks disagree",
            "distributed.md",
            "distributed",
            owner="PyTorch",
        ),
        Setting(
            "TORCH_FR_DUMP_TEMP_FILE",
            str,
            None,
            "path prefix of the Flight Recorder dumps (one file per rank: prefix + rank)",
            "distributed.md",
            "distributed",
            owner="PyTorch",
        ),
        # -- Hugging Face (set when unset by the demo and the architecture coverage tool) --
        Setting(
            "HF_HUB_OFFLINE",
            bool,
            False,
            "set to 1 (when unset) by torch-neuronx demo and arch_coverage: they never need the Hub",
            "configuration.md",
            "huggingface",
            owner="Hugging Face",
        ),
        Setting(
            "TRANSFORMERS_OFFLINE",
            bool,
            False,
            "set to 1 (when unset) by arch_coverage",
            "configuration.md",
            "huggingface",
            owner="Hugging Face",
        ),
        Setting(
            "TRANSFORMERS_NO_ADVISORY_WARNINGS",
            bool,
            False,
            "set to 1 (when unset) by torch-neuronx demo",
            "configuration.md",
            "huggingface",
            owner="Hugging Face",
        ),
    )
}


def _setting(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError(
            f"{name} is not a registered environment variable; declare it in neuronsim/settings.py "
            f"(SETTINGS) and document it in docs/configuration.md"
        ) from None


def raw(name: str) -> str | None:
    """The variable's text as set, or None when unset."""
    return os.environ.get(_setting(name).name)


def get(name: str):
    """The variable's value as its declared type, or its default when unset.

    bool: ``1``/``true``/``yes``/``on`` (any case) are true, anything else false.
    str: an empty value counts as unset. int: a value that is not an integer raises.
    """
    s = _setting(name)
    text = os.environ.get(name)
    if s.type is bool:
        return s.default if text is None else text.strip().lower() in _ON
    if s.type is int:
        if text is None:
            return s.default
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{name}={text!r} is not an integer; set it to an integer or unset it") from None
    return text or s.default


def setdefault(name: str, value: str) -> None:
    """Set the variable to `value` unless it is set (for tools whose settings are read at their import)."""
    os.environ.setdefault(_setting(name).name, value)


@contextlib.contextmanager
def override(name: str, value: str):
    """Set the variable while the block runs; restore it (or unset it) after."""
    prev = raw(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if prev is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = prev


def environ_copy() -> dict[str, str]:
    """A copy of the whole environment, to start a child process with (then add the variables it needs)."""
    return dict(os.environ)


# What torchrun sets in each rank's environment (its names, not ours): the dry run's rank
# launcher plays torchrun's part for the ranks it forks.
TORCHRUN_RANK_ENV = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
)


def set_rank_environment(values: dict[str, str | None]) -> dict[str, str | None]:
    """Set a rank's torchrun environment in this process (names from TORCHRUN_RANK_ENV only;
    None unsets). Returns the values they had, to restore them with the same call."""
    unknown = sorted(set(values) - set(TORCHRUN_RANK_ENV))
    if unknown:
        raise ValueError(f"not a variable torchrun sets for a rank: {unknown}")
    prev = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    return prev
