"""Contrastive pairs: the unit every consistency method trains on (DESIGN §2)."""

from opct.pairs.schema import Pair, load_pairs, save_pairs, validate_pair  # noqa: F401
