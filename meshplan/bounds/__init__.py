"""The bounds a search prunes with, fed from a scorer config: :mod:`meshplan.bounds.tier0`
(every candidate, from the unsharded program; ``simulator.bounds.tier0``) and
:mod:`meshplan.bounds.layout` (the tight bound, layout costs shared over dp and recompute;
``simulator.bounds.step``)."""
