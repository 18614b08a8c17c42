"""One module per federated algorithm: its components (:class:`neurofed.trainer.fl.api.Component`) and its
registry entry (:class:`neurofed.trainer.fl.api.Algorithm`). The registry is :mod:`neurofed.trainer.fl.strategies`."""
