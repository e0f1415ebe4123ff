__version__ = "0.1.0"

# Before any submodule loads: choose between the compiled hot path and its sources.
from amqpd import hotpath as _hotpath

_hotpath.install()
