"""The recorder's observers: each owns one kind of fact about a run and its part of the Recording.

``spans`` (steps and regions: where counts go), ``phases`` (generation forwards), ``ops`` (op
calls and their cost), ``fallbacks`` (real or would-be CPU fallbacks), ``collectives``,
``graphs`` (compiled graphs, costed whole), ``memory`` (allocator counters and the storage
ledger's snapshots), ``compile`` (Dynamo's metrics and graph-break sites). The recorder
(``readiness/_recorder.py``) runs one dispatch mode and hands each op to them.
"""
