"""The plugin's settings: ``plugins.settings.tallow-speculator-ngram``."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tallow.plugin import plugin_settings

from . import DISTRIBUTION


class ReplayEntry(BaseModel):
    """A recorded continuation: the prompt's token ids and the tokens that followed."""

    model_config = ConfigDict(extra="forbid")

    prompt: list[int] = Field(min_length=1)
    output: list[int]


class ReplaySettings(BaseModel):
    """The ``replay`` speculator: recorded continuations and the share of proposed tokens the
    target is to keep."""

    model_config = ConfigDict(extra="forbid")

    acceptance_rate: float = Field(1.0, ge=0.0, le=1.0)
    #: continuations given inline
    continuations: list[ReplayEntry] = Field(default_factory=list)
    #: or a JSON file holding a list of {"prompt": [...], "output": [...]}
    file: Optional[str] = None


class NgramSettings(BaseModel):
    """Prompt lookup: the longest and shortest suffix of the sequence looked up."""

    model_config = ConfigDict(extra="forbid")

    prompt_lookup_max: int = Field(4, ge=1, le=64)
    prompt_lookup_min: int = Field(2, ge=1, le=64)
    replay: ReplaySettings = Field(default_factory=ReplaySettings)

    @model_validator(mode="after")
    def _order(self) -> "NgramSettings":
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) exceeds "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )
        return self


def settings_of(config: object) -> NgramSettings:
    return plugin_settings(NgramSettings, config, DISTRIBUTION)
