"""The systems side of the simulation: availability, speeds, the virtual clock."""
from rayfed.systems.availability import (AVAILABILITIES, AlwaysOnline, Availability, BernoulliOnline, MarkovOnline,
                                         TraceOnline, make_availability)

__all__ = ["AVAILABILITIES", "AlwaysOnline", "Availability", "BernoulliOnline", "MarkovOnline", "TraceOnline",
           "make_availability"]
