"""One module per federated algorithm: its components (:class:`trainer.fl.api.Component`) and its
registry entry (:class:`trainer.fl.api.Algorithm`). The registry is :mod:`trainer.fl.strategies`."""
