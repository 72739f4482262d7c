"""Spectrum's cost model: dated prices, break-evens, fleet sizing and per-rung monthly cost.

Kept import-light (standard library only) so that any CLI can price a plan without delay.
"""
from cost.prices import (HOURS_PER_MONTH, PriceTable, UnknownName, hourly_cost_line, load_prices,
                         token_cost)

__all__ = ["HOURS_PER_MONTH", "PriceTable", "UnknownName", "hourly_cost_line", "load_prices",
           "token_cost"]
