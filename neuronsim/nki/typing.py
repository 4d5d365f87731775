"""``nki.typing``: annotations kernels use (``tensor[128, 512]``); no runtime effect."""


class _Subscriptable(type):
    def __getitem__(cls, item):
        return cls


class tensor(metaclass=_Subscriptable):
    """Annotation of a tensor argument or tile, optionally with a shape: ``tensor[128, 4]``."""


class mutable_tensor(tensor):
    """Annotation of a tensor argument the kernel writes."""


class scalar(metaclass=_Subscriptable):
    """Annotation of a scalar argument."""
