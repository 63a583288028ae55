"""The names a model can be asked for: its ID and its aliases, unique across the file."""

from __future__ import annotations

from collections.abc import Mapping

from .errors import ProblemLog
from .model import ModelConfig

MAX_LISTED_NAMES = 12


class ModelIndex:
    """Maps every model ID and alias to the real model ID."""

    def __init__(self, models: Mapping[str, ModelConfig], log: ProblemLog):
        self.ids = sorted(models)
        self._real: dict[str, str] = {model_id: model_id for model_id in models}
        for model_id in self.ids:
            model = models[model_id]
            for alias, key in zip(model.aliases, model.alias_keys, strict=True):
                owner = self._real.get(alias)
                if alias == model_id:
                    log.error(key, f'"{alias}" is the model\'s own ID — remove it from aliases')
                elif alias in models:
                    log.error(key, f'"{alias}" is already the ID of model {alias} — choose another alias')
                elif owner == model_id:
                    log.error(key, f'"{alias}" is listed twice — remove one')
                elif owner is not None:
                    log.error(key, f'"{alias}" is already an alias of model {owner} — aliases must be unique across all models')
                else:
                    self._real[alias] = model_id

    def resolve(self, name: str) -> str | None:
        """The real model ID for an ID or alias, or None."""
        return self._real.get(name)

    def aliases(self) -> dict[str, str]:
        """Every alias with the model ID it stands for."""
        return {name: real for name, real in self._real.items() if name != real}

    def unknown(self, name: str) -> str:
        """Message for a name that is neither a model ID nor an alias."""
        listed = ", ".join(self.ids[:MAX_LISTED_NAMES])
        if len(self.ids) > MAX_LISTED_NAMES:
            listed += f", … ({len(self.ids)} in all)"
        known = f"defined models: {listed}" if self.ids else "no models are defined"
        return f'no model or alias is called "{name}" — use a model ID from `models:` ({known})'
