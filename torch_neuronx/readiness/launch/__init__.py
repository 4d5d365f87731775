"""The launch wing: ``torch-neuronx check`` from its command line to the report.

``cli`` parses the command line once into a typed :class:`job.Job` (its :class:`job.RankSpec` too),
reads the user's command through ``launchers`` (accelerate, trl, console scripts, torchrun, python)
into a typed ``Command``, and starts it; each process becomes a rank in ``rank`` (the job read from
its ``job.json``), or, for a dry run of a torchrun job, the ``scheduler`` forks the ranks after
``preimport`` imported what they share. At the end ``cli`` merges the ranks' recordings into the
report.

May import: every other wing (it runs them); nothing imports it but the package's entry points.
"""
