"""The recorder's observers: each owns one kind of fact about a run and its part of the Recording.

``spans`` (steps and regions: where counts go), ``phases`` (generation forwards; ``generate``
taps transformers' generate for it), ``fallbacks`` (real or would-be CPU fallbacks),
``collectives`` (a c10d call's kind, bytes and group), ``sequence`` (each group's collectives in
order), ``graphs`` (compiled graphs, costed whole), ``pipeline`` (a pipeline schedule and its
stages' actions), ``memory`` (allocator counters and the storage ledger's snapshots), ``compile``
(Dynamo's metrics and graph-break sites). The recorder (``record/recorder.py``) runs one dispatch
mode and hands each op to them; what an op measures is ``record/measure.py``'s.
"""
