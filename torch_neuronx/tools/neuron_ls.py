"""``neuron-ls``: list the Neuron devices (chips) and NeuronCores this process sees.

Modelled on the AWS Neuron tool of the same name: a short header (instance
type, logical NeuronCore config), then one row per Neuron device that holds at
least one visible logical NeuronCore. The instance is the one simulated by the
torch-neuronx runtime, so the usual runtime variables apply:

* ``TORCH_NEURONX_INSTANCE_TYPE`` -- which instance to simulate (default trn2.3xlarge)
* ``NEURON_LOGICAL_NC_CONFIG``     -- physical cores per logical core (LNC)
* ``NEURON_RT_VISIBLE_CORES``      -- which logical cores this process may use, e.g. ``0-3`` or ``1,3``
* ``NEURON_RT_NUM_CORES``          -- how many of them

An invalid setting is reported on stderr with exit code 1.

Usage::

    neuron-ls            # table
    neuron-ls --json     # JSON list of devices
    python -m torch_neuronx.tools.neuron_ls
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Iterable

from neuronsim import settings as _settings

ENV_VARS = (
    "TORCH_NEURONX_INSTANCE_TYPE",
    "NEURON_LOGICAL_NC_CONFIG",
    "NEURON_RT_VISIBLE_CORES",
    "NEURON_RT_NUM_CORES",
)


def format_ids(ids: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 6]`` -> ``"0-3,6"`` (ranges of consecutive ids)."""
    ids = sorted(set(ids))
    parts = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def format_bytes(n: int) -> str:
    """Binary units with decimal names, as neuron-ls prints them (96 GiB -> ``96 GB``)."""
    if n == 0:
        return "0 B"
    units = ["B", "KB", "MB", "GB", "TB"]
    value = float(n)
    for unit in units:
        if value < 1024 or unit == units[-1]:
            break
        value /= 1024
    if unit == "B" or value == int(value):
        return f"{int(value)} {unit}"
    return f"{value:.1f} {unit}"


def collect() -> dict:
    """Describe the simulated instance and its visible devices.

    Returns a dict with the instance-level fields and ``devices``: one entry per
    Neuron device (chip) that has at least one visible logical core. Raises
    ``ValueError`` (from the runtime) if the environment configuration is invalid.
    """
    import torch  # autoloads torch_neuronx

    from torch_neuronx import _C

    info = _C._instance_info()
    lnc = info["logical_nc_config"]
    phys_per_chip = info["physical_cores_per_chip"]
    logical_per_chip = phys_per_chip // lnc

    devices: dict[int, dict] = {}
    for core in info["cores"]:
        chip = core["chip"]
        dev = devices.setdefault(
            chip,
            {
                "neuron_device": chip,
                "nc_count": 0,
                "neuroncore_ids": [],
                "torch_device_indices": [],
                "physical_neuroncore_ids": [],
                "logical_neuroncore_config": lnc,
                "memory_size": info["hbm_bytes_per_chip"],
                "memory_used": 0,
            },
        )
        dev["nc_count"] += 1
        dev["neuroncore_ids"].append(core["logical_id"])
        dev["torch_device_indices"].append(core["index"])
        dev["physical_neuroncore_ids"].extend(core["physical_cores"])
        dev["memory_used"] += torch.neuron.memory_allocated(core["index"])

    return {
        "instance_type": info["instance_type"],
        "simulated": True,
        "chip": info["chip"],
        "num_devices": info["num_chips"],
        "physical_cores_per_device": phys_per_chip,
        "logical_cores_per_device": logical_per_chip,
        "logical_nc_config": lnc,
        "logical_cores_total": info["logical_cores_total"],
        "visible_cores": [c["logical_id"] for c in info["cores"]],
        "devices": [devices[k] for k in sorted(devices)],
    }


COLUMNS = [
    # (header line 1, header line 2, cell function)
    ("NEURON", "DEVICE", lambda d: str(d["neuron_device"])),
    ("NEURON", "CORES", lambda d: str(d["nc_count"])),
    ("NEURON", "CORE IDS", lambda d: format_ids(d["neuroncore_ids"])),
    ("PHYSICAL", "CORE IDS", lambda d: format_ids(d["physical_neuroncore_ids"])),
    ("TORCH", "DEVICES", lambda d: format_ids(d["torch_device_indices"])),
    ("NEURON", "MEMORY", lambda d: format_bytes(d["memory_size"])),
    ("MEMORY USED", "(THIS PROCESS)", lambda d: format_bytes(d["memory_used"])),
]


def render_table(devices: list[dict]) -> str:
    """A plain-text table in the style of the AWS tool."""
    rows = [[fn(d) for _, _, fn in COLUMNS] for d in devices]
    widths = [max(len(h1), len(h2), *(len(r[i]) for r in rows)) + 2 for i, (h1, h2, _) in enumerate(COLUMNS)]
    sep = "+" + "+".join("-" * w for w in widths) + "+"

    def line(cells, center):
        out = []
        for c, w in zip(cells, widths):
            out.append(c.center(w) if center else " " + c.ljust(w - 1))
        return "|" + "|".join(out) + "|"

    lines = [sep, line([c[0] for c in COLUMNS], True), line([c[1] for c in COLUMNS], True), sep]
    lines += [line(r, False) for r in rows]
    lines.append(sep)
    return "\n".join(lines)


def render(data: dict) -> str:
    """Header and table."""
    total = data["logical_cores_total"]
    visible = data["visible_cores"]
    env = [f"{k}={_settings.raw(k)}" for k in ENV_VARS if (_settings.raw(k) or "").strip()]
    header = [
        f"instance-type: {data['instance_type']} (simulated by torch-neuronx; no Trainium hardware)",
        f"neuron-devices: {data['num_devices']} x {data['chip']}, "
        f"{data['physical_cores_per_device']} physical NeuronCores and "
        f"{format_bytes(data['devices'][0]['memory_size'])} HBM each",
        f"logical-neuroncore-config: {data['logical_nc_config']}",
        f"visible-neuroncores: {len(visible)} of {total} ({format_ids(visible)})",
    ]
    if env:
        header.append("environment: " + " ".join(env))
    return "\n".join(header) + "\n" + render_table(data["devices"])


def build_parser(prog: str = "neuron-ls") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="List the Neuron devices and NeuronCores of the (simulated) Trainium "
        "instance visible to this process. Honours TORCH_NEURONX_INSTANCE_TYPE, "
        "NEURON_LOGICAL_NC_CONFIG, NEURON_RT_VISIBLE_CORES and NEURON_RT_NUM_CORES.",
    )
    p.add_argument("-j", "--json", action="store_true", help="print a JSON list of devices")
    return p


def _stdout_closed_by_reader() -> int:
    # `neuron-ls | head -1`: the reader left, which is not an error of ours. Point stdout at
    # /dev/null so the interpreter's final flush cannot raise a second BrokenPipeError.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def main(argv: list[str] | None = None, prog: str = "neuron-ls") -> int:
    """Entry point of ``neuron-ls`` (and of ``torch-neuronx ls``, with that ``prog``)."""
    try:
        return _main(argv, prog)
    except BrokenPipeError:
        return _stdout_closed_by_reader()


def _main(argv, prog) -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        data = collect()
    except ValueError as e:  # invalid runtime configuration (from the C++ runtime)
        print(f"neuron-ls: error: invalid Neuron configuration: {e}", file=sys.stderr)
        return 1
    if args.json:
        devices = [dict(d, instance_type=data["instance_type"], simulated=True) for d in data["devices"]]
        print(json.dumps(devices, indent=2))
    else:
        print(render(data))
    sys.stdout.flush()  # a closed pipe raises here, inside main's handler
    return 0


if __name__ == "__main__":
    sys.exit(main())
