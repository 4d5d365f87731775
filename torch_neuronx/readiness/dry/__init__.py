"""The dry wing: a script at its real size with no data (fake tensors, real allocator accounting).

``executor`` assembles the parts; ``mode`` routes each op (real host work, fake device work, value
reads, collectives); ``accounting`` reserves each new neuron storage through the device's allocator;
``parameters`` keeps optimizers pointed at moved parameters; ``values`` is the one value store
(what a dry run knows of tensor values; ``reads`` answers what it does not know;
``collective_values`` gives collectives' results by the value rule; ``mailbox`` passes point-to-point
messages between ranks; ``objects`` re-issues c10d's object collectives under the rule); ``taps``
lists the replacements a dry run installs; ``pipeline`` runs the micro-batches of a pipeline
schedule's step that differ; ``checkpoints`` stands in for absent weights and writes saved files
without data.

May import: the record wing (the executor feeds its ledger and recording), ``_torch_private``, and
the lower layers' hooks; never the estimate, report or launch wings.
"""
