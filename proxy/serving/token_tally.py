"""What one request spent in tokens, for its key's tokens-per-minute quota.

The answer's usage says it exactly. Without one — a client that left mid-stream (the final usage never came), a
route or server that reports none — the tokens are estimated rather than counted as none, which would make a
hang-up just before the end free: a quarter of the request body's bytes for the prompt, and one token per streamed
event relayed (or a quarter of the answer's bytes when it did not stream).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.tickets import Outcome

BYTES_PER_TOKEN = 4  # about what an English text's token takes; JSON's quoting makes a body's estimate generous


@dataclass
class Tally:
    """Set up with the request (`prompt_bytes`, `counting` when its key has a tpm), fed what is relayed to the
    client (`relayed`) and told how the request ended (`ended`)."""

    counting: bool = False
    prompt_bytes: int = 0
    relayed_bytes: int = 0
    relayed_events: int = 0
    tokens: int = 0
    estimated: bool = False  # no usage came: `tokens` is the estimate

    def relayed(self, body: bytes) -> None:
        if self.counting:
            self.relayed_bytes += len(body)
            self.relayed_events += body.count(b"data:")

    def ended(self, outcome: Outcome) -> None:
        """The tokens the answer's usage reported, prompt plus completion as its row records them; else the
        estimate."""
        usage = outcome.usage or {}
        self.estimated = not ("input_tokens" in usage or "output_tokens" in usage)
        if self.estimated:
            answer = self.relayed_events or self.relayed_bytes // BYTES_PER_TOKEN
            self.tokens = self.prompt_bytes // BYTES_PER_TOKEN + answer
        else:
            self.tokens = int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
