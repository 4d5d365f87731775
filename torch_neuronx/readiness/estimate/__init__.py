"""The estimate wing: how fast a recorded run would be on Trainium.

``time_model`` times one op call from a core's published figures (tiles applied here, from the
recorded matmul shapes: the recording holds no chip); ``collective_time`` times one collective (formulas from ``neuronsim.collectives``); ``steps``
composes buckets, steps, ranks and a generation's phases into typed ``results``; ``assumptions``
writes the rules every report prints; ``known_error`` holds the published rows the model was
checked against and the error bands a report gives; ``model`` is :class:`TimeModel`, the time
model as one object with a method per term.

May import: the record wing's ``recording`` types and ``neuronsim`` only (no torch).
"""
