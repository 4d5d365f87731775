"""The record wing: one run of a script, recorded as typed facts.

``session`` runs one recording in one order (executor, rank context, recorder); ``recorder`` is
one dispatch mode that hands every op reaching the device to the ``observers`` (spans of steps
and regions, phases of a generation, compiled graphs, fallbacks, collectives and their order per
group, memory, compile metrics); ``measure`` says what an op or a compiled graph measures (FLOPs,
bytes, operands, matmul shapes: no chip); ``ledger`` holds the live device storages and their
snapshots at each core's peak; ``recording`` is the typed, versioned result everything above reads;
``real`` is the executor of a real run (the dry wing has the other).

May import: ``_torch_private``, ``neuronsim`` and the lower layers of torch_neuronx (through their
hooks); never the dry, estimate, report or launch wings: an executor is handed to the session.
"""
