"""specchat: a terminal chat app that shows speculative decoding happening, live."""

__version__ = "0.1.0"
