"""A brute-force O(n) reference for the serial pick, written from the spec, to check the core against.

Scores are exact fractions, so "equal scores keep arrival order" is checked
exactly. Tests feed it dyadic numbers (whole or quarter seconds, divisors like
0.5 or 60), for which the core's floating-point keys are exact too.
"""

from fractions import Fraction

from scheduling.core import SerialSettings, Ticket


def exact_score(ticket: Ticket, now: float, loaded, settings: SerialSettings) -> Fraction:
    affinity = settings.swap_affinity_bonus if ticket.model in loaded else 0
    divisor = Fraction(settings.aging_divisor)
    aging = (Fraction(now) - Fraction(ticket.arrival)) / divisor if divisor > 0 else 0
    return ticket.priority + affinity + aging


def best_first(tickets, now, loaded, settings) -> list[Ticket]:
    """Waiting tickets in dispatch order: score, then earlier arrival, then lower id."""
    return sorted(tickets, key=lambda t: (-exact_score(t, now, loaded, settings), t.arrival, t.id))
